/// @file fp_kv_cache.h
/// @brief The reference KV cache: contiguous fp32 per sequence, exact fp32 attention.
/// Simple on purpose — the paged and quantized caches are tested against it.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "hack/kv/kv_cache.h"

namespace hack {

class FpKvCache final : public KvCache {
 public:
  explicit FpKvCache(const KvShape& shape);

  const KvShape& shape() const override { return shape_; }
  std::string name() const override { return "fp32-contiguous"; }
  /// add/remove must not run concurrently with append/attend.
  void add_sequence(int seq_id, int max_tokens) override;
  void remove_sequence(int seq_id) override;
  bool has_sequence(int seq_id) const override;
  int length(int seq_id, int layer) const override;
  void append(int layer, int seq_id, int start_pos, int n_tokens, const float* k, const float* v) override;
  void attend(int layer, int seq_id, int kv_head, int start_pos, int n_tokens, const float* q, size_t q_row_stride,
              float* out, size_t out_row_stride, float scale, float* scratch) const;
  size_t attend_scratch_floats(int n_tokens, int context_tokens) const;
  KvCacheStats stats() const override;

 private:
  struct Sequence {
    int max_tokens = 0;
    std::vector<int> length;      // [layer]
    std::vector<float> k, v;      // [layer][kv_head][max_tokens][head_dim]
  };
  const Sequence& get(int seq_id) const;
  size_t head_offset(const Sequence& s, int layer, int kv_head) const;

  KvShape shape_;
  std::unordered_map<int, std::unique_ptr<Sequence>> sequences_;
};

}  // namespace hack
