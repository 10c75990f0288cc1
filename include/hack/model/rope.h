/// @file rope.h
/// @brief RoPE's inverse frequencies for a model: a property of the model (theta, head_dim,
/// scaling), computed once on the host and handed to the kernels (cpu::rope_apply, the CUDA
/// rope kernel), which know nothing of model configs.
#pragma once

#include <vector>

#include "hack/model/config.h"

namespace hack {

/// Inverse frequencies of RoPE for head_dim (head_dim / 2 values), with the config's
/// rope scaling (linear or llama3) applied exactly as Hugging Face computes them.
std::vector<float> rope_inv_freq(const ModelConfig& config);

}  // namespace hack
