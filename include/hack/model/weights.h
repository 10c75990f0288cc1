/// @file weights.h
/// @brief The weights of a Llama-family model, loaded from safetensors (memory-mapped,
/// zero-copy for matrices) or generated from a seed (synthetic mode).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string_view>
#include <vector>

#include "hack/core/tensor.h"
#include "hack/model/config.h"

namespace hack {

struct FdcRuntime;  // model/fdc.h

/// How a GGUF file's block-quantized matrices are held (the --weights flag): native keeps the
/// blocks (views of the mapping; the matmul kernels read them); dequant converts them to f32
/// at load (exact: every block value is an fp32 product), for the equality tests against
/// references on dequantized weights.
enum class WeightFormat { native, dequant };
/// Parses "native" | "dequant".
WeightFormat parse_weight_format(std::string_view name);

/// Matrices keep the checkpoint's dtype (f32, f16, bf16, or a GGUF block type) and HF's
/// [out_features, in_features] row-major layout. Vectors (norms, biases) are always f32.
struct LayerWeights {
  Tensor attn_norm;       // [hidden] f32
  Tensor wq;              // [n_heads * head_dim, hidden]
  Tensor wk;              // [n_kv_heads * head_dim, hidden]
  Tensor wv;              // [n_kv_heads * head_dim, hidden]
  Tensor wo;              // [hidden, n_heads * head_dim]
  Tensor bq, bk, bv;      // [q_dim], [kv_dim], [kv_dim] f32; defined only if attention_bias
  Tensor bo;              // [hidden] f32; defined only if attention_out_bias
  Tensor q_norm, k_norm;  // [head_dim] f32; defined only if qk_norm
  Tensor ffn_norm;        // [hidden] f32
  Tensor w_gate;          // [intermediate, hidden]
  Tensor w_up;            // [intermediate, hidden]
  Tensor w_down;          // [hidden, intermediate]
};

struct ModelWeights {
  Tensor embed;       // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [hidden] f32
  Tensor lm_head;     // [vocab, hidden]; shares embed's buffer when tied
};

struct Model {
  ModelConfig config;
  ModelWeights weights;
  std::filesystem::path directory;  ///< the HF directory or GGUF file loaded; empty for synthetic models
  /// FDC applied (model/fdc.h apply_fdc): per-head ranks and the post-RoPE Q/K projection
  /// the backend runs; null for a plain model.
  std::shared_ptr<const FdcRuntime> fdc;

  /// Loads config.json and model.safetensors (or the sharded index) from a Hugging Face
  /// model directory. Errors name the file and tensor (missing, mis-shaped, truncated,
  /// unsupported dtype).
  ///
  /// Or a GGUF file (model/gguf_weights.h): llama and qwen2 architectures, F32/F16/BF16 and
  /// Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K tensors, kept as they lie in the mapped file (`format`).
  static Model load(const std::filesystem::path& directory, WeightFormat format = WeightFormat::native);
  /// Random weights for `config` (normal, std 0.02 scaled for depth; norms 1), reproducible
  /// from `seed`, matrices in `dtype` (f32, f16 or bf16).
  static Model synthetic(const ModelConfig& config, uint64_t seed, DType dtype = DType::bf16);
  /// Bytes of all weights (tied lm_head counted once).
  size_t weight_bytes() const;
  /// Copies every matrix (tied ones once) into one anonymous mapping advised for
  /// transparent huge pages and points the tensors at it. Decode streams all weights per
  /// token, and on 4 KiB pages the hardware prefetcher stops at every page boundary: on
  /// the dev VM a bf16 GEMV read 15 GB/s from the mmapped checkpoint and 21 GB/s from
  /// huge pages (bench/RESULTS.md, issue 16). Costs a second copy of the weights while the
  /// checkpoint's pages stay in the page cache (reclaimable). Returns the bytes copied.
  size_t place_in_huge_pages();
  /// Parses the --weights-memory flag: true for "huge-pages" (place_in_huge_pages), false for
  /// "mmap" (the checkpoint's mapping); anything else is an error naming the flag.
  static bool wants_huge_pages(std::string_view weights_memory);
};

/// A digest of a model's weights (xxh3 over every tensor's shape, dtype and bytes; hex):
/// what an FDC artifact records as the model it was calibrated on, and part of the prefix
/// cache's fingerprint. ~30 ms for SmolLM2's 270 MB.
std::string weights_digest(const Model& model);

}  // namespace hack
