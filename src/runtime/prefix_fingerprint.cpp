// What a prefix-cache block's bytes depend on (include/hack/runtime/prefix_fingerprint.h).
#include "hack/runtime/prefix_fingerprint.h"

#include <xxhash.h>

#include "hack/core/error.h"

namespace hack {

namespace {

// xxh3 over every weight tensor (name order fixed by the struct), with its shape and dtype:
// ~30 ms for SmolLM2's 270 MB. The weights are the operator's, not an adversary's, so a fast
// hash suffices here; the chain keys themselves are SHA-256.
std::string weights_digest(const Model& model) {
  XXH3_state_t* state = XXH3_createState();
  HACK_CHECK(state != nullptr && XXH3_64bits_reset(state) == XXH_OK, "weights digest: cannot initialise xxh3");
  auto add = [&](const Tensor& t) {
    if (!t.defined()) return;
    const std::string d = t.describe();
    XXH3_64bits_update(state, d.data(), d.size());
    XXH3_64bits_update(state, t.raw(), t.bytes());
  };
  const ModelWeights& w = model.weights;
  add(w.embed);
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.bo, &l.q_norm,
                            &l.k_norm, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down})
      add(*t);
  }
  add(w.final_norm);
  add(w.lm_head);
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return fmt::format("{:016x}", h);
}

}  // namespace

KvFingerprint prefix_fingerprint(const Model& model, const std::string& device, const KvCacheOptions& kv,
                                 DType exact_dtype, BlockCodec codec) {
  const ModelConfig& c = model.config;
  KvFingerprint f;
  f.add("format", "kv_block v1")
      .add("codec", block_codec_name(codec))
      .add("model.layers", c.num_layers)
      .add("model.hidden", c.hidden_size)
      .add("model.heads", c.num_heads)
      .add("model.kv_heads", c.num_kv_heads)
      .add("model.head_dim", c.head_dim)
      .add("model.vocab", c.vocab_size)
      .add("model.rope_theta", fmt::format("{}", c.rope_theta))
      .add("model.weights_xxh3", weights_digest(model))
      .add("device", device)
      .add("kv.exact_dtype", dtype_name(exact_dtype))
      .add("kv.block_tokens", kv.block_tokens)
      .add("fdc", "none");
  return f;
}

DType cache_exact_dtype(const KvCacheOptions& kv) { return kv.mode == KvMode::hack ? DType::bf16 : kv.fp_dtype; }

}  // namespace hack
