#include "hack/backend/engine.h"

#include "hack/backend/cpu_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "hack/core/error.h"

namespace hack {

Engine::Engine(Backend& backend, EngineOptions options, ThreadPool* pool)
    : backend_(backend), kv_(backend.kv()), options_(options), pool_(pool) {
  HACK_CHECK(options_.prefill_chunk_tokens > 0, "prefill_chunk_tokens must be positive");
  validate(options_.keep);
  if (options_.keep.enabled()) {
    // Scores come from the observer's uncompressed q against the cache's keys, which FDC
    // stores projected: the dot would be wrong.
    HACK_CHECK(!kv_.shape().compressed(), "--kv-keep-ratio / --kv-keep-tokens cannot be combined with --fdc yet");
  }
}

void Engine::add_sequence(int seq_id, int max_tokens) {
  HACK_CHECK(!sequences_.contains(seq_id), "sequence {} already exists", seq_id);
  kv_.add_sequence(seq_id, max_tokens);
  sequences_[seq_id] = SequenceState{};
}

CpuEngine make_cpu_engine(const Model& model, ThreadPool& pool, const KvCacheOptions& kv_options, EngineOptions options) {
  CpuEngine e;
  e.kv = make_paged_kv_cache(kv_shape(model), kv_options);
  e.kv->set_quantize_pool(&pool);  // the engine thread appends and closes between its parallel regions
  e.backend = make_cpu_backend(model, pool, *e.kv, options.matmul_precision);
  e.engine = std::make_unique<Engine>(*e.backend, options, &pool);
  return e;
}

EngineParts make_cpu_engine_parts(const Model& model, ThreadPool& pool, const KvCacheOptions& kv_options,
                                  EngineOptions options) {
  CpuEngine e = make_cpu_engine(model, pool, kv_options, options);
  EngineParts parts;
  parts.kv = std::move(e.kv);
  parts.backend = std::move(e.backend);
  parts.engine = std::move(e.engine);
  return parts;
}

void Engine::adopt_sequence(int seq_id, int position) {
  auto it = sequences_.find(seq_id);
  HACK_CHECK(it == sequences_.end() || it->second.position == 0, "adopt: sequence {} has already run {} tokens",
             seq_id, it == sequences_.end() ? 0 : it->second.position);
  HACK_CHECK(kv_.has_sequence(seq_id), "adopt: sequence {} is not in the KV cache", seq_id);
  const int length = kv_.length(seq_id, 0);
  for (int l = 1; l < kv_.shape().num_layers; ++l)
    HACK_CHECK(kv_.length(seq_id, l) == length, "adopt: sequence {} holds {} tokens in layer 0 but {} in layer {}",
               seq_id, length, kv_.length(seq_id, l), l);
  if (position < 0) position = length;
  HACK_CHECK(position >= length, "adopt: sequence {} holds {} tokens, more than the {} it stands for", seq_id, length,
             position);
  sequences_[seq_id] = SequenceState{position, position - length};
}

void Engine::remove_sequence(int seq_id) {
  kv_.remove_sequence(seq_id);
  sequences_.erase(seq_id);
}

const Engine::SequenceState& Engine::state(int seq_id) const {
  auto it = sequences_.find(seq_id);
  HACK_CHECK(it != sequences_.end(), "unknown sequence {}", seq_id);
  return it->second;
}

Engine::SequenceState& Engine::state(int seq_id) {
  return const_cast<SequenceState&>(std::as_const(*this).state(seq_id));
}

int Engine::position(int seq_id) const { return state(seq_id).position; }

bool Engine::evicts(int prompt_tokens) const {
  return options_.keep.enabled() && options_.keep.budget(prompt_tokens) < prompt_tokens;
}

void Engine::score_chunk(int layer, int first_pos, int rows, const float* q, const float* k, int window_start) {
  const int first_row = std::max(0, window_start - first_pos);
  if (first_row >= rows) return;
  const ModelConfig& c = config();
  const size_t kvd = static_cast<size_t>(c.kv_dim()), qd = static_cast<size_t>(c.q_dim());
  const int n_keys = first_pos + rows;
  // Keys [0, first_pos) as the cache holds them (exact inside the prefill), then the chunk's own.
  keys_.resize(static_cast<size_t>(n_keys) * kvd);
  if (first_pos > 0) kv_.read_exact_tokens(current_seq_, layer, 0, first_pos, keys_.data(), nullptr);
  std::copy_n(k, static_cast<size_t>(rows) * kvd, keys_.begin() + static_cast<std::ptrdiff_t>(first_pos * kvd));
  std::vector<float>& scores = scores_[options_.keep.scope == KeepScope::layer ? static_cast<size_t>(layer) : 0];
  accumulate_attention_scores(q + static_cast<size_t>(first_row) * qd, rows - first_row, first_pos + first_row,
                              keys_.data(), n_keys, c.num_heads, c.num_kv_heads, c.head_dim, scores, pool_);
}

void Engine::prefill(int seq_id, std::span<const int> tokens, std::vector<float>& logits, bool all_logits,
                     const std::function<void(int layer, bool last_chunk)>& on_layer_done,
                     const std::function<void(int layer)>& before_evict) {
  HACK_CHECK(!tokens.empty(), "sequence {}: empty prompt", seq_id);
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  SequenceState& st = state(seq_id);
  const int num_layers = config().num_layers;
  const int prompt = st.position + static_cast<int>(tokens.size());  // a restored prefix included
  const bool evict = st.evicted == 0 && evicts(prompt);
  const int window_start = options_.keep.window_start(prompt);
  struct ObserverGuard {  // the observer lives only inside this prefill
    Backend* backend = nullptr;
    ~ObserverGuard() {
      if (backend) backend->set_activation_observer({});
    }
  } guard;
  int chunk_first = 0;
  if (evict) {
    scores_.assign(options_.keep.scope == KeepScope::layer ? static_cast<size_t>(num_layers) : 1,
                   std::vector<float>(static_cast<size_t>(prompt), 0.0f));
    current_seq_ = seq_id;
    backend_.set_activation_observer([&](int layer, size_t rows, const float* q, const float* k, const float*) {
      score_chunk(layer, chunk_first, static_cast<int>(rows), q, k, window_start);
    });
    guard.backend = &backend_;
  }
  std::vector<float> chunk_logits;
  if (all_logits) logits.resize(tokens.size() * vocab);
  size_t done = 0;
  kv_.begin_prefill(seq_id);
  while (done < tokens.size()) {
    const size_t n = std::min(tokens.size() - done, static_cast<size_t>(options_.prefill_chunk_tokens));
    chunk_first = st.position - st.evicted;
    SequenceChunk c{seq_id, chunk_first, tokens.subspan(done, n), all_logits, st.evicted};
    const bool last_chunk = done + n == tokens.size();
    LayerDoneFn layer_done;
    if (last_chunk && evict) {
      layer_done = [&](int layer) {
        if (options_.keep.scope == KeepScope::layer) {
          if (before_evict) before_evict(layer);
          evict_layer(seq_id, layer);
          if (on_layer_done) on_layer_done(layer, true);
        } else if (layer + 1 == num_layers) {  // one kept set from every layer's scores
          for (int l = 0; l < num_layers; ++l)
            if (before_evict) before_evict(l);
          for (int l = 0; l < num_layers; ++l) evict_layer(seq_id, l);
          for (int l = 0; l < num_layers; ++l)
            if (on_layer_done) on_layer_done(l, true);
        }
      };
    } else if (on_layer_done || (last_chunk && before_evict)) {
      layer_done = [&](int layer) {
        if (last_chunk && before_evict) before_evict(layer);
        if (on_layer_done) on_layer_done(layer, last_chunk);
      };
    }
    backend_.forward(std::span<const SequenceChunk>(&c, 1), chunk_logits, layer_done);
    if (all_logits) std::copy(chunk_logits.begin(), chunk_logits.end(), logits.begin() + static_cast<std::ptrdiff_t>(done * vocab));
    st.position += static_cast<int>(n);
    done += n;
  }
  if (evict) st.evicted = st.position - evict_kept_;
  kv_.end_prefill(seq_id);
  if (!all_logits) logits.swap(chunk_logits);
}

void Engine::prefill_batch(std::span<const PrefillItem> items, std::vector<float>& logits,
                           const std::function<void(int layer)>& on_layer_done) {
  HACK_CHECK(!items.empty(), "prefill batch: no prompts");
  size_t total = 0;
  chunks_.clear();
  for (const PrefillItem& item : items) {
    HACK_CHECK(!item.tokens.empty(), "sequence {}: empty prompt", item.seq_id);
    const SequenceState& st = state(item.seq_id);
    HACK_CHECK(st.evicted == 0 && !evicts(st.position + static_cast<int>(item.tokens.size())),
               "prefill batch: sequence {} is pruned by static eviction; prefill it alone", item.seq_id);
    HACK_CHECK(std::none_of(chunks_.begin(), chunks_.end(), [&](const SequenceChunk& c) { return c.seq_id == item.seq_id; }),
               "prefill batch: sequence {} appears twice", item.seq_id);
    total += item.tokens.size();
    chunks_.push_back(SequenceChunk{item.seq_id, st.position, item.tokens, false, 0});
  }
  HACK_CHECK(total <= static_cast<size_t>(options_.prefill_chunk_tokens),
             "prefill batch: {} tokens, more than one chunk of {}", total, options_.prefill_chunk_tokens);
  for (const PrefillItem& item : items) kv_.begin_prefill(item.seq_id);
  backend_.forward(chunks_, logits, on_layer_done);
  for (const PrefillItem& item : items) {
    state(item.seq_id).position += static_cast<int>(item.tokens.size());
    kv_.end_prefill(item.seq_id);
  }
}

void Engine::evict_layer(int seq_id, int layer) {
  const std::vector<float>& scores =
      scores_[options_.keep.scope == KeepScope::layer ? static_cast<size_t>(layer) : 0];
  const std::vector<int> kept = select_kept_tokens(scores, options_.keep);
  kv_.keep_tokens(seq_id, layer, kept);
  evict_kept_ = static_cast<int>(kept.size());
}

void Engine::decode(std::span<const int> seq_ids, std::span<const int> tokens, std::vector<float>& logits) {
  step(seq_ids, tokens, nullptr, logits);
}

void Engine::step(std::span<const int> seq_ids, std::span<const int> tokens, const PrefillPiece* piece,
                  std::vector<float>& logits) {
  HACK_CHECK(seq_ids.size() == tokens.size(), "decode: {} sequences but {} tokens", seq_ids.size(), tokens.size());
  chunks_.clear();
  for (size_t i = 0; i < seq_ids.size(); ++i) {
    const SequenceState& st = state(seq_ids[i]);
    chunks_.push_back(SequenceChunk{seq_ids[i], st.position - st.evicted, tokens.subspan(i, 1), false, st.evicted});
  }
  if (piece != nullptr) {
    HACK_CHECK(!piece->tokens.empty(), "sequence {}: empty prefill piece", piece->seq_id);
    const SequenceState& st = state(piece->seq_id);
    HACK_CHECK(st.evicted == 0, "sequence {}: a pruned sequence cannot take a prefill piece", piece->seq_id);
    if (piece->first) kv_.begin_prefill(piece->seq_id);
    chunks_.push_back(SequenceChunk{piece->seq_id, st.position, piece->tokens, false, 0});
  }
  backend_.forward(chunks_, logits);
  for (int id : seq_ids) ++state(id).position;
  if (piece != nullptr) {
    state(piece->seq_id).position += static_cast<int>(piece->tokens.size());
    if (piece->last) kv_.end_prefill(piece->seq_id);
  }
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
