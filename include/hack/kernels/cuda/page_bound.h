/// @file kernels/cuda/page_bound.h
/// @brief MPCache / Quest page scores on CUDA: the twin of cpu::page_bound_kernel
/// (kernels/cpu/page_bound.h), bit-identical to it — the same 16-lane channel split, the same
/// fmas, the same 8+8, 4+4, 2+2, 1+1 fold — so a GPU decode node selects the pages a CPU one
/// would. Only compiled with HACK_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include "hack/kernels/cpu/page_bound.h"

namespace hack::cuda {

/// out[b] (device) = the score of box b, for the ceil(n_pages / span) boxes. Every pointer of
/// `args` is device memory: the page pointer array, the pages, qpos/qneg (quest) or qsum
/// (mpcache). Asynchronous on `stream`; launch errors throw hack::Error.
void page_bound(const cpu::PageBoundArgs& args, float* out, cudaStream_t stream);

}  // namespace hack::cuda
