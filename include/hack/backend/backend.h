/// @file backend.h
/// @brief The forward contract every backend (cpu, cuda) implements: run the transformer
/// over a batch of sequence chunks, storing KV and returning logits.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hack/core/thread_pool.h"
#include "hack/kernels/cpu/matmul.h"
#include "hack/kv/kv_cache.h"
#include "hack/kv/paged_kv.h"
#include "hack/model/weights.h"

namespace hack {

class CpuPagedKvCache;

/// The KV cache shape a model needs (without FDC).
KvShape kv_shape(const ModelConfig& config);
/// The KV cache shape a model needs, with its FDC ranks as per-head dims when model.fdc is set.
KvShape kv_shape(const Model& model);

enum class DeviceKind { cpu, cuda };
DeviceKind parse_device(const std::string& name);

/// New tokens of one sequence. Prefill is one chunk of many tokens (or several chunks
/// of a long prompt over successive calls), decode is many chunks of one token each.
struct SequenceChunk {
  int seq_id = 0;
  int start_pos = 0;             ///< KV index of tokens[0]: the sequence's KV length before the call
  std::span<const int> tokens;
  bool all_logits = false;       ///< logits for every token (else only the last)
  /// RoPE position of tokens[i] is start_pos + rope_offset + i: prompt tokens a static
  /// eviction dropped (kv/static_eviction.h) still count for positions, not in the KV.
  int rope_offset = 0;
};

/// Called by forward() once per layer, after that layer's K/V of every chunk are appended
/// and its attention is computed, before the next layer starts (e.g. to export the layer's
/// KV while later layers run). On the host the KV is final when it is called; a device
/// backend synchronises its stream first (it is only called when set).
using LayerDoneFn = std::function<void(int layer)>;

/// Sees, per layer of a forward, every row's post-RoPE queries [rows][q_dim] and keys
/// [rows][kv_dim] and its values [rows][kv_dim], before FDC compresses any of them (what
/// hack-calibrate captures). Runs on the forward's thread before the layer's attention.
using ActivationObserverFn =
    std::function<void(int layer, size_t rows, const float* q, const float* k, const float* v)>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const ModelConfig& config() const = 0;

  /// The KV cache this backend computes over. Each backend is built over its own cache
  /// type (the CPU backend a CpuPagedKvCache, the CUDA backend a CudaPagedKvCache); callers
  /// that only open, close and measure sequences use this interface.
  virtual KvCache& kv() = 0;

  /// Runs every chunk through the model, appending its K/V to kv() (the chunk's sequence
  /// must exist there, each sequence at most once), and writes logits rows into `logits`:
  /// for each chunk in order, n_tokens rows if all_logits else 1 row; each row vocab floats.
  /// Attention is planned once for the batch and run in every layer. Returns the number of
  /// rows written. `on_layer_done` (optional) runs after each layer; an exception it throws
  /// aborts the forward (the KV of the layers done so far stays stored).
  virtual size_t forward(std::span<const SequenceChunk> batch, std::vector<float>& logits,
                         const LayerDoneFn& on_layer_done = {}) = 0;

  /// Sets (or with an empty function clears) the activation observer. Backends that cannot
  /// show activations throw hack::Error.
  virtual void set_activation_observer(ActivationObserverFn fn);

  /// What MPCache page selection (--kv-select-*) attended to so far; nullptr when the backend
  /// does not select. reset clears the counts.
  virtual const PageSelectStats* page_select_stats() const { return nullptr; }
  virtual void reset_page_select_stats() {}
  /// Bench only: in every layer that reuses a selection, also measure how much of the
  /// layer's own selection the shared one holds (PageSelectStats::shared_*). Slow.
  virtual void set_measure_sharing(bool) {}
};

/// The CPU reference backend over `kv` (fp or HACK pages). `pool` runs every kernel; the
/// model, the pool and the cache must outlive the backend.
std::unique_ptr<Backend> make_cpu_backend(const Model& model, ThreadPool& pool, CpuPagedKvCache& kv,
                                          cpu::MatmulPrecision matmul_precision = cpu::MatmulPrecision::f32);

}  // namespace hack
