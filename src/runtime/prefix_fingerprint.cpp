// What a prefix-cache block's bytes depend on (include/hack/runtime/prefix_fingerprint.h).
#include "hack/runtime/prefix_fingerprint.h"

#include "hack/core/error.h"
#include "hack/model/fdc.h"

namespace hack {

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
      .add("fdc", model.fdc ? model.fdc->digest : "none");  // the artifact and the ranks in use (model/fdc.h)
  return f;
}

DType cache_exact_dtype(const KvCacheOptions& kv) { return kv.mode == KvMode::hack ? DType::bf16 : kv.fp_dtype; }

}  // namespace hack
