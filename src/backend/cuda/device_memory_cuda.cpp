// Pinned and device memory through the CUDA runtime.
#include <cuda_runtime.h>

#include "hack/backend/cuda_check.h"
#include "hack/core/error.h"
#include "hack/core/tensor.h"
#include "src/core/device_memory.h"

namespace hack::detail {

void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  HACK_CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}

void pinned_free(void* p) noexcept { cudaFreeHost(p); }

void* device_alloc(size_t bytes, int device_index) {
  HACK_CHECK(cuda_device_count() > device_index, "device allocation of {} bytes: no CUDA device {}", bytes,
             device_index);
  void* p = nullptr;
  HACK_CUDA_CHECK(cudaSetDevice(device_index));
  HACK_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void device_free(void* p, int device_index) noexcept {
  cudaSetDevice(device_index);
  cudaFree(p);
}

int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace hack::detail

namespace hack {
bool cuda_device_available() { return detail::cuda_device_count() > 0; }
}  // namespace hack
