#include "hack/kv/paged_kv_cache.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "hack/core/error.h"

namespace hack {

namespace {

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

}  // namespace

KvMode parse_kv_mode(std::string_view name) {
  if (name == "fp") return KvMode::fp;
  if (name == "hack") return KvMode::hack;
  fail("--kv must be fp or hack, got '{}'", name);
}

Rounding parse_rounding(std::string_view name) {
  if (name == "nearest") return Rounding::nearest;
  if (name == "stochastic") return Rounding::stochastic;
  fail("--hack-rounding must be nearest or stochastic, got '{}'", name);
}

std::string_view hack_attention_name(HackAttention attention) {
  return attention == HackAttention::homomorphic ? "homomorphic" : "dequantized";
}

std::string_view kv_mode_name(KvMode mode) { return mode == KvMode::fp ? "fp" : "hack"; }
std::string_view rounding_name(Rounding rounding) { return rounding == Rounding::nearest ? "nearest" : "stochastic"; }

std::string describe(const KvCacheOptions& o) {
  if (o.mode == KvMode::fp) return fmt::format("fp {} block={}", dtype_name(o.fp_dtype), o.block_tokens);
  std::string s;
  if (o.layer_bits.empty()) {
    s = fmt::format("hack k{}v{}", o.k_bits, o.v_bits);
  } else {  // "hack layers[k4v2 x10, k2v2 x20]": how many layers have each width
    std::vector<std::pair<HackLayerBits, int>> counts;
    for (const HackLayerBits& b : o.layer_bits) {
      auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == b; });
      if (it == counts.end()) counts.push_back({b, 1});
      else ++it->second;
    }
    s = "hack layers[";
    for (size_t i = 0; i < counts.size(); ++i)
      s += fmt::format("{}k{}v{} x{}", i ? ", " : "", counts[i].first.k_bits, counts[i].first.v_bits, counts[i].second);
    s += "]";
  }
  s += fmt::format(" block={} sinks={} {}", o.block_tokens, o.sinks, rounding_name(o.rounding));
  if (o.rounding == Rounding::stochastic) s += fmt::format(" seed={}", o.seed);
  if (o.recent_tokens > 0) s += fmt::format(" recent={}", o.recent_tokens);
  if (!o.exact_prefill) s += " quantized-prefill";
  if (o.attention != HackAttention::homomorphic) s += fmt::format(" {}", hack_attention_name(o.attention));
  return s;
}

PagedKvCache::PagedKvCache(const KvShape& shape, const KvCacheOptions& options)
    : shape_(shape),
      options_(options),
      kernels_(&cpu::hack_attention_kernels(options.isa.value_or(cpu_isa()))),
      budget_(options.capacity_bytes) {
  HACK_CHECK(shape.num_layers > 0 && shape.num_kv_heads > 0 && shape.head_dim > 0 && shape.group_size > 0,
             "paged KV cache: invalid shape ({} layers, {} KV heads, head_dim {}, group {})", shape.num_layers,
             shape.num_kv_heads, shape.head_dim, shape.group_size);
  HACK_CHECK(options.block_tokens >= 16 && options.block_tokens % 16 == 0 && options.block_tokens <= 4096,
             "--hack-block must be a multiple of 16 in [16, 4096], got {}", options.block_tokens);
  const size_t H = static_cast<size_t>(shape.num_kv_heads), d = static_cast<size_t>(shape.head_dim);
  const size_t T = static_cast<size_t>(options.block_tokens);
  if (options.mode == KvMode::fp) {
    HACK_CHECK(options.fp_dtype == DType::bf16 || options.fp_dtype == DType::f32,
               "paged KV cache: fp pages hold bf16 or f32, not {}", dtype_name(options.fp_dtype));
    exact_elem_bytes_ = dtype_size(options.fp_dtype);
    block_pools_.push_back(std::make_unique<PagePool>(2 * H * T * d * exact_elem_bytes_));
    layer_pool_.assign(static_cast<size_t>(shape.num_layers), block_pools_.front().get());
    return;
  }
  HACK_CHECK(options.sinks >= 0 && options.sinks <= 1024, "--hack-sinks must be in [0, 1024], got {}", options.sinks);
  HACK_CHECK(options.recent_tokens >= 0 && options.recent_tokens <= 65536,
             "--hack-recent must be in [0, 65536], got {}", options.recent_tokens);
  HACK_CHECK(shape.head_dim % 16 == 0, "--kv hack needs head_dim a multiple of 16, got {}", shape.head_dim);
  HACK_CHECK(options.layer_bits.empty() || static_cast<int>(options.layer_bits.size()) == shape.num_layers,
             "HACK bit allocation: {} layers given, the model has {}", options.layer_bits.size(), shape.num_layers);
  for (int l = 0; l < shape.num_layers; ++l) {
    HackPageParams params;
    const HackLayerBits bits =
        options.layer_bits.empty() ? HackLayerBits{options.k_bits, options.v_bits} : options.layer_bits[static_cast<size_t>(l)];
    params.k_bits = bits.k_bits;
    params.v_bits = bits.v_bits;
    params.block_tokens = options.block_tokens;
    params.k_group = options.k_group;
    params.v_group = options.v_group;
    params.heads.assign(H, HackHeadDims{shape.head_dim, shape.head_dim});
    layouts_.emplace_back(params);
    // Layers of the same page size share a pool.
    PagePool* pool = nullptr;
    for (const auto& p : block_pools_)
      if (p->page_bytes() == layouts_.back().page_bytes()) pool = p.get();
    if (pool == nullptr) {
      block_pools_.push_back(std::make_unique<PagePool>(layouts_.back().page_bytes()));
      pool = block_pools_.back().get();
    }
    layer_pool_.push_back(pool);
  }
  exact_elem_bytes_ = 2;
  open_pool_ = std::make_unique<PagePool>(2 * H * T * d * 2);
  if (options.sinks > 0) sink_pool_ = std::make_unique<PagePool>(2 * H * static_cast<size_t>(options.sinks) * d * 2);
}

PagedKvCache::~PagedKvCache() {
  for (auto& [id, s] : sequences_) release_pages(*s);
}

std::string PagedKvCache::name() const {
  if (options_.mode == KvMode::hack && !options_.layer_bits.empty()) return "hack-per-layer";
  if (options_.mode == KvMode::hack)
    return options_.k_bits == options_.v_bits ? fmt::format("hack-{}bit", options_.k_bits)
                                              : fmt::format("hack-k{}v{}", options_.k_bits, options_.v_bits);
  return options_.fp_dtype == DType::f32 ? "fp32-paged" : "bf16-paged";
}

PagedKvCache::Sequence& PagedKvCache::get(int seq_id) {
  auto it = sequences_.find(seq_id);
  HACK_CHECK(it != sequences_.end(), "unknown sequence {}", seq_id);
  return *it->second;
}

const PagedKvCache::Sequence& PagedKvCache::get(int seq_id) const {
  auto it = sequences_.find(seq_id);
  HACK_CHECK(it != sequences_.end(), "unknown sequence {}", seq_id);
  return *it->second;
}

int PagedKvCache::full_blocks(int length) const {
  if (options_.mode == KvMode::fp) return length / options_.block_tokens;
  return std::max(0, length - options_.sinks) / options_.block_tokens;
}

size_t PagedKvCache::reserve_bytes_for(int max_tokens) const {
  const int T = options_.block_tokens;
  size_t per_layer;
  if (options_.mode == KvMode::fp) {
    per_layer = static_cast<size_t>((max_tokens + T - 1) / T) * block_pools_.front()->page_bytes();
    return per_layer * static_cast<size_t>(shape_.num_layers);
  }
  size_t total = 0;
  for (int l = 0; l < shape_.num_layers; ++l) {
    // The recent window's full blocks are held as bf16 pages instead of HACK pages.
    const int blocks = full_blocks(max_tokens);
    const int window = std::min(blocks, (options_.recent_tokens + T - 1) / T);
    per_layer = static_cast<size_t>(blocks - window) * pages_of(l).page_bytes() +
                static_cast<size_t>(window) * open_pool_->page_bytes();
    if (max_tokens > options_.sinks) per_layer += open_pool_->page_bytes();
    if (sink_pool_) per_layer += sink_pool_->page_bytes();
    total += per_layer;
  }
  return total;
}

void PagedKvCache::add_sequence(int seq_id, int max_tokens) {
  HACK_CHECK(!sequences_.contains(seq_id), "sequence {} already exists", seq_id);
  HACK_CHECK(max_tokens > 0, "sequence {}: max_tokens must be positive, got {}", seq_id, max_tokens);
  const size_t bytes = reserve_bytes_for(max_tokens);
  HACK_CHECK(budget_.try_reserve(bytes),
             "sequence {}: {} tokens need {} KV bytes, {} of {} are committed", seq_id, max_tokens, bytes,
             budget_.reserved(), budget_.capacity());
  auto s = std::make_unique<Sequence>();
  s->max_tokens = max_tokens;
  s->reserved_bytes = bytes;
  s->layers.resize(static_cast<size_t>(shape_.num_layers));
  const int max_pages = (max_tokens + options_.block_tokens - 1) / options_.block_tokens + 1;
  for (size_t l = 0; l < s->layers.size(); ++l) {  // no reallocation on the decode path
    LayerPages& lp = s->layers[l];
    lp.layer = static_cast<int>(l);
    lp.pages.reserve(static_cast<size_t>(max_pages));
    lp.pending.reserve(static_cast<size_t>(2 + (options_.recent_tokens + options_.block_tokens - 1) / options_.block_tokens));
  }
  sequences_.emplace(seq_id, std::move(s));
}

bool PagedKvCache::try_extend_sequence(int seq_id, int max_tokens) {
  Sequence& s = get(seq_id);
  if (max_tokens <= s.max_tokens) return true;
  const size_t bytes = reserve_bytes_for(max_tokens);
  if (bytes > s.reserved_bytes && !budget_.try_reserve(bytes - s.reserved_bytes)) return false;
  if (bytes > s.reserved_bytes) s.reserved_bytes = bytes;
  s.max_tokens = max_tokens;
  const size_t max_pages = static_cast<size_t>((max_tokens + options_.block_tokens - 1) / options_.block_tokens + 1);
  for (auto& lp : s.layers) lp.pages.reserve(max_pages);
  return true;
}

void PagedKvCache::release_pages(Sequence& s) {
  for (auto& lp : s.layers) {
    for (PageRef p : lp.pages) pages_of(lp.layer).release(p);
    lp.pages.clear();
    for (PageRef p : lp.pending) open_pool_->release(p);
    lp.pending.clear();
    if (lp.open) open_pool_->release(lp.open);
    if (lp.sink) sink_pool_->release(lp.sink);
    lp.open = lp.sink = PageRef{};
  }
}

void PagedKvCache::remove_sequence(int seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return;
  release_pages(*it->second);
  budget_.release(it->second->reserved_bytes);
  sequences_.erase(it);
}

bool PagedKvCache::has_sequence(int seq_id) const { return sequences_.contains(seq_id); }

int PagedKvCache::length(int seq_id, int layer) const {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  return get(seq_id).layers[static_cast<size_t>(layer)].length;
}

namespace {

// Writes one token's K or V ([heads][d] f32) into an exact page region of `capacity`
// tokens per head ([heads][capacity][d]) at `slot`.
void write_exact(std::byte* region, size_t elem_bytes, int heads, int capacity, int d, int slot, const float* x) {
  for (int h = 0; h < heads; ++h) {
    const float* src = x + static_cast<size_t>(h) * static_cast<size_t>(d);
    const size_t at = (static_cast<size_t>(h) * static_cast<size_t>(capacity) + static_cast<size_t>(slot)) *
                      static_cast<size_t>(d);
    if (elem_bytes == 4) {
      std::memcpy(reinterpret_cast<float*>(region) + at, src, static_cast<size_t>(d) * 4);
    } else {
      uint16_t* dst = reinterpret_cast<uint16_t*>(region) + at;
      for (int c = 0; c < d; ++c) dst[c] = f32_to_bf16(src[c]);
    }
  }
}

}  // namespace

void PagedKvCache::quantize_pending(int layer, LayerPages& lp) {
  const int T = options_.block_tokens, d = shape_.head_dim, H = shape_.num_kv_heads;
  size_t done = 0;
  for (; done < lp.pending.size(); ++done) {
    const int block_end = options_.sinks + static_cast<int>(lp.pages.size() + 1) * T;
    if (block_end > lp.length - options_.recent_tokens) break;  // still inside the recent window
    const PageRef block = lp.pending[done];
    const PageRef page = pages_of(layer).allocate();
    quantize_block(layer, block.data, options_.sinks + static_cast<int64_t>(lp.pages.size()) * T, page.data);
    lp.pages.push_back(page);
    open_pool_->release(block);
  }
  lp.pending.erase(lp.pending.begin(), lp.pending.begin() + static_cast<std::ptrdiff_t>(done));
}

void PagedKvCache::quantize_block(int layer, const std::byte* block, int64_t first, std::byte* page) const {
  const int T = options_.block_tokens, d = shape_.head_dim, H = shape_.num_kv_heads;
  const HackPageLayout& layout = layouts_[static_cast<size_t>(layer)];
  std::memset(page, 0, layout.page_bytes());  // padding too: pages are compared and hashed as bytes
  layout.write_header(page, layer, first, options_.rounding);
  const RoundingSpec spec{options_.rounding, options_.seed, layer, first};
  const uint16_t* k = reinterpret_cast<const uint16_t*>(block);
  const uint16_t* v = k + static_cast<size_t>(H) * static_cast<size_t>(T) * static_cast<size_t>(d);
  for (int h = 0; h < H; ++h) {
    const size_t off = static_cast<size_t>(h) * static_cast<size_t>(T) * static_cast<size_t>(d);
    quantize_k_block(layout, h, k + off, static_cast<size_t>(d), spec, page);
    quantize_v_block(layout, h, v + off, static_cast<size_t>(d), spec, page);
  }
}

void PagedKvCache::peek_block_page(int seq_id, int layer, int block, std::byte* page) const {
  HACK_CHECK(options_.mode == KvMode::hack, "peek_block_page: cache is in fp mode");
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  const LayerPages& lp = get(seq_id).layers[static_cast<size_t>(layer)];
  HACK_CHECK(block >= 0 && static_cast<size_t>(block) < lp.pages.size() + lp.pending.size(),
             "peek_block_page: sequence {} layer {} has no full block {}", seq_id, layer, block);
  const HackPageLayout& layout = layouts_[static_cast<size_t>(layer)];
  if (static_cast<size_t>(block) < lp.pages.size()) {
    std::memcpy(page, lp.pages[static_cast<size_t>(block)].data, layout.page_bytes());
    return;
  }
  quantize_block(layer, lp.pending[static_cast<size_t>(block) - lp.pages.size()].data,
                 options_.sinks + static_cast<int64_t>(block) * options_.block_tokens, page);
}

void PagedKvCache::begin_prefill(int seq_id) {
  Sequence& s = get(seq_id);
  if (options_.mode == KvMode::hack && options_.exact_prefill) s.prefilling = true;
}

void PagedKvCache::end_prefill(int seq_id) {
  Sequence& s = get(seq_id);
  if (!s.prefilling) return;
  s.prefilling = false;
  close_pending_blocks(seq_id);
}

void PagedKvCache::append(int layer, int seq_id, int start_pos, int n_tokens, const float* k, const float* v) {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  Sequence& s = get(seq_id);
  LayerPages& lp = s.layers[static_cast<size_t>(layer)];
  HACK_CHECK(start_pos == lp.length, "sequence {} layer {}: append at {} but length is {}", seq_id, layer, start_pos,
             lp.length);
  HACK_CHECK(n_tokens >= 0 && lp.length + n_tokens <= s.max_tokens, "sequence {}: {} tokens exceed its capacity of {}",
             seq_id, lp.length + n_tokens, s.max_tokens);
  const int H = shape_.num_kv_heads, d = shape_.head_dim, T = options_.block_tokens;
  const size_t token_floats = static_cast<size_t>(H) * static_cast<size_t>(d);
  if (options_.mode == KvMode::hack && n_tokens > 0 && !s.prefilling) quantize_pending(layer, lp);
  for (int i = 0; i < n_tokens; ++i) {
    const int pos = start_pos + i;
    const float* kt = k + static_cast<size_t>(i) * token_floats;
    const float* vt = v + static_cast<size_t>(i) * token_floats;
    if (options_.mode == KvMode::fp) {
      const int slot = pos % T;
      if (slot == 0) lp.pages.push_back(pages_of(layer).allocate());
      std::byte* page = lp.pages.back().data;
      write_exact(page, exact_elem_bytes_, H, T, d, slot, kt);
      write_exact(page + token_floats * static_cast<size_t>(T) * exact_elem_bytes_, exact_elem_bytes_, H, T, d, slot,
                  vt);
    } else if (pos < options_.sinks) {
      if (!lp.sink) lp.sink = sink_pool_->allocate();
      const int S = options_.sinks;
      write_exact(lp.sink.data, 2, H, S, d, pos, kt);
      write_exact(lp.sink.data + token_floats * static_cast<size_t>(S) * 2, 2, H, S, d, pos, vt);
    } else {
      const int rel = pos - options_.sinks, slot = rel % T;
      if (!lp.open) lp.open = open_pool_->allocate();
      write_exact(lp.open.data, 2, H, T, d, slot, kt);
      write_exact(lp.open.data + token_floats * static_cast<size_t>(T) * 2, 2, H, T, d, slot, vt);
      if (slot == T - 1) {  // full: exact until an append finds it outside the recent window
        lp.pending.push_back(lp.open);
        lp.open = PageRef{};
      }
    }
    lp.length = pos + 1;
  }
}

template <class Fn>
void PagedKvCache::for_each_segment(const LayerPages& lp, int end, Fn&& fn) const {
  const int T = options_.block_tokens;
  const int stored = std::min(end, lp.length);
  if (options_.mode == KvMode::fp) {
    for (size_t i = 0; i < lp.pages.size() && static_cast<int>(i) * T < stored; ++i) {
      const int first = static_cast<int>(i) * T;
      fn(Segment{first, std::min(T, lp.length - first), false, lp.pages[i].data, T});
    }
    return;
  }
  const int S = options_.sinks;
  if (S > 0 && stored > 0) fn(Segment{0, std::min(S, lp.length), false, lp.sink.data, S});
  for (size_t i = 0; i < lp.pages.size(); ++i) {
    const int first = S + static_cast<int>(i) * T;
    if (first >= stored) return;
    fn(Segment{first, T, true, lp.pages[i].data, T});
  }
  int first = S + static_cast<int>(lp.pages.size()) * T;
  for (size_t i = 0; i < lp.pending.size(); ++i, first += T) {
    if (first >= stored) return;
    fn(Segment{first, T, false, lp.pending[i].data, T});
  }
  if (first < stored) fn(Segment{first, lp.length - first, false, lp.open.data, T});
}

cpu::ExactHeadView PagedKvCache::exact_view(const Segment& seg, int kv_head) const {
  const size_t d = static_cast<size_t>(shape_.head_dim), cap = static_cast<size_t>(seg.capacity);
  const size_t head_elems = cap * d;
  const size_t v_region = static_cast<size_t>(shape_.num_kv_heads) * head_elems * exact_elem_bytes_;
  cpu::ExactHeadView view;
  view.bf16 = exact_elem_bytes_ == 2;
  view.tokens = seg.tokens;
  view.k_dim = view.v_dim = shape_.head_dim;
  view.k = seg.data + static_cast<size_t>(kv_head) * head_elems * exact_elem_bytes_;
  view.v = seg.data + v_region + static_cast<size_t>(kv_head) * head_elems * exact_elem_bytes_;
  view.k_stride = view.v_stride = d;
  return view;
}

cpu::HackHeadView hack_head_view(const HackPageLayout& layout, const std::byte* page, int head) {
  const HackHeadLayout& hl = layout.head(head);
  cpu::HackHeadView v;
  v.k_bits = layout.k_bits();
  v.v_bits = layout.v_bits();
  v.tokens = layout.block_tokens();
  v.k_dim = hl.k_dim;
  v.v_dim = hl.v_dim;
  v.k_group = hl.k_group;
  v.v_group = hl.v_group;
  v.k_sum_bytes = layout.k_sum_bytes();
  v.v_sum_bytes = layout.v_sum_bytes();
  v.k_codes = reinterpret_cast<const uint8_t*>(page + hl.k_codes);
  v.k_min = reinterpret_cast<const uint16_t*>(page + hl.k_min);
  v.k_scale = reinterpret_cast<const uint16_t*>(page + hl.k_scale);
  v.k_sums = page + hl.k_sums;
  v.v_codes = reinterpret_cast<const uint8_t*>(page + hl.v_codes);
  v.v_min = reinterpret_cast<const uint16_t*>(page + hl.v_min);
  v.v_scale = reinterpret_cast<const uint16_t*>(page + hl.v_scale);
  v.v_sums = page + hl.v_sums;
  return v;
}

HackLayerBits PagedKvCache::layer_bits(int layer) const {
  const HackPageLayout& l = layouts_.at(static_cast<size_t>(layer));
  return {l.k_bits(), l.v_bits()};
}

cpu::HackHeadView PagedKvCache::hack_view(int layer, const std::byte* page, int kv_head) const {
  return hack_head_view(layouts_[static_cast<size_t>(layer)], page, kv_head);
}

size_t PagedKvCache::work_floats() const {
  size_t w = cpu::exact_block_work_floats(std::max(options_.block_tokens, options_.sinks));
  if (options_.mode == KvMode::hack) {
    const HackHeadLayout& hl = layouts_.front().head(0);
    w = std::max(w, cpu::hack_block_work_floats(options_.block_tokens, hl.k_dim, hl.v_dim, hl.k_group, hl.v_group));
  }
  return align16(w);
}

size_t PagedKvCache::attend_scratch_floats(int n_tokens, int) const {
  const size_t rows = static_cast<size_t>(std::max(1, n_tokens)) * static_cast<size_t>(shape_.group_size);
  const size_t d = static_cast<size_t>(shape_.head_dim);
  return align16(rows * d) * 2 + align16(rows) * 3 + work_floats() + 16;
}

void PagedKvCache::attend_rows(const LayerPages& lp, int end, int head_begin, int head_end, int start_pos,
                               int n_tokens, const cpu::AttentionRows* rows, int seg_begin, int seg_end,
                               float* work) const {
  const int G = shape_.group_size;
  // Segments are visited in position order and, inside one, every head in turn, so a page
  // is read front to back. The next segment is prefetched while this one computes: a HACK
  // kernel spreads prefetches of the next page's section of its head over its work; exact
  // segments get their first lines requested here.
  const Segment* prev = nullptr;
  Segment held;
  auto run = [&](const Segment& seg, const Segment* next) {
    // Rows of tokens at positions >= seg.first_token see part of the segment.
    const int t0 = std::max(0, seg.first_token - start_pos);
    if (t0 >= n_tokens) return;
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
      if (next != nullptr && !next->quantized) {
        const cpu::ExactHeadView v = exact_view(*next, h);
        for (const void* base : {v.k, v.v})
          for (size_t off = 0; off < 1024; off += 64) _mm_prefetch(static_cast<const char*>(base) + off, _MM_HINT_T0);
      }
      if (seg.quantized) {
        cpu::HackHeadView view = hack_view(lp.layer, seg.data, h);
        if (next != nullptr && next->quantized) {
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
        kernels_->exact_block(exact_view(seg, h), sub, work);
      }
    }
  };
  // Segments run one behind the enumeration so the next one is known.
  int index = 0;
  for_each_segment(lp, end, [&](const Segment& seg) {
    const int i = index++;
    if (i < seg_begin || i >= seg_end) return;
    if (prev != nullptr) run(*prev, &seg);
    held = seg;
    prev = &held;
  });
  if (prev != nullptr) run(*prev, nullptr);
}

void PagedKvCache::attend_dequantized(int layer, const std::byte* page, int kv_head, const cpu::AttentionRows& rows,
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

void PagedKvCache::attend(int layer, int seq_id, int kv_head, int start_pos, int n_tokens, const float* q,
                          size_t q_row_stride, float* out, size_t out_row_stride, float scale, float* scratch) const {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers && kv_head >= 0 && kv_head < shape_.num_kv_heads,
             "attend: layer {} / KV head {} out of range", layer, kv_head);
  const LayerPages& lp = get(seq_id).layers[static_cast<size_t>(layer)];
  HACK_CHECK(start_pos >= 0 && n_tokens > 0 && lp.length >= start_pos + n_tokens,
             "sequence {} layer {}: attention over {} tokens but {} stored", seq_id, layer, start_pos + n_tokens,
             lp.length);
  const int G = shape_.group_size, d = shape_.head_dim;
  const size_t rows_n = static_cast<size_t>(n_tokens) * static_cast<size_t>(G), ud = static_cast<size_t>(d);
  float* qs = scratch;
  float* acc = qs + align16(rows_n * ud);
  int* visible = reinterpret_cast<int*>(acc + align16(rows_n * ud));
  float* mx = reinterpret_cast<float*>(visible) + align16(rows_n);
  float* sum = mx + align16(rows_n);
  float* work = sum + align16(rows_n);
  for (int t = 0; t < n_tokens; ++t)
    for (int g = 0; g < G; ++g) {
      const float* src = q + static_cast<size_t>(t) * q_row_stride + static_cast<size_t>(g) * ud;
      float* dst = qs + (static_cast<size_t>(t) * static_cast<size_t>(G) + static_cast<size_t>(g)) * ud;
      for (size_t c = 0; c < ud; ++c) dst[c] = src[c] * scale;
    }
  const cpu::AttentionRows rows{static_cast<int>(rows_n), d, d, qs, visible, mx, sum, acc};
  cpu::attention_rows_reset(rows);
  attend_rows(lp, start_pos + n_tokens, kv_head, kv_head + 1, start_pos, n_tokens, &rows, 0, 1 << 30, work);
  for (int t = 0; t < n_tokens; ++t) {
    cpu::AttentionRows tr = rows;
    tr.n = G;
    tr.max = mx + static_cast<size_t>(t) * static_cast<size_t>(G);
    tr.sum = sum + static_cast<size_t>(t) * static_cast<size_t>(G);
    tr.acc = acc + static_cast<size_t>(t) * static_cast<size_t>(G) * ud;
    cpu::attention_rows_finish(tr, out + static_cast<size_t>(t) * out_row_stride, ud);
  }
}

void PagedKvCache::attend_decode(ThreadPool& pool, int layer, std::span<const DecodeQuery> queries, float scale,
                                 DecodeWorkspace& workspace) const {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  if (queries.empty()) return;
  const int H = shape_.num_kv_heads, G = shape_.group_size, d = shape_.head_dim;
  const size_t ud = static_cast<size_t>(d), uG = static_cast<size_t>(G), uH = static_cast<size_t>(H);
  // Tasks: (query, segment range) with all heads, so each thread streams through whole
  // pages; a sequence's segments are split so there are ~2 tasks per thread. Task t is
  // ints[3t .. 3t+3) = query, first segment, end segment.
  std::vector<const void*>& lps = workspace.layers;
  std::vector<int>& ints = workspace.ints;
  lps.clear();
  ints.clear();
  const size_t target = static_cast<size_t>(pool.size()) * 2;
  const int splits_wanted = static_cast<int>((target + queries.size() - 1) / queries.size());
  // Sized for the most tasks this batch size can make, so later steps never grow it.
  const size_t max_tasks = queries.size() * static_cast<size_t>(splits_wanted);
  ints.reserve(3 * max_tasks);
  lps.reserve(queries.size());
  for (size_t i = 0; i < queries.size(); ++i) {
    const LayerPages& lp = get(queries[i].seq_id).layers[static_cast<size_t>(layer)];
    HACK_CHECK(lp.length > 0, "sequence {} layer {}: nothing stored to attend to", queries[i].seq_id, layer);
    lps.push_back(&lp);
    int n = 0;
    for_each_segment(lp, lp.length, [&](const Segment&) { ++n; });
    const int splits = std::clamp(splits_wanted, 1, std::max(1, n / 4));
    for (int s = 0; s < splits; ++s) ints.insert(ints.end(), {static_cast<int>(i), n * s / splits, n * (s + 1) / splits});
  }
  const size_t n_tasks = ints.size() / 3;

  // Workspace: per task and head the state [G] max, [G] sum, [G] visible, [G·d] acc; per
  // thread the scaled q of all heads and the kernel work area.
  const size_t head_state = align16(3 * uG) + align16(uG * ud);
  const size_t task_floats = uH * head_state;
  const size_t thread_floats = align16(uH * uG * ud) + work_floats();
  const size_t need = max_tasks * task_floats + static_cast<size_t>(pool.size()) * thread_floats + 16;
  if (workspace.floats.size() < need) workspace.floats.resize(need);
  float* state_base = workspace.floats.data();
  float* thread_base = state_base + max_tasks * task_floats;
  auto head_rows = [&](size_t task, int h, const float* qs) {
    float* st = state_base + task * task_floats + static_cast<size_t>(h) * head_state;
    return cpu::AttentionRows{G, d, d, qs, reinterpret_cast<int*>(st + 2 * uG), st, st + uG, st + align16(3 * uG)};
  };

  // One captured pointer keeps the std::function of pool.run in its small buffer (no heap).
  struct Context {
    const PagedKvCache* self;
    std::span<const DecodeQuery> queries;
    const std::vector<const void*>* lps;
    const int* tasks;
    size_t n_tasks, thread_floats, q_floats;
    float* thread_base;
    float scale;
    int H;
    const decltype(head_rows)* rows_of;
    std::atomic<size_t> next{0};
  } ctx{this, queries, &lps, ints.data(), n_tasks, thread_floats, uH * uG * ud, thread_base, scale, H, &head_rows};
  pool.run([c = &ctx](int thread, int) {
    float* qs = c->thread_base + static_cast<size_t>(thread) * c->thread_floats;
    float* work = qs + align16(c->q_floats);
    int loaded = -1;  // query whose scaled q is in qs
    cpu::AttentionRows rows[kMaxDecodeHeads];
    for (;;) {
      const size_t t = c->next.fetch_add(1, std::memory_order_relaxed);
      if (t >= c->n_tasks) return;
      const int* task = c->tasks + 3 * t;
      if (task[0] != loaded) {
        const float* src = c->queries[static_cast<size_t>(task[0])].q;
        for (size_t i = 0; i < c->q_floats; ++i) qs[i] = src[i] * c->scale;
        loaded = task[0];
      }
      const LayerPages& lp = *static_cast<const LayerPages*>((*c->lps)[static_cast<size_t>(task[0])]);
      // Heads in groups of kMaxDecodeHeads (all of them for usual models).
      for (int h0 = 0; h0 < c->H; h0 += kMaxDecodeHeads) {
        const int h1 = std::min(c->H, h0 + kMaxDecodeHeads);
        for (int h = h0; h < h1; ++h) {
          rows[h - h0] = (*c->rows_of)(t, h, qs + static_cast<size_t>(h) * (c->q_floats / static_cast<size_t>(c->H)));
          cpu::attention_rows_reset(rows[h - h0]);
        }
        c->self->attend_rows(lp, lp.length, h0, h1, lp.length - 1, 1, rows, task[1], task[2], work);
      }
    }
  });
  // Merge the splits of each query in task order and write the output.
  for (size_t t = 0; t < n_tasks;) {
    const int query = ints[3 * t];
    size_t u = t + 1;
    while (u < n_tasks && ints[3 * u] == query) ++u;
    for (int h = 0; h < H; ++h) {
      const cpu::AttentionRows dst = head_rows(t, h, nullptr);
      for (size_t v = t + 1; v < u; ++v) cpu::attention_rows_merge(dst, head_rows(v, h, nullptr));
      cpu::attention_rows_finish(dst, queries[static_cast<size_t>(query)].out + static_cast<size_t>(h) * uG * ud, ud);
    }
    t = u;
  }
}

void PagedKvCache::fork_sequence(int src_seq, int dst_seq, int n_tokens, int max_tokens) {
  const Sequence& src = get(src_seq);
  HACK_CHECK(n_tokens >= 0 && n_tokens <= max_tokens, "fork: {} tokens do not fit {}", n_tokens, max_tokens);
  const int T = options_.block_tokens, S = options_.mode == KvMode::hack ? options_.sinks : 0;
  const int blocks = full_blocks(n_tokens);
  const int tail = std::max(0, n_tokens - S - blocks * T);  // tokens of the partly filled block
  for (const LayerPages& lp : src.layers) {
    HACK_CHECK(n_tokens <= lp.length, "fork: sequence {} holds {} tokens, not {}", src_seq, lp.length, n_tokens);
    HACK_CHECK(options_.mode == KvMode::fp || tail == 0 || blocks >= static_cast<int>(lp.pages.size()),
               "fork: token {} lies in a block sequence {} has already quantized", n_tokens, src_seq);
  }
  add_sequence(dst_seq, max_tokens);
  Sequence& dst = get(dst_seq);
  const size_t H = static_cast<size_t>(shape_.num_kv_heads), d = static_cast<size_t>(shape_.head_dim);
  auto copy_tokens = [&](const std::byte* from, std::byte* to, size_t capacity, int count) {
    for (size_t region = 0; region < 2 * H; ++region) {  // K and V of every head
      const size_t off = region * capacity * d * exact_elem_bytes_;
      std::memcpy(to + off, from + off, static_cast<size_t>(count) * d * exact_elem_bytes_);
    }
  };
  for (size_t l = 0; l < src.layers.size(); ++l) {
    const LayerPages& from = src.layers[l];
    LayerPages& to = dst.layers[l];
    to.length = n_tokens;
    if (options_.mode == KvMode::fp) {
      for (int i = 0; i < blocks; ++i) {
        pages_of(from.layer).retain(from.pages[static_cast<size_t>(i)]);
        to.pages.push_back(from.pages[static_cast<size_t>(i)]);
      }
      if (tail > 0) {
        to.pages.push_back(pages_of(from.layer).allocate());
        copy_tokens(from.pages[static_cast<size_t>(blocks)].data, to.pages.back().data, static_cast<size_t>(T), tail);
      }
      continue;
    }
    if (S > 0 && n_tokens > 0) {
      if (n_tokens >= S) {  // complete sinks are never written again
        sink_pool_->retain(from.sink);
        to.sink = from.sink;
      } else {
        to.sink = sink_pool_->allocate();
        copy_tokens(from.sink.data, to.sink.data, static_cast<size_t>(S), n_tokens);
      }
    }
    // Full blocks: quantized ones shared as HACK pages, pending ones shared as pending.
    const size_t quantized = from.pages.size();
    for (int i = 0; i < blocks; ++i) {
      if (static_cast<size_t>(i) < quantized) {
        pages_of(from.layer).retain(from.pages[static_cast<size_t>(i)]);
        to.pages.push_back(from.pages[static_cast<size_t>(i)]);
      } else {
        const PageRef p = from.pending[static_cast<size_t>(i) - quantized];
        open_pool_->retain(p);
        to.pending.push_back(p);
      }
    }
    if (tail > 0) {
      const size_t b = static_cast<size_t>(blocks) - quantized;  // exact block holding the tail
      const PageRef block = b < from.pending.size() ? from.pending[b] : from.open;
      to.open = open_pool_->allocate();
      copy_tokens(block.data, to.open.data, static_cast<size_t>(T), tail);
    }
  }
}

void PagedKvCache::close_pending_blocks(int seq_id) {
  if (options_.mode != KvMode::hack) return;
  Sequence& s = get(seq_id);
  for (size_t l = 0; l < s.layers.size(); ++l) quantize_pending(static_cast<int>(l), s.layers[l]);
}

void PagedKvCache::close_pending_blocks(int seq_id, int layer) {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  if (options_.mode != KvMode::hack) return;
  quantize_pending(layer, get(seq_id).layers[static_cast<size_t>(layer)]);
}

int PagedKvCache::pending_block_count(int seq_id, int layer) const {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  return static_cast<int>(get(seq_id).layers[static_cast<size_t>(layer)].pending.size());
}

int PagedKvCache::max_tokens(int seq_id) const { return get(seq_id).max_tokens; }

DType PagedKvCache::exact_dtype() const { return options_.mode == KvMode::fp ? options_.fp_dtype : DType::bf16; }

const std::byte* PagedKvCache::exact_location(const LayerPages& lp, int seq_id, int layer, int pos, int& slot,
                                              int& capacity) const {
  HACK_CHECK(pos >= 0 && pos < lp.length, "sequence {} layer {}: token {} is not stored ({} tokens)", seq_id, layer,
             pos, lp.length);
  const int T = options_.block_tokens;
  if (options_.mode == KvMode::fp) {
    slot = pos % T;
    capacity = T;
    return lp.pages[static_cast<size_t>(pos / T)].data;
  }
  const int S = options_.sinks;
  if (pos < S) {
    slot = pos;
    capacity = S;
    return lp.sink.data;
  }
  const size_t block = static_cast<size_t>((pos - S) / T);
  HACK_CHECK(block >= lp.pages.size(), "sequence {} layer {}: token {} lies in a quantized block", seq_id, layer, pos);
  const size_t b = block - lp.pages.size();
  slot = (pos - S) % T;
  capacity = T;
  return b < lp.pending.size() ? lp.pending[b].data : lp.open.data;
}

void PagedKvCache::copy_exact_tokens(int seq_id, int layer, int first_token, int n_tokens, std::byte* k,
                                     std::byte* v) const {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  HACK_CHECK(n_tokens >= 0, "copy_exact_tokens: negative token count {}", n_tokens);
  const LayerPages& lp = get(seq_id).layers[static_cast<size_t>(layer)];
  const size_t H = static_cast<size_t>(shape_.num_kv_heads), d = static_cast<size_t>(shape_.head_dim);
  const size_t row_bytes = d * exact_elem_bytes_;
  // Check the whole range first so nothing is written for a bad one.
  for (int i = 0; i < n_tokens; ++i) {
    int slot = 0, capacity = 0;
    exact_location(lp, seq_id, layer, first_token + i, slot, capacity);
  }
  for (int i = 0; i < n_tokens; ++i) {
    int slot = 0, capacity = 0;
    const std::byte* base = exact_location(lp, seq_id, layer, first_token + i, slot, capacity);
    const size_t cap = static_cast<size_t>(capacity);
    for (size_t h = 0; h < H; ++h) {
      const size_t src = (h * cap + static_cast<size_t>(slot)) * row_bytes;
      const size_t dst = (static_cast<size_t>(i) * H + h) * row_bytes;
      std::memcpy(k + dst, base + src, row_bytes);
      std::memcpy(v + dst, base + H * cap * row_bytes + src, row_bytes);
    }
  }
}

void PagedKvCache::read_exact_tokens(int seq_id, int layer, int first_token, int n_tokens, float* k, float* v) const {
  const size_t elems = static_cast<size_t>(std::max(n_tokens, 0)) * static_cast<size_t>(shape_.num_kv_heads) *
                       static_cast<size_t>(shape_.head_dim);
  if (exact_elem_bytes_ == 4) {
    copy_exact_tokens(seq_id, layer, first_token, n_tokens, reinterpret_cast<std::byte*>(k),
                      reinterpret_cast<std::byte*>(v));
    return;
  }
  std::vector<uint16_t> kb(elems), vb(elems);
  copy_exact_tokens(seq_id, layer, first_token, n_tokens, reinterpret_cast<std::byte*>(kb.data()),
                    reinterpret_cast<std::byte*>(vb.data()));
  for (size_t i = 0; i < elems; ++i) {
    k[i] = bf16_to_f32(kb[i]);
    v[i] = bf16_to_f32(vb[i]);
  }
}

double PagedKvCache::bytes_per_token() const { return kv_bytes_per_token(shape_, options_); }

size_t PagedKvCache::attend_bytes(int seq_id, int layer) const {
  const LayerPages& lp = get(seq_id).layers[static_cast<size_t>(layer)];
  const size_t exact_token = 2 * static_cast<size_t>(shape_.num_kv_heads) * static_cast<size_t>(shape_.head_dim) *
                             exact_elem_bytes_;
  size_t bytes = 0;
  for_each_segment(lp, lp.length, [&](const Segment& seg) {
    bytes += seg.quantized ? pages_of(layer).page_bytes() : static_cast<size_t>(seg.tokens) * exact_token;
  });
  return bytes;
}

int PagedKvCache::hack_page_count(int seq_id, int layer) const {
  HACK_CHECK(options_.mode == KvMode::hack, "hack_page_count: cache is in fp mode");
  return static_cast<int>(get(seq_id).layers[static_cast<size_t>(layer)].pages.size());
}

std::span<const std::byte> PagedKvCache::hack_page(int seq_id, int layer, int index) const {
  HACK_CHECK(options_.mode == KvMode::hack, "hack_page: cache is in fp mode");
  const LayerPages& lp = get(seq_id).layers[static_cast<size_t>(layer)];
  HACK_CHECK(index >= 0 && index < static_cast<int>(lp.pages.size()), "hack_page: no page {}", index);
  return {lp.pages[static_cast<size_t>(index)].data, pages_of(layer).page_bytes()};
}

int PagedKvCache::page_ref_count(int seq_id, int layer, int index) const {
  const LayerPages& lp = get(seq_id).layers[static_cast<size_t>(layer)];
  HACK_CHECK(index >= 0 && index < static_cast<int>(lp.pages.size()), "page_ref_count: no page {}", index);
  return pages_of(layer).ref_count(lp.pages[static_cast<size_t>(index)]);
}

void PagedKvCache::append_hack_page(int layer, int seq_id, const void* bytes, size_t size) {
  HACK_CHECK(options_.mode == KvMode::hack, "append_hack_page: cache is in fp mode");
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "layer {} out of range", layer);
  layouts_[static_cast<size_t>(layer)].validate(bytes, size);
  Sequence& s = get(seq_id);
  LayerPages& lp = s.layers[static_cast<size_t>(layer)];
  const int64_t expected = options_.sinks + static_cast<int64_t>(lp.pages.size()) * options_.block_tokens;
  HACK_CHECK(lp.length == expected && lp.pending.empty(), "append_hack_page: sequence {} layer {} holds {} tokens, a block starts at {}",
             seq_id, layer, lp.length, expected);
  HACK_CHECK(HackPageLayout::page_layer(bytes) == layer && HackPageLayout::page_first_token(bytes) == expected,
             "append_hack_page: page is layer {} token {}, expected layer {} token {}", HackPageLayout::page_layer(bytes),
             HackPageLayout::page_first_token(bytes), layer, expected);
  HACK_CHECK(lp.length + options_.block_tokens <= s.max_tokens, "sequence {}: {} tokens exceed its capacity of {}",
             seq_id, lp.length + options_.block_tokens, s.max_tokens);
  const PageRef page = pages_of(layer).allocate();
  std::memcpy(page.data, bytes, size);
  lp.pages.push_back(page);
  lp.length += options_.block_tokens;
}

KvCacheStats PagedKvCache::stats() const {
  KvCacheStats st;
  st.sequences = static_cast<int64_t>(sequences_.size());
  for (const auto& [id, s] : sequences_) st.tokens += s->layers.back().length;
  for (const auto& p : block_pools_) st.bytes_used += p->bytes_in_use();
  if (open_pool_) st.bytes_used += open_pool_->bytes_in_use();
  if (sink_pool_) st.bytes_used += sink_pool_->bytes_in_use();
  st.bytes_capacity = budget_.capacity();
  st.bytes_reserved = budget_.reserved();
  return st;
}

std::unique_ptr<PagedKvCache> make_paged_kv_cache(const KvShape& shape, const KvCacheOptions& options) {
  return std::make_unique<PagedKvCache>(shape, options);
}

double bf16_kv_bytes_per_token(const KvShape& shape) {
  KvCacheOptions bf16;
  bf16.mode = KvMode::fp;
  bf16.fp_dtype = DType::bf16;
  return kv_bytes_per_token(shape, bf16);
}

double kv_bytes_per_token(const KvShape& shape, const KvCacheOptions& options) {
  if (options.mode == KvMode::fp)
    return static_cast<double>(shape.num_layers) * 2.0 * shape.num_kv_heads * shape.head_dim * static_cast<double>(dtype_size(options.fp_dtype));
  double bytes = 0;
  for (int l = 0; l < shape.num_layers; ++l) {
    const HackLayerBits bits = options.layer_bits.empty() ? HackLayerBits{options.k_bits, options.v_bits}
                                                          : options.layer_bits.at(static_cast<size_t>(l));
    HackPageParams params;
    params.k_bits = bits.k_bits;
    params.v_bits = bits.v_bits;
    params.block_tokens = options.block_tokens;
    params.k_group = options.k_group;
    params.v_group = options.v_group;
    params.heads.assign(static_cast<size_t>(shape.num_kv_heads), HackHeadDims{shape.head_dim, shape.head_dim});
    bytes += HackPageLayout(params).bytes_per_token();
  }
  return bytes;
}

}  // namespace hack
