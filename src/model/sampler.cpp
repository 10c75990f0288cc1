// Sampling, in vLLM's order: penalties (repetition, then frequency and presence) on the
// raw logits, temperature, min-p, top-k, top-p, then one draw from the renormalised
// softmax of what is left.
//
// Cost per token is O(V): min-p is a threshold, top-k a bounded heap (k <= 1024) or an
// nth_element, top-p a histogram of the candidates' logits that sorts only the one bucket
// where the mass crosses p; top logprobs come from a k-element heap. Nothing sorts the
// vocabulary. Scratch memory grows on first use only: none for greedy, 8 bytes per
// candidate otherwise, plus a copy of the logits when logprobs are requested.
//
// Reported logprobs are the log-softmax of the logits with logit_bias added (as OpenAI
// reports them) but before penalties and temperature, as vLLM reports by default; they are computed only when
// params.logprobs >= 0, otherwise SampleResult::logprob is 0.
#include "hack/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "hack/core/error.h"

namespace hack {

namespace {

// vLLM's _SAMPLING_EPS: temperatures below this are greedy.
constexpr float kGreedyTemperature = 1e-5f;

// Top-k up to this size uses a bounded heap, larger k an nth_element over all candidates.
constexpr size_t kHeapTopK = 1024;

// Best first: larger logit, then lower token id (so ties resolve to the lowest id).
bool better(const std::pair<float, int>& a, const std::pair<float, int>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// splitmix64's finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

// Defined by us, so reproducible across standard libraries (std::uniform_real_distribution
// is not) and across processes: one draw per step, from (seed, step) alone.
double uniform_for_step(uint64_t seed, uint64_t step) {
  return static_cast<double>(splitmix64(seed + splitmix64(step)) >> 11) * 0x1.0p-53;
}

void SamplingParams::validate(int vocab_size) const {
  HACK_CHECK(vocab_size > 0, "vocab_size must be > 0, got {}", vocab_size);
  HACK_CHECK(std::isfinite(temperature) && temperature >= 0.0f, "temperature must be >= 0, got {}", temperature);
  HACK_CHECK(top_k >= -1, "top_k must be >= 0 (0 or -1 = off), got {}", top_k);
  HACK_CHECK(top_p > 0.0f && top_p <= 1.0f, "top_p must be in (0, 1], got {}", top_p);
  HACK_CHECK(min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1], got {}", min_p);
  HACK_CHECK(presence_penalty >= -2.0f && presence_penalty <= 2.0f, "presence_penalty must be in [-2, 2], got {}",
             presence_penalty);
  HACK_CHECK(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f, "frequency_penalty must be in [-2, 2], got {}",
             frequency_penalty);
  HACK_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f, "repetition_penalty must be > 0, got {}",
             repetition_penalty);
  HACK_CHECK(max_tokens >= 1, "max_tokens must be >= 1, got {}", max_tokens);
  HACK_CHECK(min_tokens >= 0 && min_tokens <= max_tokens, "min_tokens must be in [0, max_tokens = {}], got {}",
             max_tokens, min_tokens);
  for (int id : stop_token_ids) {
    HACK_CHECK(id >= 0 && id < vocab_size, "stop_token_ids: token {} is outside the vocabulary [0, {})", id, vocab_size);
  }
  HACK_CHECK(logprobs >= -1 && logprobs <= vocab_size, "logprobs must be in [-1, {}], got {}", vocab_size, logprobs);
  HACK_CHECK(prompt_logprobs >= -1 && prompt_logprobs <= vocab_size, "prompt_logprobs must be in [-1, {}], got {}",
             vocab_size, prompt_logprobs);
  for (const auto& [id, bias] : logit_bias) {
    HACK_CHECK(id >= 0 && id < vocab_size, "logit_bias: token {} is outside the vocabulary [0, {})", id, vocab_size);
    HACK_CHECK(std::isfinite(bias) && bias >= -100.0f && bias <= 100.0f,
               "logit_bias: the bias of token {} must be in [-100, 100], got {}", id, bias);
  }
}

Sampler::Sampler(const SamplingParams& params, int vocab_size, const LogitsConstraintFactory* constraints,
                 std::span<const int> eos_ids)
    : params_(params),
      vocab_size_(vocab_size),
      seed_(params.seed ? *params.seed : random_seed()),
      seen_in_prompt_or_output_(static_cast<size_t>(std::max(vocab_size, 0)), 0) {
  params_.validate(vocab_size);
  if (!params_.grammar.empty()) {
    HACK_CHECK(constraints != nullptr, "grammar: this process cannot apply a grammar (no tokenizer loaded)");
    constraint_ = constraints->make(params_, eos_ids);
  }
}

void Sampler::mark_seen(int token) {
  HACK_CHECK(token >= 0 && token < vocab_size_, "token {} is outside the vocabulary [0, {})", token, vocab_size_);
  uint8_t& seen = seen_in_prompt_or_output_[static_cast<size_t>(token)];
  if (!seen) {
    seen = 1;
    seen_ids_.push_back(token);
  }
}

void Sampler::add_prompt_tokens(std::span<const int> tokens) {
  for (int t : tokens) mark_seen(t);
}

void Sampler::record_token(int token) {
  mark_seen(token);  // validates the id
  if (constraint_) constraint_->accept(token);
  ++output_counts_[token];
  ++step_;
}

void Sampler::apply_penalties(std::span<float> logits) const {
  // Repetition (HF/CTRL): over prompt and output, positive logits divided, others multiplied.
  const float rep = params_.repetition_penalty;
  if (rep != 1.0f) {
    for (int t : seen_ids_) {
      float& l = logits[static_cast<size_t>(t)];
      l = l > 0.0f ? l / rep : l * rep;
    }
  }
  // Frequency and presence (OpenAI): over output tokens only.
  if (params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f) {
    for (const auto& [t, count] : output_counts_) {
      logits[static_cast<size_t>(t)] -= params_.frequency_penalty * static_cast<float>(count) + params_.presence_penalty;
    }
  }
}

SampleResult Sampler::sample(std::span<float> logits) {
  HACK_CHECK(logits.size() == static_cast<size_t>(vocab_size_), "sample: {} logits for a vocabulary of {}",
             logits.size(), vocab_size_);
  SampleResult result;
  const bool want_logprobs = params_.logprobs >= 0;
  // logit_bias first: the reported logprobs are of the biased distribution, as OpenAI's are.
  for (const auto& [t, bias] : params_.logit_bias) logits[static_cast<size_t>(t)] += bias;
  // The grammar next: reported logprobs are of the distribution sampled from.
  if (constraint_) constraint_->mask_logits(logits);
  if (want_logprobs) raw_logits_.assign(logits.begin(), logits.end());

  apply_penalties(logits);

  const bool greedy = params_.temperature < kGreedyTemperature || params_.top_k == 1;
  if (greedy) {
    size_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i) {
      if (logits[i] > logits[best]) best = i;  // strict: ties keep the lowest id
    }
    HACK_CHECK(!std::isnan(logits[best]), "sample: logits contain NaN");
    result.token = static_cast<int>(best);
  } else {
    result.token = sample_random(logits, uniform_for_step(seed_, static_cast<uint64_t>(step_)));
  }

  if (want_logprobs) fill_logprobs(result);
  if (constraint_) constraint_->accept(result.token);
  ++output_counts_[result.token];
  mark_seen(result.token);
  ++step_;
  return result;
}

// u: this step's uniform draw in [0, 1).
int Sampler::sample_random(std::span<float> logits, double u01) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const float inv_t = 1.0f / params_.temperature;
  float max_logit = kNegInf;
  bool has_nan = false;
  for (float& l : logits) {
    l *= inv_t;
    has_nan |= std::isnan(l);
    max_logit = std::max(max_logit, l);
  }
  HACK_CHECK(!has_nan, "sample: logits contain NaN");
  HACK_CHECK(max_logit > kNegInf, "sample: every logit is -inf");

  const bool top_k_on = params_.top_k > 0 && params_.top_k < vocab_size_;
  if (!top_k_on && params_.min_p == 0.0f && params_.top_p >= 1.0f) {
    // Plain temperature sampling: weights in place, no candidate list.
    double total = 0;
    for (float& l : logits) total += (l = std::exp(l - max_logit));
    const double u = u01 * total;
    double acc = 0;
    int last_positive = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      if (logits[i] == 0.0f) continue;
      acc += logits[i];
      last_positive = static_cast<int>(i);
      if (u < acc) return last_positive;
    }
    return last_positive;  // u landed in the rounding gap at the top
  }

  // Candidates as (logit, token): min-p is a threshold (p >= min_p * p_max  <=>  logit >=
  // max + log(min_p)), top-k a bounded heap (small k) or nth_element (large k); both keep
  // the best logits, so they commute.
  const float min_logit = params_.min_p > 0.0f ? max_logit + std::log(params_.min_p) : kNegInf;
  const size_t k = top_k_on ? static_cast<size_t>(params_.top_k) : logits.size();
  scratch_.clear();
  if (k <= kHeapTopK) {
    select_top(logits, k, min_logit);
  } else {
    for (size_t i = 0; i < logits.size(); ++i) {
      if (logits[i] >= min_logit && logits[i] > kNegInf) scratch_.emplace_back(logits[i], static_cast<int>(i));
    }
    if (k < scratch_.size()) {
      std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(k), scratch_.end(), better);
      scratch_.resize(k);
    }
  }

  size_t n = scratch_.size();
  double total = 0;
  if (params_.top_p < 1.0f) {
    n = nucleus(max_logit, &total);
  } else {
    for (const auto& c : scratch_) total += std::exp(c.first - max_logit);
  }

  // One draw from the renormalised distribution over scratch_[0, n).
  const double u = u01 * total;
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += std::exp(scratch_[i].first - max_logit);
    if (u < acc) return scratch_[i].second;
  }
  return scratch_[n - 1].second;  // u landed in the rounding gap at the top
}

// The best k of `logits` with logit >= min_logit into scratch_ (unordered), by a bounded
// heap whose front is the worst kept: O(V) comparisons against the front, O(log k) per
// replacement.
void Sampler::select_top(std::span<const float> logits, size_t k, float min_logit) {
  for (size_t i = 0; i < logits.size(); ++i) {
    const float l = logits[i];
    if (!(l >= min_logit) || l == -std::numeric_limits<float>::infinity()) continue;
    const std::pair<float, int> c(l, static_cast<int>(i));
    if (scratch_.size() < k) {
      scratch_.push_back(c);
      std::push_heap(scratch_.begin(), scratch_.end(), better);
    } else if (better(c, scratch_.front())) {
      std::pop_heap(scratch_.begin(), scratch_.end(), better);
      scratch_.back() = c;
      std::push_heap(scratch_.begin(), scratch_.end(), better);
    }
  }
}

// Top-p without sorting the candidates: bucket scratch_ by logit (bucket b holds logits
// b / kBucketsPerUnit .. (b + 1) / kBucketsPerUnit below the max), find the bucket where
// the cumulative probability mass crosses top_p, and sort only that bucket. Moves the
// best-first prefix of the candidates whose mass first reaches top_p of their total (the
// crossing token included) to the front of scratch_; returns its size, its mass in *kept_mass.
size_t Sampler::nucleus(float max_logit, double* kept_mass) {
  constexpr float kBucketsPerUnit = 128.0f;  // 1/128 of a logit wide
  constexpr int kBuckets = 32 * 128;         // 32 below the max (p < 1.3e-14) and further: last bucket
  bucket_mass_.assign(kBuckets, 0.0);
  auto bucket_of = [max_logit](float logit) {
    const float d = (max_logit - logit) * kBucketsPerUnit;
    return d < static_cast<float>(kBuckets - 1) ? static_cast<int>(d) : kBuckets - 1;
  };
  double total = 0;
  for (const auto& c : scratch_) {
    const double w = std::exp(c.first - max_logit);
    bucket_mass_[static_cast<size_t>(bucket_of(c.first))] += w;
    total += w;
  }
  const double target = static_cast<double>(params_.top_p) * total;

  double above = 0;  // mass of the buckets before the crossing one
  int crossing = kBuckets - 1;
  for (int b = 0; b < kBuckets; ++b) {
    if (above + bucket_mass_[static_cast<size_t>(b)] >= target) {
      crossing = b;
      break;
    }
    above += bucket_mass_[static_cast<size_t>(b)];
  }
  const auto begin = scratch_.begin();
  const auto mid = std::partition(begin, scratch_.end(), [&](const auto& c) { return bucket_of(c.first) < crossing; });
  const auto last = std::partition(mid, scratch_.end(), [&](const auto& c) { return bucket_of(c.first) == crossing; });
  std::sort(mid, last, better);
  double cum = above;
  for (auto it = mid; it != last; ++it) {
    cum += std::exp(it->first - max_logit);
    if (cum >= target || it + 1 == last) {
      *kept_mass = cum;
      return static_cast<size_t>(it - begin) + 1;
    }
  }
  *kept_mass = above;  // empty crossing bucket: reachable only through rounding
  return std::max<size_t>(1, static_cast<size_t>(mid - begin));
}

void Sampler::fill_logprobs(SampleResult& result) {
  // log-softmax of the raw logits: x - (max + log Σ exp(x - max)).
  float max_raw = -std::numeric_limits<float>::infinity();
  for (float l : raw_logits_) max_raw = std::max(max_raw, l);
  double sum = 0;
  for (float l : raw_logits_) sum += std::exp(l - max_raw);
  const double log_z = static_cast<double>(max_raw) + std::log(sum);
  result.logprob = static_cast<float>(static_cast<double>(raw_logits_[static_cast<size_t>(result.token)]) - log_z);

  const size_t k = std::min(static_cast<size_t>(params_.logprobs), raw_logits_.size());
  result.top_logprobs.clear();
  if (k == 0) return;
  scratch_.clear();
  select_top(raw_logits_, k, -std::numeric_limits<float>::max());
  std::sort_heap(scratch_.begin(), scratch_.end(), better);
  result.top_logprobs.reserve(k);
  for (const auto& [logit, token] : scratch_) {
    result.top_logprobs.push_back({token, static_cast<float>(static_cast<double>(logit) - log_z)});
  }
}

std::vector<SampleResult> prompt_logprobs(std::span<const float> logits, std::span<const int> tokens, int vocab_size,
                                          int top_k) {
  const auto vocab = static_cast<size_t>(vocab_size);
  HACK_CHECK(logits.size() == tokens.size() * vocab, "prompt_logprobs: {} logits for {} tokens of vocabulary {}",
             logits.size(), tokens.size(), vocab);
  std::vector<SampleResult> out;
  if (tokens.size() < 2) return out;
  out.reserve(tokens.size() - 1);
  const size_t k = std::min(static_cast<size_t>(std::max(top_k, 0)), vocab);
  std::vector<int> order(vocab);
  for (size_t i = 1; i < tokens.size(); ++i) {
    const std::span<const float> row = logits.subspan((i - 1) * vocab, vocab);
    const float max_raw = *std::max_element(row.begin(), row.end());
    double sum = 0;
    for (float l : row) sum += std::exp(l - max_raw);
    const double log_z = static_cast<double>(max_raw) + std::log(sum);
    SampleResult r;
    r.token = tokens[i];
    HACK_CHECK(r.token >= 0 && static_cast<size_t>(r.token) < vocab, "prompt_logprobs: token {} out of vocabulary", r.token);
    r.logprob = static_cast<float>(static_cast<double>(row[static_cast<size_t>(r.token)]) - log_z);
    if (k > 0) {
      for (size_t t = 0; t < vocab; ++t) order[t] = static_cast<int>(t);
      // Best first; equal logits by lower id, so the order is deterministic.
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), [&](int a, int b) {
        const float la = row[static_cast<size_t>(a)], lb = row[static_cast<size_t>(b)];
        return la != lb ? la > lb : a < b;
      });
      for (size_t j = 0; j < k; ++j) {
        r.top_logprobs.push_back(
            {order[j], static_cast<float>(static_cast<double>(row[static_cast<size_t>(order[j])]) - log_z)});
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

bool Sampler::is_stop_token(int token, std::span<const int> eos_ids) const {
  if (std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), token) != params_.stop_token_ids.end()) {
    return true;
  }
  return !params_.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end();
}

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::tool_calls: return "tool_calls";
  }
  return "stop";
}

void suppress_ending_tokens(std::span<float> logits, const SamplingParams& params, std::span<const int> eos_ids,
                            int generated) {
  if (generated >= params.min_tokens) return;
  for (const std::span<const int> ids : {eos_ids, std::span<const int>(params.stop_token_ids)})
    for (int id : ids)
      if (id >= 0 && static_cast<size_t>(id) < logits.size()) logits[static_cast<size_t>(id)] = -INFINITY;
}

}  // namespace hack
