// Bench data on the device: deterministic pseudo-random values, never zeros.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace {

// Deterministic pseudo-normal bf16 values (sum of uniforms), channel offsets on K like
// post-RoPE keys, so HACK's ranges are realistic; never zeros.
__global__ void fill_bf16(uint16_t* out, size_t n, uint32_t seed, int dim, float offset_scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed ^ static_cast<uint32_t>(i >> 32) * 0x85EBCA77u;
    float s = 0.0f;
    for (int k = 0; k < 4; ++k) {
      h ^= h >> 15;
      h *= 0x2C1B3C6Du;
      h ^= h >> 12;
      h *= 0x297A2D39u;
      h ^= h >> 15;
      s += static_cast<float>(h & 0xffffff) * (1.0f / 16777216.0f);
    }
    const int c = static_cast<int>(i % static_cast<size_t>(dim));
    const float v = (s - 2.0f) * 1.7f + offset_scale * static_cast<float>((c * 37) % 11 - 5);
    const uint32_t bits = __float_as_uint(v);
    out[i] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
}

__global__ void fill_f32(float* out, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    out[i] = (static_cast<float>(h & 0xffff) * (1.0f / 65536.0f) - 0.5f) * 4.0f;
  }
}

}  // namespace

/// n bf16 values roughly N(0, 1) plus a per-channel offset (offset_scale · small integer of c)
/// for channel c = i mod dim, like post-RoPE keys; keyed by seed.
void bench_fill_bf16(void* out, size_t n, uint32_t seed, int dim, float offset_scale) {
  fill_bf16<<<1024, 256>>>(static_cast<uint16_t*>(out), n, seed, dim, offset_scale);
}

/// n floats uniform in [-2, 2), keyed by seed.
void bench_fill_f32(void* out, size_t n, uint32_t seed) {
  fill_f32<<<256, 256>>>(static_cast<float*>(out), n, seed);
}
