// Page scores on CUDA, the twin of kernels/cpu/page_bound.cpp: half a warp scores one box,
// lane j accumulating channels ≡ j (mod 16) as the CPU's lane j does, then a 16-wide shuffle
// fold in the CPU's order (v[j] += v[j + w], w = 8, 4, 2, 1). Bit-identical to the scalar
// reference (tests/gpu/kernels/cuda_page_bound_test.cpp).
#include "hack/kernels/cuda/ops.h"
#include "hack/kernels/cuda/page_bound.h"

namespace hack::cuda {

namespace {

constexpr int kThreads = 128;  // 8 boxes per block, 16 lanes each

__device__ float bf16_bits_to_f32(uint16_t b) { return __uint_as_float(static_cast<unsigned>(b) << 16); }

__global__ void page_bound_kernel(cpu::PageBoundArgs a, float* out, int boxes) {
  const int lane = static_cast<int>(threadIdx.x) & 15;
  const int box = static_cast<int>(blockIdx.x) * (kThreads / 16) + static_cast<int>(threadIdx.x) / 16;
  const bool valid = box < boxes;
  const int p0 = box * a.span, p1 = valid ? min(a.n_pages, p0 + a.span) : p0;
  const float beta = 1.0f - a.alpha;
  float acc = 0.0f;
  for (int c = lane; c < a.k_dim; c += 16) {
    float lo = 0.0f, hi = 0.0f;
    for (int p = p0; p < p1; ++p) {
      const auto* mins = reinterpret_cast<const uint16_t*>(a.pages[p] + a.k_min_offset);
      const auto* scales = reinterpret_cast<const uint16_t*>(a.pages[p] + a.k_scale_offset);
      const float mn = bf16_bits_to_f32(mins[c]);
      const float mx = __fmaf_rn(bf16_bits_to_f32(scales[c]), a.levels, mn);
      lo = p == p0 ? mn : fminf(lo, mn);
      hi = p == p0 ? mx : fmaxf(hi, mx);
    }
    if (a.linear) {
      acc = __fmaf_rn(a.qsum[c], __fmaf_rn(a.alpha, hi, __fmul_rn(beta, lo)), acc);
    } else {
      acc = __fmaf_rn(a.qpos[c], hi, __fmaf_rn(a.qneg[c], lo, acc));
    }
  }
  // Every lane of the warp takes part in the shuffles (invalid boxes carry zeros).
  for (int w = 8; w >= 1; w /= 2) acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, w, 16));
  if (valid && lane == 0) out[box] = acc;
}

}  // namespace

void page_bound(const cpu::PageBoundArgs& args, float* out, cudaStream_t stream) {
  if (args.k_dim % 16 != 0 || args.span < 1 || args.n_pages < 0)
    cuda_fail(cudaErrorInvalidValue, "page_bound: k_dim must be a multiple of 16 and span >= 1", __FILE__, __LINE__);
  if (args.n_pages == 0) return;
  const int boxes = (args.n_pages + args.span - 1) / args.span;
  const int per_block = kThreads / 16;
  page_bound_kernel<<<static_cast<unsigned>((boxes + per_block - 1) / per_block), kThreads, 0, stream>>>(args, out, boxes);
  HACK_CUDA_CU_CHECK(cudaGetLastError());
}

}  // namespace hack::cuda
