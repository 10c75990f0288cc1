// bench/quantize_bench: what closing one KV head's block costs the CPU — the HACK quantizer
// (kernels/cpu/hack_quantize.h) on one head of Π tokens, K and V apart, per code width, and for
// 2-bit K its clipped-range search alone on the scalar definition and on AVX2 lanes.
//   quantize_bench [--dims 64,128] [--bits 2,4,8] [--tokens 64] [--blocks 2000]
// Every block of a sequence is quantized once per layer and KV head when it leaves the recent
// window (decode), at a prompt's end (prefill, a recompute, a prefix hit's restored blocks), so
// a 2K-token prompt of SmolLM2 (30 layers × 3 KV heads) closes 31 × 90 head-blocks.
// HACK_CPU_ISA picks the tier hack_quantize_k runs on (the clip search is timed on both).
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "hack/core/cpu_features.h"
#include "hack/core/dtype.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/kernels/cpu/hack_quantize.h"

namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double us_per_call(int n, F&& f) {
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) f();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dims_flag = "64,128", bits_flag = "2,4,8";
  int tokens = 64, blocks = 2000;
  hack::FlagSet flags("quantize_bench", "The CPU HACK quantizer per KV head and block.", "HACK_QUANTIZE_BENCH");
  flags.add_string("dims", &dims_flag, "head dims, comma-separated");
  flags.add_string("bits", &bits_flag, "code widths, comma-separated (2, 4, 8)");
  flags.add_int("tokens", &tokens, "tokens per block (Π)");
  flags.add_int("blocks", &blocks, "timed calls per measurement");
  try {
    if (!flags.parse(argc, argv)) return 0;
    HACK_CHECK(tokens > 0 && blocks > 0, "--tokens and --blocks must be positive");
    std::printf("cpu: %s; hack_quantize_k/v on %s; Π %d; mean of %d calls\n", hack::cpu_features().describe().c_str(),
                hack::cpu_isa_name(hack::cpu_isa()), tokens, blocks);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (const int dim : hack::parse_int_list(dims_flag, "dims")) {
      std::vector<uint16_t> x(static_cast<size_t>(tokens) * static_cast<size_t>(dim));
      for (auto& v : x) v = hack::f32_to_bf16(normal(rng));
      for (const int bits : hack::parse_int_list(bits_flag, "bits")) {
        const size_t code_bytes = static_cast<size_t>(tokens) * static_cast<size_t>(dim) * static_cast<size_t>(bits) / 8;
        std::vector<uint8_t> k_codes(code_bytes), v_codes(code_bytes);
        std::vector<uint16_t> k_min(static_cast<size_t>(dim)), k_scale(static_cast<size_t>(dim));
        const int group = dim % 64 == 0 ? 64 : dim;  // channels per partition, as the nodes' default Π-sized groups
        const size_t partitions = static_cast<size_t>(dim / group);
        std::vector<uint16_t> v_min(partitions * static_cast<size_t>(tokens)), v_scale(v_min.size());
        std::vector<uint16_t> k_sums(partitions * static_cast<size_t>(tokens)), v_sums(static_cast<size_t>(dim));
        hack::cpu::HackHeadSlots h;
        h.k_bits = h.v_bits = bits;
        h.tokens = tokens;
        h.k_dim = h.v_dim = dim;
        h.k_group = h.v_group = group;
        h.k_codes = k_codes.data();
        h.k_min = k_min.data();
        h.k_scale = k_scale.data();
        h.k_sums = k_sums.data();
        h.v_codes = v_codes.data();
        h.v_min = v_min.data();
        h.v_scale = v_scale.data();
        h.v_sums = v_sums.data();
        const hack::cpu::HackBlockRounding nearest;
        const double k_us = us_per_call(blocks, [&] { hack::cpu::hack_quantize_k(h, x.data(), static_cast<size_t>(dim), nearest); });
        const double v_us = us_per_call(blocks, [&] { hack::cpu::hack_quantize_v(h, x.data(), static_cast<size_t>(dim), nearest); });
        std::printf("head_dim %3d  %d-bit: K %7.1f us, V %6.1f us per head-block", dim, bits, k_us, v_us);
        if (bits == 2) {
          std::vector<float> lo(static_cast<size_t>(dim), -3.0f), hi(static_cast<size_t>(dim), 3.0f), l, u;
          double clip_us[2];
          const hack::CpuIsa isas[2] = {hack::CpuIsa::scalar, hack::CpuIsa::avx2};
          for (int i = 0; i < 2; ++i) {
            clip_us[i] = us_per_call(blocks, [&] {
              l = lo;
              u = hi;
              hack::cpu::clip_k_ranges_2bit(x.data(), static_cast<size_t>(dim), tokens, dim, l.data(), u.data(), isas[i]);
            });
          }
          std::printf(" | clip search: scalar %.1f us, avx2 %.1f us (%.1fx)", clip_us[0], clip_us[1], clip_us[0] / clip_us[1]);
        }
        std::printf("\n");
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quantize_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
