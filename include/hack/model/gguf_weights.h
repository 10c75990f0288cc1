/// @file gguf_weights.h
/// @brief A llama-, qwen2- or qwen3-architecture GGUF file as a Model: the config from the
/// `<arch>.*` metadata, the weights as views of the mapped file (block types stay quantized),
/// names mapped as llama.cpp's converter wrote them (token_embd, blk.N.attn_q, ...).
///
/// llama.cpp's convert_hf_to_gguf.py interleaves the two RoPE halves of each head in the rows
/// of attn_q and attn_k of *llama* models (LlamaModel.permute); those two matrices are copied
/// here with their rows put back in the Hugging Face order (whole rows, so block rows too).
/// Its qwen2 and qwen3 keep the Hugging Face order (NEOX RoPE), so nothing is copied for them;
/// qwen3 adds per-head q/k norms (attn_q_norm, attn_k_norm) and has no attention biases.
#pragma once

#include "hack/model/config.h"
#include "hack/core/gguf_file.h"
#include "hack/model/weights.h"

namespace hack {

/// The Hugging Face config a GGUF file stands for; throws hack::Error naming the key for
/// anything unsupported (architecture, rope scaling, partial rotary, experts).
ModelConfig gguf_model_config(const GgufFile& file);

/// The weights of `file` (see Model::load).
Model load_gguf_model(const GgufFile& file, WeightFormat format);

/// Source row of Hugging Face row `r` in a llama GGUF attn_q / attn_k of heads of head_dim rows:
/// within a head, HF row j·(head_dim/2) + i is GGUF row 2i + j.
inline int64_t gguf_rope_row(int64_t r, int64_t head_dim) {
  const int64_t h = r / head_dim, k = r % head_dim, half = head_dim / 2;
  return h * head_dim + 2 * (k % half) + k / half;
}

}  // namespace hack
