#include "hack/core/membw.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "hack/core/tensor.h"

namespace hack {

namespace {
// Sums a slice read as `Streams` sequential streams over equal sub-ranges, 128 bytes per
// stream per iteration; the result is returned so the loads cannot be optimised away.
template <int Streams>
float read_slice(const float* p, size_t n_floats) {
  const size_t per = n_floats / Streams / 32 * 32;
  __m256 acc[Streams];
  for (int s = 0; s < Streams; ++s) acc[s] = _mm256_setzero_ps();
  for (size_t i = 0; i < per; i += 32) {
    for (int s = 0; s < Streams; ++s) {
      const float* q = p + static_cast<size_t>(s) * per + i;
      const __m256 x = _mm256_add_ps(_mm256_load_ps(q), _mm256_load_ps(q + 8));
      const __m256 y = _mm256_add_ps(_mm256_load_ps(q + 16), _mm256_load_ps(q + 24));
      acc[s] = _mm256_add_ps(acc[s], _mm256_add_ps(x, y));
    }
  }
  __m256 sum = acc[0];
  for (int s = 1; s < Streams; ++s) sum = _mm256_add_ps(sum, acc[s]);
  float out[8];
  _mm256_storeu_ps(out, sum);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

using ReadFn = float (*)(const float*, size_t);
constexpr ReadFn kReaders[] = {read_slice<1>, read_slice<4>, read_slice<8>, read_slice<16>};
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
  for (ReadFn read : kReaders) {
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      pool.run([&](int t, int nt) {
        size_t b, e;
        split_range(n / 256, t, nt, &b, &e);
        sink[static_cast<size_t>(t)] += read(data + b * 256, (e - b) * 256);
      });
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, static_cast<double>(n * sizeof(float)) / s / 1e9);
    }
  }
  volatile float keep = sink[0];
  (void)keep;
  return best;
}

}  // namespace hack
