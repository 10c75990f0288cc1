#include "hack/grammar/matcher.h"

#include <algorithm>
#include <cstring>

#include "hack/core/error.h"

namespace hack::grammar {

namespace {
using Kind = GrammarElement::Kind;
constexpr int32_t kUnknown = -2;
}  // namespace

void StackSet::add(std::span<const uint32_t> s) {
  for (size_t i = 0; i < size(); ++i) {
    const std::span<const uint32_t> t = stack(i);
    if (t.size() == s.size() && std::equal(t.begin(), t.end(), s.begin())) return;
  }
  data.insert(data.end(), s.begin(), s.end());
  ends.push_back(static_cast<uint32_t>(data.size()));
}

GrammarStateTable::GrammarStateTable(std::shared_ptr<const CompiledGrammar> grammar,
                                     std::shared_ptr<const TokenVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  HACK_CHECK(grammar_ != nullptr, "GrammarStateTable: no grammar");
}

// Resolves rule references at the top of `stack` until every resulting stack has a byte-set
// element on top (or is empty: complete), adding each to `out`. `stack` is restored on return.
// Terminates because compile_gbnf refuses left recursion.
void GrammarStateTable::expand(std::vector<uint32_t>& stack, StackSet& out) const {
  if (stack.empty() || grammar_->elements[stack.back()].kind == Kind::bytes) {
    out.add(stack);
    return;
  }
  const uint32_t pos = stack.back();
  const GrammarElement& ref = grammar_->elements[pos];
  stack.pop_back();
  // The return position, unless the reference ends its alternative (a tail call: loops
  // written as R ::= x R do not grow the stack).
  const bool has_return = grammar_->elements[pos + 1].kind != Kind::end;
  if (has_return) stack.push_back(pos + 1);
  for (uint32_t start : grammar_->rules[ref.rule]) {
    const bool nonempty = grammar_->elements[start].kind != Kind::end;
    if (nonempty) stack.push_back(start);
    expand(stack, out);
    if (nonempty) stack.pop_back();
  }
  if (has_return) stack.pop_back();
  stack.push_back(pos);
}

void GrammarStateTable::advance(const StackSet& in, uint8_t b, StackSet& out) {
  out.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    const std::span<const uint32_t> s = in.stack(i);
    if (s.empty()) continue;
    const uint32_t pos = s.back();
    if (!grammar_->elements[pos].matches(b)) continue;
    scratch_stack_.assign(s.begin(), s.end() - 1);
    if (grammar_->elements[pos + 1].kind != Kind::end) scratch_stack_.push_back(pos + 1);
    expand(scratch_stack_, out);
  }
}

StackSet GrammarStateTable::initial() const {
  StackSet set;
  std::vector<uint32_t> stack;
  for (uint32_t start : grammar_->rules[grammar_->root]) {
    if (grammar_->elements[start].kind != Kind::end) stack.push_back(start);
    expand(stack, set);
    stack.clear();
  }
  return set;
}

int32_t GrammarStateTable::intern(const StackSet& set) {
  scratch_key_.assign(reinterpret_cast<const char*>(set.ends.data()), set.ends.size() * sizeof(uint32_t));
  scratch_key_.push_back('|');
  scratch_key_.append(reinterpret_cast<const char*>(set.data.data()), set.data.size() * sizeof(uint32_t));
  const auto [it, inserted] = ids_.emplace(scratch_key_, static_cast<int32_t>(states_.size()));
  if (inserted) {
    State st;
    st.set = set;
    for (size_t i = 0; i < set.size(); ++i) st.accepting |= set.stack(i).empty();
    st.next.fill(kUnknown);
    states_.push_back(std::move(st));
  }
  return it->second;
}

int32_t GrammarStateTable::step(int32_t state, uint8_t b) {
  int32_t next = states_[static_cast<size_t>(state)].next[b];
  if (next != kUnknown) return next;
  advance(states_[static_cast<size_t>(state)].set, b, scratch_set_);
  next = scratch_set_.empty() ? kDead : intern(scratch_set_);
  states_[static_cast<size_t>(state)].next[b] = next;  // after intern: states_ may have moved
  return next;
}

const std::vector<uint64_t>& GrammarStateTable::mask(int32_t state) {
  HACK_CHECK(vocab_ != nullptr, "grammar mask: the matcher has no vocabulary");
  if (!states_[static_cast<size_t>(state)].mask.empty()) return states_[static_cast<size_t>(state)].mask;
  std::vector<uint64_t> bits((static_cast<size_t>(vocab_->size()) + 63) / 64, 0);
  const std::vector<TokenVocabulary::TrieNode>& trie = vocab_->trie();
  const std::vector<int>& tokens = vocab_->trie_tokens();
  walk_.assign(static_cast<size_t>(vocab_->max_token_bytes()) + 1, kDead);
  walk_[0] = state;
  for (size_t i = 1; i < trie.size();) {
    const TokenVocabulary::TrieNode& node = trie[i];
    const int32_t next = step(walk_[node.depth - 1u], node.byte);
    if (next == kDead) {
      i = node.subtree_end;  // no token with this prefix is allowed
      continue;
    }
    walk_[node.depth] = next;
    for (uint32_t k = node.tokens_begin; k < node.tokens_end; ++k) {
      const auto t = static_cast<size_t>(tokens[k]);
      bits[t >> 6] |= uint64_t{1} << (t & 63);
    }
    ++i;
  }
  states_[static_cast<size_t>(state)].mask = std::move(bits);
  return states_[static_cast<size_t>(state)].mask;
}

bool GrammarStateTable::maybe_reset() {
  if (states_.size() <= kMaxStates) return false;
  states_.clear();
  ids_.clear();
  ++generation_;
  return true;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<GrammarStateTable> table) : table_(std::move(table)) {
  HACK_CHECK(table_ != nullptr, "GrammarMatcher: no state table");
  std::lock_guard lock(table_->mutex());
  stacks_ = table_->initial();
}

int32_t GrammarMatcher::current_state() {
  if (table_->maybe_reset() || state_ < 0 || table_generation_ != table_->generation()) {
    state_ = table_->intern(stacks_);
    table_generation_ = table_->generation();
  }
  return state_;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  std::lock_guard lock(table_->mutex());
  int32_t s = current_state();
  for (char c : bytes) {
    s = table_->step(s, static_cast<uint8_t>(c));
    if (s == GrammarStateTable::kDead) return false;
  }
  state_ = s;
  stacks_ = table_->stacks(s);
  return true;
}

bool GrammarMatcher::accept_token(int id) {
  const TokenVocabulary* vocab = table_->vocab();
  HACK_CHECK(vocab != nullptr, "accept_token: the matcher has no vocabulary");
  if (id < 0 || id >= vocab->size() || vocab->bytes(id).empty()) return false;
  return accept_bytes(vocab->bytes(id));
}

void GrammarMatcher::fill_allowed_mask(std::span<uint64_t> bits) {
  std::lock_guard lock(table_->mutex());
  const std::vector<uint64_t>& mask = table_->mask(current_state());
  HACK_CHECK(bits.size() == mask.size(), "fill_allowed_mask: {} words for a mask of {}", bits.size(), mask.size());
  std::memcpy(bits.data(), mask.data(), mask.size() * sizeof(uint64_t));
}

void GrammarMatcher::fill_allowed_mask(std::vector<uint8_t>& allowed) {
  std::lock_guard lock(table_->mutex());
  const std::vector<uint64_t>& mask = table_->mask(current_state());
  allowed.assign(static_cast<size_t>(table_->vocab()->size()), 0);
  for (size_t t = 0; t < allowed.size(); ++t) allowed[t] = (mask[t >> 6] >> (t & 63)) & 1;
}

bool GrammarMatcher::can_end() const {
  for (size_t i = 0; i < stacks_.size(); ++i) {
    if (stacks_.stack(i).empty()) return true;
  }
  return false;
}

bool GrammarMatcher::is_terminated() const { return stacks_.size() == 1 && stacks_.stack(0).empty(); }

void GrammarMatcher::replay(std::span<const int> tokens) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    HACK_CHECK(accept_token(tokens[i]), "grammar replay: token {} (#{}) is not allowed by the grammar", tokens[i], i);
  }
}

}  // namespace hack::grammar
