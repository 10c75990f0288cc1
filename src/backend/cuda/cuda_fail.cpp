// The host halves of kernels/cuda/*.cu that need fmt (nvcc cannot compile it): the throwing
// half of HACK_CUDA_CU_CHECK and the shared-memory opt-in.
#include <map>
#include <mutex>
#include <string>

#include "hack/core/error.h"
#include "hack/kernels/cuda/ops.h"

namespace hack::cuda {

void cuda_fail(cudaError_t status, const char* expr, const char* file, int line) {
  fail("CUDA error {} ({}) in {} at {}:{}", static_cast<int>(status), cudaGetErrorString(status), expr, file, line);
}

void allow_dynamic_smem(const void* kernel, size_t bytes, const char* what) {
  constexpr size_t kDefaultBytes = 48 * 1024;
  int device = 0;
  HACK_CUDA_CU_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<int, int> optin_by_device;
  int optin = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = optin_by_device.find(device);
    if (it == optin_by_device.end()) {
      HACK_CUDA_CU_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
      it = optin_by_device.emplace(device, optin).first;
    }
    optin = it->second;
  }
  if (bytes > static_cast<size_t>(optin))
    fail("{}: needs {} bytes of shared memory, device {} allows {}", what, bytes, device, optin);
  if (bytes > kDefaultBytes)
    HACK_CUDA_CU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace hack::cuda
