// The host halves of kernels/cuda/*.cu that need fmt (nvcc cannot compile it): the throwing
// half of HACK_CUDA_CU_CHECK and the shared-memory opt-in.
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "hack/core/error.h"
#include "hack/kernels/cuda/ops.h"

namespace hack::cuda {

void cuda_fail(cudaError_t status, const char* expr, const char* file, int line) {
  fail("CUDA error {} ({}) in {} at {}:{}", static_cast<int>(status), cudaGetErrorString(status), expr, file, line);
}

size_t max_dynamic_smem() {
  int device = 0;
  HACK_CUDA_CU_CHECK(cudaGetDevice(&device));
  // Read once per device: kernels launch on every step.
  static std::mutex mutex;
  static std::map<int, int> optin_by_device;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = optin_by_device.find(device);
  if (it == optin_by_device.end()) {
    int optin = 0;
    HACK_CUDA_CU_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    it = optin_by_device.emplace(device, optin).first;
  }
  return static_cast<size_t>(it->second);
}

void allow_dynamic_smem(const void* kernel, size_t bytes, const char* what) {
  constexpr size_t kDefaultBytes = 48 * 1024;
  if (bytes <= kDefaultBytes) return;
  int device = 0;
  HACK_CUDA_CU_CHECK(cudaGetDevice(&device));
  const size_t optin = max_dynamic_smem();
  if (bytes > optin) fail("{}: needs {} bytes of shared memory, device {} allows {}", what, bytes, device, optin);
  // A kernel's attribute is raised only past what it already allows (never lowered).
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, size_t> allowed;
  const std::lock_guard<std::mutex> lock(mutex);
  size_t& now = allowed[{device, kernel}];
  if (bytes > now) {
    HACK_CUDA_CU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    now = bytes;
  }
}

}  // namespace hack::cuda
