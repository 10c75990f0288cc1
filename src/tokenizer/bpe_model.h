// The BPE model of tokenizer.json: vocab, ranked merges (both "a b" and ["a","b"]
// encodings), byte_fallback, unk / fuse_unk, ignore_merges, continuing_subword_prefix and
// end_of_word_suffix. Merging uses a linked list of symbols and a min-heap of candidate
// pairs (HF's Word::merge_all), so a word of n characters costs O(n log n).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "src/tokenizer/hash_tables.h"

namespace hack::tok {

/// Bounded cache of word -> ids, owned by one thread at a time (it lives in the per-call
/// scratch, so no locking). Cleared wholesale when full.
class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 64;

  std::span<const int> find(std::string_view word, uint64_t hash) const;
  void insert(std::string_view word, uint64_t hash, std::span<const int> ids);
  void clear();

 private:
  static constexpr size_t kSlots = 1 << 15;  // at most half of them used (HF caches 10,000 words)
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = 0, ids_offset = 0;
    uint16_t key_len = 0, ids_len = 0;
    bool used = false;
  };
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int> ids_;
  size_t used_ = 0;
};

/// Per-call working memory of BpeModel::tokenize.
struct BpeScratch {
  struct Symbol {
    int id;
    int prev, next;  // indices into symbols, -1 at the ends
    int len;         // bytes of the word it covers; 0 once merged into its left neighbour
  };
  struct Candidate {
    int rank, pos, new_id;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::string piece;
  WordCache cache;
};

class BpeModel {
 public:
  /// `spec` is tokenizer.json "model"; `where` names it in errors.
  BpeModel(const nlohmann::json& spec, const std::string& where);

  /// Appends the ids of `word` (one pre-tokenized piece) to `out`.
  void tokenize(std::string_view word, BpeScratch& scratch, std::vector<int>& out) const;

  /// -1 when `token` is not in the vocab.
  int token_to_id(std::string_view token) const { return vocab_.find(token); }
  /// Null when `id` has no token.
  const std::string* id_to_token(int id) const {
    if (id < 0 || id >= static_cast<int>(id_to_entry_.size()) || id_to_entry_[id] < 0) return nullptr;
    return &entry_tokens_[id_to_entry_[id]];
  }
  /// One past the largest id in the vocab.
  int id_limit() const { return static_cast<int>(id_to_entry_.size()); }
  /// Number of vocab entries.
  size_t vocab_entries() const { return entry_tokens_.size(); }

 private:
  void tokenize_word(std::string_view word, BpeScratch& scratch, std::vector<int>& out) const;
  void merge_word(std::string_view word, BpeScratch& scratch, std::vector<int>& out) const;
  // The vocab string of one character: with continuing_subword_prefix unless first, with
  // end_of_word_suffix when last.
  std::string_view symbol_text(std::string_view chars, bool is_first, bool is_last, BpeScratch& scratch) const;
  int symbol_id(std::string_view text) const;

  std::vector<std::string> entry_tokens_;  // vocab keys; vocab_ holds views into them
  std::vector<int> id_to_entry_;           // [id] -> index into entry_tokens_, or -1
  StringIdMap vocab_;
  PairMergeMap merges_;
  std::vector<int> bmp_char_id_;    // [code point < 0x10000] -> id of that one-character token, or -1
  std::array<int, 256> byte_id_{};  // <0xNN> tokens for byte_fallback, -1 when absent
  std::optional<std::string> unk_token_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  bool split_at_metaspace_ = false;  // long words may be cut before "▁" runs (see the constructor)
};

}  // namespace hack::tok
