/// @file engine.h
/// @brief Sequence bookkeeping over a Backend and a KvCache: chunked prefill, batched
/// decode steps, and a generate() loop with sampling and stop handling (what hack-run uses;
/// the decode daemon's scheduler drives the same calls).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hack/backend/backend.h"
#include "hack/model/sampler.h"

namespace hack {

struct EngineOptions {
  int prefill_chunk_tokens = 512;  ///< longer prompts are prefilled in chunks of this size
};

class Engine {
 public:
  /// Runs over backend.kv().
  explicit Engine(Backend& backend, EngineOptions options = {});

  const ModelConfig& config() const { return backend_.config(); }
  KvCache& kv() { return kv_; }

  /// Opens a sequence able to hold max_tokens (prompt + generated).
  void add_sequence(int seq_id, int max_tokens);
  /// Takes over a sequence that already holds KV in kv() (e.g. imported from a prefill
  /// node): its position is its stored length, which must be the same in every layer. The
  /// sequence may have been opened with add_sequence (the usual way to reserve its KV)
  /// as long as the engine has not run it yet.
  void adopt_sequence(int seq_id);
  void remove_sequence(int seq_id);
  /// Tokens processed so far for the sequence (its next position).
  int position(int seq_id) const;

  /// Runs `tokens` through the model in chunks; `logits` gets the last token's logits
  /// (vocab floats), or every token's ([n][vocab]) when all_logits. `on_layer_done(layer,
  /// last_chunk)` runs after each layer of each chunk (Backend::forward's LayerDoneFn);
  /// last_chunk is true in the chunk that ends the prompt, when the layer's KV is final.
  void prefill(int seq_id, std::span<const int> tokens, std::vector<float>& logits, bool all_logits = false,
               const std::function<void(int layer, bool last_chunk)>& on_layer_done = {});
  /// One decode step: tokens[i] is the next token of seq_ids[i]; logits [n][vocab].
  void decode(std::span<const int> seq_ids, std::span<const int> tokens, std::vector<float>& logits);

 private:
  Backend& backend_;
  KvCache& kv_;
  EngineOptions options_;
  std::unordered_map<int, int> positions_;
  std::vector<SequenceChunk> chunks_;
};

/// A paged KV cache, the CPU backend over it and an engine over both: what a tool or a test
/// needs to run a model over one cache configuration.
struct CpuEngine {
  std::unique_ptr<PagedKvCache> kv;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
};
/// The cache is shaped for `model`; `model` and `pool` must outlive the result.
CpuEngine make_cpu_engine(const Model& model, ThreadPool& pool, const KvCacheOptions& kv_options,
                          EngineOptions options = {});

struct GenerationStats {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  double prefill_s = 0;      ///< prompt processing (prefill) time
  double first_token_s = 0;  ///< time to first token (prefill + first sample)
  double decode_s = 0;       ///< time of the decode steps after the first token
};

struct GenerationResult {
  std::vector<int> tokens;             ///< generated ids (a stop token included when it ended generation)
  std::vector<SampleResult> samples;   ///< one per generated token
  FinishReason finish_reason = FinishReason::length;
  GenerationStats stats;
};

/// Generates for one prompt until a stop token or params.max_tokens. `on_token` sees each
/// sample as it is produced and may return false to stop early (finish_reason stop).
/// eos_ids: the model's EOS ids (ignored when params.ignore_eos). `constraints` builds
/// params.grammar's constraint (required when it is set).
GenerationResult generate(Engine& engine, int seq_id, std::span<const int> prompt, const SamplingParams& params,
                          std::span<const int> eos_ids,
                          const std::function<bool(const SampleResult&)>& on_token = nullptr,
                          const LogitsConstraintFactory* constraints = nullptr);

}  // namespace hack
