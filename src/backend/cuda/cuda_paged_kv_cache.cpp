#include "hack/backend/cuda_paged_kv_cache.h"

#include <cuda_runtime.h>

#include "hack/backend/cuda_check.h"
#include "hack/core/dtype.h"
#include "hack/core/error.h"

namespace hack {

CudaPagedKvCache::CudaPagedKvCache(const KvShape& shape, const CudaKvOptions& options)
    : shape_(shape), options_(options) {
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
  free_.reserve(static_cast<size_t>(options.num_pages));
  for (int p = options.num_pages - 1; p >= 0; --p) free_.push_back(p);
}

std::string CudaPagedKvCache::name() const { return "bf16-paged-cuda"; }

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
  HACK_CHECK(!sequences_.contains(seq_id), "device KV cache: sequence {} already exists", seq_id);
  HACK_CHECK(max_tokens > 0, "device KV cache: sequence {} needs max_tokens > 0 (got {})", seq_id, max_tokens);
  const int need = pages_for(max_tokens, options_.page_tokens);
  HACK_CHECK(need <= free_pages(),
             "device KV cache: sequence {} needs {} pages of {} tokens for {} tokens, {} of {} are free", seq_id, need,
             options_.page_tokens, max_tokens, free_pages(), options_.num_pages);
  Sequence s;
  s.max_tokens = max_tokens;
  s.lengths.assign(static_cast<size_t>(shape_.num_layers), 0);
  s.pages.reserve(static_cast<size_t>(need));
  for (int i = 0; i < need; ++i) {
    s.pages.push_back(free_.back());
    free_.pop_back();
  }
  sequences_.emplace(seq_id, std::move(s));
}

void CudaPagedKvCache::remove_sequence(int seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return;
  for (int p : it->second.pages) free_.push_back(p);
  sequences_.erase(it);
}

bool CudaPagedKvCache::has_sequence(int seq_id) const { return sequences_.contains(seq_id); }

int CudaPagedKvCache::length(int seq_id, int layer) const {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "device KV cache: layer {} out of range", layer);
  return get(seq_id).lengths[static_cast<size_t>(layer)];
}

std::span<const int> CudaPagedKvCache::page_table(int seq_id) const { return get(seq_id).pages; }

int CudaPagedKvCache::max_tokens(int seq_id) const { return get(seq_id).max_tokens; }

cuda::PagedKvLayer CudaPagedKvCache::layer(int layer) const {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "device KV cache: layer {} out of range", layer);
  cuda::PagedKvLayer v;
  v.data = reinterpret_cast<cuda::bf16*>(static_cast<char*>(pool_.data()) +
                                         static_cast<size_t>(layer) * page_bytes() *
                                             static_cast<size_t>(options_.num_pages));
  v.page_tokens = options_.page_tokens;
  v.kv_heads = shape_.num_kv_heads;
  v.head_dim = shape_.head_dim;
  return v;
}

void CudaPagedKvCache::commit_append(int layer, int seq_id, int start_pos, int n_tokens) {
  Sequence& s = get(seq_id);
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "device KV cache: layer {} out of range", layer);
  int& len = s.lengths[static_cast<size_t>(layer)];
  HACK_CHECK(start_pos == len, "device KV cache: sequence {} layer {}: append at {} but length is {}", seq_id, layer,
             start_pos, len);
  HACK_CHECK(n_tokens >= 0 && start_pos + n_tokens <= s.max_tokens,
             "device KV cache: sequence {}: {} + {} tokens exceed its reservation of {}", seq_id, start_pos, n_tokens,
             s.max_tokens);
  len += n_tokens;
}

void CudaPagedKvCache::append(int layer, int seq_id, int start_pos, int n_tokens, const float* k, const float* v) {
  const Sequence& s = get(seq_id);
  HACK_CHECK(start_pos == length(seq_id, layer), "device KV cache: sequence {} layer {}: append at {} but length is {}",
             seq_id, layer, start_pos, length(seq_id, layer));
  HACK_CHECK(start_pos + n_tokens <= s.max_tokens, "device KV cache: sequence {}: {} + {} tokens exceed its reservation of {}",
             seq_id, start_pos, n_tokens, s.max_tokens);
  const cuda::PagedKvLayer view = this->layer(layer);
  const size_t hd = static_cast<size_t>(shape_.head_dim);
  const size_t kvd = static_cast<size_t>(shape_.num_kv_heads) * hd;
  const size_t head_elems = static_cast<size_t>(options_.page_tokens) * hd;
  std::vector<uint16_t> row(hd);
  for (int t = 0; t < n_tokens; ++t) {
    const int pos = start_pos + t;
    const size_t page = static_cast<size_t>(s.pages[static_cast<size_t>(pos / options_.page_tokens)]);
    const size_t r = static_cast<size_t>(pos % options_.page_tokens);
    for (int which = 0; which < 2; ++which) {
      const float* src = (which == 0 ? k : v) + static_cast<size_t>(t) * kvd;
      for (size_t h = 0; h < static_cast<size_t>(shape_.num_kv_heads); ++h) {
        for (size_t d = 0; d < hd; ++d) row[d] = f32_to_bf16(src[h * hd + d]);
        cuda::bf16* dst = view.data + ((page * 2 + static_cast<size_t>(which)) * static_cast<size_t>(shape_.num_kv_heads) + h) *
                                          head_elems +
                          r * hd;
        HACK_CUDA_CHECK(cudaMemcpy(dst, row.data(), hd * sizeof(uint16_t), cudaMemcpyHostToDevice));
      }
    }
  }
  commit_append(layer, seq_id, start_pos, n_tokens);
}

KvCacheStats CudaPagedKvCache::stats() const {
  KvCacheStats st;
  st.sequences = static_cast<int64_t>(sequences_.size());
  for (const auto& [id, s] : sequences_) {
    st.tokens += s.lengths.front();
    st.bytes_used += s.pages.size() * page_bytes() * static_cast<size_t>(shape_.num_layers);
  }
  st.bytes_capacity = pool_.bytes();
  return st;
}

}  // namespace hack
