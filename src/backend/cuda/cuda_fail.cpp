// The throwing half of HACK_CUDA_CU_CHECK (kernels/cuda/*.cu cannot include fmt).
#include "hack/core/error.h"
#include "hack/kernels/cuda_ops.h"

namespace hack::cuda {

void cuda_fail(cudaError_t status, const char* expr, const char* file, int line) {
  fail("CUDA error {} ({}) in {} at {}:{}", static_cast<int>(status), cudaGetErrorString(status), expr, file, line);
}

}  // namespace hack::cuda
