// bench/cpu_peak: the instruction throughputs the CPU kernels are bound by, measured on one
// core: AVX-512 VPDPBUSD (HACK attention's INT8 dot products), VDPBF16PS (bf16 GEMM/GEMV in
// --matmul-precision bf16) and fp32 FMA (the default fp32 GEMM), each as 12 independent
// accumulator chains (enough to hide latency), plus a dependent integer add chain for the
// clock. RESULTS.md turns these into compute floors (e.g. "at most X tok/s of prefill").
//   cpu_peak [--seconds S] [--json]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>

#include "hack/core/cpu_features.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"

namespace {

constexpr long kInner = 1 << 20;  // instructions per timed call, per chain

template <class Body>
double per_second(double seconds, Body body) {
  long calls = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    body();
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < seconds);
  return static_cast<double>(calls) * kInner * 12 / elapsed;
}

// Twelve named chains so the compiler keeps every accumulator in a register.
#define HACK_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

__attribute__((target("avx512f,avx512bw,avx512vnni"))) int vpdpbusd_run() {
#define HACK_INIT(i) __m512i a##i = _mm512_set1_epi32(i);
  HACK_CHAINS(HACK_INIT)
#undef HACK_INIT
  __m512i b = _mm512_set1_epi8(1), c = _mm512_set1_epi8(2);
  for (long n = 0; n < kInner; ++n) {
#define HACK_STEP(i) a##i = _mm512_dpbusd_epi32(a##i, b, c);
    HACK_CHAINS(HACK_STEP)
#undef HACK_STEP
    asm volatile("" : "+v"(b));
  }
  __m512i z = a0;
#define HACK_SUM(i) z = _mm512_add_epi32(z, a##i);
  HACK_CHAINS(HACK_SUM)
#undef HACK_SUM
  alignas(64) int32_t t[16];
  _mm512_store_si512(t, z);
  return t[0];
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) float vdpbf16ps_run() {
#define HACK_INIT(i) __m512 a##i = _mm512_set1_ps(static_cast<float>(i));
  HACK_CHAINS(HACK_INIT)
#undef HACK_INIT
  __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80)), c = b;
  for (long n = 0; n < kInner; ++n) {
#define HACK_STEP(i) a##i = _mm512_dpbf16_ps(a##i, b, c);
    HACK_CHAINS(HACK_STEP)
#undef HACK_STEP
    asm volatile("" : "+v"(b));
  }
  __m512 z = a0;
#define HACK_SUM(i) z = _mm512_add_ps(z, a##i);
  HACK_CHAINS(HACK_SUM)
#undef HACK_SUM
  alignas(64) float t[16];
  _mm512_store_ps(t, z);
  return t[0];
}

__attribute__((target("avx512f"))) float fma512_run() {
#define HACK_INIT(i) __m512 a##i = _mm512_set1_ps(static_cast<float>(i));
  HACK_CHAINS(HACK_INIT)
#undef HACK_INIT
  __m512 x = _mm512_set1_ps(0.5f), y = _mm512_set1_ps(0.25f);
  for (long n = 0; n < kInner; ++n) {
#define HACK_STEP(i) a##i = _mm512_fmadd_ps(a##i, x, y);
    HACK_CHAINS(HACK_STEP)
#undef HACK_STEP
    asm volatile("" : "+v"(x));
  }
  __m512 z = a0;
#define HACK_SUM(i) z = _mm512_add_ps(z, a##i);
  HACK_CHAINS(HACK_SUM)
#undef HACK_SUM
  alignas(64) float t[16];
  _mm512_store_ps(t, z);
  return t[0];
}

__attribute__((target("avx2,fma"))) float fma256_run() {
#define HACK_INIT(i) __m256 a##i = _mm256_set1_ps(static_cast<float>(i));
  HACK_CHAINS(HACK_INIT)
#undef HACK_INIT
  __m256 x = _mm256_set1_ps(0.5f), y = _mm256_set1_ps(0.25f);
  for (long n = 0; n < kInner; ++n) {
#define HACK_STEP(i) a##i = _mm256_fmadd_ps(a##i, x, y);
    HACK_CHAINS(HACK_STEP)
#undef HACK_STEP
    asm volatile("" : "+v"(x));
  }
  __m256 z = a0;
#define HACK_SUM(i) z = _mm256_add_ps(z, a##i);
  HACK_CHAINS(HACK_SUM)
#undef HACK_SUM
  alignas(32) float t[8];
  _mm256_store_ps(t, z);
  return t[0];
}
#undef HACK_CHAINS

// Cycles per second from a chain of dependent adds (one per cycle on every x86 core).
double clock_hz(double seconds) {
  const long n = 200'000'000;
  double best = 0;
  const auto start = std::chrono::steady_clock::now();
  do {
    long x = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n; ++i) asm volatile("add $1, %0" : "+r"(x));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n) / s);
  } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds);
  return best;
}

volatile double g_sink;  // keeps the results alive

}  // namespace

int main(int argc, char** argv) {
  float seconds = 1.0f;
  bool json = false;
  hack::FlagSet flags("cpu_peak", "Instruction throughputs of one core (the compute floors of the CPU kernels).",
                      "HACK_CPU_PEAK");
  flags.add_float("seconds", &seconds, "time per measurement");
  flags.add_bool("json", &json, "JSON output");
  try {
    if (!flags.parse(argc, argv)) return 0;
    HACK_CHECK(seconds > 0, "--seconds must be positive");
  } catch (const hack::Error& e) {
    std::fprintf(stderr, "cpu_peak: %s\n", e.what());
    return 2;
  }
  const hack::CpuFeatures& f = hack::cpu_features();
  struct Row {
    const char* name;
    int flops;  // per instruction (a multiply-add is 2)
    double per_s;
  };
  Row rows[4];
  int n = 0;
  double sink = 0;
  const double hz = clock_hz(seconds);
  if (f.avx512f && f.avx512vnni)
    rows[n++] = {"vpdpbusd_zmm", 128, per_second(seconds, [&] { sink += vpdpbusd_run(); })};
  if (f.avx512f && f.avx512bf16)
    rows[n++] = {"vdpbf16ps_zmm", 64, per_second(seconds, [&] { sink += vdpbf16ps_run(); })};
  if (f.avx512f) rows[n++] = {"fma_zmm", 32, per_second(seconds, [&] { sink += fma512_run(); })};
  if (f.avx2 && f.fma) rows[n++] = {"fma_ymm", 16, per_second(seconds, [&] { sink += fma256_run(); })};
  g_sink = sink;
  if (json) {
    std::printf("{\"clock_ghz\":%.3f", hz / 1e9);
    for (int i = 0; i < n; ++i)
      std::printf(",\"%s\":{\"g_per_s\":%.3f,\"per_cycle\":%.3f,\"gops\":%.1f}", rows[i].name, rows[i].per_s / 1e9,
                  rows[i].per_s / hz, rows[i].per_s * rows[i].flops / 1e9);
    std::printf("}\n");
    return 0;
  }
  std::printf("cpu features: %s\nclock (dependent add chain): %.2f GHz\n", f.describe().c_str(), hz / 1e9);
  std::printf("%-14s %10s %10s %12s\n", "instruction", "G/s", "per cycle", "G ops/s");
  for (int i = 0; i < n; ++i)
    std::printf("%-14s %10.3f %10.2f %12.1f\n", rows[i].name, rows[i].per_s / 1e9, rows[i].per_s / hz,
                rows[i].per_s * rows[i].flops / 1e9);
  std::printf("(ops: a multiply-add counts 2; vpdpbusd = 64 u8·s8 multiply-adds, vdpbf16ps = 32 bf16 pairs)\n");
  return 0;
}
