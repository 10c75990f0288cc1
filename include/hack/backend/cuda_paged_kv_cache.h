/// @file cuda_paged_kv_cache.h
/// @brief The device KV cache of `--device cuda --kv fp`: one pre-allocated pool of bf16
/// pages on the GPU, per-sequence page tables on the host, and nothing allocated after
/// construction. Only compiled with HACK_HAVE_CUDA.
///
/// Pool layout: [layer][page][K|V][kv_head][page_tokens Π][head_dim] bf16. A sequence owns
/// the same page ids in every layer; token p lives in page_table[p / Π], row p % Π.
/// add_sequence reserves all pages the sequence may need (max_tokens), so appends never
/// allocate and never fail for lack of memory.
///
/// KvCache::append speaks of host fp32 pointers and is implemented as a synchronous upload
/// (tests, restoring KV); the CUDA backend, which owns this cache, writes K/V on the device
/// with the kv_append kernel and then calls commit_append, and runs attention there.
#pragma once

#include <span>
#include <unordered_map>
#include <vector>

#include "hack/core/tensor.h"
#include "hack/kernels/cuda/ops.h"
#include "hack/kv/kv_cache.h"

namespace hack {

struct CudaKvOptions {
  int page_tokens = 16;  ///< Π: tokens per page
  int num_pages = 0;     ///< pool size in pages (every layer holds this many)
  int device = 0;        ///< CUDA device index
};

class CudaPagedKvCache final : public KvCache {
 public:
  CudaPagedKvCache(const KvShape& shape, const CudaKvOptions& options);

  const KvShape& shape() const override { return shape_; }
  /// "bf16-paged-cuda"
  std::string name() const override;
  /// Reserves ceil(max_tokens / Π) pages; throws when the pool has too few free pages.
  void add_sequence(int seq_id, int max_tokens) override;
  void remove_sequence(int seq_id) override;
  bool has_sequence(int seq_id) const override;
  int length(int seq_id, int layer) const override;
  /// Host fp32 K/V -> bf16 pages, synchronously (not the backend's path; see the file comment).
  void append(int layer, int seq_id, int start_pos, int n_tokens, const float* k, const float* v) override;
  KvCacheStats stats() const override;

  int page_tokens() const { return options_.page_tokens; }
  int num_pages() const { return options_.num_pages; }
  int free_pages() const { return static_cast<int>(free_.size()); }
  int device() const { return options_.device; }
  /// Device view of one layer of the pool.
  cuda::PagedKvLayer layer(int layer) const;
  /// Page ids of the sequence, in token order (covering its max_tokens).
  std::span<const int> page_table(int seq_id) const;
  int max_tokens(int seq_id) const;
  /// Records that n_tokens were written at [start_pos, start_pos + n_tokens) of `layer` on
  /// the device; checks start_pos == length and the reservation.
  void commit_append(int layer, int seq_id, int start_pos, int n_tokens);

  /// Bytes of one page in one layer (K and V, all heads).
  size_t page_bytes() const;
  /// Pages a sequence of max_tokens needs.
  static int pages_for(int max_tokens, int page_tokens) { return (max_tokens + page_tokens - 1) / page_tokens; }

 private:
  struct Sequence {
    int max_tokens = 0;
    std::vector<int> pages;
    std::vector<int> lengths;  // [layer]
  };
  const Sequence& get(int seq_id) const;
  Sequence& get(int seq_id);

  KvShape shape_;
  CudaKvOptions options_;
  Buffer pool_;            // device
  std::vector<int> free_;  // free page ids (a stack)
  std::unordered_map<int, Sequence> sequences_;
};

}  // namespace hack
