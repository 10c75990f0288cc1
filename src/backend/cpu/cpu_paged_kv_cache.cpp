#include "hack/backend/cpu_paged_kv_cache.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <utility>

#include "hack/core/error.h"

namespace hack {

namespace {

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

}  // namespace

namespace {

void check_select(const PageSelectOptions& select, KvMode mode) {
  validate(select);
  HACK_CHECK(!select.enabled() || mode == KvMode::hack,
             "--kv-select-ratio / --kv-select-tokens need --kv hack (page selection reads HACK pages' K ranges)");
}

}  // namespace

CpuPagedKvCache::CpuPagedKvCache(const KvShape& shape, const KvCacheOptions& options)
    : shape_(shape),
      options_(options),
      kernels_(&cpu::hack_attention_kernels(options.isa.value_or(cpu_isa()))),
      blocks_(shape.num_layers, options, [this](int max_tokens) { return reserve_bytes_for(max_tokens); }) {
  HACK_CHECK(shape.num_layers > 0 && shape.num_kv_heads > 0 && shape.head_dim > 0 && shape.group_size > 0,
             "paged KV cache: invalid shape ({} layers, {} KV heads, head_dim {}, group {})", shape.num_layers,
             shape.num_kv_heads, shape.head_dim, shape.group_size);
  HACK_CHECK(options.block_tokens >= 16 && options.block_tokens % 16 == 0 && options.block_tokens <= 4096,
             "--hack-block must be a multiple of 16 in [16, 4096], got {}", options.block_tokens);
  check_select(options.select, options.mode);
  const size_t H = static_cast<size_t>(shape.num_kv_heads);
  const size_t T = static_cast<size_t>(options.block_tokens);
  const size_t dims = static_cast<size_t>(shape.num_layers) * H;
  HACK_CHECK((shape.k_dims.empty() && shape.v_dims.empty()) || (shape.k_dims.size() == dims && shape.v_dims.size() == dims),
             "paged KV cache: per-head dims for {} (layer, KV head) pairs, got {} K and {} V", dims, shape.k_dims.size(),
             shape.v_dims.size());
  size_t widest_token = 0;  // K and V elements of one token in the widest layer
  for (int l = 0; l < shape.num_layers; ++l) {
    ExactLayout e;
    size_t k_total = 0, v_total = 0;
    for (int h = 0; h < shape.num_kv_heads; ++h) {
      const int kd = shape.k_dim(l, h), vd = shape.v_dim(l, h);
      for (const int dim : {kd, vd})
        HACK_CHECK(dim > 0 && dim <= shape.head_dim && (dim == shape.head_dim || dim % 16 == 0),
                   "paged KV cache: layer {} KV head {}: dim {} must be a multiple of 16 in [16, head_dim {}]", l, h, dim,
                   shape.head_dim);
      e.k_dim.push_back(kd);
      e.v_dim.push_back(vd);
      e.k_off.push_back(k_total);
      k_total += static_cast<size_t>(kd);
    }
    for (int h = 0; h < shape.num_kv_heads; ++h) {
      e.v_off.push_back(k_total + v_total);
      v_total += static_cast<size_t>(e.v_dim[static_cast<size_t>(h)]);
    }
    e.token_elems = k_total + v_total;
    widest_token = std::max(widest_token, e.token_elems);
    exact_.push_back(std::move(e));
  }
  // Layers whose pages have the same size share a pool, whose ids are one of the block
  // manager's id spaces (it hands them out, counts their holders and shares them on forks).
  std::vector<size_t> page_bytes;  // per layer
  const auto use_pools = [&] {
    std::vector<int> space;
    std::vector<size_t> sizes;
    for (size_t bytes : page_bytes) {
      const auto at = std::find(sizes.begin(), sizes.end(), bytes);
      space.push_back(static_cast<int>(at - sizes.begin()));
      if (at == sizes.end()) sizes.push_back(bytes);
    }
    blocks_.own_page_ids(space);
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int first_layer = static_cast<int>(std::find(space.begin(), space.end(), static_cast<int>(i)) - space.begin());
      block_pools_.push_back(std::make_unique<PagePool>(sizes[i], 0, &blocks_.page_ids(first_layer)));
    }
    for (int s : space) layer_pool_.push_back(block_pools_[static_cast<size_t>(s)].get());
  };
  if (options.mode == KvMode::fp) {
    HACK_CHECK(options.fp_dtype == DType::bf16 || options.fp_dtype == DType::f32,
               "paged KV cache: fp pages hold bf16 or f32, not {}", dtype_name(options.fp_dtype));
    exact_elem_bytes_ = dtype_size(options.fp_dtype);
    for (const ExactLayout& e : exact_) page_bytes.push_back(T * e.token_elems * exact_elem_bytes_);
    use_pools();
    return;
  }
  HACK_CHECK(options.sinks >= 0 && options.sinks <= 1024, "--hack-sinks must be in [0, 1024], got {}", options.sinks);
  HACK_CHECK(options.recent_tokens >= 0 && options.recent_tokens <= 65536,
             "--hack-recent must be in [0, 65536], got {}", options.recent_tokens);
  HACK_CHECK(shape.head_dim % 16 == 0, "--kv hack needs head_dim a multiple of 16, got {}", shape.head_dim);
  HACK_CHECK(options.layer_bits.empty() || static_cast<int>(options.layer_bits.size()) == shape.num_layers,
             "HACK bit allocation: {} layers given, the model has {}", options.layer_bits.size(), shape.num_layers);
  for (int l = 0; l < shape.num_layers; ++l) {
    layouts_.push_back(hack_page_layout(shape, options, l));
    page_bytes.push_back(layouts_.back().page_bytes());
  }
  use_pools();
  exact_elem_bytes_ = 2;
  // Exact pages are sized for the widest layer (all layers share these pools).
  open_pool_ = std::make_unique<PagePool>(T * widest_token * 2);
  if (options.sinks > 0) sink_pool_ = std::make_unique<PagePool>(static_cast<size_t>(options.sinks) * widest_token * 2);
}

CpuPagedKvCache::~CpuPagedKvCache() {
  for (auto& [id, s] : sequences_) release_pages(*s);
}

std::string CpuPagedKvCache::name() const {
  if (options_.mode == KvMode::hack && !options_.layer_bits.empty()) return "hack-per-layer";
  if (options_.mode == KvMode::hack)
    return options_.k_bits == options_.v_bits ? fmt::format("hack-{}bit", options_.k_bits)
                                              : fmt::format("hack-k{}v{}", options_.k_bits, options_.v_bits);
  return options_.fp_dtype == DType::f32 ? "fp32-paged" : "bf16-paged";
}

CpuPagedKvCache::Sequence& CpuPagedKvCache::get(int seq_id) {
  auto it = sequences_.find(seq_id);
  HACK_CHECK(it != sequences_.end(), "unknown sequence {}", seq_id);
  return *it->second;
}

const CpuPagedKvCache::Sequence& CpuPagedKvCache::get(int seq_id) const {
  auto it = sequences_.find(seq_id);
  HACK_CHECK(it != sequences_.end(), "unknown sequence {}", seq_id);
  return *it->second;
}

size_t CpuPagedKvCache::reserve_bytes_for(int max_tokens) const {
  const int T = options_.block_tokens;
  size_t per_layer;
  size_t total = 0;
  if (options_.mode == KvMode::fp) {
    for (int l = 0; l < shape_.num_layers; ++l) total += static_cast<size_t>((max_tokens + T - 1) / T) * pages_of(l).page_bytes();
    return total;
  }
  for (int l = 0; l < shape_.num_layers; ++l) {
    // The recent window's full blocks are held as bf16 pages instead of HACK pages.
    const int blocks = blocks_.full_blocks(max_tokens);
    const int window = std::min(blocks, (options_.recent_tokens + T - 1) / T);
    per_layer = static_cast<size_t>(blocks - window) * pages_of(l).page_bytes() +
                static_cast<size_t>(window) * open_pool_->page_bytes();
    if (max_tokens > options_.sinks) per_layer += open_pool_->page_bytes();
    if (sink_pool_) per_layer += sink_pool_->page_bytes();
    total += per_layer;
  }
  return total;
}

void CpuPagedKvCache::add_sequence(int seq_id, int max_tokens) {
  blocks_.add_sequence(seq_id, max_tokens);  // checks the id, the count and the budget
  add_pages(seq_id);
}

void CpuPagedKvCache::add_pages(int seq_id) {
  auto s = std::make_unique<Sequence>();
  s->layers.resize(static_cast<size_t>(shape_.num_layers));
  for (size_t l = 0; l < s->layers.size(); ++l) {  // no reallocation on the decode path
    LayerPages& lp = s->layers[l];
    lp.layer = static_cast<int>(l);
    lp.pending.reserve(static_cast<size_t>(2 + (options_.recent_tokens + options_.block_tokens - 1) / options_.block_tokens));
  }
  sequences_.emplace(seq_id, std::move(s));
}

bool CpuPagedKvCache::try_extend_sequence(int seq_id, int max_tokens) {
  return blocks_.try_extend_sequence(seq_id, max_tokens);
}

void CpuPagedKvCache::release_pages(Sequence& s) {
  for (auto& lp : s.layers) {  // the closed pages are the block manager's
    for (PageRef p : lp.pending) open_pool_->release(p);
    lp.pending.clear();
    if (lp.open) open_pool_->release(lp.open);
    if (lp.sink) sink_pool_->release(lp.sink);
    lp.open = lp.sink = PageRef{};
  }
}

void CpuPagedKvCache::remove_sequence(int seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return;
  release_pages(*it->second);
  blocks_.remove_sequence(seq_id);
  sequences_.erase(it);
}

void CpuPagedKvCache::write_exact(int layer, std::byte* page, int capacity, int slot, const float* k, const float* v) const {
  const ExactLayout& e = exact_[static_cast<size_t>(layer)];
  const size_t cap = static_cast<size_t>(capacity), at = static_cast<size_t>(slot);
  auto put = [&](size_t offset, const float* src, int n) {
    if (exact_elem_bytes_ == 4) {
      std::memcpy(reinterpret_cast<float*>(page) + offset, src, static_cast<size_t>(n) * 4);
    } else {
      uint16_t* dst = reinterpret_cast<uint16_t*>(page) + offset;
      for (int c = 0; c < n; ++c) dst[c] = f32_to_bf16(src[c]);
    }
  };
  const size_t d = static_cast<size_t>(shape_.head_dim);
  for (int h = 0; h < shape_.num_kv_heads; ++h) {
    put(e.k_at(h, cap, at), k + static_cast<size_t>(h) * d, e.k_dim[static_cast<size_t>(h)]);
    put(e.v_at(h, cap, at), v + static_cast<size_t>(h) * d, e.v_dim[static_cast<size_t>(h)]);
  }
}

void CpuPagedKvCache::copy_exact_page(int layer, const std::byte* from, std::byte* to, int capacity, int count) const {
  const ExactLayout& e = exact_[static_cast<size_t>(layer)];
  const size_t cap = static_cast<size_t>(capacity), n = static_cast<size_t>(count);
  for (int h = 0; h < shape_.num_kv_heads; ++h) {
    const size_t k = e.k_at(h, cap, 0) * exact_elem_bytes_, v = e.v_at(h, cap, 0) * exact_elem_bytes_;
    std::memcpy(to + k, from + k, n * static_cast<size_t>(e.k_dim[static_cast<size_t>(h)]) * exact_elem_bytes_);
    std::memcpy(to + v, from + v, n * static_cast<size_t>(e.v_dim[static_cast<size_t>(h)]) * exact_elem_bytes_);
  }
}

void CpuPagedKvCache::quantize_pending(int seq_id, int layer, const KnownPages* known) {
  const int T = options_.block_tokens;
  LayerPages& lp = get(seq_id).layers[static_cast<size_t>(layer)];
  // The blocks that have left the recent window (the block manager's rule, the same on
  // every device); pending blocks are the full ones past the closed pages.
  const size_t closed = static_cast<size_t>(blocks_.closed_blocks(seq_id, layer));
  const size_t upto = static_cast<size_t>(blocks_.closable_blocks(seq_id, layer));
  const size_t done = upto > closed ? std::min(lp.pending.size(), upto - closed) : 0;
  if (done == 0) return;
  // Page ids come from the block manager first, then their memory from the pool; the
  // quantization of each block (a pure function of its tokens and position) may then run in
  // parallel. A decode step closes one block: the id list's capacity is kept per thread.
  thread_local std::vector<uint32_t> ids;
  blocks_.new_pages(layer, static_cast<int>(done), ids);
  thread_local std::vector<std::byte*> fresh_data;
  fresh_data.resize(done);
  std::byte** fresh = fresh_data.data();
  try {
    for (size_t i = 0; i < done; ++i) fresh[i] = pages_of(layer).map(ids[i]);
  } catch (...) {
    blocks_.free_pages(layer, ids);
    throw;
  }
  const int64_t first = options_.sinks + static_cast<int64_t>(closed) * T;
  // Known pages are looked up and checked here, on this thread, before anything changes.
  std::vector<const std::byte*> given;
  if (known != nullptr && *known) {
    given.assign(done, nullptr);
    const HackPageLayout& layout = layouts_[static_cast<size_t>(layer)];
    try {
      for (size_t i = 0; i < done; ++i) {
        const std::byte* page = (*known)(layer, static_cast<int>(closed + i));
        if (page == nullptr) continue;
        const int64_t at = first + static_cast<int64_t>(i) * T;
        layout.validate_at(page, layer, at);
        given[i] = page;
      }
    } catch (...) {
      blocks_.free_pages(layer, ids);
      throw;
    }
  }
  const auto quantize = [&](size_t b0, size_t b1) {
    for (size_t i = b0; i < b1; ++i) {
      if (!given.empty() && given[i] != nullptr) {
        std::memcpy(fresh[i], given[i], layouts_[static_cast<size_t>(layer)].page_bytes());
      } else {
        quantize_block(layer, lp.pending[i].data, first + static_cast<int64_t>(i) * T, fresh[i]);
      }
    }
  };
  try {
    if (quantize_pool_ != nullptr && done > 1 && quantize_pool_->size() > 1) {
      quantize_pool_->parallel_for_dynamic(done, 1, quantize);  // a late worker takes what is left
    } else {
      quantize(0, done);
    }
  } catch (...) {  // the blocks stay pending, the new pages go back
    blocks_.free_pages(layer, ids);
    throw;
  }
  blocks_.close_blocks(seq_id, layer, ids);
  for (size_t i = 0; i < done; ++i) open_pool_->release(lp.pending[i]);
  lp.pending.erase(lp.pending.begin(), lp.pending.begin() + static_cast<std::ptrdiff_t>(done));
}

void CpuPagedKvCache::quantize_block(int layer, const std::byte* block, int64_t first, std::byte* page) const {
  const size_t T = static_cast<size_t>(options_.block_tokens);
  const HackPageLayout& layout = layouts_[static_cast<size_t>(layer)];
  const ExactLayout& e = exact_[static_cast<size_t>(layer)];
  std::memset(page, 0, layout.page_bytes());  // padding too: pages are compared and hashed as bytes
  layout.write_header(page, layer, first, options_.rounding);
  const RoundingSpec spec{options_.rounding, options_.seed, layer, first};
  const uint16_t* exact = reinterpret_cast<const uint16_t*>(block);
  for (int h = 0; h < shape_.num_kv_heads; ++h) {
    quantize_k_block(layout, h, exact + e.k_at(h, T, 0), static_cast<size_t>(e.k_dim[static_cast<size_t>(h)]), spec, page);
    quantize_v_block(layout, h, exact + e.v_at(h, T, 0), static_cast<size_t>(e.v_dim[static_cast<size_t>(h)]), spec, page);
  }
}

void CpuPagedKvCache::peek_block_page(int seq_id, int layer, int block, std::byte* page) const {
  HACK_CHECK(options_.mode == KvMode::hack, "peek_block_page: cache is in fp mode");
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  const LayerPages& lp = get(seq_id).layers[static_cast<size_t>(layer)];
  const std::span<const uint32_t> closed = blocks_.pages(seq_id, layer);
  HACK_CHECK(block >= 0 && static_cast<size_t>(block) < closed.size() + lp.pending.size(),
             "peek_block_page: sequence {} layer {} has no full block {}", seq_id, layer, block);
  const HackPageLayout& layout = layouts_[static_cast<size_t>(layer)];
  if (static_cast<size_t>(block) < closed.size()) {
    std::memcpy(page, page_data(layer, closed[static_cast<size_t>(block)]), layout.page_bytes());
    return;
  }
  quantize_block(layer, lp.pending[static_cast<size_t>(block) - closed.size()].data,
                 options_.sinks + static_cast<int64_t>(block) * options_.block_tokens, page);
}

void CpuPagedKvCache::begin_prefill(int seq_id) { blocks_.begin_prefill(seq_id); }

void CpuPagedKvCache::end_prefill(int seq_id) {
  if (blocks_.end_prefill(seq_id)) close_pending_blocks(seq_id);
}

void CpuPagedKvCache::append(int layer, int seq_id, int start_pos, int n_tokens, const float* k, const float* v) {
  blocks_.check_append(seq_id, layer, start_pos, n_tokens);
  LayerPages& lp = get(seq_id).layers[static_cast<size_t>(layer)];
  const int T = options_.block_tokens;
  const size_t token_floats = static_cast<size_t>(shape_.num_kv_heads) * static_cast<size_t>(shape_.head_dim);
  if (options_.mode == KvMode::hack && n_tokens > 0 && !blocks_.prefilling(seq_id)) quantize_pending(seq_id, layer);
  if (KvAppendObserver* observer = blocks_.observer(seq_id); observer != nullptr && n_tokens > 0)
    observer->on_append(layer, start_pos, n_tokens, k, v);
  std::byte* fp_page = nullptr;  // fp: the page being written
  for (int i = 0; i < n_tokens; ++i) {
    const int pos = start_pos + i;
    const float* kt = k + static_cast<size_t>(i) * token_floats;
    const float* vt = v + static_cast<size_t>(i) * token_floats;
    if (options_.mode == KvMode::fp) {
      const int slot = pos % T;
      if (slot == 0) fp_page = pages_of(layer).map(blocks_.add_page(seq_id, layer));
      if (fp_page == nullptr) fp_page = pages_of(layer).data(blocks_.pages(seq_id, layer).back());
      write_exact(layer, fp_page, T, slot, kt, vt);
    } else if (pos < options_.sinks) {
      if (!lp.sink) lp.sink = sink_pool_->allocate();
      write_exact(layer, lp.sink.data, options_.sinks, pos, kt, vt);
    } else {
      const int rel = pos - options_.sinks, slot = rel % T;
      if (!lp.open) lp.open = open_pool_->allocate();
      write_exact(layer, lp.open.data, T, slot, kt, vt);
      if (slot == T - 1) {  // full: exact until an append finds it outside the recent window
        lp.pending.push_back(lp.open);
        lp.open = PageRef{};
      }
    }
  }
  blocks_.record_append(seq_id, layer, n_tokens);
}

CpuPagedKvCache::Segment CpuPagedKvCache::resolve(const CpuLayerView& view, const PlanSegment& s) const {
  const int T = options_.block_tokens;
  const LayerPages& lp = *view.exact;
  switch (s.slot) {
    case SegmentSlot::sinks:
      return {s.first_token, s.tokens, false, lp.sink.data, options_.sinks};
    case SegmentSlot::closed:
      return {s.first_token, s.tokens, options_.mode == KvMode::hack,
              page_data(lp.layer, view.pages[static_cast<size_t>(s.index)]), T};
    case SegmentSlot::pending:
      return {s.first_token, s.tokens, false, lp.pending[static_cast<size_t>(s.index)].data, T};
    case SegmentSlot::open:
      break;
  }
  return {s.first_token, s.tokens, false, lp.open.data, T};
}

cpu::ExactHeadView CpuPagedKvCache::exact_view(int layer, const Segment& seg, int kv_head) const {
  const ExactLayout& e = exact_[static_cast<size_t>(layer)];
  const size_t cap = static_cast<size_t>(seg.capacity);
  cpu::ExactHeadView view;
  view.bf16 = exact_elem_bytes_ == 2;
  view.tokens = seg.tokens;
  view.k_dim = e.k_dim[static_cast<size_t>(kv_head)];
  view.v_dim = e.v_dim[static_cast<size_t>(kv_head)];
  view.k = seg.data + e.k_at(kv_head, cap, 0) * exact_elem_bytes_;
  view.v = seg.data + e.v_at(kv_head, cap, 0) * exact_elem_bytes_;
  view.k_stride = static_cast<size_t>(view.k_dim);
  view.v_stride = static_cast<size_t>(view.v_dim);
  return view;
}

HackLayerBits CpuPagedKvCache::layer_bits(int layer) const {
  const HackPageLayout& l = layouts_.at(static_cast<size_t>(layer));
  return {l.k_bits(), l.v_bits()};
}

cpu::HackHeadView CpuPagedKvCache::hack_view(int layer, const std::byte* page, int kv_head) const {
  return hack_head_view(layouts_[static_cast<size_t>(layer)], page, kv_head);
}

size_t CpuPagedKvCache::work_floats() const {
  size_t w = cpu::exact_block_work_floats(std::max(options_.block_tokens, options_.sinks));
  for (const HackPageLayout& layout : layouts_)
    for (int h = 0; h < layout.num_heads(); ++h) {
      const HackHeadLayout& hl = layout.head(h);
      w = std::max(w, cpu::hack_block_work_floats(options_.block_tokens, hl.k_dim, hl.v_dim, hl.k_group, hl.v_group));
    }
  return align16(w);
}

size_t CpuPagedKvCache::attend_scratch_floats(int n_tokens, int) const {
  const size_t rows = static_cast<size_t>(std::max(1, n_tokens)) * static_cast<size_t>(shape_.group_size);
  const size_t d = static_cast<size_t>(shape_.head_dim);
  return align16(rows * d) * 2 + align16(rows) * 3 + work_floats() + 16;
}

void CpuPagedKvCache::attend_segments(const CpuLayerView& lv, std::span<const PlanSegment> segments, const int* selection,
                                   int seg_begin, int seg_end, int head_begin, int head_end, int start_pos,
                                   int n_tokens, const cpu::AttentionRows* rows, float* work) const {
  const int G = shape_.group_size;
  const LayerPages& lp = *lv.exact;
  auto segment = [&](int i) { return resolve(lv, segments[static_cast<size_t>(selection ? selection[i] : i)]); };
  // Segments are visited in position order and, inside one, every head in turn, so a page
  // is read front to back. The next segment is prefetched while this one computes: a HACK
  // kernel spreads prefetches of the next page's section of its head over its work; exact
  // segments get their first lines requested here.
  for (int i = seg_begin; i < seg_end; ++i) {
    const Segment seg = segment(i);
    const std::optional<Segment> next = i + 1 < seg_end ? std::optional<Segment>(segment(i + 1)) : std::nullopt;
    // Rows of tokens at positions >= seg.first_token see part of the segment.
    const int t0 = std::max(0, seg.first_token - start_pos);
    if (t0 >= n_tokens) continue;
    const size_t r0 = static_cast<size_t>(t0) * static_cast<size_t>(G);
    for (int h = head_begin; h < head_end; ++h) {
      const cpu::AttentionRows& rh = rows[h - head_begin];
      int* visible = const_cast<int*>(rh.visible);
      for (int t = t0; t < n_tokens; ++t) {
        const int vis = std::clamp(start_pos + t + 1 - seg.first_token, 0, seg.tokens);
        for (int g = 0; g < G; ++g) visible[t * G + g] = vis;
      }
      cpu::AttentionRows sub = rh;
      sub.n = rh.n - static_cast<int>(r0);
      sub.q = rh.q + r0 * static_cast<size_t>(rh.k_dim);
      sub.visible = rh.visible + r0;
      sub.max = rh.max + r0;
      sub.sum = rh.sum + r0;
      sub.acc = rh.acc + r0 * static_cast<size_t>(rh.v_dim);
      if (next && !next->quantized) {
        const cpu::ExactHeadView v = exact_view(lp.layer, *next, h);
        for (const void* base : {v.k, v.v})
          for (size_t off = 0; off < 1024; off += 64) _mm_prefetch(static_cast<const char*>(base) + off, _MM_HINT_T0);
      }
      if (seg.quantized) {
        cpu::HackHeadView view = hack_view(lp.layer, seg.data, h);
        if (next && next->quantized) {
          const HackHeadLayout& hl = layouts_[static_cast<size_t>(lp.layer)].head(h);
          view.prefetch = next->data + hl.offset;
          view.prefetch_bytes = hl.bytes;
        }
        if (options_.attention == HackAttention::dequantized) {
          attend_dequantized(lp.layer, seg.data, h, sub, work);
        } else {
          kernels_->hack_block(view, sub, work);
        }
      } else {
        kernels_->exact_block(exact_view(lp.layer, seg, h), sub, work);
      }
    }
  }
}

void CpuPagedKvCache::attend_dequantized(int layer, const std::byte* page, int kv_head, const cpu::AttentionRows& rows,
                                      float* work) const {
  const HackPageLayout& layout = layouts_[static_cast<size_t>(layer)];
  const HackHeadLayout& hl = layout.head(kv_head);
  const size_t T = static_cast<size_t>(options_.block_tokens);
  thread_local std::vector<float> kv;  // [Π][k_dim] K, then [Π][v_dim] V (ablation only)
  kv.resize(T * static_cast<size_t>(hl.k_dim + hl.v_dim));
  float* k = kv.data();
  float* v = k + T * static_cast<size_t>(hl.k_dim);
  dequantize_k_block(layout, kv_head, page, k);
  dequantize_v_block(layout, kv_head, page, v);
  cpu::ExactHeadView view;
  view.bf16 = false;
  view.tokens = options_.block_tokens;
  view.k_dim = hl.k_dim;
  view.v_dim = hl.v_dim;
  view.k = k;
  view.v = v;
  view.k_stride = static_cast<size_t>(hl.k_dim);
  view.v_stride = static_cast<size_t>(hl.v_dim);
  kernels_->exact_block(view, rows, work);
}

void CpuPagedKvCache::attend(int layer, int seq_id, int kv_head, int start_pos, int n_tokens, const float* q,
                          size_t q_row_stride, float* out, size_t out_row_stride, float scale, float* scratch) const {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers && kv_head >= 0 && kv_head < shape_.num_kv_heads,
             "attend: layer {} / KV head {} out of range", layer, kv_head);
  const std::span<const uint32_t> closed = blocks_.pages(seq_id, layer);
  const CpuLayerView view{&get(seq_id).layers[static_cast<size_t>(layer)], closed.data()};
  const int length = blocks_.length(seq_id, layer);
  HACK_CHECK(start_pos >= 0 && n_tokens > 0 && length >= start_pos + n_tokens,
             "sequence {} layer {}: attention over {} tokens but {} stored", seq_id, layer, start_pos + n_tokens,
             length);
  // A head's q and output occupy the first k_dim / v_dim entries of head_dim-wide slots.
  const int G = shape_.group_size, kd = shape_.k_dim(layer, kv_head), vd = shape_.v_dim(layer, kv_head);
  const size_t rows_n = static_cast<size_t>(n_tokens) * static_cast<size_t>(G), ud = static_cast<size_t>(shape_.head_dim);
  float* qs = scratch;
  float* acc = qs + align16(rows_n * ud);
  int* visible = reinterpret_cast<int*>(acc + align16(rows_n * ud));
  float* mx = reinterpret_cast<float*>(visible) + align16(rows_n);
  float* sum = mx + align16(rows_n);
  float* work = sum + align16(rows_n);
  for (int t = 0; t < n_tokens; ++t)
    for (int g = 0; g < G; ++g) {
      const float* src = q + static_cast<size_t>(t) * q_row_stride + static_cast<size_t>(g) * ud;
      float* dst = qs + (static_cast<size_t>(t) * static_cast<size_t>(G) + static_cast<size_t>(g)) * static_cast<size_t>(kd);
      for (int c = 0; c < kd; ++c) dst[c] = src[c] * scale;
    }
  const cpu::AttentionRows rows{static_cast<int>(rows_n), kd, vd, qs, visible, mx, sum, acc};
  cpu::attention_rows_reset(rows);
  std::vector<PlanSegment> segments;  // the reference path may allocate
  blocks_.list_segments(start_pos + n_tokens, static_cast<int>(closed.size()), segments);
  attend_segments(view, segments, nullptr, 0, static_cast<int>(segments.size()), kv_head, kv_head + 1, start_pos, n_tokens,
                  &rows, work);
  for (int t = 0; t < n_tokens; ++t) {
    cpu::AttentionRows tr = rows;
    tr.n = G;
    tr.max = mx + static_cast<size_t>(t) * static_cast<size_t>(G);
    tr.sum = sum + static_cast<size_t>(t) * static_cast<size_t>(G);
    tr.acc = acc + static_cast<size_t>(t) * static_cast<size_t>(G) * static_cast<size_t>(vd);
    float* dst = out + static_cast<size_t>(t) * out_row_stride;
    cpu::attention_rows_finish(tr, dst, ud);
    for (int g = 0; g < G; ++g) std::fill(dst + static_cast<size_t>(g) * ud + static_cast<size_t>(vd), dst + (static_cast<size_t>(g) + 1) * ud, 0.0f);
  }
}

// What the tasks of one run() share.
struct CpuPagedKvCache::RunContext {
  const AttentionPlan& plan;
  const AttentionWorkspace& ws;
  const float* q;
  size_t q_stride;
  float* out;
  size_t out_stride;
  float scale;
  int v_dim;         // plan.state_v_dim: the layout of the softmax states
  float* states;     // plan.state_floats
  int layer;
};

cpu::AttentionRows CpuPagedKvCache::task_rows(const RunContext& c, const PlanTask& t, int head, const float* qs) const {
  const int n = t.n_rows * shape_.group_size;
  const size_t un = static_cast<size_t>(n);
  float* st = c.states + t.state + static_cast<size_t>(head - t.head_begin) * plan_head_state_floats(n, c.v_dim);
  return cpu::AttentionRows{n, shape_.k_dim(c.layer, head), shape_.v_dim(c.layer, head), qs,
                            reinterpret_cast<int*>(st + 2 * un), st, st + un, st + align16(3 * un)};
}

void CpuPagedKvCache::finish_rows(const RunContext& c, const PlanTask& t, const cpu::AttentionRows& rows, int head) const {
  const PlanItem& it = c.plan.items[static_cast<size_t>(t.item)];
  const size_t G = static_cast<size_t>(shape_.group_size), d = static_cast<size_t>(shape_.head_dim);
  for (int r = 0; r < t.n_rows; ++r) {
    cpu::AttentionRows tr = rows;  // the G query rows of token r
    const size_t at = static_cast<size_t>(r) * G;
    tr.n = shape_.group_size;
    tr.max = rows.max + at;
    tr.sum = rows.sum + at;
    tr.acc = rows.acc + at * static_cast<size_t>(rows.v_dim);
    float* dst = c.out + static_cast<size_t>(it.row + t.row_begin + r) * c.out_stride + static_cast<size_t>(head) * G * d;
    cpu::attention_rows_finish(tr, dst, d);
    // FDC: the head's output is its first v_dim entries; the rest of the slot is 0.
    if (static_cast<size_t>(rows.v_dim) < d)
      for (size_t g = 0; g < G; ++g) std::fill(dst + g * d + static_cast<size_t>(rows.v_dim), dst + (g + 1) * d, 0.0f);
  }
}

namespace {

// Tasks that differ only in their segment range (the splits of one unit) are merged.
bool same_unit(const PlanTask& a, const PlanTask& b) {
  return a.item == b.item && a.head_begin == b.head_begin && a.row_begin == b.row_begin;
}

}  // namespace

void CpuPagedKvCache::run_task(const RunContext& c, size_t index, float* qs, float* work) const {
  const AttentionPlan& p = c.plan;
  const PlanTask& t = p.tasks[index];
  const PlanItem& it = p.items[static_cast<size_t>(t.item)];
  const CpuLayerView& lp = c.ws.layers[static_cast<size_t>(t.item)];
  const std::span<const int> sel = p.selection_of(t.item, t.head_begin);
  const int* selection = t.head_end - t.head_begin == 1 && !sel.empty() ? sel.data() : nullptr;
  const bool alone = (index == 0 || !same_unit(p.tasks[index - 1], t)) &&
                     (index + 1 == p.tasks.size() || !same_unit(t, p.tasks[index + 1]));
  const size_t G = static_cast<size_t>(shape_.group_size), d = static_cast<size_t>(shape_.head_dim);
  cpu::AttentionRows rows[kMaxDecodeHeads];
  // Heads in groups of kMaxDecodeHeads (all of them for usual models).
  for (int h0 = t.head_begin; h0 < t.head_end; h0 += kMaxDecodeHeads) {
    const int h1 = std::min(t.head_end, h0 + kMaxDecodeHeads);
    for (int h = h0; h < h1; ++h) {
      // Scaled q of head h's rows: [n_rows][G][d], from the batch rows of the item.
      // (FDC: a head's q is the first k_dim entries of each head_dim slot.)
      const size_t kd = static_cast<size_t>(shape_.k_dim(c.layer, h));
      float* qh = qs + static_cast<size_t>(h - h0) * static_cast<size_t>(t.n_rows) * G * d;
      for (int r = 0; r < t.n_rows; ++r) {
        const float* src = c.q + static_cast<size_t>(it.row + t.row_begin + r) * c.q_stride + static_cast<size_t>(h) * G * d;
        float* dst = qh + static_cast<size_t>(r) * G * kd;
        for (size_t g = 0; g < G; ++g)
          for (size_t i = 0; i < kd; ++i) dst[g * kd + i] = src[g * d + i] * c.scale;
      }
      rows[h - h0] = task_rows(c, t, h, qh);
      cpu::attention_rows_reset(rows[h - h0]);
    }
    attend_segments(lp, p.segments_of(t.item), selection, t.seg_begin, t.seg_end, h0, h1, it.start_pos + t.row_begin,
                    t.n_rows, rows, work);
    if (alone)  // no split to merge: write the output now, in this thread
      for (int h = h0; h < h1; ++h) finish_rows(c, t, rows[h - h0], h);
  }
}

void CpuPagedKvCache::merge_splits(const RunContext& c) const {
  const std::vector<PlanTask>& tasks = c.plan.tasks;
  for (size_t t = 0; t < tasks.size();) {
    size_t u = t + 1;
    while (u < tasks.size() && same_unit(tasks[t], tasks[u])) ++u;
    if (u - t > 1) {
      for (int h = tasks[t].head_begin; h < tasks[t].head_end; ++h) {
        const cpu::AttentionRows dst = task_rows(c, tasks[t], h, nullptr);
        for (size_t v = t + 1; v < u; ++v) cpu::attention_rows_merge(dst, task_rows(c, tasks[v], h, nullptr));
        finish_rows(c, tasks[t], dst, h);
      }
    }
    t = u;
  }
}

void CpuPagedKvCache::run(const AttentionPlan& plan, int layer, const float* q, size_t q_stride, float* out,
                       size_t out_stride, float scale, ThreadPool& pool, AttentionWorkspace& ws) const {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  HACK_CHECK(plan.num_kv_heads == shape_.num_kv_heads && plan.group_size == shape_.group_size,
             "attention plan for {} KV heads × {} does not fit the cache's {} × {}", plan.num_kv_heads, plan.group_size,
             shape_.num_kv_heads, shape_.group_size);
  if (plan.tasks.empty()) return;
  // The plan was made before the step's appends; check this layer now holds what it says.
  ws.layers.resize(plan.items.size());
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const PlanItem& it = plan.items[i];
    const int length = blocks_.length(it.seq_id, layer);
    const std::span<const uint32_t> closed = blocks_.pages(it.seq_id, layer);
    HACK_CHECK(length == it.start_pos + it.n_tokens &&
                   (options_.mode == KvMode::fp || static_cast<int>(closed.size()) == it.closed_pages),
               "sequence {} layer {}: holds {} tokens in {} closed pages, the step's plan expects {} in {}", it.seq_id,
               layer, length, closed.size(), it.start_pos + it.n_tokens, it.closed_pages);
    ws.layers[i] = {&get(it.seq_id).layers[static_cast<size_t>(layer)], closed.data()};
  }
  // Workspace: the plan's softmax states, then per thread the scaled q of a task and the
  // kernels' work area.
  const size_t q_floats = align16(static_cast<size_t>(plan.max_task_rows) * static_cast<size_t>(shape_.head_dim));
  const size_t thread_floats = q_floats + work_floats();
  const size_t need = plan.state_floats + static_cast<size_t>(pool.size()) * thread_floats + 16;
  if (ws.floats.size() < need) ws.floats.resize(need);
  const RunContext c{plan, ws, q, q_stride, out, out_stride, scale, plan.state_v_dim, ws.floats.data(), layer};
  float* threads_base = ws.floats.data() + plan.state_floats;
  // Workers take the layer's tasks in the plan's order (longest first when balanced).
  const size_t T = plan.tasks.size();
  const int* order = plan.order.size() >= static_cast<size_t>(layer + 1) * T ? plan.order.data() + static_cast<size_t>(layer) * T
                                                                             : nullptr;
  std::atomic<size_t> next{0};
  pool.run([&](int thread, int) {
    float* qs = threads_base + static_cast<size_t>(thread) * thread_floats;
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < T; i = next.fetch_add(1, std::memory_order_relaxed))
      run_task(c, order != nullptr ? static_cast<size_t>(order[i]) : i, qs, qs + q_floats);
  });
  merge_splits(c);
}

void CpuPagedKvCache::set_select_options(const PageSelectOptions& select) {
  check_select(select, options_.mode);
  options_.select = select;
  blocks_.set_options(options_);
}

void CpuPagedKvCache::fork_sequence(int src_seq, int dst_seq, int n_tokens, int max_tokens) {
  const Sequence& src = get(src_seq);
  // The block manager checks the cut, reserves dst, records its lengths and closed blocks
  // (the closed ones among the first n_tokens) and shares their page ids; the exact pages
  // follow that here.
  blocks_.fork_sequence(src_seq, dst_seq, n_tokens, max_tokens);
  add_pages(dst_seq);
  const int T = options_.block_tokens, S = options_.mode == KvMode::hack ? options_.sinks : 0;
  const int blocks = blocks_.full_blocks(n_tokens);
  const int tail = std::max(0, n_tokens - S - blocks * T);  // tokens of the partly filled block
  Sequence& dst = get(dst_seq);
  for (size_t l = 0; l < src.layers.size(); ++l) {
    const LayerPages& from = src.layers[l];
    LayerPages& to = dst.layers[l];
    const int layer = from.layer;
    if (options_.mode == KvMode::fp) {  // the full pages are shared; the tail's page is dst's own
      if (tail > 0)
        copy_exact_page(layer, page_data(layer, blocks_.pages(src_seq, layer)[static_cast<size_t>(blocks)]),
                        pages_of(layer).map(blocks_.pages(dst_seq, layer).back()), T, tail);
      continue;
    }
    if (S > 0 && n_tokens > 0) {
      if (n_tokens >= S) {  // complete sinks are never written again
        sink_pool_->retain(from.sink);
        to.sink = from.sink;
      } else {
        to.sink = sink_pool_->allocate();
        copy_exact_page(from.layer, from.sink.data, to.sink.data, S, n_tokens);
      }
    }
    // Full blocks: quantized ones are shared as HACK pages (by the block manager), pending
    // ones shared as pending.
    const size_t quantized = blocks_.pages(src_seq, layer).size();
    for (int i = static_cast<int>(quantized); i < blocks; ++i) {
      const PageRef p = from.pending[static_cast<size_t>(i) - quantized];
      open_pool_->retain(p);
      to.pending.push_back(p);
    }
    if (tail > 0) {
      const size_t b = static_cast<size_t>(blocks) - quantized;  // exact block holding the tail
      const PageRef block = b < from.pending.size() ? from.pending[b] : from.open;
      to.open = open_pool_->allocate();
      copy_exact_page(from.layer, block.data, to.open.data, T, tail);
    }
  }
}

void CpuPagedKvCache::close_pending_blocks(int seq_id) {
  if (options_.mode != KvMode::hack) return;
  for (int l = 0; l < shape_.num_layers; ++l) quantize_pending(seq_id, l);
}

void CpuPagedKvCache::close_pending_blocks(int seq_id, int layer) {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  if (options_.mode != KvMode::hack) return;
  quantize_pending(seq_id, layer);
}

void CpuPagedKvCache::close_pending_blocks(int seq_id, int layer, const KnownPages& known) {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  if (options_.mode != KvMode::hack) return;
  quantize_pending(seq_id, layer, &known);
}

DType CpuPagedKvCache::exact_dtype() const { return options_.mode == KvMode::fp ? options_.fp_dtype : DType::bf16; }

const std::byte* CpuPagedKvCache::exact_location(const LayerPages& lp, int seq_id, int layer, int pos, int& slot,
                                              int& capacity) const {
  const int length = blocks_.length(seq_id, layer);
  HACK_CHECK(pos >= 0 && pos < length, "sequence {} layer {}: token {} is not stored ({} tokens)", seq_id, layer, pos,
             length);
  const int T = options_.block_tokens;
  const std::span<const uint32_t> closed = blocks_.pages(seq_id, layer);
  if (options_.mode == KvMode::fp) {
    slot = pos % T;
    capacity = T;
    return page_data(layer, closed[static_cast<size_t>(pos / T)]);
  }
  const int S = options_.sinks;
  if (pos < S) {
    slot = pos;
    capacity = S;
    return lp.sink.data;
  }
  const size_t block = static_cast<size_t>((pos - S) / T);
  HACK_CHECK(block >= closed.size(), "sequence {} layer {}: token {} lies in a quantized block", seq_id, layer, pos);
  const size_t b = block - closed.size();
  slot = (pos - S) % T;
  capacity = T;
  return b < lp.pending.size() ? lp.pending[b].data : lp.open.data;
}

void CpuPagedKvCache::copy_exact_tokens(int seq_id, int layer, int first_token, int n_tokens, std::byte* k,
                                     std::byte* v) const {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  HACK_CHECK(n_tokens >= 0, "copy_exact_tokens: negative token count {}", n_tokens);
  const LayerPages& lp = get(seq_id).layers[static_cast<size_t>(layer)];
  const size_t H = static_cast<size_t>(shape_.num_kv_heads), d = static_cast<size_t>(shape_.head_dim);
  const size_t row_bytes = d * exact_elem_bytes_, elem = exact_elem_bytes_;
  const ExactLayout& e = exact_[static_cast<size_t>(layer)];
  // Check the whole range first so nothing is written for a bad one.
  for (int i = 0; i < n_tokens; ++i) {
    int slot = 0, capacity = 0;
    exact_location(lp, seq_id, layer, first_token + i, slot, capacity);
  }
  for (int i = 0; i < n_tokens; ++i) {
    int slot = 0, capacity = 0;
    const std::byte* base = exact_location(lp, seq_id, layer, first_token + i, slot, capacity);
    const size_t cap = static_cast<size_t>(capacity);
    for (size_t h = 0; h < H; ++h) {  // a compressed head fills the start of its slot, 0 after
      const int hi = static_cast<int>(h);
      const size_t kb = static_cast<size_t>(e.k_dim[h]) * elem, vb = static_cast<size_t>(e.v_dim[h]) * elem;
      const size_t dst = (static_cast<size_t>(i) * H + h) * row_bytes;
      std::memcpy(k + dst, base + e.k_at(hi, cap, static_cast<size_t>(slot)) * elem, kb);
      std::memset(k + dst + kb, 0, row_bytes - kb);
      if (v == nullptr) continue;
      std::memcpy(v + dst, base + e.v_at(hi, cap, static_cast<size_t>(slot)) * elem, vb);
      std::memset(v + dst + vb, 0, row_bytes - vb);
    }
  }
}

void CpuPagedKvCache::keep_tokens(int seq_id, int layer, const std::vector<int>& kept) {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  LayerPages& lp = get(seq_id).layers[static_cast<size_t>(layer)];
  HACK_CHECK(options_.mode == KvMode::fp || (blocks_.prefilling(seq_id) && blocks_.pages(seq_id, layer).empty()),
             "sequence {} layer {}: tokens can be evicted only inside its prefill, before any block is quantized",
             seq_id, layer);
  std::vector<float> k, v;
  read_kept_tokens(seq_id, layer, kept, k, v);
  for (PageRef p : lp.pending) open_pool_->release(p);
  lp.pending.clear();
  if (lp.open) open_pool_->release(lp.open);
  if (lp.sink) sink_pool_->release(lp.sink);
  lp.open = lp.sink = PageRef{};
  blocks_.set_layer(seq_id, layer, 0, 0);  // gives the closed pages back
  KvAppendObserver* observer = blocks_.observer(seq_id);  // it saw these tokens once already
  blocks_.set_observer(seq_id, nullptr);
  append(layer, seq_id, 0, static_cast<int>(kept.size()), k.data(), v.data());
  blocks_.set_observer(seq_id, observer);
}

double CpuPagedKvCache::bytes_per_token() const { return kv_bytes_per_token(shape_, options_); }

size_t CpuPagedKvCache::attend_bytes(int seq_id, int layer) const {
  const size_t exact_token = exact_[static_cast<size_t>(layer)].token_elems * exact_elem_bytes_;
  std::vector<PlanSegment> segments;
  blocks_.list_segments(blocks_.length(seq_id, layer), blocks_.closed_blocks(seq_id, layer), segments);
  size_t bytes = 0;
  for (const PlanSegment& s : segments)
    bytes += s.slot == SegmentSlot::closed && options_.mode == KvMode::hack ? pages_of(layer).page_bytes()
                                                                            : static_cast<size_t>(s.tokens) * exact_token;
  return bytes;
}

std::span<const uint32_t> CpuPagedKvCache::hack_pages(int seq_id, int layer) const {
  HACK_CHECK(options_.mode == KvMode::hack, "hack_pages: cache is in fp mode");
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "hack_pages: layer {} out of range", layer);
  return blocks_.pages(seq_id, layer);
}

std::span<const std::byte> CpuPagedKvCache::hack_page(int seq_id, int layer, int index) const {
  const std::span<const uint32_t> ids = hack_pages(seq_id, layer);
  HACK_CHECK(index >= 0 && index < static_cast<int>(ids.size()), "hack_page: no page {}", index);
  return {page_data(layer, ids[static_cast<size_t>(index)]), pages_of(layer).page_bytes()};
}

std::span<const std::byte> CpuPagedKvCache::host_hack_page(int seq_id, int layer, int index) const {
  return hack_page(seq_id, layer, index);
}

void CpuPagedKvCache::read_hack_page(int seq_id, int layer, int index, std::byte* page) const {
  const std::span<const std::byte> bytes = hack_page(seq_id, layer, index);
  std::memcpy(page, bytes.data(), bytes.size());
}

int CpuPagedKvCache::page_ref_count(int seq_id, int layer, int index) const {
  return blocks_.page_ref_count(seq_id, layer, index);
}

void CpuPagedKvCache::set_append_observer(int seq_id, KvAppendObserver* observer) { blocks_.set_observer(seq_id, observer); }

void CpuPagedKvCache::append_hack_page(int layer, int seq_id, const void* bytes, size_t size) {
  HACK_CHECK(options_.mode == KvMode::hack, "append_hack_page: cache is in fp mode");
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  layouts_[static_cast<size_t>(layer)].validate(bytes, size);
  const LayerPages& lp = get(seq_id).layers[static_cast<size_t>(layer)];
  const int length = blocks_.length(seq_id, layer);
  const int64_t expected = options_.sinks + static_cast<int64_t>(blocks_.closed_blocks(seq_id, layer)) * options_.block_tokens;
  HACK_CHECK(length == expected && lp.pending.empty(), "append_hack_page: sequence {} layer {} holds {} tokens, a block starts at {}",
             seq_id, layer, length, expected);
  HACK_CHECK(HackPageLayout::page_layer(bytes) == layer && HackPageLayout::page_first_token(bytes) == expected,
             "append_hack_page: page is layer {} token {}, expected layer {} token {}", HackPageLayout::page_layer(bytes),
             HackPageLayout::page_first_token(bytes), layer, expected);
  blocks_.check_append(seq_id, layer, length, options_.block_tokens);
  thread_local std::vector<uint32_t> id;
  blocks_.new_pages(layer, 1, id);
  try {
    std::memcpy(pages_of(layer).map(id[0]), bytes, size);
  } catch (...) {
    blocks_.free_pages(layer, id);
    throw;
  }
  blocks_.record_append(seq_id, layer, options_.block_tokens);
  blocks_.close_blocks(seq_id, layer, id);
}

KvCacheStats CpuPagedKvCache::stats() const {
  KvCacheStats st;
  st.sequences = blocks_.sequence_count();
  st.tokens = blocks_.token_count();
  for (const auto& p : block_pools_) {
    st.bytes_used += p->bytes_in_use();
    st.bytes_pooled += p->bytes_reserved();
  }
  for (const PagePool* p : {open_pool_.get(), sink_pool_.get()}) {
    if (p == nullptr) continue;
    st.bytes_used += p->bytes_in_use();
    st.bytes_pooled += p->bytes_reserved();
  }
  st.bytes_capacity = blocks_.capacity_bytes();
  st.bytes_reserved = blocks_.reserved_bytes();
  return st;
}

size_t CpuPagedKvCache::release_free_slabs() {
  size_t released = 0;
  for (const auto& p : block_pools_) released += p->release_free_slabs();
  for (PagePool* p : {open_pool_.get(), sink_pool_.get()}) {
    if (p != nullptr) released += p->release_free_slabs();
  }
  return released;
}

std::unique_ptr<CpuPagedKvCache> make_paged_kv_cache(const KvShape& shape, const KvCacheOptions& options) {
  return std::make_unique<CpuPagedKvCache>(shape, options);
}

}  // namespace hack
