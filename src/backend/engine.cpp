#include "hack/backend/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "hack/core/error.h"

namespace hack {

Engine::Engine(Backend& backend, EngineOptions options)
    : backend_(backend), kv_(backend.kv()), options_(options) {
  HACK_CHECK(options_.prefill_chunk_tokens > 0, "prefill_chunk_tokens must be positive");
}

void Engine::add_sequence(int seq_id, int max_tokens) {
  HACK_CHECK(!positions_.contains(seq_id), "sequence {} already exists", seq_id);
  kv_.add_sequence(seq_id, max_tokens);
  positions_[seq_id] = 0;
}

CpuEngine make_cpu_engine(const Model& model, ThreadPool& pool, const KvCacheOptions& kv_options, EngineOptions options) {
  CpuEngine e;
  e.kv = make_paged_kv_cache(kv_shape(model), kv_options);
  e.backend = make_cpu_backend(model, pool, *e.kv);
  e.engine = std::make_unique<Engine>(*e.backend, options);
  return e;
}

void Engine::adopt_sequence(int seq_id) {
  auto it = positions_.find(seq_id);
  HACK_CHECK(it == positions_.end() || it->second == 0, "adopt: sequence {} has already run {} tokens", seq_id,
             it == positions_.end() ? 0 : it->second);
  HACK_CHECK(kv_.has_sequence(seq_id), "adopt: sequence {} is not in the KV cache", seq_id);
  const int length = kv_.length(seq_id, 0);
  for (int l = 1; l < kv_.shape().num_layers; ++l)
    HACK_CHECK(kv_.length(seq_id, l) == length, "adopt: sequence {} holds {} tokens in layer 0 but {} in layer {}",
               seq_id, length, kv_.length(seq_id, l), l);
  positions_[seq_id] = length;
}

void Engine::remove_sequence(int seq_id) {
  kv_.remove_sequence(seq_id);
  positions_.erase(seq_id);
}

int Engine::position(int seq_id) const {
  auto it = positions_.find(seq_id);
  HACK_CHECK(it != positions_.end(), "unknown sequence {}", seq_id);
  return it->second;
}

void Engine::prefill(int seq_id, std::span<const int> tokens, std::vector<float>& logits, bool all_logits,
                     const std::function<void(int layer, bool last_chunk)>& on_layer_done) {
  HACK_CHECK(!tokens.empty(), "sequence {}: empty prompt", seq_id);
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  int& pos = positions_.at(seq_id);
  std::vector<float> chunk_logits;
  if (all_logits) logits.resize(tokens.size() * vocab);
  size_t done = 0;
  kv_.begin_prefill(seq_id);
  while (done < tokens.size()) {
    const size_t n = std::min(tokens.size() - done, static_cast<size_t>(options_.prefill_chunk_tokens));
    SequenceChunk c{seq_id, pos, tokens.subspan(done, n), all_logits};
    const bool last_chunk = done + n == tokens.size();
    LayerDoneFn layer_done;
    if (on_layer_done) layer_done = [&](int layer) { on_layer_done(layer, last_chunk); };
    backend_.forward(std::span<const SequenceChunk>(&c, 1), chunk_logits, layer_done);
    if (all_logits) std::copy(chunk_logits.begin(), chunk_logits.end(), logits.begin() + static_cast<std::ptrdiff_t>(done * vocab));
    pos += static_cast<int>(n);
    done += n;
  }
  kv_.end_prefill(seq_id);
  if (!all_logits) logits.swap(chunk_logits);
}

void Engine::decode(std::span<const int> seq_ids, std::span<const int> tokens, std::vector<float>& logits) {
  HACK_CHECK(seq_ids.size() == tokens.size(), "decode: {} sequences but {} tokens", seq_ids.size(), tokens.size());
  chunks_.clear();
  for (size_t i = 0; i < seq_ids.size(); ++i) {
    chunks_.push_back(SequenceChunk{seq_ids[i], position(seq_ids[i]), tokens.subspan(i, 1), false});
  }
  backend_.forward(chunks_, logits);
  for (int id : seq_ids) ++positions_.at(id);
}

GenerationResult generate(Engine& engine, int seq_id, std::span<const int> prompt, const SamplingParams& params,
                          std::span<const int> eos_ids, const std::function<bool(const SampleResult&)>& on_token,
                          const LogitsConstraintFactory* constraints) {
  using clock = std::chrono::steady_clock;
  const int vocab = engine.config().vocab_size;
  params.validate(vocab);
  GenerationResult result;
  result.stats.prompt_tokens = static_cast<int>(prompt.size());
  Sampler sampler(params, vocab, constraints, eos_ids);
  sampler.add_prompt_tokens(prompt);

  const auto t_start = clock::now();
  std::vector<float> logits;
  engine.prefill(seq_id, prompt, logits);
  const auto t_prefilled = clock::now();
  result.stats.prefill_s = std::chrono::duration<double>(t_prefilled - t_start).count();

  clock::time_point t_first;
  for (int i = 0; i < params.max_tokens; ++i) {
    const std::span<float> row(logits.data(), static_cast<size_t>(vocab));
    suppress_ending_tokens(row, params, eos_ids, i);
    SampleResult s = sampler.sample(row);
    if (i == 0) {
      t_first = clock::now();
      result.stats.first_token_s = std::chrono::duration<double>(t_first - t_start).count();
    }
    result.tokens.push_back(s.token);
    result.samples.push_back(s);
    const bool keep_going = on_token ? on_token(s) : true;
    if (sampler.is_stop_token(s.token, eos_ids) || !keep_going) {
      result.finish_reason = FinishReason::stop;
      break;
    }
    if (i + 1 == params.max_tokens) break;
    const int token = s.token;
    engine.decode(std::span<const int>(&seq_id, 1), std::span<const int>(&token, 1), logits);
  }
  result.stats.generated_tokens = static_cast<int>(result.tokens.size());
  if (!result.tokens.empty()) result.stats.decode_s = std::chrono::duration<double>(clock::now() - t_first).count();
  return result;
}

}  // namespace hack
