#include "hack/grammar/grammar_constraint.h"

#include <algorithm>
#include <cmath>

#include "hack/core/error.h"

namespace hack::grammar {

GrammarConstraint::GrammarConstraint(std::shared_ptr<GrammarStateTable> table, std::span<const int> eos_ids)
    : matcher_(table), eos_ids_(eos_ids.begin(), eos_ids.end()), eos_logits_(eos_ids.size()),
      bits_((static_cast<size_t>(table->vocab()->size()) + 63) / 64) {}

void GrammarConstraint::mask_logits(std::span<float> logits) {
  for (size_t i = 0; i < eos_ids_.size(); ++i) {
    const auto id = static_cast<size_t>(eos_ids_[i]);
    eos_logits_[i] = id < logits.size() ? logits[id] : -INFINITY;
  }
  matcher_.fill_allowed_mask(bits_);
  const size_t covered = std::min(logits.size(), bits_.size() * 64);
  for (size_t w = 0; w * 64 < covered; ++w) {
    const uint64_t word = bits_[w];
    if (word == ~uint64_t{0}) continue;
    const size_t end = std::min(covered, w * 64 + 64);
    for (size_t t = w * 64; t < end; ++t) {
      if (!((word >> (t & 63)) & 1)) logits[t] = -INFINITY;
    }
  }
  for (size_t t = covered; t < logits.size(); ++t) logits[t] = -INFINITY;  // padding rows of the model
  if (matcher_.can_end()) {
    for (size_t i = 0; i < eos_ids_.size(); ++i) {
      const auto id = static_cast<size_t>(eos_ids_[i]);
      if (id < logits.size()) logits[id] = eos_logits_[i];
    }
  }
}

void GrammarConstraint::accept(int token) {
  if (std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()) return;
  HACK_CHECK(matcher_.accept_token(token), "grammar: token {} is not allowed here", token);
}

GrammarConstraintFactory::GrammarConstraintFactory(std::shared_ptr<const TokenVocabulary> vocab, size_t max_grammars)
    : vocab_(std::move(vocab)), max_grammars_(std::max<size_t>(max_grammars, 1)) {
  HACK_CHECK(vocab_ != nullptr, "GrammarConstraintFactory: no vocabulary");
}

std::shared_ptr<GrammarStateTable> GrammarConstraintFactory::table(const std::string& gbnf) const {
  {
    std::lock_guard lock(mutex_);
    const auto it = cache_.find(gbnf);
    if (it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return it->second.first;
    }
  }
  // Compiled outside the lock; a concurrent compile of the same text keeps the first.
  auto compiled = std::make_shared<const CompiledGrammar>(compile_gbnf(gbnf));
  auto table = std::make_shared<GrammarStateTable>(std::move(compiled), vocab_);
  std::lock_guard lock(mutex_);
  const auto it = cache_.find(gbnf);
  if (it != cache_.end()) return it->second.first;
  lru_.push_front(gbnf);
  cache_.emplace(gbnf, std::make_pair(table, lru_.begin()));
  while (cache_.size() > max_grammars_) {
    cache_.erase(lru_.back());
    lru_.pop_back();
  }
  return table;
}

std::unique_ptr<LogitsConstraint> GrammarConstraintFactory::make(const SamplingParams& params,
                                                                 std::span<const int> eos_ids) const {
  if (params.grammar.empty()) return nullptr;
  return std::make_unique<GrammarConstraint>(table(params.grammar), eos_ids);
}

}  // namespace hack::grammar
