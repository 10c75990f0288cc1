// Helpers of the CUDA differential tests: device copies of host vectors, bf16 rounding,
// a seeded RNG whose seed the failing test prints.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <vector>

#include "hack/core/dtype.h"
#include "hack/core/error.h"
#include "hack/core/tensor.h"
#include "hack/kernels/cuda/ops.h"

namespace hack::test {

template <class T>
Buffer to_device(const std::vector<T>& v) {
  Buffer b = Buffer::allocate(MemoryKind::device, v.size() * sizeof(T));
  if (!v.empty() && cudaMemcpy(b.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
    throw Error("cudaMemcpy to device failed");
  return b;
}

template <class T>
std::vector<T> to_host(const Buffer& b, size_t n) {
  std::vector<T> v(n);
  if (cudaDeviceSynchronize() != cudaSuccess) throw Error("a kernel failed (cudaDeviceSynchronize)");
  if (n != 0 && cudaMemcpy(v.data(), b.data(), n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
    throw Error("cudaMemcpy to host failed");
  return v;
}

template <class T>
T* dptr(const Buffer& b) {
  return static_cast<T*>(b.data());
}

inline cuda::bf16* bptr(const Buffer& b) { return static_cast<cuda::bf16*>(b.data()); }

/// Uniform floats in [lo, hi), rounded to bf16-representable values when `bf16_exact`.
inline std::vector<float> random_floats(std::mt19937& rng, size_t n, float lo, float hi, bool bf16_exact = false) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) {
    x = d(rng);
    if (bf16_exact) x = bf16_to_f32(f32_to_bf16(x));
  }
  return v;
}

inline std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

inline std::vector<float> from_bf16_bits(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}

}  // namespace hack::test
