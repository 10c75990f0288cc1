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
/// --kv hack keeps the CPU cache's semantics (backend/cpu_paged_kv_cache.h) with exact prefill: the
/// first S tokens are sinks (bf16, page 0 of the table); block b of Π tokens after them fills
/// bf16 page 1 + b and, once closed, is quantized into HACK page b of the sequence's HACK
/// table, byte for byte what the CPU cache writes (cuda::hack_quantize_blocks). A block
/// closes once it has left the recent window (KvBlockManager::closable_blocks), at the first
/// append after that outside a prefill (inside this storage: commit_append for the rows the
/// backend's kv_append kernel wrote, append for host rows — the CPU storage's rule, at the
/// same appends), or at end_prefill. The backend never closes blocks. A recent window > 0 leaves exact blocks behind the open one,
/// which only the plan runner attends to (the backend refuses it on the kernels path).
/// Blocks close per layer (a prefill node exports a layer as soon as its prefill is done), so
/// closed counts are kept per layer; a decode step closes every layer up to the same block.
/// Decode attends to sinks + HACK pages + the one bf16 block being filled
/// (cuda::hack_decode_attention); a prefill attends to bf16 only (nothing is quantized
/// inside a prefill). The bf16 pages of closed blocks stay reserved: the device pool does
/// not yet give them back, so --kv hack saves no device memory today, only bytes read.
///
/// It is a PagedKv (kv/paged_kv.h), so the nodes serve from it: host fp32 appends (restoring
/// KV, importing exact tokens) and HACK pages in and out go through synchronous copies on the
/// legacy default stream, which orders with the backend's blocking stream both ways. The CUDA
/// backend, which owns this cache, writes K/V on the device with the kv_append kernel and then
/// calls commit_append, and runs attention there. Imported HACK pages have no bf16 rows
/// behind them: their tokens are attended to as codes and cannot be read back exactly (as on
/// the CPU). An append observer (a decode node's vault recording) sees host appends as given
/// and the backend's device-written tokens as the bf16 stored, read back after each layer's
/// commit_append (a synchronous copy per layer and step, only for observed sequences). Static
/// eviction (keep_tokens) moves a layer's kept tokens through the host, inside the prefill
/// bracket, as the CPU cache does (one round trip per layer of a pruned prompt).
#pragma once

#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "hack/core/tensor.h"
#include "hack/kernels/cuda/ops.h"
#include "hack/kernels/hack_page_geometry.h"
#include "hack/kv/kv_cache.h"
#include "hack/kv/kv_options.h"
#include "hack/kv/paged_kv.h"

namespace hack {

struct CudaKvOptions {
  int page_tokens = 16;  ///< Π: tokens per page
  int num_pages = 0;     ///< pool size in pages (every layer holds this many)
  int device = 0;        ///< CUDA device index
  /// --kv hack: its options (block_tokens must equal page_tokens; exact prefill,
  /// homomorphic attention, no page selection); nullopt = --kv fp.
  std::optional<KvCacheOptions> hack;
};

class CudaPagedKvCache final : public PagedKv {
 public:
  CudaPagedKvCache(const KvShape& shape, const CudaKvOptions& options);

  const KvShape& shape() const override { return shape_; }
  /// "bf16-paged-cuda", "hack-k2v2-cuda", ...
  std::string name() const override;
  /// Reserves the bf16 pages of max_tokens rows (and, --kv hack, a HACK page per block);
  /// throws when the pool has too few free pages.
  void add_sequence(int seq_id, int max_tokens) override;
  void remove_sequence(int seq_id) override;
  /// Host fp32 K/V -> bf16 rows, synchronously (not the backend's path; see the file comment).
  void append(int layer, int seq_id, int start_pos, int n_tokens, const float* k, const float* v) override;
  void keep_tokens(int seq_id, int layer, const std::vector<int>& kept) override;

  // PagedKv (kv/paged_kv.h).
  const KvCacheOptions& options() const override { return kv_options_; }
  /// Its sequence_bytes are page units (a page's bf16 rows and its HACK page, every layer)
  /// of max_tokens: capacity and reservations count whole page units, so a byte comparison
  /// is a page count.
  const KvBlockManager& blocks() const override { return blocks_; }
  /// Takes more pages from the pool; false (nothing changed) when too few are free.
  bool try_extend_sequence(int seq_id, int max_tokens) override;
  size_t release_free_slabs() override { return 0; }  // the pool is allocated once
  void set_append_observer(int seq_id, KvAppendObserver* observer) override;
  void close_pending_blocks(int seq_id) override;
  void close_pending_blocks(int seq_id, int layer) override;
  void close_pending_blocks(int seq_id, int layer, const KnownPages& known) override;
  std::span<const std::byte> host_hack_page(int, int, int) const override { return {}; }
  void read_hack_page(int seq_id, int layer, int index, std::byte* page) const override;
  void peek_block_page(int seq_id, int layer, int block, std::byte* page) const override;
  void append_hack_page(int layer, int seq_id, const void* bytes, size_t size) override;
  DType exact_dtype() const override { return DType::bf16; }
  void copy_exact_tokens(int seq_id, int layer, int first_token, int n_tokens, std::byte* k,
                         std::byte* v) const override;
  KvCacheStats stats() const override;
  /// --kv hack: nothing closes in between; end_prefill closes every full block.
  void begin_prefill(int seq_id) override;
  void end_prefill(int seq_id) override;

  int page_tokens() const { return options_.page_tokens; }
  int num_pages() const { return options_.num_pages; }
  int free_pages() const { return static_cast<int>(page_ids_.available()); }
  int device() const { return options_.device; }
  /// Device view of one layer of the pool.
  cuda::PagedKvLayer layer(int layer) const;
  /// Page ids of the sequence, in token order (covering its max_tokens).
  std::span<const int> page_table(int seq_id) const;
  /// Records that n_tokens were written at [start_pos, start_pos + n_tokens) of `layer` on
  /// the device; checks start_pos == length and the reservation. An observed sequence's
  /// tokens are read back and shown to its observer.
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
  /// Blocks of the sequence quantized so far in every layer (the fewest of any layer).
  int closed_blocks(int seq_id) const;
  bool prefilling(int seq_id) const;
  /// Quantizes each layer's blocks [its closed count, upto) (each must be full) on the
  /// legacy default stream, which orders with the backend's blocking stream both ways.
  void close_blocks(int seq_id, int upto);
  /// HACK page ids of the sequence, one per block it may fill, in block order.
  std::span<const int> hack_page_table(int seq_id) const;
  /// Device address of HACK page `page` of `layer` (64-byte aligned).
  void* hack_page(int layer, int page) const;
  const HackPageLayout& hack_layout(int layer) const override { return layouts_.at(static_cast<size_t>(layer)); }
  const HackPageGeometry& hack_geometry(int layer) const { return geometries_.at(static_cast<size_t>(layer)); }
  /// Device address of bf16 page `page` of `layer` (its K section; V follows all heads' K).
  const uint16_t* exact_page(int layer, int page) const;

 private:
  // The pages of a sequence; its lengths, closed blocks, reservation and prefill bracket
  // are in blocks_.
  struct Sequence {
    std::vector<int> pages;       // bf16 page ids covering max_tokens rows
    std::vector<int> hack_pages;  // --kv hack: one HACK page id per block
  };
  const Sequence& get(int seq_id) const;
  Sequence& get(int seq_id);
  void init_hack(const KvCacheOptions& hack);
  // Outside a prefill, closes what the layer's next append closes (before recording it).
  void close_at_append(int seq_id, int layer, int n_tokens);
  // Quantizes blocks [from, upto) of one layer of s into their HACK pages.
  void close_layer(Sequence& s, int seq_id, int layer, int upto, const KnownPages* known = nullptr);
  // Quantizes n full bf16 blocks of one layer on the device (legacy stream, synchronous upload
  // of the arguments): args = k_src[n], v_src[n], pages[n] (device addresses), first_tokens[n].
  void quantize_blocks(int layer, const std::vector<uint64_t>& args, int n) const;
  // Writes slot i of n of quantize_blocks' arguments: block `block` of s in `layer` into `page`.
  void put_block_args(const Sequence& s, int layer, int block, const void* page, std::vector<uint64_t>& args, int i,
                      int n) const;
  // Device address of the bf16 row of token `pos` of the sequence in `layer`, K (or V) of `head`.
  const uint16_t* exact_row(const Sequence& s, int layer, int pos, int head, bool value) const;
  // Pages of the pool a sequence of max_tokens holds (bf16 rows; HACK pages are fewer).
  int pages_needed(int max_tokens) const { return pages_for(rows_for(max_tokens), options_.page_tokens); }

  KvShape shape_;
  CudaKvOptions options_;
  Buffer pool_;            // device bf16 [layer][num_pages][K|V][kv_head][Π][head_dim]
  PageIds page_ids_;       // bf16 page ids [0, num_pages): the last freed is handed out first
  // --kv hack:
  std::vector<HackPageLayout> layouts_;        // per layer
  std::vector<HackPageGeometry> geometries_;   // per layer
  std::vector<size_t> hack_stride_;            // per layer: bytes between pages (64-byte multiple)
  std::vector<size_t> hack_offset_;            // per layer: its pages' start in hack_pool_
  Buffer hack_pool_;                           // device: per layer l at hack_offset_[l], [num_pages] HACK pages hack_stride_[l] apart
  Buffer headers_;                             // device: per layer its page header template, at header_offset_
  std::vector<size_t> header_offset_;
  PageIds hack_ids_;                           // --kv hack: HACK page ids [0, num_pages)
  mutable Buffer close_args_;                  // device u64 [4][n]: k_src, v_src, page pointers, first tokens (quantize_blocks), grown on demand
  mutable Buffer scratch_page_;                // device: one HACK page peek_block_page quantizes into
  KvCacheOptions kv_options_;                  // options(): the HACK options, or fp bf16 pages of Π
  KvBlockManager blocks_;                      // lengths, closed blocks, reservations, the plan
  std::unordered_map<int, Sequence> sequences_;
};

/// Bytes of one page unit of a device KV pool for `shape` under `options`: the page's bf16 rows
/// and (--kv hack) its HACK page, in every layer (what --kv-capacity-mb buys pages by).
size_t cuda_kv_page_bytes(const KvShape& shape, const CudaKvOptions& options);

}  // namespace hack
