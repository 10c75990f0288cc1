// What every paged KV implementation shares (include/hack/kv/paged_kv.h).
#include "hack/kv/paged_kv.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "hack/core/dtype.h"
#include "hack/core/error.h"

namespace hack {

int PagedKv::hack_page_count(int seq_id, int layer) const {
  HACK_CHECK(options().mode == KvMode::hack, "hack_page_count: the cache is in fp mode");
  return blocks().closed_blocks(seq_id, layer);
}

void PagedKv::read_exact_tokens(int seq_id, int layer, int first_token, int n_tokens, float* k, float* v) const {
  const KvShape& s = shape();
  const size_t elems =
      static_cast<size_t>(std::max(n_tokens, 0)) * static_cast<size_t>(s.num_kv_heads) * static_cast<size_t>(s.head_dim);
  if (exact_dtype() == DType::f32) {
    copy_exact_tokens(seq_id, layer, first_token, n_tokens, reinterpret_cast<std::byte*>(k),
                      reinterpret_cast<std::byte*>(v));
    return;
  }
  std::vector<uint16_t> kb(elems), vb(v ? elems : 0);
  copy_exact_tokens(seq_id, layer, first_token, n_tokens, reinterpret_cast<std::byte*>(kb.data()),
                    v ? reinterpret_cast<std::byte*>(vb.data()) : nullptr);
  for (size_t i = 0; i < elems; ++i) k[i] = bf16_to_f32(kb[i]);
  if (v)
    for (size_t i = 0; i < elems; ++i) v[i] = bf16_to_f32(vb[i]);
}

void PagedKv::read_kept_tokens(int seq_id, int layer, const std::vector<int>& kept, std::vector<float>& k,
                               std::vector<float>& v) const {
  const int n = length(seq_id, layer);
  for (size_t i = 0; i < kept.size(); ++i)
    HACK_CHECK(kept[i] >= 0 && kept[i] < n && (i == 0 || kept[i] > kept[i - 1]),
               "sequence {} layer {}: kept token {} is out of order or not among its {} tokens", seq_id, layer, kept[i],
               n);
  const size_t token_floats = static_cast<size_t>(shape().num_kv_heads) * static_cast<size_t>(shape().head_dim);
  k.resize(static_cast<size_t>(n) * token_floats);
  v.resize(k.size());
  read_exact_tokens(seq_id, layer, 0, n, k.data(), v.data());
  for (size_t i = 0; i < kept.size(); ++i) {
    const auto from = static_cast<std::ptrdiff_t>(static_cast<size_t>(kept[i]) * token_floats);
    const auto to = static_cast<std::ptrdiff_t>(i * token_floats);
    std::copy_n(k.begin() + from, token_floats, k.begin() + to);
    std::copy_n(v.begin() + from, token_floats, v.begin() + to);
  }
  k.resize(kept.size() * token_floats);
  v.resize(k.size());
}

}  // namespace hack
