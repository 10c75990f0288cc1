#include "hack/core/membw.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "hack/core/tensor.h"

namespace hack {

namespace {
// Sums 32-byte words with 4 independent accumulators; the result is returned so the
// loads cannot be optimised away.
float read_slice(const float* p, size_t n_floats) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n_floats; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
}  // namespace

double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes, int repeats) {
  const size_t n = bytes / sizeof(float) / 256 * 256;
  Buffer buf = Buffer::allocate(MemoryKind::host, n * sizeof(float));
  auto* data = static_cast<float*>(buf.data());
  // Touch every page from the thread that will read it (first-touch placement).
  pool.run([&](int t, int nt) {
    size_t b, e;
    split_range(n / 256, t, nt, &b, &e);
    std::fill(data + b * 256, data + e * 256, 1.0f);
  });
  double best = 0;
  std::vector<float> sink(static_cast<size_t>(pool.size()));
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int t, int nt) {
      size_t b, e;
      split_range(n / 256, t, nt, &b, &e);
      sink[static_cast<size_t>(t)] += read_slice(data + b * 256, (e - b) * 256);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n * sizeof(float)) / s / 1e9);
  }
  volatile float keep = sink[0];
  (void)keep;
  return best;
}

}  // namespace hack
