// tokenizer.json "added_tokens": the tokens cut out of the input before normalization and
// pre-tokenization. Matching is leftmost-longest over a byte trie (what HF's Aho-Corasick
// automaton with MatchKind::LeftmostLongest does), then lstrip / rstrip / single_word.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "hack/tokenizer/tokenizer.h"

namespace hack::tok {

/// Byte trie over token patterns with a longest-match query.
class TokenTrie {
 public:
  TokenTrie();
  /// Adds `pattern` for `value`; a pattern added twice keeps its first value.
  void add(std::string_view pattern, int value);
  /// Value of the longest pattern that starts at text[pos] (its length in *len), or -1.
  int longest_at(std::string_view text, size_t pos, size_t* len) const;
  bool can_start(unsigned char c) const { return root_[c] >= 0; }
  bool empty() const { return nodes_.size() == 1; }

 private:
  struct Node {
    int value = -1;
    std::vector<std::pair<unsigned char, int>> children;  // sorted by byte (not used at the root)
  };
  int child(int node, unsigned char c) const;
  std::vector<Node> nodes_;    // [0] is the root
  std::array<int, 256> root_;  // the root's children, by byte

};

/// One split of the input: a run of plain text [start, end) or an added token.
struct AddedSplit {
  size_t start, end;
  int token_id;  // -1 for plain text
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  /// `tokens` in tokenizer.json order; `normalized_contents[i]` is tokens[i].content run
  /// through the normalizer (used for tokens with normalized = true).
  AddedVocabulary(std::vector<AddedToken> tokens, const std::vector<std::string>& normalized_contents);

  /// Splits `text` on the tokens matched against raw input (normalized = false) or against
  /// normalized input (normalized = true). Pieces cover `text` in order, except whitespace
  /// an lstrip / rstrip token absorbs.
  void split(std::string_view text, bool normalized_set, std::vector<AddedSplit>& out) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

 private:
  std::vector<AddedToken> tokens_;
  TokenTrie raw_trie_, normalized_trie_;  // values index tokens_
};

}  // namespace hack::tok
