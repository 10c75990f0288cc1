/// @file block_manager.h
/// @brief The device-neutral half of a paged KV cache (DESIGN.md §2): which sequences exist,
/// how many tokens each holds per layer, how many of its blocks are closed (quantized, or
/// full fp pages), what the prefill bracket and the recent window let close next, what each
/// sequence reserved against the byte budget — and from all of that, the step's
/// AttentionPlan. No attention arithmetic, no page memory, no device calls.
///
/// A device storage (CpuPagedKvCache on the host, CudaPagedKvCache on a GPU) owns one manager
/// and the pages behind it: it asks the manager before it changes anything (check_append,
/// closable_blocks, admission) and records what it did (record_append, record_closed,
/// set_length). Both storages therefore close the same blocks at the same appends and build
/// the same plan from the same state, which is what lets one plan drive either runner and a
/// page set move between devices.
///
/// Page ids: a storage whose pages are all alike per layer group (the host pools) lets the
/// manager hand out their ids (own_page_ids): then the manager keeps each (sequence, layer)'s
/// page table — the ids of its closed blocks in block order — with reference counts, shares
/// closed pages between forks and frees them with the last holder, and the storage only maps
/// ids to memory. A storage that names its pages itself (the device pool, whose one id indexes
/// every layer's pages in the kernels' tables) keeps counts here and its ids to itself.
///
/// Per (sequence, layer) of `length` tokens, in hack mode: the sinks [0, S) (exact), then
/// full blocks of Π tokens from S — the first `closed` of them closed (HACK pages), the rest
/// pending (exact, not yet quantized) — then the open block (exact, partly filled). In fp
/// mode: exact pages of Π tokens from 0, every one closed (the last may be partial).
/// Not thread-safe: the owner serializes access (as it does for its pages).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "hack/kv/attention_plan.h"
#include "hack/kv/kv_cache.h"
#include "hack/kv/kv_options.h"
#include "hack/kv/page_pool.h"

namespace hack {

class KvBlockManager {
 public:
  /// Bytes a sequence of max_tokens reserves (the storage's own formula: host page sizes
  /// per layer, or a device's page units).
  using ReserveBytes = std::function<size_t(int max_tokens)>;

  /// `options` gives the mode, Π, S and the recent window; the budget holds
  /// options.capacity_bytes (0 = unbounded).
  KvBlockManager(int num_layers, const KvCacheOptions& options, ReserveBytes reserve_bytes);

  int num_layers() const { return num_layers_; }
  const KvCacheOptions& options() const { return options_; }
  /// Replaces the options that do not change stored state (page selection).
  void set_options(const KvCacheOptions& options) { options_ = options; }

  // ---- sequences and the budget ----
  /// Opens a sequence of at most max_tokens tokens, reserving sequence_bytes(max_tokens).
  /// Throws hack::Error (naming the sequence and the bytes) when it exists, max_tokens is not
  /// positive or the budget cannot hold it.
  void add_sequence(int seq_id, int max_tokens);
  /// Forgets the sequence and gives its reservation (and its pages' ids) back; false when it
  /// was unknown.
  bool remove_sequence(int seq_id);
  /// Opens dst (reserving max_tokens) holding the first n_tokens of src in every layer: the
  /// blocks src closed among them closed in dst too (with owns_pages() their page ids are
  /// shared here; full blocks src has not closed stay pending; a partly filled fp page gets
  /// a new id in dst's table, which the storage fills with a copy). Throws
  /// hack::Error, nothing changed, when n_tokens exceeds max_tokens or what src holds, or
  /// would cut into a block src has already closed (its exact tokens are gone).
  void fork_sequence(int src_seq, int dst_seq, int n_tokens, int max_tokens);
  /// Grows the reservation to max_tokens (never shrinks it); false, nothing changed, when
  /// the budget cannot hold the difference.
  bool try_extend_sequence(int seq_id, int max_tokens);
  bool has_sequence(int seq_id) const { return sequences_.contains(seq_id); }
  int max_tokens(int seq_id) const { return get(seq_id).max_tokens; }
  size_t sequence_bytes(int max_tokens) const { return reserve_bytes_(max_tokens); }
  size_t reserved_bytes() const { return budget_.reserved(); }
  size_t capacity_bytes() const { return budget_.capacity(); }
  int64_t sequence_count() const { return static_cast<int64_t>(sequences_.size()); }
  /// Tokens of every sequence in its last layer (what the sequences hold once a step ends).
  int64_t token_count() const;

  // ---- page ids (own_page_ids) ----
  /// From now on the manager hands out the page ids: layer l's pages are ids of space
  /// layer_space[l] (layers whose pages share memory share a space). Before any sequence.
  void own_page_ids(const std::vector<int>& layer_space);
  bool owns_pages() const { return !spaces_.empty(); }
  /// The id space of a layer's pages (owns_pages()).
  PageIds& page_ids(int layer) const;
  /// A layer's page table: hack mode, its closed blocks' pages in block order; fp mode, its
  /// pages in token order (the last may be partial). Empty unless owns_pages().
  std::span<const uint32_t> pages(int seq_id, int layer) const;
  /// fp mode: a new page at the end of the layer's table, for the next Π tokens.
  uint32_t add_page(int seq_id, int layer);
  /// n ids of the layer's space in no table yet (reference count 1): pages to fill before
  /// close_blocks adopts them, or free_pages gives them back.
  void new_pages(int layer, int n, std::vector<uint32_t>& ids);
  void free_pages(int layer, std::span<const uint32_t> ids);
  /// hack mode: `ids` (from new_pages) become the layer's next closed blocks.
  void close_blocks(int seq_id, int layer, std::span<const uint32_t> ids);
  /// Holders of page `index` of a layer's table.
  int page_ref_count(int seq_id, int layer, int index) const;

  // ---- blocks of one layer ----
  int length(int seq_id, int layer) const { return layer_of(seq_id, layer).length; }
  /// Blocks of Π tokens that `length` tokens fill (after the sinks in hack mode).
  int full_blocks(int length) const;
  /// Closed blocks of a layer: HACK pages in hack mode; in fp mode every page, the last
  /// possibly partial (⌈length / Π⌉).
  int closed_blocks(int seq_id, int layer) const;
  /// Full blocks of a layer not yet quantized (hack mode; 0 in fp mode).
  int pending_blocks(int seq_id, int layer) const;
  /// The closed count closing the layer now reaches (hack mode): every full block whose end
  /// lies at or before length − recent_tokens; never fewer than are closed already. fp: the
  /// closed count.
  int closable_blocks(int seq_id, int layer) const;
  /// Throws hack::Error naming the sequence unless n_tokens ≥ 0 tokens can be appended to
  /// `layer` at start_pos (= its length, within max_tokens).
  void check_append(int seq_id, int layer, int start_pos, int n_tokens) const;
  /// Records an append the storage made (check_append's conditions hold).
  void record_append(int seq_id, int layer, int n_tokens);
  /// Records that the layer's blocks [closed, closed_blocks) are closed now (hack mode; a
  /// storage naming its own pages — with owns_pages(), close_blocks records them).
  void record_closed(int seq_id, int layer, int closed_blocks);
  /// Sets a layer's state outright (an import, a rebuild): `closed` full blocks of `length`
  /// tokens closed (hack mode; ignored in fp mode). With owns_pages() the page table must
  /// hold as many pages, except that (0, 0) empties it (its pages released).
  void set_layer(int seq_id, int layer, int length, int closed);

  // ---- the prefill bracket (options().exact_prefill, hack mode) ----
  /// Between these, appends close nothing. begin_prefill opens the bracket where the mode
  /// has one; end_prefill returns whether one was open (the storage then closes what
  /// closable_blocks allows).
  void begin_prefill(int seq_id);
  bool end_prefill(int seq_id);
  bool prefilling(int seq_id) const { return get(seq_id).prefilling; }

  // ---- the append observer (KvAppendObserver) ----
  void set_observer(int seq_id, KvAppendObserver* observer) { get(seq_id).observer = observer; }
  KvAppendObserver* observer(int seq_id) const { return get(seq_id).observer; }

  // ---- the plan ----
  /// Appends the segments of a layer holding `length` tokens of which `closed` blocks are
  /// closed, in position order (the same in every layer).
  void list_segments(int length, int closed, std::vector<PlanSegment>& out) const;
  /// Plans the attention of one step (kv/attention_plan.h) whose chunks are `items`
  /// (seq_id, start_pos = the sequence's length now, n_tokens, row); each sequence at most
  /// once. Run it after the step's appends, in every layer. Throws hack::Error naming the
  /// sequence when a chunk does not fit. `shape` gives the heads and per-head dims.
  void plan(const KvShape& shape, std::span<const PlanItem> items, const PlanPolicy& policy, AttentionPlan& plan) const;

 private:
  struct Layer {
    int length = 0;
    int closed = 0;               // hack: closed full blocks
    std::vector<uint32_t> pages;  // owns_pages(): the page table (hack: `closed` ids)
  };
  struct Sequence {
    int max_tokens = 0;
    size_t reserved_bytes = 0;
    bool prefilling = false;
    KvAppendObserver* observer = nullptr;
    std::vector<Layer> layers;
  };
  Sequence& get(int seq_id);
  const Sequence& get(int seq_id) const;
  Layer& layer_of(int seq_id, int layer);
  const Layer& layer_of(int seq_id, int layer) const;
  bool hack() const { return options_.mode == KvMode::hack; }
  void release_pages(int layer, Layer& l);
  // Page-table entries a sequence of max_tokens may need (its blocks, plus one).
  size_t table_pages(int max_tokens) const { return static_cast<size_t>(max_tokens / options_.block_tokens + 2); }

  int num_layers_;
  KvCacheOptions options_;
  ReserveBytes reserve_bytes_;
  MemoryBudget budget_;
  std::unordered_map<int, Sequence> sequences_;
  std::vector<std::unique_ptr<PageIds>> spaces_;  // own_page_ids: the id spaces
  std::vector<int> layer_space_;                  // [layer]: its space in spaces_
};

}  // namespace hack
