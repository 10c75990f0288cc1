/// @file kv_cache.h
/// @brief What every KV cache offers the engine and the servers: sequences, their lengths,
/// appends and byte accounting. Attention is not here: each backend owns its cache type
/// (the CPU backend a CpuPagedKvCache, the CUDA backend a CudaPagedKvCache) and runs attention
/// through that type's plan (kv/attention_plan.h), so no backend casts a KvCache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hack {

/// Dimensions every KV cache is built for.
struct KvShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int group_size = 1;  ///< query heads per KV head (GQA)
  /// Per (layer, KV head) dims the cache stores, [layer · num_kv_heads + head], each a
  /// multiple of 16 in [16, head_dim]; empty = head_dim everywhere. FDC (model/fdc.h) sets
  /// them: a head's K'/V' are the first k_dim/v_dim entries of its head_dim slot in every
  /// append/read (the rest are 0 there) and only those are stored and attended to.
  std::vector<int> k_dims, v_dims;
  bool operator==(const KvShape&) const = default;

  int k_dim(int layer, int head) const {
    return k_dims.empty() ? head_dim : k_dims[static_cast<size_t>(layer * num_kv_heads + head)];
  }
  int v_dim(int layer, int head) const {
    return v_dims.empty() ? head_dim : v_dims[static_cast<size_t>(layer * num_kv_heads + head)];
  }
  bool compressed() const { return !k_dims.empty(); }
};

struct KvCacheStats {
  int64_t sequences = 0;
  int64_t tokens = 0;          ///< tokens stored, summed over sequences (one layer's worth)
  size_t bytes_used = 0;       ///< bytes held for stored tokens, all layers
  size_t bytes_capacity = 0;   ///< bytes the cache may use (0 = unbounded)
  size_t bytes_reserved = 0;   ///< bytes committed to open sequences (their reservations)
  size_t bytes_pooled = 0;     ///< bytes the page pools hold from the system (grows in slabs, never shrinks)
};

class KvCache {
 public:
  virtual ~KvCache() = default;

  virtual const KvShape& shape() const = 0;
  /// "fp32", "hack-2bit", ...
  virtual std::string name() const = 0;

  /// Opens an empty sequence that will hold at most `max_tokens`. Throws hack::Error if the
  /// id is in use or the memory cannot be reserved.
  virtual void add_sequence(int seq_id, int max_tokens) = 0;
  /// Frees everything held for the sequence (no-op for an unknown id).
  virtual void remove_sequence(int seq_id) = 0;
  virtual bool has_sequence(int seq_id) const = 0;
  /// Tokens stored for the sequence in `layer`.
  virtual int length(int seq_id, int layer) const = 0;

  /// Stores K and V of n_tokens new tokens at positions [start_pos, start_pos + n_tokens)
  /// of `layer`; start_pos must equal length(seq_id, layer).
  /// k, v: [n_tokens][num_kv_heads][head_dim] f32, K already rotated (RoPE).
  /// Calls for different sequences may run concurrently.
  virtual void append(int layer, int seq_id, int start_pos, int n_tokens, const float* k, const float* v) = 0;

  /// A prompt's prefill starts / ends (Engine::prefill brackets its chunks with these). A
  /// quantizing cache keeps everything the prompt stores exact in between, so every chunk
  /// attends to the whole prompt in full precision, and quantizes once at the end (as the
  /// HACK artifact's prefill does). Exact caches need not care.
  virtual void begin_prefill(int /*seq_id*/) {}
  virtual void end_prefill(int /*seq_id*/) {}

  /// Copies tokens [first_token, first_token + n_tokens) of a layer that are stored exactly,
  /// as f32: k, v [n_tokens][num_kv_heads][head_dim]; v may be null (keys only). A cache that
  /// cannot throws hack::Error.
  virtual void read_exact_tokens(int seq_id, int layer, int first_token, int n_tokens, float* k, float* v) const;
  /// Static eviction (kv/static_eviction.h): a layer keeps only the tokens `kept` (ascending
  /// indices into what it stores), in order, at indices 0 .. kept.size(); the rest are freed.
  /// Only inside a prefill bracket (or in an exact cache), before anything is quantized. Every
  /// layer of a sequence must end with the same length. A cache that cannot throws hack::Error.
  virtual void keep_tokens(int seq_id, int layer, const std::vector<int>& kept);

  virtual KvCacheStats stats() const = 0;
};

}  // namespace hack
