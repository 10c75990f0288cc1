/// @file cuda_backend.h
/// @brief The CUDA backend (`--device cuda`) of the fp path: bf16 weights uploaded once,
/// cuBLAS GEMMs (bf16 in, fp32 compute), own kernels for everything else, attention over a
/// CudaPagedKvCache. Only compiled with HACK_HAVE_CUDA.
///
/// Numerics: the residual stream and every element-wise op are fp32; GEMM inputs (normed
/// activations, attention output, SwiGLU output) are rounded to bf16, as are K/V in the pool.
/// Logits come back to the host as fp32 [rows][vocab] and are sampled there by the
/// existing host Sampler (the host sampling path: one device→host copy of the logits rows
/// per forward, then Engine/generate as on the CPU).
#pragma once

#include <memory>

#include "hack/backend/backend.h"
#include "hack/backend/cuda_paged_kv_cache.h"

namespace hack {

struct CudaBackendOptions {
  int device = 0;              ///< CUDA device index
  int max_batch_tokens = 512;  ///< token rows per forward (prefill chunk + decode tokens); sizes the workspace
  int max_sequences = 64;      ///< chunks per forward
  int max_logit_rows = 64;     ///< rows per lm_head pass (bounds the device logits buffer)
  /// Attention by the CUDA runner of the step's AttentionPlan (backend/cuda_plan_runner.h:
  /// the plan the block manager builds for the CPU too; any chunk, including prompt chunks
  /// over a quantized past) instead of the decode/prefill kernels (HackDecodePlan, the
  /// measured path). hack-run and the nodes: --cuda-attention plan|kernels.
  bool plan_attention = false;
};

/// Uploads the model's weights (as bf16) to the device and pre-allocates the workspace for
/// options.max_batch_tokens; the backend computes over `kv` (on the same device, shaped for
/// the model; it must outlive the backend). Throws hack::Error when no CUDA device is
/// present, the cache does not fit the model, or memory runs out.
std::unique_ptr<Backend> make_cuda_backend(const Model& model, CudaPagedKvCache& kv,
                                           const CudaBackendOptions& options = {});

/// The device KV cache shaped for `config`: num_pages pages of page_tokens tokens.
std::unique_ptr<CudaPagedKvCache> make_cuda_kv_cache(const ModelConfig& config, const CudaKvOptions& options);

}  // namespace hack
