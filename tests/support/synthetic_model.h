// A small synthetic model shape and reproducible random prompts, shared by the tests that
// run prefill→decode on random weights (backend kv_stream, server prefill worker).
#pragma once

#include <cstdint>
#include <vector>

#include "hack/kv/kv_options.h"
#include "hack/model/config.h"

namespace hack::test {

/// "tiny" with 3 layers, a 512-token vocabulary, BOS 1 / EOS 2 and 4096 positions.
inline ModelConfig small_synthetic_config() {
  ModelConfig c = synthetic_model_config("tiny");
  c.num_layers = 3;
  c.vocab_size = 512;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.max_position_embeddings = 4096;
  return c;
}

/// `length` token ids below `vocab`, the same for the same seed (an LCG).
inline std::vector<int> random_prompt(int length, int vocab, uint32_t seed) {
  std::vector<int> p(static_cast<size_t>(length));
  uint32_t x = seed * 2654435761u + 1;
  for (int& t : p) {
    x = x * 1664525u + 1013904223u;
    t = static_cast<int>((x >> 8) % static_cast<uint32_t>(vocab));
  }
  return p;
}

/// The KV these tests run on: `mode`, blocks of `block_tokens`, 4 sinks, f32 exact tokens (so
/// a paged cache keeps the computed values as they are).
inline KvCacheOptions synthetic_kv_options(KvMode mode, int block_tokens) {
  KvCacheOptions o;
  o.mode = mode;
  o.block_tokens = block_tokens;
  o.sinks = 4;
  o.fp_dtype = DType::f32;
  return o;
}

}  // namespace hack::test
