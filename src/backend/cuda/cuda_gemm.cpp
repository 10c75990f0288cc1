// The GEMM of the fp path: cuBLAS with bf16 operands and fp32 accumulation and output.
#include <cublas_v2.h>

#include "hack/core/error.h"
#include "hack/kernels/cuda/ops.h"

namespace hack::cuda {

void gemm_bf16(cublasHandle_t handle, const bf16* w, int out, int in, const bf16* x, int rows, float* y) {
  if (rows == 0) return;
  // cuBLAS is column-major. Row-major W [out][in] is the column-major in×out matrix W^T,
  // row-major X [rows][in] is X^T (in×rows), and row-major Y [rows][out] is Y^T (out×rows):
  //   Y^T = W · X^T = op_T(W^T) · X^T  ->  transa = T, transb = N, m = out, n = rows, k = in.
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t s =
      cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &alpha, w, CUDA_R_16BF, in, x, CUDA_R_16BF, in,
                   &beta, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  HACK_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuBLAS error {} ({}) in cublasGemmEx [{} x {}] · [{} x {}]^T",
             static_cast<int>(s), cublasGetStatusString(s), rows, in, out, in);
}

}  // namespace hack::cuda
