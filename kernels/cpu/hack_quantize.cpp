// The CPU HACK quantizer (kernels/cpu/hack_quantize.h).
#include "hack/kernels/cpu/hack_quantize.h"

#include <algorithm>
#include <cstring>

#include "hack/core/dtype.h"
#include "hack/kernels/cpu/hack_attention.h"
#include "hack/kernels/hack_quant_math.h"

namespace hack::cpu {

namespace {

using quant::Quantizer;

// The page code of x under q: the shared host/device definition (hack_quant_math.h), so
// the CUDA quantizer writes the same bytes for round to nearest.
int quantize_one(const Quantizer& q, float x, bool stochastic, float random) {
  return stochastic ? quant::quantize_stochastic(q, x, random) : quant::quantize_nearest(q, x);
}

quant::BlockRandom block_random(const HackBlockRounding& r, int kind) {
  return quant::BlockRandom(r.seed, r.layer, r.first_token, r.head, kind);
}

void put_sum(void* sums, int bytes, size_t i, uint32_t value) {
  if (bytes == 1) static_cast<uint8_t*>(sums)[i] = static_cast<uint8_t>(value);
  else static_cast<uint16_t*>(sums)[i] = static_cast<uint16_t>(value);
}

uint32_t load_sum(const void* sums, int bytes, size_t i) {
  return bytes == 1 ? static_cast<const uint8_t*>(sums)[i] : static_cast<const uint16_t*>(sums)[i];
}

}  // namespace

void hack_quantize_k(const HackHeadSlots& h, const uint16_t* k, size_t k_stride, const HackBlockRounding& rounding) {
  const int T = h.tokens, bits = h.k_bits, max_code = (1 << bits) - 1;
  std::memset(h.k_codes, 0, static_cast<size_t>(T) * static_cast<size_t>(h.k_dim) * static_cast<size_t>(bits) / 8);
  const quant::BlockRandom random = block_random(rounding, 0);
  for (int c = 0; c < h.k_dim; ++c) {
    float lo = bf16_to_f32(k[c]), hi = lo;
    for (int t = 1; t < T; ++t) {
      const float x = bf16_to_f32(k[static_cast<size_t>(t) * k_stride + static_cast<size_t>(c)]);
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    if (bits == 2 && !rounding.stochastic) {  // stochastic rounding stays unbiased: no clipping
      quant::clip_k_range_2bit(
          [&](int t) { return bf16_to_f32(k[static_cast<size_t>(t) * k_stride + static_cast<size_t>(c)]); }, T, &lo,
          &hi);
    }
    quant::make_quantizer(lo, hi, max_code, &h.k_min[c], &h.k_scale[c]);
  }
  const int partitions = h.k_dim / h.k_group;
  for (int t = 0; t < T; ++t) {
    const uint16_t* row = k + static_cast<size_t>(t) * k_stride;
    for (int p = 0; p < partitions; ++p) {
      uint32_t sum = 0;
      for (int c = p * h.k_group; c < (p + 1) * h.k_group; ++c) {
        const Quantizer q = quant::stored_quantizer(h.k_min[c], h.k_scale[c], max_code);
        const int code = quantize_one(q, bf16_to_f32(row[c]), rounding.stochastic,
                                      random(static_cast<uint64_t>(t) * static_cast<uint64_t>(h.k_dim) + c));
        const HackCodePos pos = hack_k_code_pos(bits, h.k_dim, t, c);
        h.k_codes[pos.byte] = static_cast<uint8_t>(h.k_codes[pos.byte] | (code << pos.shift));
        sum += static_cast<uint32_t>(code);
      }
      put_sum(h.k_sums, h.k_sum_bytes, static_cast<size_t>(p) * static_cast<size_t>(T) + static_cast<size_t>(t), sum);
    }
  }
}

void hack_quantize_v(const HackHeadSlots& h, const uint16_t* v, size_t v_stride, const HackBlockRounding& rounding) {
  const int T = h.tokens, bits = h.v_bits, max_code = (1 << bits) - 1;
  std::memset(h.v_codes, 0, static_cast<size_t>(T) * static_cast<size_t>(h.v_dim) * static_cast<size_t>(bits) / 8);
  const quant::BlockRandom random = block_random(rounding, 1);
  std::memset(h.v_sums, 0, static_cast<size_t>(h.v_dim) * static_cast<size_t>(h.v_sum_bytes));
  const int partitions = h.v_dim / h.v_group;
  for (int t = 0; t < T; ++t) {
    const uint16_t* row = v + static_cast<size_t>(t) * v_stride;
    for (int p = 0; p < partitions; ++p) {
      const int c0 = p * h.v_group;
      float lo = bf16_to_f32(row[c0]), hi = lo;
      for (int c = c0 + 1; c < c0 + h.v_group; ++c) {
        lo = std::min(lo, bf16_to_f32(row[c]));
        hi = std::max(hi, bf16_to_f32(row[c]));
      }
      const size_t meta = static_cast<size_t>(p) * static_cast<size_t>(T) + static_cast<size_t>(t);
      const Quantizer q = quant::make_quantizer(lo, hi, max_code, &h.v_min[meta], &h.v_scale[meta]);
      for (int c = c0; c < c0 + h.v_group; ++c) {
        const int code = quantize_one(q, bf16_to_f32(row[c]), rounding.stochastic,
                                      random(static_cast<uint64_t>(t) * h.v_dim + c));
        const HackCodePos pos = hack_v_code_pos(bits, T, t, c);
        h.v_codes[pos.byte] = static_cast<uint8_t>(h.v_codes[pos.byte] | (code << pos.shift));
        const size_t ci = static_cast<size_t>(c);
        put_sum(h.v_sums, h.v_sum_bytes, ci, load_sum(h.v_sums, h.v_sum_bytes, ci) + static_cast<uint32_t>(code));
      }
    }
  }
}

}  // namespace hack::cpu
