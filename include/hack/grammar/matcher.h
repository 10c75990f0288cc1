/// @file matcher.h
/// @brief Grammar matcher over bytes: accept tokens, compute the allowed-token mask.
///
/// The matcher's state is a set of stacks (llama.cpp's construction): each stack holds the
/// positions still to match, innermost on top, every top a byte-set element; an empty stack
/// means the grammar is complete. A byte advances every stack whose top matches it.
///
/// Stack sets are interned in a GrammarStateTable — a DFA over stack sets built lazily —
/// so a state reached again (inside a JSON string every character returns to the same
/// state) costs one table lookup per byte. The allowed-token mask walks the vocabulary's
/// byte trie with the DFA, skipping each subtree whose prefix is already rejected, and is
/// cached per state. Share one table between the matchers of one grammar and vocabulary.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hack/grammar/grammar.h"
#include "hack/grammar/token_vocabulary.h"

namespace hack::grammar {

/// Stacks back to back: stack i is data[begin(i), ends[i]), bottom first.
struct StackSet {
  std::vector<uint32_t> data;
  std::vector<uint32_t> ends;

  size_t size() const { return ends.size(); }
  bool empty() const { return ends.empty(); }
  void clear() {
    data.clear();
    ends.clear();
  }
  std::span<const uint32_t> stack(size_t i) const {
    const uint32_t b = i == 0 ? 0 : ends[i - 1];
    return {data.data() + b, ends[i] - b};
  }
  /// Adds `s` unless an equal stack is present.
  void add(std::span<const uint32_t> s);
};

/// The lazily built DFA over stack sets of one grammar, and per-state token masks for one
/// vocabulary. Thread-safe: every call locks (one engine thread per node in practice).
class GrammarStateTable {
 public:
  static constexpr int32_t kDead = -1;
  /// Reset (states forgotten) when it grows past this many states, between calls.
  static constexpr size_t kMaxStates = 16384;  // ~1 KiB of transitions each

  GrammarStateTable(std::shared_ptr<const CompiledGrammar> grammar, std::shared_ptr<const TokenVocabulary> vocab);

  const CompiledGrammar& grammar() const { return *grammar_; }
  const TokenVocabulary* vocab() const { return vocab_.get(); }
  std::mutex& mutex() const { return mutex_; }

  // The rest: call with mutex() held.
  /// The id of the state holding `set` (interned on first sight).
  int32_t intern(const StackSet& set);
  /// The state after byte b, or kDead.
  int32_t step(int32_t state, uint8_t b);
  const StackSet& stacks(int32_t state) const { return states_[static_cast<size_t>(state)].set; }
  bool accepting(int32_t state) const { return states_[static_cast<size_t>(state)].accepting; }
  /// The allowed-token bitset of `state` ([ceil(vocab / 64)] words), computed on first use.
  const std::vector<uint64_t>& mask(int32_t state);
  /// The stack set of the grammar's start.
  StackSet initial() const;
  size_t state_count() const { return states_.size(); }
  /// Forgets every state if there are more than kMaxStates (ids held by callers die).
  bool maybe_reset();
  /// Bumped by every reset.
  size_t generation() const { return generation_; }

 private:
  struct State {
    StackSet set;
    bool accepting = false;
    std::array<int32_t, 256> next;
    std::vector<uint64_t> mask;  // empty until computed
  };
  void expand(std::vector<uint32_t>& stack, StackSet& out) const;
  void advance(const StackSet& in, uint8_t b, StackSet& out);

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  mutable std::mutex mutex_;
  std::vector<State> states_;
  std::unordered_map<std::string, int32_t> ids_;  // key: the set's data and ends, as bytes
  std::vector<uint32_t> scratch_stack_;
  StackSet scratch_set_;
  std::string scratch_key_;
  std::vector<int32_t> walk_;  // walk_[d]: the state after the first d bytes of the trie path
  size_t generation_ = 0;
};

/// One sequence's position in the grammar.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<GrammarStateTable> table);

  /// Advances over `bytes` if the grammar allows all of them; else returns false unchanged.
  bool accept_bytes(std::string_view bytes);
  /// Advances over the token's bytes; false (unchanged) if the grammar does not allow it or
  /// the token has no bytes (special tokens).
  bool accept_token(int id);
  /// Bit t of `bits` ([ceil(vocab / 64)] words) = token t keeps the output valid. EOS is not
  /// included: allow it when can_end().
  void fill_allowed_mask(std::span<uint64_t> bits);
  /// allowed[t] = 1 when token t is allowed (resized to the vocabulary).
  void fill_allowed_mask(std::vector<uint8_t>& allowed);
  /// Whether the output so far is a complete sentence of the grammar (EOS allowed).
  bool can_end() const;
  /// Whether nothing can follow: only EOS is allowed.
  bool is_terminated() const;
  /// Advances over already generated tokens (a continued or migrated stream); throws
  /// hack::Error naming the first token the grammar rejects.
  void replay(std::span<const int> tokens);

 private:
  int32_t current_state();  // with the table's mutex held

  std::shared_ptr<GrammarStateTable> table_;
  StackSet stacks_;
  int32_t state_ = -1;
  size_t table_generation_ = 0;
};

}  // namespace hack::grammar
