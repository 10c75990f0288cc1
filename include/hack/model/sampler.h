/// @file sampler.h
/// @brief Token sampling from logits: greedy, temperature, top-k, top-p, min-p, seeded RNG,
/// presence / frequency / repetition penalties, stop tokens, logprobs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hack {

struct SamplingParams {
  float temperature = 1.0f;   ///< 0 = greedy
  int top_k = 0;              ///< 0 (or -1, as vLLM clients send) = off
  float top_p = 1.0f;         ///< 1 = off
  float min_p = 0.0f;         ///< 0 = off; keep tokens with p >= min_p * p_max
  std::optional<uint64_t> seed;  ///< unset = nondeterministic
  float presence_penalty = 0.0f;    ///< OpenAI semantics, subtracted once per seen token
  float frequency_penalty = 0.0f;   ///< OpenAI semantics, subtracted per occurrence
  float repetition_penalty = 1.0f;  ///< HF/CTRL semantics over prompt + output; 1 = off
  int max_tokens = 16;
  int min_tokens = 0;  ///< stop and EOS tokens are suppressed until this many are generated
  std::vector<int> stop_token_ids;  ///< generation ends after emitting one of these
  /// OpenAI logit_bias: (token, bias in [-100, 100]) added to the token's logit before
  /// penalties, temperature and truncation (±100 in effect bans or forces the token).
  /// Reported logprobs include it (the biased distribution, as OpenAI reports).
  std::vector<std::pair<int, float>> logit_bias;
  bool ignore_eos = false;
  /// Structured output: GBNF text the output must match (empty = unconstrained). The
  /// router compiles JSON schemas, regexes and choices to GBNF; every node that samples
  /// builds a matcher from it through a LogitsConstraintFactory.
  std::string grammar;
  int logprobs = -1;  ///< -1: none (SampleResult::logprob left 0); 0: the sampled token's; k > 0: also the top k
  /// -1: none; k >= 0: the prefill also reports every prompt token's logprob (with the top k
  /// alternatives) under the raw logits of the tokens before it (prompt_logprobs()).
  int prompt_logprobs = -1;

  /// Throws hack::Error naming the field if a value is out of range.
  void validate(int vocab_size) const;
};

struct TokenLogprob {
  int token = -1;
  float logprob = 0.0f;
};

struct SampleResult {
  int token = -1;
  float logprob = 0.0f;                   ///< log-softmax of the raw logits (before penalties/temperature), as vLLM reports by default
  std::vector<TokenLogprob> top_logprobs; ///< top `logprobs` tokens, best first
};

/// The uniform double in [0, 1) (53 random bits) for step `step` of the sequence seeded
/// with `seed`: splitmix64(seed + splitmix64(step)).
double uniform_for_step(uint64_t seed, uint64_t step);

/// One sequence's sampler: owns its seed, step count and the counts needed for penalties.
///
/// Randomness is a pure function of (seed, step): the draw for generated token i uses
/// uniform_for_step(seed, i) only, so generation can move between processes — prefill
/// samples token 0, decode records it (record_token) and samples tokens 1, 2, ... with the
/// same seed, drawing exactly what one process would have drawn.
/// Teacher-forced logprobs of a prompt: entry i - 1 is tokens[i] under the log-softmax of
/// row i - 1 of `logits` ([tokens.size()][vocab], each position's raw logits), with the
/// top_k best tokens of that row (best first). tokens.size() - 1 entries: the first token
/// has no logprob (OpenAI and vLLM report null).
std::vector<SampleResult> prompt_logprobs(std::span<const float> logits, std::span<const int> tokens, int vocab_size,
                                          int top_k);

/// Why generation ended.
enum class FinishReason { stop, length, tool_calls };
/// "stop" | "length" | "tool_calls", as the OpenAI API names them. Nodes only report stop and
/// length; the router turns stop into tool_calls when it parsed tool calls from the text.
std::string_view finish_reason_name(FinishReason reason);

/// min_tokens (HF min_new_tokens, vLLM min_tokens): while fewer than params.min_tokens
/// tokens have been generated, the tokens that would end generation — `eos_ids` and
/// params.stop_token_ids — get −inf logits, so they cannot be chosen. Ids outside the row
/// are ignored. The one place every sampling path (generate, the decode scheduler, the
/// prefill node's first token) applies it.
void suppress_ending_tokens(std::span<float> logits, const SamplingParams& params, std::span<const int> eos_ids,
                            int generated);

/// A constraint on which tokens may come next (a grammar matcher). The sampler calls
/// mask_logits after logit_bias and before penalties and temperature, and accept for every
/// token it samples or records. Defined here so the model library needs no grammar code.
class LogitsConstraint {
 public:
  virtual ~LogitsConstraint() = default;
  /// Sets the logits of disallowed tokens to −inf; EOS (`eos_ids` given at creation) is
  /// allowed only where the constraint can end, and is the only token once it is terminated.
  /// Must not allocate (the decode hot path).
  virtual void mask_logits(std::span<float> logits) = 0;
  /// Advances over `token`; throws hack::Error if the constraint does not allow it.
  /// Ending tokens (EOS) are ignored.
  virtual void accept(int token) = 0;
};

/// Builds the constraint a request's SamplingParams ask for (params.grammar).
class LogitsConstraintFactory {
 public:
  virtual ~LogitsConstraintFactory() = default;
  /// nullptr when params.grammar is empty; throws hack::Error if the grammar is invalid.
  virtual std::unique_ptr<LogitsConstraint> make(const SamplingParams& params, std::span<const int> eos_ids) const = 0;
};

class Sampler {
 public:
  /// Validates `params` (throws hack::Error like SamplingParams::validate). Without
  /// params.seed a random seed is picked (see seed()). A non-empty params.grammar needs
  /// `constraints` (throws otherwise); `eos_ids` are the tokens the grammar lets end it.
  Sampler(const SamplingParams& params, int vocab_size, const LogitsConstraintFactory* constraints = nullptr,
          std::span<const int> eos_ids = {});

  /// The seed in use: params.seed, or the one picked at construction (hand it to the
  /// process that continues the sequence).
  uint64_t seed() const { return seed_; }
  /// Tokens generated or recorded so far (the step index of the next sample).
  int64_t step() const { return step_; }
  /// Records a token generated elsewhere (e.g. the first token, sampled by the prefill
  /// node) as if this sampler had produced it: it counts for penalties, advances the
  /// step and the grammar (throws if the grammar rejects it), without drawing.
  void record_token(int token);

  /// Records prompt tokens (they count for the repetition penalty only).
  void add_prompt_tokens(std::span<const int> tokens);
  /// Samples the next token from `logits` [vocab] (modified in place as scratch) and
  /// records it as generated.
  SampleResult sample(std::span<float> logits);

  /// Whether `token` ends generation (a stop id, or EOS given in eos_ids unless ignore_eos).
  bool is_stop_token(int token, std::span<const int> eos_ids) const;
  const SamplingParams& params() const { return params_; }

 private:
  void mark_seen(int token);
  void apply_penalties(std::span<float> logits) const;
  int sample_random(std::span<float> logits, double u01);
  void select_top(std::span<const float> logits, size_t k, float min_logit);
  size_t nucleus(float max_logit, double* kept_mass);
  void fill_logprobs(SampleResult& result);

  SamplingParams params_;
  int vocab_size_;
  uint64_t seed_;
  int64_t step_ = 0;
  std::unordered_map<int, int> output_counts_;
  std::vector<uint8_t> seen_in_prompt_or_output_;
  std::vector<int> seen_ids_;             // the tokens flagged in seen_in_prompt_or_output_
  std::vector<std::pair<float, int>> scratch_;  // (logit, token) candidates
  std::vector<float> raw_logits_;         // copy before penalties, when logprobs are wanted
  std::vector<double> bucket_mass_;       // top-p histogram
  std::unique_ptr<LogitsConstraint> constraint_;  // params.grammar's matcher, if any
};

}  // namespace hack
