/// @file cuda_paged_kv_cache.h
/// @brief The device KV cache of `--device cuda --kv fp|hack`: one pre-allocated pool of
/// bf16 pages on the GPU (and, for --kv hack, one of HACK pages), per-sequence page tables
/// on the host, and nothing allocated after construction. Only compiled with HACK_HAVE_CUDA.
///
/// bf16 pool layout: [layer][page][K|V][kv_head][page_tokens Π][head_dim] bf16. A sequence
/// owns the same page ids in every layer; token p lives at row kv_row(p) (kernels/cuda/ops.h):
/// page page_table[row / Π], row % Π. add_sequence reserves all pages the sequence may need
/// (max_tokens), so appends never allocate and never fail for lack of memory.
///
/// --kv hack keeps the CPU cache's semantics (kv/paged_kv_cache.h) with recent_tokens 0 and
/// exact prefill: the first S tokens are sinks (bf16, page 0 of the table); block b of Π
/// tokens after them fills bf16 page 1 + b and, once closed, is quantized into HACK page b
/// of the sequence's HACK table, byte for byte what the CPU cache writes (cuda::
/// hack_quantize_blocks). A block closes at the first append after it fills, outside a
/// prefill (close_blocks, called by the backend before a decode step), or at end_prefill.
/// Decode attends to sinks + HACK pages + the one bf16 block being filled
/// (cuda::hack_decode_attention); a prefill attends to bf16 only (nothing is quantized
/// inside a prefill). The bf16 pages of closed blocks stay reserved: the device pool does
/// not yet give them back, so --kv hack saves no device memory today, only bytes read.
///
/// KvCache::append speaks of host fp32 pointers and is implemented as a synchronous upload
/// (tests, restoring KV; --kv fp only); the CUDA backend, which owns this cache, writes K/V
/// on the device with the kv_append kernel and then calls commit_append, and runs attention
/// there.
#pragma once

#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "hack/core/tensor.h"
#include "hack/kernels/cuda/ops.h"
#include "hack/kernels/hack_page_geometry.h"
#include "hack/kv/kv_cache.h"
#include "hack/kv/paged_kv_cache.h"

namespace hack {

struct CudaKvOptions {
  int page_tokens = 16;  ///< Π: tokens per page
  int num_pages = 0;     ///< pool size in pages (every layer holds this many)
  int device = 0;        ///< CUDA device index
  /// --kv hack: its options (block_tokens must equal page_tokens; recent_tokens 0, exact
  /// prefill, homomorphic attention, no page selection); nullopt = --kv fp.
  std::optional<KvCacheOptions> hack;
};

class CudaPagedKvCache final : public KvCache {
 public:
  CudaPagedKvCache(const KvShape& shape, const CudaKvOptions& options);

  const KvShape& shape() const override { return shape_; }
  /// "bf16-paged-cuda", "hack-k2v2-cuda", ...
  std::string name() const override;
  /// Reserves the bf16 pages of max_tokens rows (and, --kv hack, a HACK page per block);
  /// throws when the pool has too few free pages.
  void add_sequence(int seq_id, int max_tokens) override;
  void remove_sequence(int seq_id) override;
  bool has_sequence(int seq_id) const override;
  int length(int seq_id, int layer) const override;
  /// Host fp32 K/V -> bf16 pages, synchronously (not the backend's path; see the file comment).
  void append(int layer, int seq_id, int start_pos, int n_tokens, const float* k, const float* v) override;
  KvCacheStats stats() const override;
  /// --kv hack: nothing closes in between; end_prefill closes every full block.
  void begin_prefill(int seq_id) override;
  void end_prefill(int seq_id) override;

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
  /// bf16 rows (of the page table) that tokens [0, n_tokens) span: kv_row(n_tokens − 1) + 1.
  int rows_for(int n_tokens) const;

  // --kv hack (in fp mode sinks, full_blocks and closed_blocks are 0 and nothing prefills;
  // close_blocks, hack_page_table and hack_page throw).
  bool is_hack() const { return options_.hack.has_value(); }
  /// Sink tokens S (0 in fp mode).
  int sinks() const { return is_hack() ? options_.hack->sinks : 0; }
  /// Blocks of Π tokens after the sinks that `length` tokens fill.
  int full_blocks(int length) const;
  /// Blocks of the sequence quantized so far (the same in every layer).
  int closed_blocks(int seq_id) const;
  bool prefilling(int seq_id) const;
  /// Quantizes blocks [closed_blocks, upto) of every layer (each must be full) on the
  /// legacy default stream, which orders with the backend's blocking stream both ways.
  void close_blocks(int seq_id, int upto);
  /// HACK page ids of the sequence, one per block it may fill, in block order.
  std::span<const int> hack_page_table(int seq_id) const;
  /// Device address of HACK page `page` of `layer` (64-byte aligned).
  void* hack_page(int layer, int page) const;
  const HackPageLayout& hack_layout(int layer) const { return layouts_.at(static_cast<size_t>(layer)); }
  const HackPageGeometry& hack_geometry(int layer) const { return geometries_.at(static_cast<size_t>(layer)); }
  /// Device address of bf16 page `page` of `layer` (its K section; V follows all heads' K).
  const uint16_t* exact_page(int layer, int page) const;

 private:
  struct Sequence {
    int max_tokens = 0;
    std::vector<int> pages;
    std::vector<int> lengths;  // [layer]
    std::vector<int> hack_pages;  // --kv hack: one per block
    int closed = 0;               // --kv hack: blocks quantized (every layer)
    bool prefilling = false;
  };
  const Sequence& get(int seq_id) const;
  Sequence& get(int seq_id);
  void init_hack(const KvCacheOptions& hack);

  KvShape shape_;
  CudaKvOptions options_;
  Buffer pool_;            // device
  std::vector<int> free_;  // free page ids (a stack)
  // --kv hack:
  std::vector<HackPageLayout> layouts_;        // per layer
  std::vector<HackPageGeometry> geometries_;   // per layer
  std::vector<size_t> hack_stride_;            // per layer: bytes between pages (64-byte multiple)
  std::vector<size_t> hack_offset_;            // per layer: its pages' start in hack_pool_
  Buffer hack_pool_;                           // device
  Buffer headers_;                             // device: per layer its page header template, at header_offset_
  std::vector<size_t> header_offset_;
  std::vector<int> hack_free_;                 // free HACK page ids (a stack)
  Buffer close_args_;                          // device: close_blocks' pointer arrays, grown on demand
  std::unordered_map<int, Sequence> sequences_;
};

}  // namespace hack
