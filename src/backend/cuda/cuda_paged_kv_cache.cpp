#include "hack/backend/cuda_paged_kv_cache.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "hack/backend/cuda_check.h"
#include "hack/core/dtype.h"
#include "hack/core/error.h"
#include "hack/kernels/cuda/hack.h"
#include "hack/backend/hack_attention_plan.h"

namespace hack {

namespace {

// What the block manager and options() see: the HACK options, or fp bf16 pages of Π; the
// capacity in page units (what sequence_bytes reserves).
KvCacheOptions device_kv_options(const KvShape& shape, const CudaKvOptions& options) {
  KvCacheOptions o;
  if (options.hack) {
    o = *options.hack;
  } else {
    o.mode = KvMode::fp;
    o.fp_dtype = DType::bf16;
    o.block_tokens = options.page_tokens;
  }
  o.capacity_bytes = options.page_tokens > 0 && options.num_pages > 0 && shape.num_layers > 0
                         ? static_cast<size_t>(options.num_pages) * cuda_kv_page_bytes(shape, options)
                         : 0;
  return o;
}

}  // namespace

CudaPagedKvCache::CudaPagedKvCache(const KvShape& shape, const CudaKvOptions& options)
    : shape_(shape),
      options_(options),
      page_ids_(static_cast<uint32_t>(std::max(options.num_pages, 0))),
      hack_ids_(static_cast<uint32_t>(std::max(options.num_pages, 0))),
      kv_options_(device_kv_options(shape, options)),
      blocks_(std::max(shape.num_layers, 1), kv_options_,
              [this](int max_tokens) { return static_cast<size_t>(pages_needed(max_tokens)) * cuda_kv_page_bytes(shape_, options_); }) {
  HACK_CHECK(shape.num_layers > 0 && shape.num_kv_heads > 0 && shape.head_dim > 0 && shape.group_size > 0,
             "device KV cache: bad shape (layers {}, kv heads {}, head_dim {}, group {})", shape.num_layers,
             shape.num_kv_heads, shape.head_dim, shape.group_size);
  HACK_CHECK(options.page_tokens > 0, "device KV cache: page_tokens must be positive (got {})", options.page_tokens);
  HACK_CHECK(options.num_pages > 0, "device KV cache: num_pages must be positive (got {})", options.num_pages);
  const size_t bytes = page_bytes() * static_cast<size_t>(options.num_pages) * static_cast<size_t>(shape.num_layers);
  pool_ = Buffer::allocate(MemoryKind::device, bytes, options.device);
  // Never-written rows are never read (attention stops at each sequence's length), but zeroed
  // memory makes a bug show up as zeros rather than as stale values from another sequence.
  HACK_CUDA_CHECK(cudaMemset(pool_.data(), 0, bytes));
  if (options.hack) init_hack(*options.hack);
}

size_t cuda_kv_page_bytes(const KvShape& shape, const CudaKvOptions& options) {
  // A page's bf16 rows: [K|V][kv_heads][Π][head_dim] in every layer.
  size_t bytes = 2 * static_cast<size_t>(shape.num_kv_heads) * static_cast<size_t>(options.page_tokens) *
                 static_cast<size_t>(shape.head_dim) * sizeof(uint16_t) * static_cast<size_t>(shape.num_layers);
  if (options.hack)
    for (int l = 0; l < shape.num_layers; ++l)
      bytes += (hack_page_layout(shape, *options.hack, l).page_bytes() + 63) / 64 * 64;
  return bytes;
}

void CudaPagedKvCache::init_hack(const KvCacheOptions& o) {
  const int P = options_.page_tokens;
  HACK_CHECK(o.mode == KvMode::hack, "device KV cache: HACK options given for --kv {}", kv_mode_name(o.mode));
  HACK_CHECK(o.block_tokens == P, "device KV cache: --hack-block {} must equal the page size {}", o.block_tokens, P);
  HACK_CHECK(P % 16 == 0 && P <= 256, "--device cuda --kv hack: --hack-block must be a multiple of 16 up to 256, got {}",
             P);
  HACK_CHECK(o.sinks >= 0 && o.sinks <= P, "--device cuda --kv hack: --hack-sinks must be in [0, --hack-block {}], got {}",
             P, o.sinks);
  HACK_CHECK(o.recent_tokens >= 0, "--device cuda --kv hack: --hack-recent must not be negative, got {}",
             o.recent_tokens);
  HACK_CHECK(o.exact_prefill, "--device cuda --kv hack: prefill must be exact (no quantized past inside a prompt)");
  HACK_CHECK(o.attention == HackAttention::homomorphic,
             "--device cuda --kv hack: only homomorphic attention runs on the GPU (the dequantized ablation is CPU-only)");
  HACK_CHECK(!o.select.enabled(), "--device cuda --kv hack: --kv-select (MPCache page selection) runs on the CPU only");
  HACK_CHECK(!shape_.compressed(), "--device cuda --kv hack: per-head FDC dims are CPU-only");
  HACK_CHECK(o.layer_bits.empty() || static_cast<int>(o.layer_bits.size()) == shape_.num_layers,
             "HACK bit allocation: {} layers given, the model has {}", o.layer_bits.size(), shape_.num_layers);
  size_t pool_bytes = 0, header_bytes = 0;
  for (int l = 0; l < shape_.num_layers; ++l) {
    layouts_.push_back(hack_page_layout(shape_, o, l));
    geometries_.push_back(page_geometry(layouts_.back()));
    const size_t stride = (layouts_.back().page_bytes() + 63) / 64 * 64;
    hack_stride_.push_back(stride);
    hack_offset_.push_back(pool_bytes);
    pool_bytes += stride * static_cast<size_t>(options_.num_pages);
    header_offset_.push_back(header_bytes);
    header_bytes += (layouts_.back().header_bytes() + 63) / 64 * 64;
  }
  hack_pool_ = Buffer::allocate(MemoryKind::device, pool_bytes, options_.device);
  HACK_CUDA_CHECK(cudaMemset(hack_pool_.data(), 0, pool_bytes));
  std::vector<uint8_t> headers(header_bytes, 0);
  for (int l = 0; l < shape_.num_layers; ++l) {
    const std::vector<uint8_t> t = page_header_template(layouts_[static_cast<size_t>(l)], l, o.rounding);
    std::copy(t.begin(), t.end(), headers.begin() + static_cast<std::ptrdiff_t>(header_offset_[static_cast<size_t>(l)]));
  }
  headers_ = Buffer::allocate(MemoryKind::device, header_bytes, options_.device);
  HACK_CUDA_CHECK(cudaMemcpy(headers_.data(), headers.data(), header_bytes, cudaMemcpyHostToDevice));
}

std::string CudaPagedKvCache::name() const {
  if (!is_hack()) return "bf16-paged-cuda";
  if (!options_.hack->layer_bits.empty()) return "hack-per-layer-cuda";
  return "hack-k" + std::to_string(options_.hack->k_bits) + "v" + std::to_string(options_.hack->v_bits) + "-cuda";
}

int CudaPagedKvCache::rows_for(int n_tokens) const {
  return n_tokens <= 0 ? 0 : cuda::kv_row(n_tokens - 1, options_.page_tokens, sinks()) + 1;
}

int CudaPagedKvCache::full_blocks(int length) const { return is_hack() ? blocks_.full_blocks(length) : 0; }

int CudaPagedKvCache::closed_blocks(int seq_id) const {
  if (!is_hack()) return 0;
  int closed = blocks_.closed_blocks(seq_id, 0);
  for (int l = 1; l < shape_.num_layers; ++l) closed = std::min(closed, blocks_.closed_blocks(seq_id, l));
  return closed;
}

bool CudaPagedKvCache::prefilling(int seq_id) const { return blocks_.prefilling(seq_id); }

std::span<const int> CudaPagedKvCache::hack_page_table(int seq_id) const {
  HACK_CHECK(is_hack(), "device KV cache: HACK pages exist only with --kv hack");
  return get(seq_id).hack_pages;
}

void* CudaPagedKvCache::hack_page(int layer, int page) const {
  HACK_CHECK(is_hack() && layer >= 0 && layer < shape_.num_layers && page >= 0 && page < options_.num_pages,
             "device KV cache: no HACK page {} in layer {}", page, layer);
  const size_t l = static_cast<size_t>(layer);
  return static_cast<char*>(hack_pool_.data()) + hack_offset_[l] + hack_stride_[l] * static_cast<size_t>(page);
}

const uint16_t* CudaPagedKvCache::exact_page(int layer, int page) const {
  HACK_CHECK(page >= 0 && page < options_.num_pages, "device KV cache: no page {}", page);
  return reinterpret_cast<const uint16_t*>(this->layer(layer).data) + page_bytes() / sizeof(uint16_t) *
                                                                           static_cast<size_t>(page);
}

void CudaPagedKvCache::begin_prefill(int seq_id) { blocks_.begin_prefill(seq_id); }

void CudaPagedKvCache::end_prefill(int seq_id) {
  if (blocks_.end_prefill(seq_id)) close_pending_blocks(seq_id);
}

void CudaPagedKvCache::close_blocks(int seq_id, int upto) {
  Sequence& s = get(seq_id);
  HACK_CHECK(is_hack(), "device KV cache: close_blocks needs --kv hack");
  for (int l = 0; l < shape_.num_layers; ++l) close_layer(s, seq_id, l, upto);
}

void CudaPagedKvCache::close_layer(Sequence& s, int seq_id, int layer, int upto, const KnownPages* known) {
  const int from = blocks_.closed_blocks(seq_id, layer), length = blocks_.length(seq_id, layer);
  if (upto <= from) return;
  HACK_CHECK(full_blocks(length) >= upto, "device KV cache: sequence {} layer {}: block {} is not full ({} tokens)",
             seq_id, layer, upto - 1, length);
  // Known pages are checked first (nothing changes for a bad one), then uploaded; the rest
  // are quantized by one kernel launch.
  const HackPageLayout& layout = hack_layout(layer);
  std::vector<std::pair<int, const std::byte*>> given;
  if (known != nullptr && *known) {
    for (int b = from; b < upto; ++b) {
      const std::byte* page = (*known)(layer, b);
      if (page == nullptr) continue;
      const int64_t at = sinks() + static_cast<int64_t>(b) * options_.page_tokens;
      layout.validate_at(page, layer, at);
      given.emplace_back(b, page);
    }
  }
  for (const auto& [b, page] : given)
    HACK_CUDA_CHECK(cudaMemcpy(hack_page(layer, s.hack_pages[static_cast<size_t>(b)]), page, layout.page_bytes(),
                               cudaMemcpyHostToDevice));
  const int n = upto - from - static_cast<int>(given.size());
  if (n > 0) {
    std::vector<uint64_t> args(4 * static_cast<size_t>(n));
    size_t g = 0;
    int i = 0;
    for (int b = from; b < upto; ++b) {
      if (g < given.size() && given[g].first == b) {
        ++g;
        continue;
      }
      put_block_args(s, layer, b, hack_page(layer, s.hack_pages[static_cast<size_t>(b)]), args, i++, n);
    }
    quantize_blocks(layer, args, n);
  }
  blocks_.record_closed(seq_id, layer, upto);
}

void CudaPagedKvCache::put_block_args(const Sequence& s, int layer, int block, const void* page,
                                      std::vector<uint64_t>& args, int i, int n) const {
  const size_t N = static_cast<size_t>(n), at = static_cast<size_t>(i);
  const size_t v_offset = static_cast<size_t>(shape_.num_kv_heads) * static_cast<size_t>(options_.page_tokens) *
                          static_cast<size_t>(shape_.head_dim);
  const int S = sinks();
  const uint16_t* exact = exact_page(layer, s.pages[static_cast<size_t>((S > 0 ? 1 : 0) + block)]);
  args[at] = reinterpret_cast<uint64_t>(exact);
  args[N + at] = reinterpret_cast<uint64_t>(exact + v_offset);
  args[2 * N + at] = reinterpret_cast<uint64_t>(page);
  args[3 * N + at] = static_cast<uint64_t>(S + block * options_.page_tokens);
}

void CudaPagedKvCache::quantize_blocks(int layer, const std::vector<uint64_t>& args, int n) const {
  const size_t bytes = args.size() * sizeof(uint64_t), N = static_cast<size_t>(n);
  if (close_args_.bytes() < bytes)
    close_args_ = Buffer::allocate(MemoryKind::device, std::max(bytes, size_t{4096}), options_.device);
  // Synchronous on the legacy stream: the previous quantization's kernels have read their arrays.
  HACK_CUDA_CHECK(cudaMemcpy(close_args_.data(), args.data(), bytes, cudaMemcpyHostToDevice));
  const auto* dev = static_cast<const uint64_t*>(close_args_.data());
  const KvCacheOptions& o = *options_.hack;
  const size_t l = static_cast<size_t>(layer);
  cuda::HackQuantizeBlocks q;
  q.blocks = n;
  q.bf16 = true;
  q.k_src = reinterpret_cast<const void* const*>(dev);
  q.v_src = reinterpret_cast<const void* const*>(dev + N);
  q.pages = reinterpret_cast<void* const*>(dev + 2 * N);
  q.token_stride = static_cast<size_t>(shape_.head_dim);
  q.head_stride = static_cast<size_t>(options_.page_tokens) * static_cast<size_t>(shape_.head_dim);
  q.first_tokens = reinterpret_cast<const int64_t*>(dev + 3 * N);
  q.header = static_cast<const uint8_t*>(headers_.data()) + header_offset_[l];
  q.stochastic = o.rounding == Rounding::stochastic;
  q.seed = o.seed;
  q.layer = layer;
  cuda::hack_quantize_blocks(geometries_[l], q, nullptr);
}

size_t CudaPagedKvCache::page_bytes() const {
  return 2 * static_cast<size_t>(shape_.num_kv_heads) * static_cast<size_t>(options_.page_tokens) *
         static_cast<size_t>(shape_.head_dim) * sizeof(uint16_t);
}

const CudaPagedKvCache::Sequence& CudaPagedKvCache::get(int seq_id) const {
  auto it = sequences_.find(seq_id);
  HACK_CHECK(it != sequences_.end(), "device KV cache: unknown sequence {}", seq_id);
  return it->second;
}

CudaPagedKvCache::Sequence& CudaPagedKvCache::get(int seq_id) {
  auto it = sequences_.find(seq_id);
  HACK_CHECK(it != sequences_.end(), "device KV cache: unknown sequence {}", seq_id);
  return it->second;
}

void CudaPagedKvCache::add_sequence(int seq_id, int max_tokens) {
  HACK_CHECK(!blocks_.has_sequence(seq_id), "device KV cache: sequence {} already exists", seq_id);
  HACK_CHECK(max_tokens > 0, "device KV cache: sequence {} needs max_tokens > 0 (got {})", seq_id, max_tokens);
  const int need = pages_needed(max_tokens);
  HACK_CHECK(need <= free_pages(),
             "device KV cache: sequence {} needs {} pages of {} tokens for {} tokens, {} of {} are free", seq_id, need,
             options_.page_tokens, max_tokens, free_pages(), options_.num_pages);
  const int blocks = is_hack() ? full_blocks(max_tokens) : 0;
  HACK_CHECK(static_cast<size_t>(blocks) <= hack_ids_.available(),
             "device KV cache: sequence {} needs {} HACK pages for {} tokens, {} of {} are free", seq_id, blocks,
             max_tokens, hack_ids_.available(), options_.num_pages);
  blocks_.add_sequence(seq_id, max_tokens);  // the budget counts the same page units
  Sequence s;
  s.pages.reserve(static_cast<size_t>(need));
  for (int i = 0; i < need; ++i) s.pages.push_back(static_cast<int>(page_ids_.allocate()));
  for (int i = 0; i < blocks; ++i) s.hack_pages.push_back(static_cast<int>(hack_ids_.allocate()));
  sequences_.emplace(seq_id, std::move(s));
}

void CudaPagedKvCache::remove_sequence(int seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return;
  for (int p : it->second.pages) page_ids_.release(static_cast<uint32_t>(p));
  for (int p : it->second.hack_pages) hack_ids_.release(static_cast<uint32_t>(p));
  sequences_.erase(it);
  blocks_.remove_sequence(seq_id);
}

std::span<const int> CudaPagedKvCache::page_table(int seq_id) const { return get(seq_id).pages; }

cuda::PagedKvLayer CudaPagedKvCache::layer(int layer) const {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "device KV cache: layer {} out of range", layer);
  cuda::PagedKvLayer v;
  v.data = reinterpret_cast<cuda::bf16*>(static_cast<char*>(pool_.data()) +
                                         static_cast<size_t>(layer) * page_bytes() *
                                             static_cast<size_t>(options_.num_pages));
  v.page_tokens = options_.page_tokens;
  v.kv_heads = shape_.num_kv_heads;
  v.head_dim = shape_.head_dim;
  v.sinks = sinks();
  return v;
}

void CudaPagedKvCache::close_at_append(int seq_id, int layer, int n_tokens) {
  // As the CPU storage does at its append: outside a prefill, an append first closes the blocks
  // that left the recent window before it (the length before the append decides), so attention
  // after the append sees a quantized past plus the new tokens exactly. The new tokens' rows lie
  // past those blocks', so closing them after the device wrote the new rows changes nothing.
  if (!is_hack() || n_tokens == 0 || blocks_.prefilling(seq_id)) return;
  close_layer(get(seq_id), seq_id, layer, blocks_.closable_blocks(seq_id, layer));
}

void CudaPagedKvCache::commit_append(int layer, int seq_id, int start_pos, int n_tokens) {
  blocks_.check_append(seq_id, layer, start_pos, n_tokens);
  close_at_append(seq_id, layer, n_tokens);
  blocks_.record_append(seq_id, layer, n_tokens);
  KvAppendObserver* observer = blocks_.observer(seq_id);
  if (observer == nullptr || n_tokens == 0) return;
  // The tokens the kv_append kernel wrote, read back as the bf16 the device keeps (the copy
  // on the legacy stream waits for the backend's stream): the observer sees what is stored.
  const size_t elems = static_cast<size_t>(n_tokens) * static_cast<size_t>(shape_.num_kv_heads) *
                       static_cast<size_t>(shape_.head_dim);
  std::vector<float> k(elems), v(elems);
  read_exact_tokens(seq_id, layer, start_pos, n_tokens, k.data(), v.data());
  observer->on_append(layer, start_pos, n_tokens, k.data(), v.data());
}

void CudaPagedKvCache::append(int layer, int seq_id, int start_pos, int n_tokens, const float* k, const float* v) {
  const Sequence& s = get(seq_id);
  blocks_.check_append(seq_id, layer, start_pos, n_tokens);
  const size_t H = static_cast<size_t>(shape_.num_kv_heads), hd = static_cast<size_t>(shape_.head_dim);
  const size_t pitch = static_cast<size_t>(options_.page_tokens) * hd * sizeof(uint16_t);  // head to head in a page
  std::vector<uint16_t> rows(H * hd);  // one token's K (or V), every head, as bf16
  close_at_append(seq_id, layer, n_tokens);
  for (int t = 0; t < n_tokens; ++t) {
    for (int which = 0; which < 2; ++which) {
      const float* src = (which == 0 ? k : v) + static_cast<size_t>(t) * H * hd;
      for (size_t i = 0; i < H * hd; ++i) rows[i] = f32_to_bf16(src[i]);
      // Heads of one token lie a page's head stride apart: one 2-D copy for all of them.
      HACK_CUDA_CHECK(cudaMemcpy2D(const_cast<uint16_t*>(exact_row(s, layer, start_pos + t, 0, which == 1)), pitch,
                                   rows.data(), hd * sizeof(uint16_t), hd * sizeof(uint16_t), H,
                                   cudaMemcpyHostToDevice));
    }
  }
  blocks_.record_append(seq_id, layer, n_tokens);
  // Host tokens (an import): the observer sees them as given, as on the CPU.
  if (KvAppendObserver* observer = blocks_.observer(seq_id); observer != nullptr && n_tokens > 0)
    observer->on_append(layer, start_pos, n_tokens, k, v);
}

const uint16_t* CudaPagedKvCache::exact_row(const Sequence& s, int layer, int pos, int head, bool value) const {
  const int P = options_.page_tokens;
  const int row = cuda::kv_row(pos, P, sinks());
  const size_t H = static_cast<size_t>(shape_.num_kv_heads), hd = static_cast<size_t>(shape_.head_dim);
  const uint16_t* page = exact_page(layer, s.pages.at(static_cast<size_t>(row / P)));
  return page + ((value ? H : 0) + static_cast<size_t>(head)) * static_cast<size_t>(P) * hd +
         static_cast<size_t>(row % P) * hd;
}

void CudaPagedKvCache::keep_tokens(int seq_id, int layer, const std::vector<int>& kept) {
  // As the CPU cache does it: the kept tokens come back as f32 (read_kept_tokens) and the
  // layer restarts from them. Its pages stay the sequence's (reserved for max_tokens).
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "device KV cache: layer {} out of range", layer);
  HACK_CHECK(!is_hack() || (blocks_.prefilling(seq_id) && blocks_.closed_blocks(seq_id, layer) == 0),
             "sequence {} layer {}: tokens can be evicted only inside its prefill, before any block is quantized",
             seq_id, layer);
  std::vector<float> k, v;
  read_kept_tokens(seq_id, layer, kept, k, v);
  blocks_.set_layer(seq_id, layer, 0, 0);
  KvAppendObserver* observer = blocks_.observer(seq_id);  // it saw these tokens once already
  blocks_.set_observer(seq_id, nullptr);
  append(layer, seq_id, 0, static_cast<int>(kept.size()), k.data(), v.data());
  blocks_.set_observer(seq_id, observer);
}

bool CudaPagedKvCache::try_extend_sequence(int seq_id, int max_tokens) {
  Sequence& s = get(seq_id);
  if (max_tokens <= blocks_.max_tokens(seq_id)) return true;
  const int more = pages_needed(max_tokens) - static_cast<int>(s.pages.size());
  const int more_hack = is_hack() ? full_blocks(max_tokens) - static_cast<int>(s.hack_pages.size()) : 0;
  if (more > free_pages() || more_hack > static_cast<int>(hack_ids_.available())) return false;
  if (!blocks_.try_extend_sequence(seq_id, max_tokens)) return false;
  for (int i = 0; i < more; ++i) s.pages.push_back(static_cast<int>(page_ids_.allocate()));
  for (int i = 0; i < more_hack; ++i) s.hack_pages.push_back(static_cast<int>(hack_ids_.allocate()));
  return true;
}

void CudaPagedKvCache::set_append_observer(int seq_id, KvAppendObserver* observer) {
  blocks_.set_observer(seq_id, observer);
}

void CudaPagedKvCache::close_pending_blocks(int seq_id) {
  if (!is_hack()) return;
  Sequence& s = get(seq_id);
  for (int l = 0; l < shape_.num_layers; ++l) close_layer(s, seq_id, l, blocks_.closable_blocks(seq_id, l));
}

void CudaPagedKvCache::close_pending_blocks(int seq_id, int layer) {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "device KV cache: layer {} out of range", layer);
  if (!is_hack()) return;
  close_layer(get(seq_id), seq_id, layer, blocks_.closable_blocks(seq_id, layer));
}

void CudaPagedKvCache::close_pending_blocks(int seq_id, int layer, const KnownPages& known) {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "device KV cache: layer {} out of range", layer);
  if (!is_hack()) return;
  close_layer(get(seq_id), seq_id, layer, blocks_.closable_blocks(seq_id, layer), &known);
}

void CudaPagedKvCache::read_hack_page(int seq_id, int layer, int index, std::byte* page) const {
  HACK_CHECK(index >= 0 && index < hack_page_count(seq_id, layer),
             "device KV cache: sequence {} layer {} has no closed page {}", seq_id, layer, index);
  const Sequence& s = get(seq_id);
  HACK_CUDA_CHECK(cudaMemcpy(page, hack_page(layer, s.hack_pages[static_cast<size_t>(index)]),
                             hack_layout(layer).page_bytes(), cudaMemcpyDeviceToHost));
}

void CudaPagedKvCache::peek_block_page(int seq_id, int layer, int block, std::byte* page) const {
  HACK_CHECK(is_hack(), "device KV cache: peek_block_page needs --kv hack");
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "device KV cache: layer {} out of range", layer);
  const Sequence& s = get(seq_id);
  HACK_CHECK(block >= 0 && block < full_blocks(blocks_.length(seq_id, layer)),
             "device KV cache: sequence {} layer {} has no full block {}", seq_id, layer, block);
  if (block < blocks_.closed_blocks(seq_id, layer)) {
    read_hack_page(seq_id, layer, block, page);
    return;
  }
  // A full bf16 block: quantized into a scratch page (the same kernel as close, so the same bytes).
  const size_t stride = *std::max_element(hack_stride_.begin(), hack_stride_.end());
  if (scratch_page_.bytes() < stride) scratch_page_ = Buffer::allocate(MemoryKind::device, stride, options_.device);
  std::vector<uint64_t> args(4);
  put_block_args(s, layer, block, scratch_page_.data(), args, 0, 1);
  quantize_blocks(layer, args, 1);
  HACK_CUDA_CHECK(cudaMemcpy(page, scratch_page_.data(), hack_layout(layer).page_bytes(), cudaMemcpyDeviceToHost));
}

void CudaPagedKvCache::append_hack_page(int layer, int seq_id, const void* bytes, size_t size) {
  HACK_CHECK(is_hack(), "device KV cache: append_hack_page needs --kv hack");
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "device KV cache: layer {} out of range", layer);
  hack_layout(layer).validate(bytes, size);
  Sequence& s = get(seq_id);
  const int P = options_.page_tokens;
  const int closed = blocks_.closed_blocks(seq_id, layer), length = blocks_.length(seq_id, layer);
  const int64_t expected = sinks() + static_cast<int64_t>(closed) * P;
  HACK_CHECK(length == expected, "append_hack_page: sequence {} layer {} holds {} tokens, a block starts at {}", seq_id,
             layer, length, expected);
  HACK_CHECK(HackPageLayout::page_layer(bytes) == layer && HackPageLayout::page_first_token(bytes) == expected,
             "append_hack_page: page is layer {} token {}, expected layer {} token {}", HackPageLayout::page_layer(bytes),
             HackPageLayout::page_first_token(bytes), layer, expected);
  blocks_.check_append(seq_id, layer, length, P);
  HACK_CHECK(static_cast<size_t>(closed) < s.hack_pages.size(), "sequence {}: {} tokens exceed its capacity of {}",
             seq_id, length + P, blocks_.max_tokens(seq_id));
  HACK_CUDA_CHECK(cudaMemcpy(hack_page(layer, s.hack_pages[static_cast<size_t>(closed)]), bytes, size,
                             cudaMemcpyHostToDevice));
  blocks_.record_append(seq_id, layer, P);
  blocks_.record_closed(seq_id, layer, closed + 1);
}

void CudaPagedKvCache::copy_exact_tokens(int seq_id, int layer, int first_token, int n_tokens, std::byte* k,
                                         std::byte* v) const {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "device KV cache: layer {} out of range", layer);
  HACK_CHECK(n_tokens >= 0, "copy_exact_tokens: negative token count {}", n_tokens);
  const Sequence& s = get(seq_id);
  const int S = sinks(), P = options_.page_tokens;
  const int length = blocks_.length(seq_id, layer), closed = is_hack() ? blocks_.closed_blocks(seq_id, layer) : 0;
  // Check the whole range first so nothing is written for a bad one.
  for (int pos = first_token; pos < first_token + n_tokens; ++pos) {
    HACK_CHECK(pos >= 0 && pos < length, "sequence {} layer {}: token {} is not stored ({} tokens)", seq_id, layer,
               pos, length);
    HACK_CHECK(!is_hack() || pos < S || (pos - S) / P >= closed,
               "sequence {} layer {}: token {} lies in a quantized block", seq_id, layer, pos);
  }
  // Whole pages come to the host once; rows are picked from them.
  const size_t H = static_cast<size_t>(shape_.num_kv_heads), hd = static_cast<size_t>(shape_.head_dim);
  const size_t head_elems = static_cast<size_t>(P) * hd, row_bytes = hd * sizeof(uint16_t);
  std::vector<uint16_t> page(2 * H * head_elems);  // [K|V][kv_head][Π][head_dim]
  int loaded = -1;
  for (int i = 0; i < n_tokens; ++i) {
    const int row = cuda::kv_row(first_token + i, P, S);
    if (row / P != loaded) {
      loaded = row / P;
      HACK_CUDA_CHECK(cudaMemcpy(page.data(), exact_page(layer, s.pages[static_cast<size_t>(loaded)]), page_bytes(),
                                 cudaMemcpyDeviceToHost));
    }
    const size_t r = static_cast<size_t>(row % P);
    for (size_t h = 0; h < H; ++h) {
      const size_t dst = (static_cast<size_t>(i) * H + h) * row_bytes;
      std::memcpy(k + dst, page.data() + h * head_elems + r * hd, row_bytes);
      if (v != nullptr) std::memcpy(v + dst, page.data() + (H + h) * head_elems + r * hd, row_bytes);
    }
  }
}

KvCacheStats CudaPagedKvCache::stats() const {
  KvCacheStats st;
  st.sequences = blocks_.sequence_count();
  st.tokens = blocks_.token_count();
  const size_t unit = cuda_kv_page_bytes(shape_, options_);
  for (const auto& [id, s] : sequences_) {
    st.bytes_reserved += s.pages.size() * unit;
    st.bytes_used += s.pages.size() * page_bytes() * static_cast<size_t>(shape_.num_layers);
    for (size_t l = 0; l < hack_stride_.size(); ++l) st.bytes_used += s.hack_pages.size() * hack_stride_[l];
  }
  st.bytes_capacity = static_cast<size_t>(options_.num_pages) * unit;  // page units, as sequence_bytes counts
  st.bytes_pooled = pool_.bytes() + hack_pool_.bytes();
  return st;
}

}  // namespace hack
