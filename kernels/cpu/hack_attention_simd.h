// Internal: the SIMD HACK attention kernels, written once over a 16-lane ISA traits class
// (AVX-512: one zmm; AVX2: two ymm) so every reduction has the canonical lane order of the
// scalar reference (lane j holds elements ≡ j mod 16, folded 8+8, 4+4, 2+2, 1+1) and the
// results are bit-identical to it. Included by hack_attention_avx2.cpp / _avx512.cpp only.
//
// The traits class Isa provides:
//   F (16 floats), A (16 int32 accumulators)
//   fzero, fset1, fload, fload_n (zero tail), fstore, fload_bf16, fload_bf16_n, add, sub, mul,
//   fma(a, b, c) = a·b + c, fmin, fmax, fold16 (canonical Σ), round (to nearest even),
//   exp2i (2^n for integral n), load_sums(ptr, bytes) (16 u8|u16 → F),
//   codes_i(F x) -> A: clamp(cvt_nearest(x), 0, 255); codes_raw(F x) -> A: cvt_nearest(x);
//   codes_bytes(A) -> 16 bytes (__m128i); store_codes4(a, b, c, d, dst): the codes of 4 rows,
//     each clamped to [0, 255] by saturating packs, quad-interleaved into 64 bytes at dst
//   reduce4<Reduce>(a, b, c, d, out[4]): four horizontal reductions through one network whose
//     levels are the canonical fold (lanes j⊕j+8, j⊕j+4, j⊕j+2, j⊕j+1)
//   azero, to_float(A), add_i(A, int), add_a(A, A), hsum_i(A)
//   dot_chunk<bits, R>(A* acc, chunk, const uint8_t* a, int quad): for every packed sub-tile j
//     of the 64-byte chunk, acc[r] lane i += Σ_{k<4} a[4(R·(quad + j) + r) + k] · code(i, k)
//     (a: u8 codes of R rows interleaved by 4-byte quads, [quad][R][4])
//   kCodeOffset8: 8-bit codes enter as (code − 128); the caller adds 128·Σa back.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/cpu/hack_attention_common.h"

namespace hack::cpu::detail {

template <class Isa>
struct HackSimd {
  using F = typename Isa::F;
  using A = typename Isa::A;

  static F exp(F x) {
    x = Isa::fmin(Isa::fmax(x, Isa::fset1(kExpLo)), Isa::fset1(kExpHi));
    const F n = Isa::round(Isa::mul(x, Isa::fset1(kLog2e)));
    F r = Isa::fma(n, Isa::fset1(-kLn2Hi), x);
    r = Isa::fma(n, Isa::fset1(-kLn2Lo), r);
    F p = Isa::fset1(kExpP0);
    p = Isa::fma(p, r, Isa::fset1(kExpP1));
    p = Isa::fma(p, r, Isa::fset1(kExpP2));
    p = Isa::fma(p, r, Isa::fset1(kExpP3));
    p = Isa::fma(p, r, Isa::fset1(kExpP4));
    p = Isa::fma(p, r, Isa::fset1(kExpP5));
    const F r2 = Isa::mul(r, r);
    F y = Isa::fma(p, r2, r);
    y = Isa::add(y, Isa::fset1(1.0f));
    return Isa::mul(y, Isa::exp2i(n));
  }

  // Horizontal reductions of v[0..n) into out[0..n), four at a time (Reduce::add folds in
  // the canonical order).
  template <Reduce Op>
  static void reduce_rows(const F* v, int n, float* out) {
    for (int i = 0; i < n; i += 4) {
      float r[4];
      Isa::template reduce4<Op>(v[i], v[std::min(i + 1, n - 1)], v[std::min(i + 2, n - 1)], v[std::min(i + 3, n - 1)], r);
      for (int k = 0; k < 4 && i + k < n; ++k) out[i + k] = r[k];
    }
  }

  // Stores the 16 codes of each of R rows (channels 16m..16m+15) quad-interleaved:
  // quad q of row i at dst + 4·(R·q + i).
  template <int R>
  static void store_codes(const A* c, uint8_t* dst) {
    for (int i = 0; i < R; ++i) {
      const __m128i b = Isa::codes_bytes(c[i]);
      _mm_storeu_si32(dst + 4 * i, b);
      _mm_storeu_si32(dst + 4 * (R + i), _mm_srli_si128(b, 4));
      _mm_storeu_si32(dst + 4 * (2 * R + i), _mm_srli_si128(b, 8));
      _mm_storeu_si32(dst + 4 * (3 * R + i), _mm_srli_si128(b, 12));
    }
  }

  // Codes of R rows' 16 values v[i] = (x − lo)·inv, stored quad-interleaved at dst (see
  // store_codes); with sum, Σ codes accumulated too. clamp(round(v), 0, 255) either way: the
  // traits' two saturating packs (int32 → int16 → u8) clamp exactly as codes_i does.
  template <int R>
  static void emit_codes(const F* v, uint8_t* dst, A* sum) {
    A c[R];
    if constexpr (R == 4) {
      if (sum == nullptr) {
        Isa::store_codes4(Isa::codes_raw(v[0]), Isa::codes_raw(v[1]), Isa::codes_raw(v[2]), Isa::codes_raw(v[3]), dst);
        return;
      }
    }
    for (int i = 0; i < R; ++i) {
      c[i] = Isa::codes_i(v[i]);
      if (sum != nullptr) sum[i] = Isa::add_a(sum[i], c[i]);
    }
    if constexpr (R == 4) Isa::store_codes4(c[0], c[1], c[2], c[3], dst);
    else store_codes<R>(c, dst);
  }

  // σ and lo of partition p of R rows from their lane-wise minima and maxima, written to
  // [i·parts + p]; lo and 1/σ broadcast for the codes.
  template <int R>
  static void partition_scales(const F* mn, const F* mx, int parts, int p, float* sigma, float* lo_out, F* lo_b,
                               F* inv_b) {
    float lo[R], hi[R];
    reduce_rows<Reduce::min>(mn, R, lo);
    reduce_rows<Reduce::max>(mx, R, hi);
    for (int i = 0; i < R; ++i) {
      const float sg = (hi[i] - lo[i]) / 255.0f;
      sigma[i * parts + p] = sg;
      lo_out[i * parts + p] = lo[i];
      lo_b[i] = Isa::fset1(lo[i]);
      inv_b[i] = Isa::fset1(sg > 0.0f ? 1.0f / sg : 0.0f);
    }
  }

  // u8 quantization of R rows (row i at x + i·ld), each in `parts` partitions of `len`
  // elements (multiples of 16), as quantize_u8_scalar per (row, partition). Codes go
  // quad-interleaved to codes ([quad][R][4], quads numbered across partitions); σ, lo and
  // (when sums is given) Σ codes to [i·parts + p].
  template <int R>
  static void quantize_rows(const float* x, size_t ld, int parts, int len, uint8_t* codes, float* sigma, float* lo_out,
                            int32_t* sums) {
    for (int p = 0; p < parts; ++p) {
      F mn[R], mx[R];
      for (int i = 0; i < R; ++i) {
        const float* xi = x + static_cast<size_t>(i) * ld + static_cast<size_t>(p) * static_cast<size_t>(len);
        mn[i] = mx[i] = Isa::fload(xi);
        for (int m = 16; m < len; m += 16) {
          const F v = Isa::fload(xi + m);
          mn[i] = Isa::fmin(mn[i], v);
          mx[i] = Isa::fmax(mx[i], v);
        }
      }
      F lo_b[R], inv_b[R];
      partition_scales<R>(mn, mx, parts, p, sigma, lo_out, lo_b, inv_b);
      A sum[R];
      for (int i = 0; i < R; ++i) sum[i] = Isa::azero();
      for (int m = 0; m < len; m += 16) {
        F v[R];
        const size_t at = static_cast<size_t>(p) * static_cast<size_t>(len) + static_cast<size_t>(m);
        for (int i = 0; i < R; ++i)
          v[i] = Isa::mul(Isa::sub(Isa::fload(x + static_cast<size_t>(i) * ld + at), lo_b[i]), inv_b[i]);
        emit_codes<R>(v, codes + at * R, sums != nullptr ? sum : nullptr);
      }
      if (sums != nullptr)
        for (int i = 0; i < R; ++i) sums[i * parts + p] = Isa::hsum_i(sum[i]);
    }
  }

  // quantize_rows for one partition of N ≤ 4 vectors per row whose values are already in
  // registers (x[i][m]: row i, elements 16m..16m+15 of the partition): no store and reload.
  template <int R, int N>
  static void quantize_held(const F (&x)[R][N], int parts, int p, uint8_t* codes, float* sigma, float* lo_out,
                            int32_t* sums) {
    F mn[R], mx[R];
    for (int i = 0; i < R; ++i) {
      mn[i] = mx[i] = x[i][0];
      for (int m = 1; m < N; ++m) {
        mn[i] = Isa::fmin(mn[i], x[i][m]);
        mx[i] = Isa::fmax(mx[i], x[i][m]);
      }
    }
    F lo_b[R], inv_b[R];
    partition_scales<R>(mn, mx, parts, p, sigma, lo_out, lo_b, inv_b);
    A sum[R];
    for (int i = 0; i < R; ++i) sum[i] = Isa::azero();
    for (int m = 0; m < N; ++m) {
      F v[R];
      for (int i = 0; i < R; ++i) v[i] = Isa::mul(Isa::sub(x[i][m], lo_b[i]), inv_b[i]);
      emit_codes<R>(v, codes + static_cast<size_t>(16 * m * R), sums != nullptr ? sum : nullptr);
    }
    if (sums != nullptr)
      for (int i = 0; i < R; ++i) sums[i * parts + p] = Isa::hsum_i(sum[i]);
  }

  // Online-softmax step of R rows over their scores (row i at p + i·ld, padded a multiple of
  // 16, scores beyond visible[i] ignored): p ← exp(score − m_new) (0 beyond visible); the
  // running max and sum of each row are updated and alpha[i] = exp(m_old − m_new). Where the
  // caller already has each row's lane-wise score maxima (every score visible), it passes
  // them as lane_max and the scores are not read twice.
  template <int R>
  static void softmax_rows(float* p, size_t ld, const int* visible, int padded, float* const* max, float* const* sum,
                           float* alpha, const F* lane_max = nullptr) {
    // Max over the visible scores (exact in any order): whole tiles in vectors, then tails.
    F m[R];
    for (int i = 0; i < R; ++i) {
      if (lane_max != nullptr) {
        m[i] = lane_max[i];
        continue;
      }
      const float* pi = p + static_cast<size_t>(i) * ld;
      m[i] = Isa::fset1(-std::numeric_limits<float>::infinity());
      for (int t = 0; t + 16 <= visible[i]; t += 16) m[i] = Isa::fmax(m[i], Isa::fload(pi + t));
    }
    float block_max[R];
    reduce_rows<Reduce::max>(m, R, block_max);
    F m_b[R], total[R];
    int full = padded;  // tiles below `full` are visible in every row
    for (int i = 0; i < R; ++i) {
      float* pi = p + static_cast<size_t>(i) * ld;
      for (int t = visible[i] / 16 * 16; t < visible[i]; ++t) block_max[i] = std::max(block_max[i], pi[t]);
      const float m_new = std::max(*max[i], block_max[i]);
      alpha[i] = exp_scalar(*max[i] - m_new);
      *max[i] = m_new;
      m_b[i] = Isa::fset1(m_new);
      total[i] = Isa::fzero();
      full = std::min(full, visible[i] / 16 * 16);
    }
    // Rows inner: R independent exp chains per tile.
    for (int t = 0; t < full; t += 16)
      for (int i = 0; i < R; ++i) {
        float* pt = p + static_cast<size_t>(i) * ld + static_cast<size_t>(t);
        const F e = exp(Isa::sub(Isa::fload(pt), m_b[i]));
        Isa::fstore(pt, e);
        total[i] = Isa::add(total[i], e);
      }
    for (int t = full; t < padded; t += 16)
      for (int i = 0; i < R; ++i) {
        float* pt = p + static_cast<size_t>(i) * ld + static_cast<size_t>(t);
        F e = exp(Isa::sub(Isa::fload(pt), m_b[i]));
        if (t + 16 > visible[i]) {  // zero the masked tail of this tile
          alignas(64) float tmp[16];
          Isa::fstore(tmp, e);
          for (int k = std::max(0, visible[i] - t); k < 16; ++k) tmp[k] = 0.0f;
          e = Isa::fload(tmp);
        }
        Isa::fstore(pt, e);
        total[i] = Isa::add(total[i], e);
      }
    float block_sum[R];
    reduce_rows<Reduce::add>(total, R, block_sum);
    for (int i = 0; i < R; ++i) *sum[i] = std::fma(*sum[i], alpha[i], block_sum[i]);
  }

  // Prefetches the next block in `n` parts of whole cache lines (first row tile only), one
  // part per call of next(), spread over the block's work.
  struct Prefetcher {
    const char* at = nullptr;
    const char* end = nullptr;
    size_t step = 0;  // bytes per part
    Prefetcher(const HackHeadView& b, int n) {
      if (b.prefetch == nullptr) return;
      const size_t lines = (b.prefetch_bytes + 63) / 64;
      at = static_cast<const char*>(b.prefetch);
      end = at + 64 * lines;
      step = 64 * ((lines + static_cast<size_t>(n) - 1) / static_cast<size_t>(n));
    }
    void next() {
      const char* stop = at + std::min(step, static_cast<size_t>(end - at));
      for (; at < stop; at += 64) _mm_prefetch(at, _MM_HINT_T0);
    }
  };

  // Step 1 of hack_tile: q of R rows folded with the block's K scales and quantized per K
  // partition (codes, σ, lo, Σ codes when sums); mt[i] = Σ_c q_c·k_min_c. N = vectors per
  // partition held in registers, or 0: folded into w.tmp and quantized from there.
  template <int R, int N>
  static void fold_q(const HackHeadView& b, const float* const* q, const HackWork& w, bool sums, float* mt) {
    const int kp = b.k_dim / b.k_group;
    F mterm[R];
    for (int i = 0; i < R; ++i) mterm[i] = Isa::fzero();
    if constexpr (N == 0) {
      const size_t ukd = static_cast<size_t>(b.k_dim);
      for (int c = 0; c < b.k_dim; c += 16) {  // the K scales and minima widened once for all R rows
        const F ks = Isa::fload_bf16(b.k_scale + c), km = Isa::fload_bf16(b.k_min + c);
        for (int i = 0; i < R; ++i) {
          const F qv = Isa::fload(q[i] + c);
          Isa::fstore(w.tmp + static_cast<size_t>(i) * ukd + c, Isa::mul(qv, ks));
          mterm[i] = Isa::fma(qv, km, mterm[i]);
        }
      }
      quantize_rows<R>(w.tmp, ukd, kp, b.k_group, w.q_codes, w.q_sigma, w.q_mu, sums ? w.q_sum : nullptr);
    } else {
      for (int p = 0; p < kp; ++p) {
        F x[R][N];
        for (int m = 0; m < N; ++m) {
          const int c = (p * N + m) * 16;
          const F ks = Isa::fload_bf16(b.k_scale + c), km = Isa::fload_bf16(b.k_min + c);
          for (int i = 0; i < R; ++i) {
            const F qv = Isa::fload(q[i] + c);
            x[i][m] = Isa::mul(qv, ks);
            mterm[i] = Isa::fma(qv, km, mterm[i]);
          }
        }
        quantize_held<R, N>(x, kp, p, w.q_codes + static_cast<size_t>(p * N * 16 * R), w.q_sigma, w.q_mu,
                            sums ? w.q_sum : nullptr);
      }
    }
    reduce_rows<Reduce::add>(mterm, R, mt);
  }

  // Step 4 of hack_tile: P (w.p, R rows of Π) folded with the V scales of each V partition and
  // quantized over the block's tokens (codes [partition][token quad][R][4], σ, lo, Σ codes);
  // w.p_min = Σ_t p_t·v_min. N = token vectors (Π/16) held in registers, or 0 (via w.tmp).
  template <int R, int N>
  static void fold_p(const HackHeadView& b, const HackWork& w, bool sums) {
    const int T = b.tokens, vp = b.v_dim / b.v_group;
    const size_t ld = static_cast<size_t>(vp) * static_cast<size_t>(T);
    const size_t p_part = static_cast<size_t>(R) * static_cast<size_t>(T);
    F pmin[R * 4];
    for (int vpi = 0; vpi < vp; ++vpi) {
      const uint16_t* vs = b.v_scale + static_cast<size_t>(vpi) * T;
      const uint16_t* vm = b.v_min + static_cast<size_t>(vpi) * T;
      F acc[R];
      for (int i = 0; i < R; ++i) acc[i] = Isa::fzero();
      if constexpr (N == 0) {
        for (int t = 0; t < T; t += 16) {  // the partition's V scales and minima widened once for all R rows
          const F vsv = Isa::fload_bf16(vs + t), vmv = Isa::fload_bf16(vm + t);
          for (int i = 0; i < R; ++i) {
            const F pv = Isa::fload(w.p + static_cast<size_t>(i) * T + t);
            Isa::fstore(w.tmp + static_cast<size_t>(i) * ld + static_cast<size_t>(vpi) * T + t, Isa::mul(pv, vsv));
            acc[i] = Isa::fma(pv, vmv, acc[i]);
          }
        }
      } else {
        F x[R][N];
        for (int m = 0; m < N; ++m) {
          const F vsv = Isa::fload_bf16(vs + 16 * m), vmv = Isa::fload_bf16(vm + 16 * m);
          for (int i = 0; i < R; ++i) {
            const F pv = Isa::fload(w.p + static_cast<size_t>(i) * T + 16 * m);
            x[i][m] = Isa::mul(pv, vsv);
            acc[i] = Isa::fma(pv, vmv, acc[i]);
          }
        }
        quantize_held<R, N>(x, vp, vpi, w.p_codes + static_cast<size_t>(vpi) * p_part, w.p_sigma, w.p_mu,
                            sums ? w.p_sum : nullptr);
      }
      for (int i = 0; i < R; ++i) {
        if (vp <= 4) pmin[i * vp + vpi] = acc[i];
        else w.p_min[i * vp + vpi] = Isa::fold16(acc[i]);
      }
    }
    if (vp <= 4) reduce_rows<Reduce::add>(pmin, R * vp, w.p_min);
    if constexpr (N == 0) quantize_rows<R>(w.tmp, ld, vp, T, w.p_codes, w.p_sigma, w.p_mu, sums ? w.p_sum : nullptr);
  }

  template <int KBits, int VBits, int R>
  static void hack_tile(const HackHeadView& b, const AttentionRows& rows, const int* row_ids, const HackWork& w) {
    const int T = b.tokens, kp = b.k_dim / b.k_group, vp = b.v_dim / b.v_group;
    constexpr int kPerChunk = 32 / KBits;  // K channels per chunk
    constexpr int vPerChunk = 32 / VBits;  // V tokens per chunk
    // Σ codes of Q / P needed for the 8-bit code offset
    constexpr bool kSumK8 = KBits == 8 && Isa::kCodeOffset8, kSumV8 = VBits == 8 && Isa::kCodeOffset8;
    const size_t ukd = static_cast<size_t>(b.k_dim);

    // 1. Q folded with the K scales, quantized per K partition; the k_min term.
    {
      const float* q[R];
      for (int i = 0; i < R; ++i) q[i] = rows.q + static_cast<size_t>(row_ids[i]) * ukd;
      float mt[R];
      switch (b.k_group) {  // partitions of ≤ 4 vectors stay in registers
        case 16: fold_q<R, 1>(b, q, w, kSumK8, mt); break;
        case 32: fold_q<R, 2>(b, q, w, kSumK8, mt); break;
        case 48: fold_q<R, 3>(b, q, w, kSumK8, mt); break;
        case 64: fold_q<R, 4>(b, q, w, kSumK8, mt); break;
        default: fold_q<R, 0>(b, q, w, kSumK8, mt); break;
      }
      for (int i = 0; i < R; ++i) w.row[i * 8 + 2] = mt[i];
    }

    // 2. Scores, 16 tokens at a time.
    const int k_chunks = b.k_dim / kPerChunk, group_chunks = b.k_group / kPerChunk;
    Prefetcher prefetch(b, T / 16 + b.v_dim / 16);
    F lane_max[R];  // the softmax's maxima, valid where every score of the block is visible
    for (int i = 0; i < R; ++i) lane_max[i] = Isa::fset1(-std::numeric_limits<float>::infinity());
    for (int tt = 0; tt < T / 16; ++tt) {
      prefetch.next();
      const uint8_t* tile = b.k_codes + static_cast<size_t>(tt) * static_cast<size_t>(k_chunks) * kHackChunkBytes;
      F s[R];
      for (int i = 0; i < R; ++i) s[i] = Isa::fzero();
      for (int p = 0; p < kp; ++p) {
        A acc[R];
        for (int i = 0; i < R; ++i) acc[i] = Isa::azero();
        for (int cc = p * group_chunks; cc < (p + 1) * group_chunks; ++cc)
          Isa::template dot_chunk<KBits, R>(acc, tile + static_cast<size_t>(cc) * kHackChunkBytes, w.q_codes,
                                           cc * (kPerChunk / 4));
        const F ksum = Isa::load_sums(static_cast<const uint8_t*>(b.k_sums) +
                                          (static_cast<size_t>(p) * T + static_cast<size_t>(tt) * 16) * b.k_sum_bytes,
                                      b.k_sum_bytes);
        for (int i = 0; i < R; ++i) {
          if (kSumK8) acc[i] = Isa::add_i(acc[i], 128 * w.q_sum[i * kp + p]);
          s[i] = Isa::fma(Isa::fset1(w.q_sigma[i * kp + p]), Isa::to_float(acc[i]), s[i]);
          s[i] = Isa::fma(Isa::fset1(w.q_mu[i * kp + p]), ksum, s[i]);
        }
      }
      for (int i = 0; i < R; ++i) {
        const F score = Isa::add(s[i], Isa::fset1(w.row[i * 8 + 2]));
        lane_max[i] = Isa::fmax(lane_max[i], score);
        Isa::fstore(w.p + static_cast<size_t>(i) * T + static_cast<size_t>(tt) * 16, score);
      }
    }

    // 3. Online softmax; 4. P folded with the V scales, quantized per V partition.
    // P codes per V partition interleaved [partition][token quad][R][4].
    const size_t p_part = static_cast<size_t>(R) * static_cast<size_t>(T);
    {
      int visible[R];
      float *mx[R], *sm[R], alpha[R];
      bool all_visible = true;
      for (int i = 0; i < R; ++i) {
        visible[i] = std::min(rows.visible[row_ids[i]], T);
        all_visible = all_visible && visible[i] == T;
        mx[i] = &rows.max[row_ids[i]];
        sm[i] = &rows.sum[row_ids[i]];
      }
      softmax_rows<R>(w.p, static_cast<size_t>(T), visible, T, mx, sm, alpha, all_visible ? lane_max : nullptr);
      for (int i = 0; i < R; ++i) w.row[i * 8 + 1] = alpha[i];
      switch (T) {  // partitions of ≤ 4 vectors stay in registers
        case 16: fold_p<R, 1>(b, w, kSumV8); break;
        case 32: fold_p<R, 2>(b, w, kSumV8); break;
        case 48: fold_p<R, 3>(b, w, kSumV8); break;
        case 64: fold_p<R, 4>(b, w, kSumV8); break;
        default: fold_p<R, 0>(b, w, kSumV8); break;
      }
    }

    // 5. P·V, 16 channels at a time, into the running accumulators.
    const int t_chunks = T / vPerChunk, part_tiles = b.v_group / 16;
    for (int vpi = 0; vpi < vp; ++vpi) {
      const uint8_t* p_codes = w.p_codes + static_cast<size_t>(vpi) * p_part;
      F sigma[R], mu[R], pmin[R], alpha[R];  // the partition's corrections, broadcast once
      float* out[R];
      for (int i = 0; i < R; ++i) {
        sigma[i] = Isa::fset1(w.p_sigma[i * vp + vpi]);
        mu[i] = Isa::fset1(w.p_mu[i * vp + vpi]);
        pmin[i] = Isa::fset1(w.p_min[i * vp + vpi]);
        alpha[i] = Isa::fset1(w.row[i * 8 + 1]);
        out[i] = rows.acc + static_cast<size_t>(row_ids[i]) * static_cast<size_t>(b.v_dim);
      }
      for (int ct = vpi * part_tiles; ct < (vpi + 1) * part_tiles; ++ct) {
        prefetch.next();
        const uint8_t* tile = b.v_codes + static_cast<size_t>(ct) * static_cast<size_t>(t_chunks) * kHackChunkBytes;
        A acc[R];
        for (int i = 0; i < R; ++i) acc[i] = Isa::azero();
        for (int tc = 0; tc < t_chunks; ++tc)
          Isa::template dot_chunk<VBits, R>(acc, tile + static_cast<size_t>(tc) * kHackChunkBytes, p_codes,
                                            tc * (vPerChunk / 4));
        const F vsum = Isa::load_sums(static_cast<const uint8_t*>(b.v_sums) + static_cast<size_t>(ct) * 16 * b.v_sum_bytes,
                                      b.v_sum_bytes);
        for (int i = 0; i < R; ++i) {
          if (kSumV8) acc[i] = Isa::add_i(acc[i], 128 * w.p_sum[i * vp + vpi]);
          F x = Isa::mul(sigma[i], Isa::to_float(acc[i]));
          x = Isa::fma(mu[i], vsum, x);
          x = Isa::add(x, pmin[i]);
          float* o = out[i] + static_cast<size_t>(ct) * 16;
          Isa::fstore(o, Isa::fma(Isa::fload(o), alpha[i], x));
        }
      }
    }
  }

  template <int KBits, int VBits>
  static void hack_block_bits(const HackHeadView& block, const AttentionRows& rows, const HackWork& w) {
    int ids[kRowTile];
    int n = 0;
    HackHeadView b = block;  // prefetches ride on the first row tile only
    auto flush = [&] {
      switch (n) {
        case 1: hack_tile<KBits, VBits, 1>(b, rows, ids, w); break;
        case 2: hack_tile<KBits, VBits, 2>(b, rows, ids, w); break;
        case 3: hack_tile<KBits, VBits, 3>(b, rows, ids, w); break;
        case 4: hack_tile<KBits, VBits, 4>(b, rows, ids, w); break;
        default: break;
      }
      n = 0;
      b.prefetch = nullptr;
    };
    for (int r = 0; r < rows.n; ++r) {
      if (rows.visible[r] <= 0) continue;
      ids[n++] = r;
      if (n == kRowTile) flush();
    }
    flush();
  }

  static void hack_block(const HackHeadView& b, const AttentionRows& rows, float* work) {
    const HackWork w = carve_hack_work(work, b.tokens, b.k_dim, b.k_dim / b.k_group, b.v_dim / b.v_group);
    switch (b.k_bits * 16 + b.v_bits) {
      case 2 * 16 + 2: hack_block_bits<2, 2>(b, rows, w); break;
      case 2 * 16 + 4: hack_block_bits<2, 4>(b, rows, w); break;
      case 2 * 16 + 8: hack_block_bits<2, 8>(b, rows, w); break;
      case 4 * 16 + 2: hack_block_bits<4, 2>(b, rows, w); break;
      case 4 * 16 + 4: hack_block_bits<4, 4>(b, rows, w); break;
      case 4 * 16 + 8: hack_block_bits<4, 8>(b, rows, w); break;
      case 8 * 16 + 2: hack_block_bits<8, 2>(b, rows, w); break;
      case 8 * 16 + 4: hack_block_bits<8, 4>(b, rows, w); break;
      default: hack_block_bits<8, 8>(b, rows, w); break;
    }
  }

  // ---- exact blocks -------------------------------------------------------------------

  static F load_row(const ExactHeadView& b, const void* base, size_t index, int n) {
    if (b.bf16) {
      const uint16_t* p = static_cast<const uint16_t*>(base) + index;
      return n >= 16 ? Isa::fload_bf16(p) : Isa::fload_bf16_n(p, n);
    }
    const float* p = static_cast<const float*>(base) + index;
    return n >= 16 ? Isa::fload(p) : Isa::fload_n(p, n);
  }

  template <int R>
  static void exact_tile(const ExactHeadView& b, const AttentionRows& rows, const int* row_ids, float* work) {
    const int kd = b.k_dim, vd = b.v_dim;
    int visible[R], max_visible = 0;
    for (int i = 0; i < R; ++i) {
      visible[i] = std::min(rows.visible[row_ids[i]], b.tokens);
      max_visible = std::max(max_visible, visible[i]);
    }
    const int padded = (max_visible + 15) / 16 * 16;
    // Scores of each row (canonical dots), K rows loaded once for all R rows.
    for (int t = 0; t < max_visible; ++t) {
      F acc[R];
      for (int i = 0; i < R; ++i) acc[i] = Isa::fzero();
      for (int c = 0; c < kd; c += 16) {
        const F k = load_row(b, b.k, static_cast<size_t>(t) * b.k_stride + static_cast<size_t>(c), kd - c);
        for (int i = 0; i < R; ++i) {
          const float* q = rows.q + static_cast<size_t>(row_ids[i]) * static_cast<size_t>(kd) + c;
          acc[i] = Isa::fma(kd - c >= 16 ? Isa::fload(q) : Isa::fload_n(q, kd - c), k, acc[i]);
        }
      }
      float score[R];
      reduce_rows<Reduce::add>(acc, R, score);
      for (int i = 0; i < R; ++i) work[static_cast<size_t>(i) * static_cast<size_t>(padded) + static_cast<size_t>(t)] = score[i];
    }
    float alpha[R], *mx[R], *sm[R];
    for (int i = 0; i < R; ++i) {
      mx[i] = &rows.max[row_ids[i]];
      sm[i] = &rows.sum[row_ids[i]];
    }
    softmax_rows<R>(work, static_cast<size_t>(padded), visible, padded, mx, sm, alpha);
    // out = out·alpha, then += p_t · v_t token by token (the scalar order per channel), 16
    // channels at a time with the accumulators of all R rows in registers.
    const float* p[R];
    for (int i = 0; i < R; ++i) p[i] = work + static_cast<size_t>(i) * static_cast<size_t>(padded);
    int c = 0;
    for (; c + 16 <= vd; c += 16) {
      F o[R];
      for (int i = 0; i < R; ++i) {
        float* oi = rows.acc + static_cast<size_t>(row_ids[i]) * static_cast<size_t>(vd) + c;
        o[i] = Isa::mul(Isa::fload(oi), Isa::fset1(alpha[i]));
      }
      for (int t = 0; t < max_visible; ++t) {
        const F v = load_row(b, b.v, static_cast<size_t>(t) * b.v_stride + static_cast<size_t>(c), 16);
        for (int i = 0; i < R; ++i) o[i] = Isa::fma(Isa::fset1(p[i][t]), v, o[i]);
      }
      for (int i = 0; i < R; ++i) Isa::fstore(rows.acc + static_cast<size_t>(row_ids[i]) * static_cast<size_t>(vd) + c, o[i]);
    }
    for (; c < vd; ++c)
      for (int i = 0; i < R; ++i) {
        float* o = rows.acc + static_cast<size_t>(row_ids[i]) * static_cast<size_t>(vd) + c;
        *o = *o * alpha[i];
        for (int t = 0; t < max_visible; ++t) {
          const size_t vi = static_cast<size_t>(t) * b.v_stride + static_cast<size_t>(c);
          const float vv = b.bf16 ? bf16_bits_to_f32(static_cast<const uint16_t*>(b.v)[vi]) : static_cast<const float*>(b.v)[vi];
          *o = std::fma(p[i][t], vv, *o);
        }
      }
  }

  static void exact_block(const ExactHeadView& b, const AttentionRows& rows, float* work) {
    int ids[kRowTile];
    int n = 0;
    auto flush = [&] {
      switch (n) {
        case 1: exact_tile<1>(b, rows, ids, work); break;
        case 2: exact_tile<2>(b, rows, ids, work); break;
        case 3: exact_tile<3>(b, rows, ids, work); break;
        case 4: exact_tile<4>(b, rows, ids, work); break;
        default: break;
      }
      n = 0;
    };
    for (int r = 0; r < rows.n; ++r) {
      if (std::min(rows.visible[r], b.tokens) <= 0) continue;
      ids[n++] = r;
      if (n == kRowTile) flush();
    }
    flush();
  }
};

}  // namespace hack::cpu::detail
