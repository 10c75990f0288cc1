/// @file kernels/cuda/hack.h
/// @brief HACK on CUDA (DESIGN.md §3.1), the twins of the CPU quantizer
/// (kernels/cpu/hack_quantize.h) and homomorphic attention (kernels/cpu/hack_attention.h):
///   - hack_quantize_blocks: closing blocks (Π tokens × all KV heads of one layer, bf16 or
///     f32 on the device) → the exact page bytes of kv/hack_page.h, header included.
///     Bit-identical to cpu::hack_quantize_k / hack_quantize_v, round to nearest or
///     stochastic (the same counter-based stream), because both evaluate hack_quant_math.h.
///   - hack_decode_attention: one decode query per sequence over bf16 sinks, HACK pages and
///     a bf16 open block; a warp per split of pages (pages streamed into shared memory by
///     cp.async), __dp4a u8×u8 over the packed code words for Q'·K' and P'·V', and a
///     combine kernel over the splits. Every float operation follows the CPU scalar
///     reference in order, so a split covering the same tokens as a CPU pass gives the
///     same bits (see tests/gpu/kernels/hack_cuda_test.cpp).
/// Plans (geometry, split count) are made on the host: backend/hack_attention_plan.h.
/// Everything is asynchronous on `stream`; nothing allocates. Launch errors throw
/// hack::Error. Device limits: head_dim ≤ 128, Π ≤ 256, group size ≤ 16, sinks ≤ Π, K
/// partitions a power of two channels.
/// Only compiled with HACK_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hack/kernels/hack_page_geometry.h"

namespace hack::cuda {

/// Closing blocks of one layer. Element (block b, token t, head h, channel c) of K is at
/// k_src[b] + t·token_stride + h·head_stride + c (elements of bf16 or f32; f32 is rounded
/// to bf16 first, exactly as the CPU cache stores it); V likewise.
struct HackQuantizeBlocks {
  int blocks = 0;
  bool bf16 = true;                       ///< element type of k_src / v_src, else f32
  const void* const* k_src = nullptr;     ///< [blocks] device pointers
  const void* const* v_src = nullptr;     ///< [blocks] device pointers
  size_t token_stride = 0;                ///< elements between tokens
  size_t head_stride = 0;                 ///< elements between heads
  void* const* pages = nullptr;           ///< [blocks] device pointers to page_bytes each, 64-byte aligned
  const int64_t* first_tokens = nullptr;  ///< [blocks] sequence position of token 0 (header)
  const uint8_t* header = nullptr;        ///< [header_bytes] page_header_template of the layer
  bool stochastic = false;                ///< --hack-rounding stochastic (else nearest)
  uint64_t seed = 0;                      ///< stochastic rounding seed
  int layer = 0;                          ///< layer (keys the stochastic stream)
};

/// Writes every byte of each page (header, codes, metadata, zero padding).
void hack_quantize_blocks(const HackPageGeometry& geometry, const HackQuantizeBlocks& blocks, cudaStream_t stream);

/// One decode step: query of sequence b attends to its sink tokens, its quantized pages
/// (in order) and its open-block tokens, as CpuPagedKvCache::attend does on the CPU.
struct HackDecodeBatch {
  int batch = 0;             ///< sequences
  int group_size = 1;        ///< query heads per KV head (GQA), ≤ 16
  float scale = 1.0f;        ///< softmax scale, multiplied into q first (q·scale, as on the CPU)
  const float* q = nullptr;  ///< [batch][num_heads·group_size][head_dim] f32; row h·G + g
  float* out = nullptr;      ///< same layout
  /// [batch][max_pages] device page pointers; entries past num_pages[b] are not read.
  const void* const* page_table = nullptr;
  int max_pages = 0;
  const int* num_pages = nullptr;  ///< [batch] quantized pages per sequence
  /// Sinks of sequence b: bf16 [K|V][num_heads][sink_capacity][head_dim] (the CPU sink
  /// page), tokens [0, sink_tokens[b]) valid; may be null where sink_tokens[b] = 0.
  const uint16_t* const* sink_kv = nullptr;
  const int* sink_tokens = nullptr;  ///< [batch]
  int sink_capacity = 0;             ///< S, ≤ Π
  /// Open block of sequence b: bf16 [K|V][num_heads][Π][head_dim] (the CPU open page),
  /// tokens [0, open_tokens[b]) valid; may be null where open_tokens[b] = 0.
  const uint16_t* const* open_kv = nullptr;
  const int* open_tokens = nullptr;  ///< [batch]
};

/// Bytes of `workspace` hack_decode_attention needs: per (sequence, KV head, split) and
/// query row a max, a sum and a head_dim accumulator.
size_t hack_decode_workspace_bytes(const HackPageGeometry& geometry, int batch, int group_size,
                                   const HackDecodePlan& plan);

/// Runs the split kernel (a warp per split; grid ⌈splits/4⌉ × num_heads × batch) and the
/// combine kernel.
/// Every sequence must hold at least one token; pages_per_split·splits must cover the
/// longest page table.
void hack_decode_attention(const HackPageGeometry& geometry, const HackDecodeBatch& batch, const HackDecodePlan& plan,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace hack::cuda
