#include "hack/kv/fp_kv_cache.h"

#include <algorithm>
#include <cstring>

#include "hack/core/error.h"
#include "hack/kernels/cpu/ops.h"

namespace hack {

FpKvCache::FpKvCache(const KvShape& shape) : shape_(shape) {
  HACK_CHECK(shape.num_layers > 0 && shape.num_kv_heads > 0 && shape.head_dim > 0 && shape.group_size > 0,
             "FpKvCache: invalid shape");
}

void FpKvCache::add_sequence(int seq_id, int max_tokens) {
  HACK_CHECK(!sequences_.contains(seq_id), "sequence {} already exists", seq_id);
  HACK_CHECK(max_tokens > 0, "sequence {}: max_tokens must be positive, got {}", seq_id, max_tokens);
  auto s = std::make_unique<Sequence>();
  s->max_tokens = max_tokens;
  s->length.assign(static_cast<size_t>(shape_.num_layers), 0);
  const size_t n = static_cast<size_t>(shape_.num_layers) * static_cast<size_t>(shape_.num_kv_heads) *
                   static_cast<size_t>(max_tokens) * static_cast<size_t>(shape_.head_dim);
  s->k.assign(n, 0.0f);
  s->v.assign(n, 0.0f);
  sequences_.emplace(seq_id, std::move(s));
}

void FpKvCache::remove_sequence(int seq_id) { sequences_.erase(seq_id); }

bool FpKvCache::has_sequence(int seq_id) const { return sequences_.contains(seq_id); }

const FpKvCache::Sequence& FpKvCache::get(int seq_id) const {
  auto it = sequences_.find(seq_id);
  HACK_CHECK(it != sequences_.end(), "unknown sequence {}", seq_id);
  return *it->second;
}

int FpKvCache::length(int seq_id, int layer) const { return get(seq_id).length[static_cast<size_t>(layer)]; }

size_t FpKvCache::head_offset(const Sequence& s, int layer, int kv_head) const {
  return ((static_cast<size_t>(layer) * static_cast<size_t>(shape_.num_kv_heads) + static_cast<size_t>(kv_head)) *
          static_cast<size_t>(s.max_tokens)) *
         static_cast<size_t>(shape_.head_dim);
}

void FpKvCache::append(int layer, int seq_id, int start_pos, int n_tokens, const float* k, const float* v) {
  auto& s = const_cast<Sequence&>(get(seq_id));
  int& len = s.length[static_cast<size_t>(layer)];
  HACK_CHECK(start_pos == len, "sequence {} layer {}: append at {} but length is {}", seq_id, layer, start_pos, len);
  HACK_CHECK(len + n_tokens <= s.max_tokens, "sequence {}: {} tokens exceed its capacity of {}", seq_id,
             len + n_tokens, s.max_tokens);
  const size_t hd = static_cast<size_t>(shape_.head_dim);
  for (int h = 0; h < shape_.num_kv_heads; ++h) {
    const size_t base = head_offset(s, layer, h);
    for (int t = 0; t < n_tokens; ++t) {
      const size_t src = (static_cast<size_t>(t) * static_cast<size_t>(shape_.num_kv_heads) + static_cast<size_t>(h)) * hd;
      const size_t dst = base + static_cast<size_t>(len + t) * hd;
      std::memcpy(&s.k[dst], k + src, hd * sizeof(float));
      std::memcpy(&s.v[dst], v + src, hd * sizeof(float));
    }
  }
  len += n_tokens;
}

size_t FpKvCache::attend_scratch_floats(int, int context_tokens) const {
  return static_cast<size_t>(shape_.group_size) * static_cast<size_t>(context_tokens);
}

void FpKvCache::attend(int layer, int seq_id, int kv_head, int start_pos, int n_tokens, const float* q,
                       size_t q_row_stride, float* out, size_t out_row_stride, float scale, float* scratch) const {
  const Sequence& s = get(seq_id);
  HACK_CHECK(s.length[static_cast<size_t>(layer)] >= start_pos + n_tokens,
             "sequence {} layer {}: attention over {} tokens but {} stored", seq_id, layer, start_pos + n_tokens,
             s.length[static_cast<size_t>(layer)]);
  const size_t hd = static_cast<size_t>(shape_.head_dim);
  const int group = shape_.group_size;
  const float* kh = s.k.data() + head_offset(s, layer, kv_head);
  const float* vh = s.v.data() + head_offset(s, layer, kv_head);
  for (int t = 0; t < n_tokens; ++t) {
    const int ctx = start_pos + t + 1;  // causal: keys 0 .. start_pos + t
    const float* qt = q + static_cast<size_t>(t) * q_row_stride;
    float* ot = out + static_cast<size_t>(t) * out_row_stride;
    for (int g = 0; g < group; ++g) {
      float* scores = scratch + static_cast<size_t>(g) * static_cast<size_t>(ctx);
      const float* qg = qt + static_cast<size_t>(g) * hd;
      for (int j = 0; j < ctx; ++j) scores[j] = scale * cpu::dot(qg, kh + static_cast<size_t>(j) * hd, hd);
      cpu::softmax(scores, static_cast<size_t>(ctx));
      float* og = ot + static_cast<size_t>(g) * hd;
      std::fill(og, og + hd, 0.0f);
      for (int j = 0; j < ctx; ++j) cpu::axpy(scores[j], vh + static_cast<size_t>(j) * hd, og, hd);
    }
  }
}

KvCacheStats FpKvCache::stats() const {
  KvCacheStats st;
  st.sequences = static_cast<int64_t>(sequences_.size());
  const size_t per_token = static_cast<size_t>(shape_.num_layers) * static_cast<size_t>(shape_.num_kv_heads) *
                           static_cast<size_t>(shape_.head_dim) * 2 * sizeof(float);
  for (const auto& [id, s] : sequences_) {
    st.tokens += s->length.back();
    st.bytes_used += per_token * static_cast<size_t>(s->max_tokens);
  }
  return st;
}

}  // namespace hack
