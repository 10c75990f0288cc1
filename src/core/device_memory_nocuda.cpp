// Without the CUDA build, pinned and device memory are unavailable: say so clearly.
#ifndef HACK_HAVE_CUDA
#include "hack/core/error.h"
#include "hack/core/tensor.h"
#include "src/core/device_memory.h"

namespace hack::detail {

void* pinned_alloc(size_t bytes) { fail("pinned allocation of {} bytes: hackserve was built without CUDA", bytes); }
void pinned_free(void*) noexcept {}
void* device_alloc(size_t bytes, int) { fail("device allocation of {} bytes: hackserve was built without CUDA", bytes); }
void device_free(void*, int) noexcept {}
int cuda_device_count() noexcept { return 0; }

}  // namespace hack::detail

namespace hack {
bool cuda_device_available() { return false; }
}  // namespace hack
#endif
