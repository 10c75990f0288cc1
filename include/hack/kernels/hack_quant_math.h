/// @file hack_quant_math.h
/// @brief The per-element arithmetic of HACK (DESIGN.md §3.1) as inline functions that
/// compile for the host and for CUDA devices, so the CPU quantizer (src/kv/hack_page.cpp),
/// the CPU attention kernels (kernels/cpu/hack_attention_*) and the CUDA kernels
/// (kernels/cuda/hack_*.cu) share one definition and agree bit for bit:
///   - bf16 directed rounding of a block's min (down) and scale (up),
///   - the page code of one element (round to nearest or stochastic, clamped),
///   - where a K / V code lives in the packed page bytes,
///   - the u8 code of a folded Q or P element at attention time,
///   - the exp polynomial of the online softmax.
/// Every float operation is written out (fma where the CPU uses one, no contractable
/// a·b + c), so nvcc's default --fmad cannot change a result.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define HACK_HD __host__ __device__
#else
#define HACK_HD
#endif

namespace hack::quant {

// ---- float primitives with one meaning on host and device --------------------------------

HACK_HD inline uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return std::bit_cast<uint32_t>(x);
#endif
}

HACK_HD inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}

/// a·b + c with one rounding.
HACK_HD inline float fma_f32(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

/// a·b, never fused with a following add.
HACK_HD inline float mul_f32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/// a + b, never fused with a preceding multiply.
HACK_HD inline float add_f32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

/// a − b, never fused with a preceding multiply.
HACK_HD inline float sub_f32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

/// a / b, IEEE round to nearest.
HACK_HD inline float div_f32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// Round half to even (std::nearbyint in the default rounding mode).
HACK_HD inline float round_even_f32(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

HACK_HD inline float floor_f32(float x) {
#if defined(__CUDA_ARCH__)
  return floorf(x);
#else
  return std::floor(x);
#endif
}

/// std::min / std::max semantics (b < a ? b : a), which fminf does not share for NaN.
HACK_HD inline float min_f32(float a, float b) { return b < a ? b : a; }
HACK_HD inline float max_f32(float a, float b) { return a < b ? b : a; }

HACK_HD inline float bf16_bits_to_f32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

/// float → bf16 bits, round to nearest even, NaN stays NaN (core/dtype.h f32_to_bf16).
HACK_HD inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// ---- page quantization ---------------------------------------------------------------------

/// bf16 of x rounded toward −∞ (a stored min never exceeds the value it replaces).
HACK_HD inline uint16_t bf16_round_down(float x) {
  const uint32_t u = float_bits(x);
  uint16_t h = static_cast<uint16_t>(u >> 16);    // truncation: toward zero
  if ((u & 0xffffu) != 0 && (u >> 31) != 0) ++h;  // negative: one step further from zero
  return h;
}

/// bf16 of x rounded toward +∞ (a stored scale never falls short of the value it replaces).
HACK_HD inline uint16_t bf16_round_up(float x) {
  const uint32_t u = float_bits(x);
  uint16_t h = static_cast<uint16_t>(u >> 16);
  if ((u & 0xffffu) != 0 && (u >> 31) == 0) ++h;
  return h;
}

/// x ≈ min + scale·code, code in [0, max_code]; scale 0 (constant group) gives code 0.
struct Quantizer {
  float min;
  float scale;
  int max_code;
};

/// The quantizer of a group with extremes [lo, hi]: min rounded down and scale rounded up
/// to bf16, so [min, min + scale·max_code] ⊇ [lo, hi]. Writes the stored bf16 bits.
/// A zero lo is stored as +0 whatever its sign, so the bytes do not depend on the order in
/// which a (parallel) min reduction met +0 and −0.
HACK_HD inline Quantizer make_quantizer(float lo, float hi, int max_code, uint16_t* min_bits, uint16_t* scale_bits) {
  *min_bits = bf16_round_down(lo == 0.0f ? 0.0f : lo);
  const float min = bf16_bits_to_f32(*min_bits);
  const float range = sub_f32(hi, min);
  *scale_bits = range > 0.0f ? bf16_round_up(div_f32(range, static_cast<float>(max_code))) : uint16_t{0};
  return {min, bf16_bits_to_f32(*scale_bits), max_code};
}

/// Quantizer from stored bf16 bits (the K quantizer of one channel).
HACK_HD inline Quantizer stored_quantizer(uint16_t min_bits, uint16_t scale_bits, int max_code) {
  return {bf16_bits_to_f32(min_bits), bf16_bits_to_f32(scale_bits), max_code};
}

HACK_HD inline int clamp_code(float c, int max_code) {
  const float top = static_cast<float>(max_code);
  return static_cast<int>(c < 0.0f ? 0.0f : (c > top ? top : c));
}

/// code = clamp(round_half_even((x − min) / scale), 0, max_code).
HACK_HD inline int quantize_nearest(const Quantizer& q, float x) {
  if (q.scale <= 0.0f) return 0;
  return clamp_code(round_even_f32(div_f32(sub_f32(x, q.min), q.scale)), q.max_code);
}

/// The range a 2-bit K channel is quantized over. With four levels, min–max spends them on
/// the block's extremes; a clipped range serves the bulk better (on SmolLM2-135M, 2-bit K
/// with this search: decode-path KL 0.160 → 0.068; 4-bit K got worse with it, V too, so
/// only 2-bit K with nearest rounding uses it — stochastic rounding stays unbiased). Of 51
/// candidate ranges — [lo, hi] shrunk by 0–50 % in 5 % steps, the cut split 0/25/50/75/100 %
/// between the ends (one split when nothing is cut) — the one whose nearest-rounding squared
/// error over the channel's n values is least (first of equals). value(i) gives value i;
/// every operation is an explicit f32 op in a fixed order, so host and device agree.
template <class Value>
HACK_HD inline void clip_k_range_2bit(const Value& value, int n, float* lo, float* hi) {
  const float r = sub_f32(*hi, *lo);
  if (!(r > 0.0f)) return;
  float best = 0.0f, best_lo = *lo, best_hi = *hi;
  bool first = true;
  for (int si = 0; si <= 10; ++si) {
    const float cut = mul_f32(0.05f * static_cast<float>(si), r);
    for (int ki = 0; ki <= (si == 0 ? 0 : 4); ++ki) {  // no cut: one range, whatever the split
      const float below = mul_f32(cut, 0.25f * static_cast<float>(ki));
      const float l = add_f32(*lo, below), h = sub_f32(*hi, sub_f32(cut, below));
      uint16_t min_bits, scale_bits;
      const Quantizer q = make_quantizer(l, h, 3, &min_bits, &scale_bits);
      float err = 0.0f;
      bool beaten = false;  // the running sum only grows: once it reaches best, stop
      for (int i0 = 0; i0 < n && !beaten; i0 += 16) {
        // 16 squared errors at a time (independent, so the host vectorizes them), summed in order.
        const int m = n - i0 < 16 ? n - i0 : 16;
        float sq[16];
        for (int j = 0; j < m; ++j) {
          const float x = value(i0 + j);
          const int code = quantize_nearest(q, x);
          const float e = sub_f32(x, add_f32(q.min, mul_f32(q.scale, static_cast<float>(code))));
          sq[j] = mul_f32(e, e);
        }
        for (int j = 0; j < m; ++j) err = add_f32(err, sq[j]);
        beaten = !first && !(err < best);
      }
      if (!beaten && (first || err < best)) {
        best = err;
        best_lo = l;
        best_hi = h;
        first = false;
      }
    }
  }
  *lo = best_lo;
  *hi = best_hi;
}

/// code = clamp(floor(u) + [random < u − floor(u)], 0, max_code), u = (x − min) / scale;
/// random uniform in [0, 1) makes the code unbiased.
HACK_HD inline int quantize_stochastic(const Quantizer& q, float x, float random) {
  if (q.scale <= 0.0f) return 0;
  const float u = div_f32(sub_f32(x, q.min), q.scale);
  const float f = floor_f32(u);
  return clamp_code(add_f32(f, random < sub_f32(u, f) ? 1.0f : 0.0f), q.max_code);
}

// ---- stochastic rounding stream ----------------------------------------------------------------

/// splitmix64 finalizer: the counter-based generator behind stochastic rounding.
HACK_HD inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Uniform [0, 1) with 24 random bits for element `index` of one block stream: a pure
/// function of (seed, layer, first_token, head, kind = 0 for K | 1 for V, index), so a
/// block quantizes to the same codes on any node, thread, chunking or device.
struct BlockRandom {
  uint64_t key;
  HACK_HD BlockRandom(uint64_t seed, int layer, int64_t first_token, int head, int kind)
      : key(mix64(seed ^ mix64(static_cast<uint64_t>(layer) * 0x100000001b3ull ^
                               mix64(static_cast<uint64_t>(first_token) * 4 + static_cast<uint64_t>(kind)) ^
                               (static_cast<uint64_t>(head) << 40)))) {}
  HACK_HD float operator()(uint64_t index) const {
    return static_cast<float>(mix64(key + index * 0xd1b54a32d192ed03ull) >> 40) * 0x1.0p-24f;
  }
};

// ---- packed code positions (the page format of kv/hack_page.h) ------------------------------

/// Bytes of one packed chunk; it holds 8/b sub-tiles of 64 codes, sub-tile j in bits
/// [b·j, b·j + b) of every byte.
inline constexpr int kChunkBytes = 64;

struct CodePos {
  size_t byte;  ///< offset inside the head's code array
  int shift;    ///< bit position of the code inside that byte
};

/// K chunk = 16 tokens × (32/b) channels; sub-tile j = channels 4j..4j+3 of the chunk,
/// byte 4·token + channel. Chunks: [Π/16][k_dim/(32/b)].
HACK_HD inline CodePos k_code_pos(int bits, int k_dim, int token, int channel) {
  const int channels_per_chunk = 32 / bits;
  const size_t chunk = static_cast<size_t>(token / 16) * static_cast<size_t>(k_dim / channels_per_chunk) +
                       static_cast<size_t>(channel / channels_per_chunk);
  const int sub = (channel % channels_per_chunk) / 4;
  return {chunk * kChunkBytes + static_cast<size_t>(4 * (token % 16) + channel % 4), bits * sub};
}

/// V chunk = 16 channels × (32/b) tokens; sub-tile j = tokens 4j..4j+3 of the chunk,
/// byte 4·channel + token. Chunks: [v_dim/16][Π/(32/b)].
HACK_HD inline CodePos v_code_pos(int bits, int block_tokens, int token, int channel) {
  const int tokens_per_chunk = 32 / bits;
  const size_t chunk = static_cast<size_t>(channel / 16) * static_cast<size_t>(block_tokens / tokens_per_chunk) +
                       static_cast<size_t>(token / tokens_per_chunk);
  const int sub = (token % tokens_per_chunk) / 4;
  return {chunk * kChunkBytes + static_cast<size_t>(4 * (channel % 16) + token % 4), bits * sub};
}

/// The code at `pos` of a head's packed code array.
HACK_HD inline int code_at(const uint8_t* codes, CodePos pos, int bits) {
  return (codes[pos.byte] >> pos.shift) & ((1 << bits) - 1);
}

// ---- attention-time u8 quantization of folded Q and P ---------------------------------------

/// σ of a u8 group with extremes [lo, hi]: (hi − lo) / 255.
HACK_HD inline float u8_sigma(float lo, float hi) { return div_f32(sub_f32(hi, lo), 255.0f); }
/// 1/σ, or 0 for a constant group (whose codes are then all 0).
HACK_HD inline float u8_inverse(float sigma) { return sigma > 0.0f ? div_f32(1.0f, sigma) : 0.0f; }
/// code = clamp(round_half_even((x − lo)·inv), 0, 255).
HACK_HD inline uint8_t u8_code(float x, float lo, float inv) {
  const float c = round_even_f32(mul_f32(sub_f32(x, lo), inv));
  return static_cast<uint8_t>(c < 0.0f ? 0.0f : (c > 255.0f ? 255.0f : c));
}

// ---- exp of the online softmax ----------------------------------------------------------------

// Cephes expf: n = round(x·log2 e), r = x − n·ln 2 (two-part ln 2), e^r ≈ 1 + r + r²·P(r),
// times 2^n through the exponent bits.
inline constexpr float kExpLo = -87.3f;
inline constexpr float kExpHi = 88.3f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kExpP0 = 1.9875691500e-4f;
inline constexpr float kExpP1 = 1.3981999507e-3f;
inline constexpr float kExpP2 = 8.3334519073e-3f;
inline constexpr float kExpP3 = 4.1665795894e-2f;
inline constexpr float kExpP4 = 1.6666665459e-1f;
inline constexpr float kExpP5 = 5.0000001201e-1f;

/// exp(x), ≤ 2 ulp for x in [−87, 88]; x ≤ −87.3 (−inf included) gives ~1e-38.
HACK_HD inline float exp_f32(float x) {
  x = min_f32(max_f32(x, kExpLo), kExpHi);
  const float n = round_even_f32(mul_f32(x, kLog2e));
  float r = fma_f32(n, -kLn2Hi, x);
  r = fma_f32(n, -kLn2Lo, r);
  float p = kExpP0;
  p = fma_f32(p, r, kExpP1);
  p = fma_f32(p, r, kExpP2);
  p = fma_f32(p, r, kExpP3);
  p = fma_f32(p, r, kExpP4);
  p = fma_f32(p, r, kExpP5);
  const float r2 = mul_f32(r, r);
  float y = fma_f32(p, r2, r);
  y = add_f32(y, 1.0f);
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  return mul_f32(y, bits_float(static_cast<uint32_t>(e)));
}

}  // namespace hack::quant
