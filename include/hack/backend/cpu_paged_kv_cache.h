/// @file cpu_paged_kv_cache.h
/// @brief The host storage of the paged KV behind `--kv fp|hack`: host page pools under the
/// device-neutral KvBlockManager (lengths, closed blocks, the closed pages' ids with their
/// reference counts, reservations, the prefill bracket, the plan), and the CPU runner
/// of the step's AttentionPlan: page by page with an online softmax in every layer (run).
///
/// Per (sequence, layer), tokens live in:
///   fp mode:   fp pages of Π tokens (bf16 or f32), the last one partly filled.
///   hack mode: a sink page (the first `sinks` tokens, bf16), HACK pages (kv/hack_page.h)
///              of Π quantized tokens starting at position `sinks`, bf16 pages of blocks
///              that filled during the latest append, and one bf16 open page for the block
///              being filled. A block is quantized once, at the first append after it
///              fills, so attention after an append sees a quantized past plus the
///              appended tokens exactly (chunked prefill: "the past plus itself"; decode:
///              the open block). Sinks and open block stay bf16 (requantization elimination).
/// Exact pages: K then V, each [num_kv_heads][capacity tokens][dim] elements, where dim is
/// the head's k_dim or v_dim (head_dim unless the shape carries FDC's per-head dims).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hack/core/cpu_features.h"
#include "hack/core/dtype.h"
#include "hack/core/thread_pool.h"
#include "hack/kernels/cpu/hack_attention.h"
#include "hack/kv/attention_plan.h"
#include "hack/kv/hack_page.h"
#include "hack/kv/kv_cache.h"
#include "hack/kv/kv_options.h"
#include "hack/kv/page_pool.h"
#include "hack/kv/paged_kv.h"

namespace hack {

/// The exact pages of one (sequence, layer) of a CpuPagedKvCache (host pages). Its closed pages
/// (hack: HACK pages; fp: every fp page, the last maybe partial) are in the block manager's
/// page table (KvBlockManager::pages), their memory in the layer's pool.
struct CpuLayerPages {
  PageRef sink;                  ///< hack: bf16 [K|V][head][sinks][dim]
  std::vector<PageRef> pending;  ///< hack: full bf16 blocks of the latest append, to quantize
  PageRef open;                  ///< hack: bf16 [K|V][head][Π][dim], the block being filled
  int layer = 0;                 ///< which layer (its page layout and pool)
};

/// What the CPU runner reads of one (sequence, layer): its exact pages and the ids of its
/// closed pages (the block manager's page table).
struct CpuLayerView {
  const CpuLayerPages* exact = nullptr;
  const uint32_t* pages = nullptr;
};

/// Caller-owned scratch of CpuPagedKvCache::run, grown on first use and reused after (so a
/// decode step allocates nothing once the batch shape has been seen).
struct AttentionWorkspace {
  std::vector<float> floats;         ///< the plan's softmax states, then per thread: scaled q, kernel work
  std::vector<CpuLayerView> layers;  ///< [plan items]: the item's pages in the running layer
};

/// The CPU's PagedKv: host page pools (huge-page slabs) and the CPU attention runner.
class CpuPagedKvCache final : public PagedKv {
 public:
  CpuPagedKvCache(const KvShape& shape, const KvCacheOptions& options);
  ~CpuPagedKvCache() override;

  const KvShape& shape() const override { return shape_; }
  /// "hack-2bit", "hack-k4v2", "hack-per-layer" (an allocation), "bf16-paged", "fp32-paged".
  std::string name() const override;
  /// Reserves the sequence's worst case in steady state (its HACK or fp pages, one open
  /// block, the sinks) against capacity_bytes; bf16 blocks pending quantization after a
  /// long append are transient and not part of the reservation.
  /// add/remove/fork must not run concurrently with append/attend.
  void add_sequence(int seq_id, int max_tokens) override;
  void remove_sequence(int seq_id) override;
  /// Grows a sequence's reservation to max_tokens (never shrinks it). False, with nothing
  /// changed, when the budget cannot hold the difference.
  bool try_extend_sequence(int seq_id, int max_tokens) override;
  void append(int layer, int seq_id, int start_pos, int n_tokens, const float* k, const float* v) override;

  /// Runs `plan` (PagedKv::plan) in `layer`: for every item, out rows = causal attention of its q rows over
  /// all stored tokens (or the selected segments). q, out: [rows][num_kv_heads · group ·
  /// head_dim] f32 with row strides q_stride / out_stride; q is scaled by `scale` here.
  /// Work is split over `pool` by the plan's tasks; results depend only on the plan, not on
  /// the pool's size. Throws hack::Error when the layer does not hold what the plan expects.
  void run(const AttentionPlan& plan, int layer, const float* q, size_t q_stride, float* out, size_t out_stride,
           float scale, ThreadPool& pool, AttentionWorkspace& workspace) const;

  /// The reference: causal attention of one KV head's query group, on the calling thread,
  ///   out[t][g] = softmax(scale · q[t][g] · K[0 .. start_pos + t]) · V[0 .. start_pos + t]
  /// q: n_tokens rows of group_size × head_dim floats, row t at q + t · q_row_stride; out:
  /// the same with out_row_stride; requires length(seq_id, layer) ≥ start_pos + n_tokens.
  /// `scratch` holds attend_scratch_floats(n_tokens) floats. Tests compare run() with it.
  void attend(int layer, int seq_id, int kv_head, int start_pos, int n_tokens, const float* q, size_t q_row_stride,
              float* out, size_t out_row_stride, float scale, float* scratch) const;
  size_t attend_scratch_floats(int n_tokens, int context_tokens = 0) const;
  KvCacheStats stats() const override;
  /// Gives back to the system the memory of every page-pool slab that holds no page now
  /// (PagePool::release_free_slabs); returns the bytes given back. For an idle owner.
  size_t release_free_slabs() override;
  /// Between these, appends quantize nothing (options().exact_prefill); end_prefill closes
  /// the blocks that left the recent window, as close_pending_blocks does.
  void begin_prefill(int seq_id) override;
  void end_prefill(int seq_id) override;

  const KvCacheOptions& options() const override { return options_; }
  const KvBlockManager& blocks() const override { return blocks_; }
  /// Replaces the page-selection options; a backend built afterwards selects with them. The
  /// stored pages do not depend on them, so one prefilled sequence (forked) can be decoded
  /// under several selections (the fidelity bench's passkey rows share one prefill).
  void set_select_options(const PageSelectOptions& select);
  /// Layout of one layer's HACK pages (hack mode; layers differ under a bit allocation).
  const HackPageLayout& hack_layout(int layer = 0) const override { return layouts_[static_cast<size_t>(layer)]; }
  /// K/V code bits of a layer (hack mode).
  HackLayerBits layer_bits(int layer) const;
  CpuIsa isa() const { return kernels_->isa; }

  /// Opens dst holding the first n_tokens of src in every layer: full pages are shared
  /// (reference counted, never written again), a partly filled block is copied. n_tokens
  /// must not cut into a quantized block that src has already closed beyond n_tokens.
  void fork_sequence(int src_seq, int dst_seq, int n_tokens, int max_tokens);

  /// KV bytes per token of closed blocks, all layers (hack: HACK pages incl. headers;
  /// fp: the page element type).
  double bytes_per_token() const;
  /// Bytes attention reads for one sequence in one layer (all heads): the pages and
  /// exact tokens it touches.
  size_t attend_bytes(int seq_id, int layer) const;

  /// Quantizes the full blocks that have left the recent window (normally the next append
  /// does), e.g. before exporting a prefilled sequence's pages. No-op in fp mode. The result
  /// is the state the next append would produce before storing its tokens (same page bytes).
  /// A block [b, b + Π) is quantized once b + Π ≤ length − recent_tokens.
  void close_pending_blocks(int seq_id) override;
  /// The same for one layer (so a layer can be exported as soon as its prefill is done).
  void close_pending_blocks(int seq_id, int layer) override;
  void close_pending_blocks(int seq_id, int layer, const KnownPages& known) override;
  /// Where a layer has several blocks to close at once (a prompt's end, a recompute's last
  /// piece, a prefix hit's restored blocks) they are quantized in parallel on `pool`; the
  /// pages are the same bytes (each block's quantization is a pure function of its tokens).
  /// nullptr (the default): on the calling thread. With a pool set, appends and closes must
  /// come from one thread at a time, outside the pool's own work (make_cpu_engine passes the
  /// engine's, whose thread runs the steps); without one, different sequences may append
  /// concurrently.
  void set_quantize_pool(ThreadPool* pool) { quantize_pool_ = pool; }
  /// Sets (or with nullptr clears) the sequence's append observer; it must outlive the
  /// sequence or be cleared first. remove_sequence forgets it.
  void set_append_observer(int seq_id, KvAppendObserver* observer) override;
  /// Element type of tokens kept exactly: bf16 in hack mode (sinks, pending and open
  /// blocks), the fp page type (bf16 or f32) in fp mode.
  DType exact_dtype() const override;
  /// Rebuilds the layer from its kept tokens (exact, as appended; KvCache::keep_tokens).
  /// hack mode: only between begin_prefill and end_prefill (nothing quantized yet).
  void keep_tokens(int seq_id, int layer, const std::vector<int>& kept) override;
  /// The same without conversion: k, v receive exact_dtype() elements (bit copies); v may be null.
  void copy_exact_tokens(int seq_id, int layer, int first_token, int n_tokens, std::byte* k,
                         std::byte* v) const override;

  /// The page block `block` (tokens [sinks + block·Π, sinks + (block + 1)·Π)) of a layer
  /// will be once quantized — byte for byte, as quantization is a pure function of the
  /// block's exact tokens — written to `page` (hack_layout(layer).page_bytes() bytes). For
  /// a block already quantized, its stored page; for a full exact block, quantized into
  /// `page` while the cache keeps attending to the exact tokens (a prefill node streams
  /// pages of an exact prefill this way before the prefill ends).
  void peek_block_page(int seq_id, int layer, int block, std::byte* page) const override;

  /// The ids of the closed HACK pages of a sequence's layer, in order (hack mode; valid until
  /// the next append or removal), and the memory of one. Page selection reads their K ranges
  /// through these.
  std::span<const uint32_t> hack_pages(int seq_id, int layer) const;
  const std::byte* page_data(int layer, uint32_t id) const { return pages_of(layer).data(id); }
  std::span<const std::byte> hack_page(int seq_id, int layer, int index) const;
  std::span<const std::byte> host_hack_page(int seq_id, int layer, int index) const override;
  void read_hack_page(int seq_id, int layer, int index, std::byte* page) const override;
  int page_ref_count(int seq_id, int layer, int index) const;
  /// Appends a received HACK page (validated: layout, layer, first token) as the next
  /// closed block; the sequence's open block must be empty and its sinks complete.
  void append_hack_page(int layer, int seq_id, const void* bytes, size_t size) override;

 private:
  using LayerPages = CpuLayerPages;
  struct Sequence {
    std::vector<LayerPages> layers;  // the pages; lengths and closed counts are in blocks_
  };
  // One contiguous token range of one layer as the kernels read it.
  struct Segment {
    int first_token = 0;
    int tokens = 0;
    bool quantized = false;
    const std::byte* data = nullptr;  // page
    int capacity = 0;                 // exact pages: token capacity (row stride per head)
  };

  Sequence& get(int seq_id);
  const Sequence& get(int seq_id) const;
  size_t reserve_bytes_for(int max_tokens) const;
  void release_pages(Sequence& s);
  // The page tables of a sequence the block manager has just opened.
  void add_pages(int seq_id);
  Segment resolve(const CpuLayerView& view, const PlanSegment& segment) const;
  cpu::ExactHeadView exact_view(int layer, const Segment& seg, int kv_head) const;
  cpu::HackHeadView hack_view(int layer, const std::byte* page, int kv_head) const;
  PagePool& pages_of(int layer) const { return *layer_pool_[static_cast<size_t>(layer)]; }
  // Quantizes the pending blocks of a layer that have left the recent window
  // (KvBlockManager::closable_blocks) into HACK pages; a block with a `known` page (may be
  // null) gets a copy of it instead.
  void quantize_pending(int seq_id, int layer, const KnownPages* known = nullptr);
  // Quantizes one exact block (bf16 [K|V][head][Π][dim]) starting at `first_token` into `page`.
  void quantize_block(int layer, const std::byte* block, int64_t first_token, std::byte* page) const;
  // Attends rows to one quantized block by expanding it to f32 (HackAttention::dequantized).
  void attend_dequantized(int layer, const std::byte* page, int kv_head, const cpu::AttentionRows& rows,
                          float* work) const;
  // Page region holding exact token `pos` of a layer: its K region start, slot and token
  // capacity per head (the V region follows K's num_kv_heads · capacity rows).
  const std::byte* exact_location(const LayerPages& lp, int seq_id, int layer, int pos, int& slot,
                                  int& capacity) const;
  // Attends segments [seg_begin, seg_end) of `segments` (or of `selection`, indices into
  // it) for heads [head_begin, head_end), rows[h − head_begin] holding head h's
  // n_tokens·group query rows at positions start_pos..; a segment is done for every head
  // before the next.
  void attend_segments(const CpuLayerView& view, std::span<const PlanSegment> segments, const int* selection, int seg_begin,
                       int seg_end, int head_begin, int head_end, int start_pos, int n_tokens,
                       const cpu::AttentionRows* rows, float* work) const;
  // run(): one task, the softmax states of a task's head, writing finished rows, merging
  // the splits of a unit in order.
  struct RunContext;
  void run_task(const RunContext& c, size_t index, float* qs, float* work) const;
  cpu::AttentionRows task_rows(const RunContext& c, const PlanTask& t, int head, const float* qs) const;
  void finish_rows(const RunContext& c, const PlanTask& t, const cpu::AttentionRows& rows, int head) const;
  void merge_splits(const RunContext& c) const;
  static constexpr int kMaxDecodeHeads = 64;
  size_t work_floats() const;

  // Where a layer's heads sit in an exact page of `capacity` tokens, in elements from the
  // page start: K of head h at capacity·k_off[h] + slot·k_dim[h], V at capacity·v_off[h] +
  // slot·v_dim[h] (V follows every head's K). Uncompressed shapes give [K|V][head][cap][head_dim].
  struct ExactLayout {
    std::vector<int> k_dim, v_dim;
    std::vector<size_t> k_off, v_off;
    size_t token_elems = 0;  // K and V elements of one token, all heads
    size_t k_at(int h, size_t capacity, size_t slot) const {
      return capacity * k_off[static_cast<size_t>(h)] + slot * static_cast<size_t>(k_dim[static_cast<size_t>(h)]);
    }
    size_t v_at(int h, size_t capacity, size_t slot) const {
      return capacity * v_off[static_cast<size_t>(h)] + slot * static_cast<size_t>(v_dim[static_cast<size_t>(h)]);
    }
  };
  // Writes one token's K and V ([heads][head_dim] f32, the first k_dim / v_dim of each head
  // stored) into an exact page of `capacity` tokens at `slot`.
  void write_exact(int layer, std::byte* page, int capacity, int slot, const float* k, const float* v) const;
  // Copies tokens [0, count) of every head from one exact page of `capacity` tokens to another.
  void copy_exact_page(int layer, const std::byte* from, std::byte* to, int capacity, int count) const;

  KvShape shape_;
  KvCacheOptions options_;
  std::vector<ExactLayout> exact_;             // per layer
  const cpu::HackAttentionKernels* kernels_;
  std::vector<HackPageLayout> layouts_;        // hack: per layer
  size_t exact_elem_bytes_ = 2;                // open/sink/fp page element size
  KvBlockManager blocks_;                      // lengths, closed blocks, reservations, the plan
  std::vector<std::unique_ptr<PagePool>> block_pools_;  // HACK pages (one pool per page size, over one of blocks_'s id spaces) or fp pages
  std::vector<PagePool*> layer_pool_;          // per layer: its pool in block_pools_
  std::unique_ptr<PagePool> open_pool_;        // hack: bf16 open blocks
  std::unique_ptr<PagePool> sink_pool_;        // hack: bf16 sinks
  std::unordered_map<int, std::unique_ptr<Sequence>> sequences_;
  ThreadPool* quantize_pool_ = nullptr;        // set_quantize_pool
};

/// The paged cache for `--kv fp|hack`.
std::unique_ptr<CpuPagedKvCache> make_paged_kv_cache(const KvShape& shape, const KvCacheOptions& options);

}  // namespace hack
