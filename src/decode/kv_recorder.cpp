// Exact KV of a decode sequence kept for the vault (include/hack/decode/kv_recorder.h).
#include "hack/decode/kv_recorder.h"

#include <algorithm>
#include <cstring>

#include "hack/core/error.h"
#include "hack/decode/decode_scheduler.h"
#include "hack/kv/kv_stream.h"

namespace hack::server {

KvRecorder::KvRecorder(const KvShape& shape, int first_token)
    : shape_(shape),
      first_(first_token),
      token_floats_(static_cast<size_t>(shape.num_kv_heads) * static_cast<size_t>(shape.head_dim)),
      data_(static_cast<size_t>(shape.num_layers)),
      have_(static_cast<size_t>(shape.num_layers)) {
  HACK_CHECK(first_token >= 0, "kv recorder: first token {} is negative", first_token);
}

void KvRecorder::put(int layer, int pos, const float* k, const float* v) {
  if (pos < first_) return;
  auto& d = data_[static_cast<size_t>(layer)];
  auto& h = have_[static_cast<size_t>(layer)];
  const auto i = static_cast<size_t>(pos - first_);
  if (h.size() <= i) {
    h.resize(i + 1, 0);
    d.resize((i + 1) * 2 * token_floats_);
  }
  std::memcpy(d.data() + i * 2 * token_floats_, k, token_floats_ * sizeof(float));
  std::memcpy(d.data() + (i * 2 + 1) * token_floats_, v, token_floats_ * sizeof(float));
  h[i] = 1;
}

void KvRecorder::on_append(int layer, int start_pos, int n_tokens, const float* k, const float* v) {
  for (int t = 0; t < n_tokens; ++t)
    put(layer, start_pos + t, k + static_cast<size_t>(t) * token_floats_, v + static_cast<size_t>(t) * token_floats_);
}

void KvRecorder::add_exact_message(int layer, std::span<const std::byte> message) {
  HACK_CHECK(layer >= 0 && layer < shape_.num_layers, "kv recorder: layer {} out of range", layer);
  const ExactTokensHeader h = decode_exact_header(message);
  HACK_CHECK(static_cast<int>(h.layer) == layer, "kv recorder: message of layer {} sent as layer {}", h.layer, layer);
  HACK_CHECK(h.num_kv_heads == shape_.num_kv_heads && h.head_dim == shape_.head_dim,
             "kv recorder: message of {} heads × {} dims, cache has {} × {}", h.num_kv_heads, h.head_dim,
             shape_.num_kv_heads, shape_.head_dim);
  std::vector<float> k, v;
  exact_tokens_f32(h, message, k, v);
  on_append(layer, static_cast<int>(h.first_token), static_cast<int>(h.n_tokens), k.data(), v.data());
}

bool KvRecorder::read(int layer, int first, int n, float* k, float* v) const {
  if (layer < 0 || layer >= shape_.num_layers || first < first_ || n < 0) return false;
  const auto& d = data_[static_cast<size_t>(layer)];
  const auto& h = have_[static_cast<size_t>(layer)];
  for (int t = 0; t < n; ++t) {
    const auto i = static_cast<size_t>(first + t - first_);
    if (i >= h.size() || !h[i]) return false;
    std::memcpy(k + static_cast<size_t>(t) * token_floats_, d.data() + i * 2 * token_floats_, token_floats_ * sizeof(float));
    std::memcpy(v + static_cast<size_t>(t) * token_floats_, d.data() + (i * 2 + 1) * token_floats_,
                token_floats_ * sizeof(float));
  }
  return true;
}

int encode_finished_blocks(const FinishedKv& f, const BlockKey& root, int block_tokens, BlockCodec codec,
                           DType exact_dtype, const KvShape& shape, const BlockStoreFn& store) {
  HACK_CHECK(f.recorder != nullptr && block_tokens > 0, "encode_finished_blocks: no recorder or block size");
  std::vector<int> tokens(f.prompt.begin(), f.prompt.end());
  tokens.insert(tokens.end(), f.generated.begin(), f.generated.end());
  const int stored = std::min(f.stored_tokens, static_cast<int>(tokens.size()));
  const int first_block = f.recorder->first_token() / block_tokens;
  const int end_block = stored / block_tokens;
  if (end_block <= first_block) return 0;
  const std::vector<BlockKey> keys =
      chain_keys(root, std::span<const int>(tokens).first(static_cast<size_t>(end_block * block_tokens)), block_tokens);
  const size_t floats = static_cast<size_t>(block_tokens) * static_cast<size_t>(shape.num_kv_heads * shape.head_dim);
  std::vector<float> k(floats), v(floats);
  int done = 0;
  for (int b = first_block; b < end_block; ++b) {
    std::vector<std::vector<std::byte>> slices(static_cast<size_t>(shape.num_layers));
    bool complete = true;
    for (int l = 0; l < shape.num_layers && complete; ++l) {
      complete = f.recorder->read(l, b * block_tokens, block_tokens, k.data(), v.data());
      if (complete)
        encode_kv_block_layer(k.data(), v.data(), block_tokens, shape.num_kv_heads, shape.head_dim, codec, exact_dtype,
                              slices[static_cast<size_t>(l)]);
    }
    if (!complete) break;
    const auto bi = static_cast<size_t>(b);
    store(keys[bi], b == 0 ? root : keys[bi - 1], b == 0,
          assemble_kv_block(codec, exact_dtype, shape, int64_t{b} * block_tokens, block_tokens, slices));
    ++done;
  }
  return done;
}

}  // namespace hack::server
