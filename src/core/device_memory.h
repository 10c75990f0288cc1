// Pinned and device allocation. Implemented with the CUDA runtime in the CUDA build
// (src/backend/cuda/device_memory_cuda.cpp) and as clear errors otherwise.
#pragma once

#include <cstddef>

namespace hack::detail {

void* pinned_alloc(size_t bytes);
void pinned_free(void* p) noexcept;
void* device_alloc(size_t bytes, int device_index);
void device_free(void* p, int device_index) noexcept;
int cuda_device_count() noexcept;

}  // namespace hack::detail
