/// @file kv_recorder.h
/// @brief The exact KV of one decode sequence from a block boundary on, kept beside the cache
/// so that, when the request finishes, the blocks holding its generated tokens can be stored in
/// the vault (the next turn of the conversation restores them instead of recomputing). The
/// cache itself cannot give them back in hack mode: it has quantized them.
///
/// Filled from the cache's appends (KvAppendObserver: imported exact tokens, decode steps, a
/// local prefill) and from the prefill node's exact_copy messages (kv_stream.h: the prompt's
/// last partial block, whose first tokens arrive inside a quantized page). Holds f32:
/// [layers][tokens][K|V][num_kv_heads][head_dim], 2 · 4 · layers · kv_dim bytes per token
/// (SmolLM2-135M: 46 KB per token), for the tokens after the prompt's last full block only.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "hack/kv/block_key.h"
#include "hack/kv/kv_block.h"
#include "hack/kv/paged_kv.h"

namespace hack::server {

struct FinishedKv;

class KvRecorder final : public KvAppendObserver {
 public:
  KvRecorder(const KvShape& shape, int first_token);

  void on_append(int layer, int start_pos, int n_tokens, const float* k, const float* v) override;
  /// An exact_copy message (kv_stream.h exact format): its tokens at or after first_token are
  /// kept. Throws hack::Error for a malformed message or one of another shape.
  void add_exact_message(int layer, std::span<const std::byte> message);
  /// K and V ([n][heads][dim] f32) of tokens [first, first + n) of a layer; false when any of
  /// them was never recorded.
  bool read(int layer, int first, int n, float* k, float* v) const;
  int first_token() const { return first_; }

 private:
  void put(int layer, int pos, const float* k, const float* v);

  KvShape shape_;
  int first_;
  size_t token_floats_;
  std::vector<std::vector<float>> data_;   // per layer: [token][K|V][heads·dim]
  std::vector<std::vector<uint8_t>> have_; // per layer: recorded flags
};

/// Receives one block to store: key, parent (the chain root for block 0), whether it is the
/// chain's first, the kv_block value.
using BlockStoreFn = std::function<void(const BlockKey& key, const BlockKey& parent, bool first,
                                        std::vector<std::byte> value)>;

/// Encodes the full blocks of a finished request that hold KV its prompt's prefill did not
/// already store — blocks [recorder.first_token() / Π, stored_tokens / Π), keyed over prompt
/// + generated tokens from `root` — and hands each to `store`. A block some of whose tokens
/// were never recorded ends the run (a chain with a hole is useless). Returns how many.
int encode_finished_blocks(const FinishedKv& finished, const BlockKey& root, int block_tokens, BlockCodec codec,
                           DType exact_dtype, const KvShape& shape, const BlockStoreFn& store);

}  // namespace hack::server
