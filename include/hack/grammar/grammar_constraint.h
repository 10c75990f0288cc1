/// @file grammar_constraint.h
/// @brief The sampler's LogitsConstraint for a GBNF grammar, and the per-node factory that
/// caches compiled grammars (keyed by their text) with their state tables.
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "hack/grammar/matcher.h"
#include "hack/model/sampler.h"

namespace hack::grammar {

/// Masks logits to the tokens a GrammarMatcher allows. EOS is allowed where the grammar can
/// end and is the only token once it is terminated. Allocation-free per token.
class GrammarConstraint final : public LogitsConstraint {
 public:
  GrammarConstraint(std::shared_ptr<GrammarStateTable> table, std::span<const int> eos_ids);
  void mask_logits(std::span<float> logits) override;
  void accept(int token) override;
  GrammarMatcher& matcher() { return matcher_; }

 private:
  GrammarMatcher matcher_;
  std::vector<int> eos_ids_;
  std::vector<float> eos_logits_;  // [eos_ids_.size()]
  std::vector<uint64_t> bits_;     // [ceil(vocab / 64)]
};

/// Builds GrammarConstraints for one vocabulary, keeping the compiled grammars (and their
/// lazily built state tables and mask caches) of the last `max_grammars` distinct texts,
/// so a repeated schema costs neither a compile nor a cold mask. Thread-safe.
class GrammarConstraintFactory final : public LogitsConstraintFactory {
 public:
  explicit GrammarConstraintFactory(std::shared_ptr<const TokenVocabulary> vocab, size_t max_grammars = 32);
  std::unique_ptr<LogitsConstraint> make(const SamplingParams& params, std::span<const int> eos_ids) const override;
  /// The state table of `gbnf`, compiled on first use (throws hack::Error if it is invalid).
  std::shared_ptr<GrammarStateTable> table(const std::string& gbnf) const;
  const std::shared_ptr<const TokenVocabulary>& vocab() const { return vocab_; }

 private:
  std::shared_ptr<const TokenVocabulary> vocab_;
  size_t max_grammars_;
  mutable std::mutex mutex_;
  mutable std::list<std::string> lru_;  // most recent first
  mutable std::unordered_map<std::string, std::pair<std::shared_ptr<GrammarStateTable>, std::list<std::string>::iterator>> cache_;
};

}  // namespace hack::grammar
