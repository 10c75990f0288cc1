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
#include "hack/kernels/cpu/matmul.h"
#include "hack/kv/static_eviction.h"
#include "hack/model/sampler.h"

namespace hack {

struct EngineOptions {
  int prefill_chunk_tokens = 512;  ///< longer prompts are prefilled in chunks of this size
  KeepOptions keep;                ///< --kv-keep-*: static eviction of every prompt (kv/static_eviction.h)
  cpu::MatmulPrecision matmul_precision = cpu::MatmulPrecision::f32;  ///< CPU backend's many-row matmuls
};

class Engine {
 public:
  /// Runs over backend.kv(). `pool` (optional) runs static eviction's scoring.
  explicit Engine(Backend& backend, EngineOptions options = {}, ThreadPool* pool = nullptr);

  const ModelConfig& config() const { return backend_.config(); }
  KvCache& kv() { return kv_; }

  /// Opens a sequence able to hold max_tokens (prompt + generated).
  void add_sequence(int seq_id, int max_tokens);
  /// Takes over a sequence that already holds KV in kv() (e.g. imported from a prefill
  /// node): its stored length must be the same in every layer. Its position is `position`
  /// (the tokens that KV stands for: the prompt's length when a static eviction pruned it,
  /// so new tokens get their true RoPE positions), or its length when -1. The sequence may
  /// have been opened with add_sequence (the usual way to reserve its KV) as long as the
  /// engine has not run it yet.
  void adopt_sequence(int seq_id, int position = -1);
  void remove_sequence(int seq_id);
  /// Tokens processed so far for the sequence (its next RoPE position). Its KV length is
  /// smaller by the tokens a static eviction dropped.
  int position(int seq_id) const;
  /// Whether prefilling a prompt of n tokens into an empty sequence evicts (--kv-keep-* on
  /// and its budget below n).
  bool evicts(int prompt_tokens) const;

  /// Runs `tokens` through the model in chunks; `logits` gets the last token's logits
  /// (vocab floats), or every token's ([n][vocab]) when all_logits. `on_layer_done(layer,
  /// last_chunk)` runs after each layer of each chunk (Backend::forward's LayerDoneFn);
  /// last_chunk is true in the chunk that ends the prompt, when the layer's KV is final.
  /// With static eviction (options().keep, evicts()) the prompt's layers are pruned in that
  /// chunk: `before_evict(layer)` sees each layer's whole prompt still exact (a prefix cache
  /// captures it there), then the layer is pruned, then on_layer_done(layer, true) runs (with
  /// KeepScope::model, once every layer is done, in layer order). Without eviction
  /// before_evict(layer) runs just before on_layer_done(layer, true). An evicting prefill
  /// scores through the backend's activation observer: it replaces any observer set, and
  /// clears it when it returns.
  void prefill(int seq_id, std::span<const int> tokens, std::vector<float>& logits, bool all_logits = false,
               const std::function<void(int layer, bool last_chunk)>& on_layer_done = {},
               const std::function<void(int layer)>& before_evict = {});
  /// One prompt of a batched prefill step.
  struct PrefillItem {
    int seq_id = 0;
    std::span<const int> tokens;
  };
  /// Prefills several short prompts in one forward (llama.cpp and vLLM batch waiting prompts
  /// the same way): each item's tokens continue its sequence (a restored prefix included) and
  /// end its prompt. `logits` gets one row per item, in order: its last token's logits
  /// [items][vocab]. `on_layer_done(layer)` runs after each layer, when every item's KV of the
  /// layer is final (a caller exports and captures them there; an exception it throws aborts
  /// the forward, as in Backend::forward). The items together hold at most
  /// options().prefill_chunk_tokens tokens, no static eviction (a caller checks evicts()), no
  /// prompt logprobs. A batch of other GEMM shapes rounds differently from one prefill() per
  /// prompt in the last bits: only callers that allow that batch (hack-prefill
  /// --prefill-batch-jobs). Throws hack::Error, nothing run, when an item breaks these rules.
  void prefill_batch(std::span<const PrefillItem> items, std::vector<float>& logits,
                     const std::function<void(int layer)>& on_layer_done = {});
  const EngineOptions& options() const { return options_; }
  /// One decode step: tokens[i] is the next token of seq_ids[i]; logits [n][vocab].
  void decode(std::span<const int> seq_ids, std::span<const int> tokens, std::vector<float>& logits);

  /// One piece of a prompt prefilled across several forwards (chunked prefill beside decode):
  /// `first` opens the prefill bracket, `last` closes it. No static eviction: a caller checks
  /// evicts() and prefills such a prompt whole.
  struct PrefillPiece {
    int seq_id = 0;
    std::span<const int> tokens;
    bool first = false;
    bool last = false;
  };
  /// One forward of a decode step (as decode()) and, when `piece` is given, one piece of a
  /// prompt, batched together: logits [n decode rows][vocab], then the piece's last-token row.
  void step(std::span<const int> seq_ids, std::span<const int> tokens, const PrefillPiece* piece,
            std::vector<float>& logits);

 private:
  Backend& backend_;
  KvCache& kv_;
  struct SequenceState {
    int position = 0;  // tokens run: the next RoPE position
    int evicted = 0;   // of them, dropped from the KV by static eviction
  };
  SequenceState& state(int seq_id);
  const SequenceState& state(int seq_id) const;
  // Static eviction inside prefill(): scores [layer][prompt token] (one row with KeepScope::model).
  void score_chunk(int layer, int first_pos, int rows, const float* q, const float* k, int window_start);
  void evict_layer(int seq_id, int layer);

  EngineOptions options_;
  ThreadPool* pool_ = nullptr;
  std::unordered_map<int, SequenceState> sequences_;
  std::vector<SequenceChunk> chunks_;
  // Engine thread, during one prefill() that evicts.
  std::vector<std::vector<float>> scores_;
  std::vector<float> keys_;
  int current_seq_ = 0;
  int evict_kept_ = 0;
};

/// A paged KV, the backend computing over it and an engine over both, on either device: what
/// a node's worker owns (built by runtime/model_runtime.h build_engine or make_cpu_engine_parts).
/// Members are destroyed engine first, then backend, then KV.
struct EngineParts {
  std::unique_ptr<PagedKv> kv;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
};

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
