/// @file cuda_check.h
/// @brief HACK_CUDA_CHECK(expr): throws hack::Error naming the expression, file and line.
#pragma once

#include <cuda_runtime.h>

#include "hack/core/error.h"

#define HACK_CUDA_CHECK(expr)                                                                     \
  do {                                                                                            \
    cudaError_t hack_cuda_status_ = (expr);                                                       \
    if (hack_cuda_status_ != cudaSuccess)                                                         \
      ::hack::fail("CUDA error {} ({}) in {} at {}:{}", static_cast<int>(hack_cuda_status_),      \
                   cudaGetErrorString(hack_cuda_status_), #expr, __FILE__, __LINE__);             \
  } while (0)
