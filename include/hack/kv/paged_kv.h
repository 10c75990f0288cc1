/// @file paged_kv.h
/// @brief The paged KV that everything above a backend speaks to — decode scheduler, prefill
/// worker, prefix cache and vault restore, KV export/import, the recorder, static eviction,
/// the runtime and the tools — whichever device holds the pages (DESIGN.md §2, "KV is three
/// things"). Sequences and their reservations, the prefill bracket, which blocks are closed
/// (quantized), and page bytes moved in and out through host memory by page index.
///
/// Every implementation is a device storage over one KvBlockManager (kv/block_manager.h):
/// the manager holds the device-neutral state (sequences, per-layer lengths and closed
/// blocks, reservations, the prefill bracket) and builds the step's AttentionPlan; the
/// storage holds the pages and runs the plan. What only reads that state is answered here
/// from the manager, once for every device.
///
/// Implementations: CpuPagedKvCache (backend/cpu_paged_kv_cache.h: host page pools and the CPU attention
/// runner) and CudaPagedKvCache (backend/cuda_paged_kv_cache.h: device page pools and the CUDA
/// kernels). Each backend computes over its own concrete type; nothing above a backend names
/// either. Page bytes are device-independent (kv/hack_page.h; the CPU and CUDA quantizers agree
/// byte for byte), so a page read from one implementation appends to the other. An operation a
/// device cannot do yet throws hack::Error naming the operation and the device.
///
/// Per (sequence, layer) the tokens [0, length) lie, in hack mode, as the sinks [0, S) (exact),
/// closed blocks (HACK pages of Π tokens from S), pending blocks (full, exact, not yet
/// quantized) and the open block (exact); in fp mode as exact pages of Π tokens.
#pragma once

#include <cstddef>
#include <functional>
#include <span>

#include "hack/kv/attention_plan.h"
#include "hack/kv/block_manager.h"
#include "hack/kv/kv_cache.h"
#include "hack/kv/kv_options.h"

namespace hack {

/// Pages of blocks known before they close: a prefix hit's pages kept from the prompt that
/// closed them (same tokens, positions and options, so the bytes a close would produce).
/// Returns the page of block `block` of `layer` (HackPageLayout::page_bytes() host bytes), or
/// null where it is not known.
using KnownPages = std::function<const std::byte*(int layer, int block)>;

class PagedKv : public KvCache {
 public:
  /// The options the pages were built with (fp mode: mode, fp_dtype and block_tokens matter).
  virtual const KvCacheOptions& options() const = 0;
  /// The device-neutral bookkeeping behind the pages.
  virtual const KvBlockManager& blocks() const = 0;

  bool has_sequence(int seq_id) const final { return blocks().has_sequence(seq_id); }
  int length(int seq_id, int layer) const final { return blocks().length(seq_id, layer); }
  /// Plans the attention of one step whose chunks are `items` (KvBlockManager::plan): the
  /// same plan from the same state on every device. Run it after the step's appends.
  void plan(std::span<const PlanItem> items, const PlanPolicy& policy, AttentionPlan& plan) const {
    blocks().plan(shape(), items, policy, plan);
  }

  // ---- sequences and the byte budget (admission) ----
  /// Bytes add_sequence(…, max_tokens) reserves against the capacity (stats().bytes_capacity).
  size_t sequence_bytes(int max_tokens) const { return blocks().sequence_bytes(max_tokens); }
  /// Grows a sequence's reservation to max_tokens (never shrinks it). False, with nothing
  /// changed, when the capacity cannot hold the difference.
  virtual bool try_extend_sequence(int seq_id, int max_tokens) = 0;
  /// Tokens the sequence is reserved for.
  int max_tokens(int seq_id) const { return blocks().max_tokens(seq_id); }
  /// Gives memory of pages no sequence holds back to the system; returns the bytes given back
  /// (0 where the pool is pre-allocated, as on a device). For an idle owner.
  virtual size_t release_free_slabs() = 0;
  /// Sets (or with nullptr clears) the observer of every token the sequence's appends store
  /// (KvAppendObserver); it must outlive the sequence or be cleared first.
  virtual void set_append_observer(int seq_id, KvAppendObserver* observer) = 0;

  // ---- blocks ----
  /// Quantizes the full blocks of the sequence (every layer / one layer) that have left the
  /// recent window: the state the next append would produce before storing its tokens. No-op
  /// in fp mode. The one-layer form lets a layer be exported as soon as its prefill is done.
  virtual void close_pending_blocks(int seq_id) = 0;
  virtual void close_pending_blocks(int seq_id, int layer) = 0;
  /// The one-layer form where some of the blocks to close have `known` pages: those are
  /// copied (validated: layout, layer, first token) instead of quantized. A prefix hit's
  /// restored blocks close this way, so the decode node gets the pages the prompt that
  /// computed them produced, and the hit skips re-quantizing them.
  virtual void close_pending_blocks(int seq_id, int layer, const KnownPages& known) = 0;
  /// Full blocks of a layer not yet quantized (hack mode; 0 in fp mode).
  int pending_block_count(int seq_id, int layer) const { return blocks().pending_blocks(seq_id, layer); }

  // ---- page bytes, through host memory ----
  /// Layout of one layer's HACK pages (hack mode).
  virtual const HackPageLayout& hack_layout(int layer) const = 0;
  /// Closed HACK pages of a sequence's layer (hack mode).
  int hack_page_count(int seq_id, int layer) const;
  /// Closed page `index` where it lies in host memory (valid and unchanged until the sequence
  /// is removed, so a sender may keep it); empty where pages live on a device (read_hack_page).
  virtual std::span<const std::byte> host_hack_page(int seq_id, int layer, int index) const = 0;
  /// Copies closed page `index` into `page` (hack_layout(layer).page_bytes() bytes of host memory).
  virtual void read_hack_page(int seq_id, int layer, int index, std::byte* page) const = 0;
  /// Block `block` (tokens [S + block·Π, S + (block + 1)·Π)) as it is or will be once quantized,
  /// byte for byte, into `page` (host): the stored page of a closed block, a pending block
  /// quantized into `page` while the cache keeps attending to its exact tokens.
  virtual void peek_block_page(int seq_id, int layer, int block, std::byte* page) const = 0;
  /// Appends a received HACK page (host bytes; validated: layout, layer, first token) as the
  /// layer's next closed block; the open block must be empty and the sinks complete.
  virtual void append_hack_page(int layer, int seq_id, const void* bytes, size_t size) = 0;

  // ---- exact tokens ----
  /// Element type of tokens kept exactly: bf16 in hack mode, the fp page type in fp mode.
  virtual DType exact_dtype() const = 0;
  /// Copies exactly stored tokens [first_token, first_token + n_tokens) of a layer, without
  /// conversion, to host: k, v [n_tokens][num_kv_heads][head_dim] of exact_dtype() (a head of
  /// FDC dims fills the start of its slot, 0 after); v may be null. Throws hack::Error for a
  /// token that is quantized or not stored, before writing anything.
  virtual void copy_exact_tokens(int seq_id, int layer, int first_token, int n_tokens, std::byte* k,
                                 std::byte* v) const = 0;
  /// The same converted to f32 (KvCache::read_exact_tokens), through copy_exact_tokens.
  void read_exact_tokens(int seq_id, int layer, int first_token, int n_tokens, float* k, float* v) const override;

 protected:
  /// keep_tokens' first half on either device: checks `kept` (ascending indices among the
  /// layer's tokens, naming the sequence) and reads the kept tokens as f32 into k, v
  /// [kept][num_kv_heads · head_dim], in order (bf16 → f32 is exact, so storing them again
  /// writes the same bits).
  void read_kept_tokens(int seq_id, int layer, const std::vector<int>& kept, std::vector<float>& k,
                        std::vector<float>& v) const;
};

}  // namespace hack
