#include "hack/kv/block_manager.h"

#include <algorithm>
#include <utility>

#include "hack/core/error.h"

namespace hack {

KvBlockManager::KvBlockManager(int num_layers, const KvCacheOptions& options, ReserveBytes reserve_bytes)
    : num_layers_(num_layers),
      options_(options),
      reserve_bytes_(std::move(reserve_bytes)),
      budget_(options.capacity_bytes) {
  HACK_CHECK(num_layers > 0, "KV block manager: {} layers", num_layers);
  HACK_CHECK(options.block_tokens > 0, "KV block manager: block_tokens must be positive, got {}", options.block_tokens);
}

KvBlockManager::Sequence& KvBlockManager::get(int seq_id) {
  auto it = sequences_.find(seq_id);
  HACK_CHECK(it != sequences_.end(), "unknown sequence {}", seq_id);
  return it->second;
}

const KvBlockManager::Sequence& KvBlockManager::get(int seq_id) const {
  auto it = sequences_.find(seq_id);
  HACK_CHECK(it != sequences_.end(), "unknown sequence {}", seq_id);
  return it->second;
}

KvBlockManager::Layer& KvBlockManager::layer_of(int seq_id, int layer) {
  HACK_CHECK(layer >= 0 && layer < num_layers_, "layer {} out of range", layer);
  return get(seq_id).layers[static_cast<size_t>(layer)];
}

const KvBlockManager::Layer& KvBlockManager::layer_of(int seq_id, int layer) const {
  HACK_CHECK(layer >= 0 && layer < num_layers_, "layer {} out of range", layer);
  return get(seq_id).layers[static_cast<size_t>(layer)];
}

void KvBlockManager::add_sequence(int seq_id, int max_tokens) {
  HACK_CHECK(!sequences_.contains(seq_id), "sequence {} already exists", seq_id);
  HACK_CHECK(max_tokens > 0, "sequence {}: max_tokens must be positive, got {}", seq_id, max_tokens);
  const size_t bytes = reserve_bytes_(max_tokens);
  HACK_CHECK(budget_.try_reserve(bytes), "sequence {}: {} tokens need {} KV bytes, {} of {} are committed", seq_id,
             max_tokens, bytes, budget_.reserved(), budget_.capacity());
  Sequence s;
  s.max_tokens = max_tokens;
  s.reserved_bytes = bytes;
  s.layers.resize(static_cast<size_t>(num_layers_));
  if (owns_pages())  // the page tables do not grow on the decode path
    for (Layer& l : s.layers) l.pages.reserve(table_pages(max_tokens));
  sequences_.emplace(seq_id, std::move(s));
}

void KvBlockManager::release_pages(int layer, Layer& l) {
  PageIds& ids = page_ids(layer);
  for (uint32_t id : l.pages) ids.release(id);
  l.pages.clear();
}

bool KvBlockManager::remove_sequence(int seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return false;
  if (owns_pages())
    for (int l = 0; l < num_layers_; ++l) release_pages(l, it->second.layers[static_cast<size_t>(l)]);
  budget_.release(it->second.reserved_bytes);
  sequences_.erase(it);
  return true;
}

void KvBlockManager::fork_sequence(int src_seq, int dst_seq, int n_tokens, int max_tokens) {
  HACK_CHECK(n_tokens >= 0 && n_tokens <= max_tokens, "fork: {} tokens do not fit {}", n_tokens, max_tokens);
  const int blocks = full_blocks(n_tokens);
  const int first_open = (hack() ? options_.sinks : 0) + blocks * options_.block_tokens;
  const Sequence& src = get(src_seq);
  for (int l = 0; l < num_layers_; ++l) {
    const Layer& from = src.layers[static_cast<size_t>(l)];
    HACK_CHECK(n_tokens <= from.length, "fork: sequence {} holds {} tokens, not {}", src_seq, from.length, n_tokens);
    HACK_CHECK(!hack() || n_tokens <= first_open || blocks >= from.closed,
               "fork: token {} lies in a block sequence {} has already quantized", n_tokens, src_seq);
  }
  add_sequence(dst_seq, max_tokens);
  const Sequence& from = get(src_seq);  // add_sequence may have moved it
  Sequence& dst = get(dst_seq);
  for (int l = 0; l < num_layers_; ++l) {
    const Layer& src_layer = from.layers[static_cast<size_t>(l)];
    Layer& to = dst.layers[static_cast<size_t>(l)];
    to.length = n_tokens;
    to.closed = hack() ? std::min(blocks, src_layer.closed) : 0;
    if (!owns_pages()) continue;
    // Closed pages (hack: the closed blocks among the first n_tokens; fp: the full pages)
    // are never written again, so dst shares them; a partly filled fp page is dst's own.
    PageIds& ids = page_ids(l);
    const int shared = hack() ? to.closed : blocks;
    to.pages.assign(src_layer.pages.begin(), src_layer.pages.begin() + shared);
    for (uint32_t id : to.pages) ids.retain(id);
    if (!hack() && n_tokens > blocks * options_.block_tokens) to.pages.push_back(ids.allocate());
  }
}

bool KvBlockManager::try_extend_sequence(int seq_id, int max_tokens) {
  Sequence& s = get(seq_id);
  if (max_tokens <= s.max_tokens) return true;
  const size_t bytes = reserve_bytes_(max_tokens);
  if (bytes > s.reserved_bytes && !budget_.try_reserve(bytes - s.reserved_bytes)) return false;
  s.reserved_bytes = std::max(s.reserved_bytes, bytes);
  s.max_tokens = max_tokens;
  if (owns_pages())
    for (Layer& l : s.layers) l.pages.reserve(table_pages(max_tokens));
  return true;
}

int64_t KvBlockManager::token_count() const {
  int64_t tokens = 0;
  for (const auto& [id, s] : sequences_) tokens += s.layers.back().length;
  return tokens;
}

int KvBlockManager::full_blocks(int length) const {
  if (!hack()) return length / options_.block_tokens;
  return std::max(0, length - options_.sinks) / options_.block_tokens;
}

int KvBlockManager::closed_blocks(int seq_id, int layer) const {
  const Layer& l = layer_of(seq_id, layer);
  if (!hack()) return (l.length + options_.block_tokens - 1) / options_.block_tokens;
  return l.closed;
}

int KvBlockManager::pending_blocks(int seq_id, int layer) const {
  if (!hack()) return 0;
  const Layer& l = layer_of(seq_id, layer);
  return full_blocks(l.length) - l.closed;
}

int KvBlockManager::closable_blocks(int seq_id, int layer) const {
  const Layer& l = layer_of(seq_id, layer);
  if (!hack()) return closed_blocks(seq_id, layer);
  // Block b ends at S + (b + 1)·Π; it may close once that is ≤ length − R.
  const int window_end = l.length - options_.recent_tokens - options_.sinks;
  const int upto = window_end < 0 ? 0 : std::min(full_blocks(l.length), window_end / options_.block_tokens);
  return std::max(l.closed, upto);
}

void KvBlockManager::check_append(int seq_id, int layer, int start_pos, int n_tokens) const {
  const Sequence& s = get(seq_id);
  const Layer& l = layer_of(seq_id, layer);
  HACK_CHECK(start_pos == l.length, "sequence {} layer {}: append at {} but length is {}", seq_id, layer, start_pos,
             l.length);
  HACK_CHECK(n_tokens >= 0 && l.length + n_tokens <= s.max_tokens, "sequence {}: {} tokens exceed its capacity of {}",
             seq_id, l.length + n_tokens, s.max_tokens);
}

void KvBlockManager::record_append(int seq_id, int layer, int n_tokens) { layer_of(seq_id, layer).length += n_tokens; }

void KvBlockManager::own_page_ids(const std::vector<int>& layer_space) {
  HACK_CHECK(sequences_.empty() && spaces_.empty(), "KV block manager: page ids are taken over before any sequence, once");
  HACK_CHECK(static_cast<int>(layer_space.size()) == num_layers_, "KV block manager: {} layer spaces for {} layers",
             layer_space.size(), num_layers_);
  int spaces = 0;
  for (int s : layer_space) {
    HACK_CHECK(s >= 0 && s < num_layers_, "KV block manager: page space {} out of range", s);
    spaces = std::max(spaces, s + 1);
  }
  for (int i = 0; i < spaces; ++i) spaces_.push_back(std::make_unique<PageIds>());
  layer_space_ = layer_space;
}

PageIds& KvBlockManager::page_ids(int layer) const {
  HACK_CHECK(owns_pages(), "KV block manager: the storage names its own pages");
  HACK_CHECK(layer >= 0 && layer < num_layers_, "layer {} out of range", layer);
  return *spaces_[static_cast<size_t>(layer_space_[static_cast<size_t>(layer)])];
}

std::span<const uint32_t> KvBlockManager::pages(int seq_id, int layer) const { return layer_of(seq_id, layer).pages; }

uint32_t KvBlockManager::add_page(int seq_id, int layer) {
  HACK_CHECK(!hack(), "KV block manager: add_page is for fp pages");
  Layer& l = layer_of(seq_id, layer);
  const uint32_t id = page_ids(layer).allocate();
  l.pages.push_back(id);
  return id;
}

void KvBlockManager::new_pages(int layer, int n, std::vector<uint32_t>& ids) {
  PageIds& space = page_ids(layer);
  ids.clear();
  try {
    for (int i = 0; i < n; ++i) ids.push_back(space.allocate());
  } catch (...) {  // a bounded space ran out: none of them is handed out
    free_pages(layer, ids);
    ids.clear();
    throw;
  }
}

void KvBlockManager::free_pages(int layer, std::span<const uint32_t> ids) {
  PageIds& space = page_ids(layer);
  for (uint32_t id : ids) space.release(id);
}

void KvBlockManager::close_blocks(int seq_id, int layer, std::span<const uint32_t> ids) {
  HACK_CHECK(hack() && owns_pages(), "KV block manager: close_blocks is for HACK pages it hands out");
  Layer& l = layer_of(seq_id, layer);
  const int closed = l.closed + static_cast<int>(ids.size());
  HACK_CHECK(closed <= full_blocks(l.length), "sequence {} layer {}: {} closed blocks of {} tokens ({} closed before)",
             seq_id, layer, closed, l.length, l.closed);
  l.pages.insert(l.pages.end(), ids.begin(), ids.end());
  l.closed = closed;
}

int KvBlockManager::page_ref_count(int seq_id, int layer, int index) const {
  const Layer& l = layer_of(seq_id, layer);
  HACK_CHECK(index >= 0 && index < static_cast<int>(l.pages.size()), "sequence {} layer {}: no page {}", seq_id, layer,
             index);
  return page_ids(layer).ref_count(l.pages[static_cast<size_t>(index)]);
}

void KvBlockManager::record_closed(int seq_id, int layer, int closed_blocks) {
  HACK_CHECK(!owns_pages(), "KV block manager: closed blocks come with their pages (close_blocks)");
  Layer& l = layer_of(seq_id, layer);
  HACK_CHECK(closed_blocks >= l.closed && closed_blocks <= full_blocks(l.length),
             "sequence {} layer {}: {} closed blocks of {} tokens ({} closed before)", seq_id, layer, closed_blocks,
             l.length, l.closed);
  l.closed = closed_blocks;
}

void KvBlockManager::set_layer(int seq_id, int layer, int length, int closed) {
  Layer& l = layer_of(seq_id, layer);
  HACK_CHECK(length >= 0 && length <= get(seq_id).max_tokens && closed >= 0 && (!hack() || closed <= full_blocks(length)),
             "sequence {} layer {}: {} tokens with {} closed blocks do not fit", seq_id, layer, length, closed);
  if (owns_pages()) {
    if (length == 0 && closed == 0) release_pages(layer, l);
    const int T = options_.block_tokens;
    const size_t held = static_cast<size_t>(hack() ? closed : (length + T - 1) / T);
    HACK_CHECK(l.pages.size() == held, "sequence {} layer {}: {} tokens with {} closed blocks need {} pages, it holds {}",
               seq_id, layer, length, closed, held, l.pages.size());
  }
  l.length = length;
  l.closed = hack() ? closed : 0;
}

void KvBlockManager::begin_prefill(int seq_id) {
  Sequence& s = get(seq_id);
  if (hack() && options_.exact_prefill) s.prefilling = true;
}

bool KvBlockManager::end_prefill(int seq_id) {
  Sequence& s = get(seq_id);
  return std::exchange(s.prefilling, false);
}

void KvBlockManager::list_segments(int length, int closed, std::vector<PlanSegment>& out) const {
  const int T = options_.block_tokens;
  if (!hack()) {
    for (int i = 0; i * T < length; ++i) out.push_back({i * T, std::min(T, length - i * T), SegmentSlot::closed, i});
    return;
  }
  const int S = options_.sinks;
  if (S > 0 && length > 0) out.push_back({0, std::min(S, length), SegmentSlot::sinks, 0});
  const int full = full_blocks(length);
  for (int b = 0; b < full; ++b) {
    const bool is_closed = b < closed;
    out.push_back({S + b * T, T, is_closed ? SegmentSlot::closed : SegmentSlot::pending, is_closed ? b : b - closed});
  }
  const int first = S + full * T;
  if (first < length) out.push_back({first, length - first, SegmentSlot::open, 0});
}

void KvBlockManager::plan(const KvShape& shape, std::span<const PlanItem> items, const PlanPolicy& policy,
                          AttentionPlan& plan) const {
  const int H = shape.num_kv_heads;
  plan.clear();
  plan.num_kv_heads = H;
  plan.group_size = shape.group_size;
  plan.k_dims.resize(static_cast<size_t>(shape.num_layers * H));
  plan.v_dims.resize(plan.k_dims.size());
  for (int l = 0; l < shape.num_layers; ++l)
    for (int h = 0; h < H; ++h) {
      const size_t at = static_cast<size_t>(l * H + h);
      plan.k_dims[at] = shape.k_dim(l, h);
      plan.v_dims[at] = shape.v_dim(l, h);
    }
  const int T = options_.block_tokens;
  // Room for every item's segments at its largest length, so a growing context does not
  // grow the plan during decode (sinks, open block and one spare around the full blocks).
  size_t most_segments = 0;
  for (const PlanItem& in : items)
    if (sequences_.contains(in.seq_id)) most_segments += static_cast<size_t>(get(in.seq_id).max_tokens / T + 3);
  plan.segments.reserve(most_segments);
  for (const PlanItem& in : items) {
    for (const PlanItem& seen : plan.items)
      HACK_CHECK(seen.seq_id != in.seq_id, "attention plan: sequence {} appears twice in one step", in.seq_id);
    const Sequence& s = get(in.seq_id);
    const Layer& first = s.layers.front();
    HACK_CHECK(in.n_tokens > 0 && in.start_pos == first.length,
               "sequence {}: a chunk of {} tokens at {} but {} are stored", in.seq_id, in.n_tokens, in.start_pos,
               first.length);
    HACK_CHECK(in.start_pos + in.n_tokens <= s.max_tokens, "sequence {}: {} tokens exceed its capacity of {}", in.seq_id,
               in.start_pos + in.n_tokens, s.max_tokens);
    // The closed pages after the step's append: an append closes the pending blocks that
    // have left the recent window (as of the length before it) unless a prefill is open.
    int closed = closed_blocks(in.seq_id, 0);
    if (hack() && !s.prefilling) closed = closable_blocks(in.seq_id, 0);
    PlanItem item = in;
    item.closed_pages = closed;
    plan.items.push_back(item);
    list_segments(in.start_pos + in.n_tokens, closed, plan.segments);
    plan.segment_offsets.push_back(static_cast<int>(plan.segments.size()));
  }
  build_plan_tasks(plan, policy);
}

}  // namespace hack
