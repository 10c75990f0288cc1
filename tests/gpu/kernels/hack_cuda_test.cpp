// HACK on CUDA against its CPU twins (CUDA vs CPU, DESIGN.md §2):
//   - hack_quantize_blocks writes the same page bytes as quantize_k_block/quantize_v_block
//     (nearest and stochastic; both evaluate hack_quant_math.h), from bf16 and f32 sources;
//   - hack_decode_attention over the pages a CpuPagedKvCache made equals
//       (a) CpuPagedKvCache::attend when the plan has one split (the same single pass), and
//       (b) the CPU kernels run over the same split ranges and merged in the same order
//           when the plan splits the pages (flash-decoding changes the running max a page
//           sees, so P's u8 codes may differ from an unsplit pass; the twin has the same ones).
// Tolerance for both: |gpu − cpu| ≤ 1e-6 + 1e-5·|cpu|. The kernels replicate every float
// operation of the CPU scalar reference in order (fma where it has fma, its 16-lane fold
// order for sums, its exp polynomial, its u8 rounding), so the expected difference is 0;
// the margin is far below what one flipped Q or P code moves an output (~σ ≈ range/255).
#include "hack/kernels/cuda/hack.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "hack/core/dtype.h"
#include "hack/core/tensor.h"
#include "hack/kernels/cpu/hack_attention.h"
#include "hack/backend/hack_attention_plan.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "gpu/require_close.h"
#include "unit/kv/kv_test_util.h"

using namespace hack;

namespace {

void check_cuda(cudaError_t status) { REQUIRE(status == cudaSuccess); }

// A device copy of a host vector (RAII through Buffer).
template <class T>
Buffer upload(const std::vector<T>& host) {
  Buffer b = Buffer::allocate(MemoryKind::device, std::max<size_t>(1, host.size() * sizeof(T)));
  if (!host.empty()) check_cuda(cudaMemcpy(b.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}

template <class T>
std::vector<T> download(const Buffer& b, size_t n) {
  std::vector<T> host(n);
  check_cuda(cudaMemcpy(host.data(), b.data(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

std::vector<uint16_t> to_bf16(const float* x, size_t n) {
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(x[i]);
  return out;
}

// Random K/V [tokens][heads][dim] like post-RoPE keys (channel offsets, outlier channels).
// K with per-channel offsets and outlier channels, V normal: tests/unit/kv's generator.
using test::KvStream;

HackPageLayout layout_of(int bits, int block, int heads, int dim, int k_group, int v_group) {
  HackPageParams p;
  p.k_bits = p.v_bits = bits;
  p.block_tokens = block;
  p.k_group = k_group;
  p.v_group = v_group;
  p.heads.assign(static_cast<size_t>(heads), HackHeadDims{dim, dim});
  return HackPageLayout(p);
}

size_t first_difference(const uint8_t* a, const uint8_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return i;
  return n;
}

// The region of a page a byte offset falls in, for failure messages.
std::string where(const HackPageGeometry& g, size_t offset) {
  if (offset < g.header_bytes) return "header";
  const size_t h = (offset - g.head0) / g.head_bytes, o = (offset - g.head0) % g.head_bytes;
  const char* field = o < g.v_codes      ? "k_codes"
                      : o < g.k_min      ? "v_codes"
                      : o < g.k_scale    ? "k_min"
                      : o < g.k_sums     ? "k_scale"
                      : o < g.v_min      ? "k_sums"
                      : o < g.v_scale    ? "v_min"
                      : o < g.v_sums     ? "v_scale"
                      : o < g.fields_end ? "v_sums"
                                         : "padding";
  return "head " + std::to_string(h) + " " + field;
}

}  // namespace

TEST_CASE("device quantizer writes the CPU page bytes", "[gpu][hack]") {
  const uint32_t seed = 20261121;
  const uint64_t kRoundingSeed = 0x5eed;
  for (int bits : {2, 4, 8})
    for (int dim : {64, 128})
      for (int block : {32, 64})
        for (bool bf16_source : {true, false})
          for (Rounding rounding : {Rounding::nearest, Rounding::stochastic}) {
            const int heads = 3, blocks = 3, layer = 2;
            const int k_group = dim == 128 ? 32 : 64;  // several K partitions in one case
            const HackPageLayout layout = layout_of(bits, block, heads, dim, k_group, 64);
            const HackPageGeometry g = page_geometry(layout);
            const KvStream s(blocks * block, heads, 1, dim, seed + static_cast<uint32_t>(bits * 1000 + dim + block));
            const std::vector<uint16_t> k16 = to_bf16(s.k.data(), s.k.size()), v16 = to_bf16(s.v.data(), s.v.size());

            // CPU pages, as CpuPagedKvCache::quantize_pending makes them.
            std::vector<uint8_t> cpu(static_cast<size_t>(blocks) * layout.page_bytes(), 0);
            std::vector<int64_t> first(static_cast<size_t>(blocks));
            for (int b = 0; b < blocks; ++b) {
              uint8_t* page = cpu.data() + static_cast<size_t>(b) * layout.page_bytes();
              first[static_cast<size_t>(b)] = 4 + static_cast<int64_t>(b) * block;
              layout.write_header(page, layer, first[static_cast<size_t>(b)], rounding);
              const RoundingSpec spec{rounding, kRoundingSeed, layer, first[static_cast<size_t>(b)]};
              for (int h = 0; h < heads; ++h) {
                const size_t at = static_cast<size_t>(b) * block * s.per_token() + static_cast<size_t>(h) * dim;
                quantize_k_block(layout, h, k16.data() + at, s.per_token(), spec, page);
                quantize_v_block(layout, h, v16.data() + at, s.per_token(), spec, page);
              }
            }

            // Device pages; the buffer starts as garbage so unwritten bytes would show.
            const Buffer k_dev = bf16_source ? upload(k16) : upload(s.k);
            const Buffer v_dev = bf16_source ? upload(v16) : upload(s.v);
            Buffer pages = upload(std::vector<uint8_t>(cpu.size(), 0xa5));
            const size_t elem = bf16_source ? 2 : 4;
            std::vector<const void*> k_src, v_src;
            std::vector<void*> page_ptrs;
            for (int b = 0; b < blocks; ++b) {
              const size_t off = static_cast<size_t>(b) * block * s.per_token() * elem;
              k_src.push_back(static_cast<const uint8_t*>(k_dev.data()) + off);
              v_src.push_back(static_cast<const uint8_t*>(v_dev.data()) + off);
              page_ptrs.push_back(static_cast<uint8_t*>(pages.data()) + static_cast<size_t>(b) * layout.page_bytes());
            }
            const Buffer k_src_dev = upload(k_src), v_src_dev = upload(v_src), pages_dev = upload(page_ptrs);
            const Buffer first_dev = upload(first), header_dev = upload(page_header_template(layout, layer, rounding));
            cuda::HackQuantizeBlocks in;
            in.blocks = blocks;
            in.bf16 = bf16_source;
            in.k_src = static_cast<const void* const*>(k_src_dev.data());
            in.v_src = static_cast<const void* const*>(v_src_dev.data());
            in.token_stride = s.per_token();
            in.head_stride = static_cast<size_t>(dim);
            in.pages = static_cast<void* const*>(pages_dev.data());
            in.first_tokens = static_cast<const int64_t*>(first_dev.data());
            in.header = static_cast<const uint8_t*>(header_dev.data());
            in.stochastic = rounding == Rounding::stochastic;
            in.seed = kRoundingSeed;
            in.layer = layer;
            cuda::hack_quantize_blocks(g, in, nullptr);
            check_cuda(cudaDeviceSynchronize());
            const std::vector<uint8_t> gpu = download<uint8_t>(pages, cpu.size());
            const size_t diff = first_difference(gpu.data(), cpu.data(), cpu.size());
            INFO("bits " << bits << " dim " << dim << " block " << block << (bf16_source ? " bf16" : " f32")
                         << " source, " << rounding_name(rounding) << " rounding, seed " << seed);
            std::string first_diff = "none";
            if (diff < cpu.size())
              first_diff = "byte " + std::to_string(diff) + " of page " + std::to_string(diff / layout.page_bytes()) +
                           " (" + where(g, diff % layout.page_bytes()) + "): gpu " + std::to_string(gpu[diff]) +
                           " cpu " + std::to_string(cpu[diff]);
            INFO("first difference: " << first_diff);
            REQUIRE(diff == cpu.size());
          }
}

namespace {

constexpr int kHeads = 2, kBlock = 64, kSinks = 4;



void run_decode_case(int bits, int dim, int group, int sm_count, uint32_t seed) {
  const int H = kHeads, T = kBlock, S = kSinks, G = group, D = dim;
  // Context lengths: a lone sink token, Π−1 / Π / Π+1 tokens past the sinks (open block
  // only, one page and nothing open, one page and one open token), 3 pages and 7 open,
  // 9 pages and 5 open (several pages per split).
  const std::vector<int> lengths = {1, S + T - 1, S + T, S + T + 1, S + 3 * T + 7, S + 9 * T + 5};
  const int B = static_cast<int>(lengths.size());
  KvShape shape;
  shape.num_layers = 1;
  shape.num_kv_heads = H;
  shape.head_dim = D;
  shape.group_size = G;
  KvCacheOptions opt;
  opt.mode = KvMode::hack;
  opt.k_bits = opt.v_bits = bits;
  opt.block_tokens = T;
  opt.sinks = S;
  opt.k_group = dim == 128 ? 32 : 64;  // 4 K partitions at 128, 1 at 64
  opt.v_group = dim == 128 ? 32 : 64;
  CpuPagedKvCache cache(shape, opt);
  const HackPageLayout& layout = cache.hack_layout();
  const HackPageGeometry g = page_geometry(layout);

  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t rows_per_seq = static_cast<size_t>(H) * static_cast<size_t>(G);
  std::vector<float> q(static_cast<size_t>(B) * rows_per_seq * static_cast<size_t>(D));
  for (float& x : q) x = 2.0f * normal(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  // Host mirrors of what the device reads.
  const size_t sink_elems = 2 * static_cast<size_t>(H) * S * D, open_elems = 2 * static_cast<size_t>(H) * T * D;
  std::vector<uint16_t> sinks(static_cast<size_t>(B) * sink_elems, 0), opens(static_cast<size_t>(B) * open_elems, 0);
  std::vector<int> num_pages(static_cast<size_t>(B)), sink_tokens(static_cast<size_t>(B)),
      open_tokens(static_cast<size_t>(B));
  std::vector<uint8_t> page_bytes;
  int max_pages = 0;
  for (int b = 0; b < B; ++b) {
    const int len = lengths[static_cast<size_t>(b)];
    const KvStream st(len, H, 1, D, seed + 17 * static_cast<uint32_t>(b + 1));
    cache.add_sequence(b, len + 1);
    cache.append(0, b, 0, len, st.k.data(), st.v.data());
    cache.close_pending_blocks(b);
    const int n = cache.hack_page_count(b, 0);
    REQUIRE(n == std::max(0, len - S) / T);
    num_pages[static_cast<size_t>(b)] = n;
    max_pages = std::max(max_pages, n);
    for (int p = 0; p < n; ++p) {
      const std::span<const std::byte> bytes = cache.hack_page(b, 0, p);
      const auto* u = reinterpret_cast<const uint8_t*>(bytes.data());
      page_bytes.insert(page_bytes.end(), u, u + bytes.size());
    }
    // Sinks [K|V][H][S][D] and the open block [K|V][H][Π][D], bf16 as the cache stores them.
    const int first_open = S + n * T;
    sink_tokens[static_cast<size_t>(b)] = std::min(len, S);
    open_tokens[static_cast<size_t>(b)] = std::max(0, len - first_open);
    for (int t = 0; t < len; ++t)
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < D; ++c) {
          const size_t src = (static_cast<size_t>(t) * H + h) * D + c;
          if (t < S) {
            uint16_t* base = sinks.data() + static_cast<size_t>(b) * sink_elems;
            base[(static_cast<size_t>(h) * S + t) * D + c] = f32_to_bf16(st.k[src]);
            base[(static_cast<size_t>(H + h) * S + t) * D + c] = f32_to_bf16(st.v[src]);
          } else if (t >= first_open) {
            uint16_t* base = opens.data() + static_cast<size_t>(b) * open_elems;
            const int tl = t - first_open;
            base[(static_cast<size_t>(h) * T + tl) * D + c] = f32_to_bf16(st.k[src]);
            base[(static_cast<size_t>(H + h) * T + tl) * D + c] = f32_to_bf16(st.v[src]);
          }
        }
  }

  // Device copies and pointer tables.
  const Buffer pages_dev = upload(page_bytes), sinks_dev = upload(sinks), opens_dev = upload(opens);
  std::vector<const void*> table(static_cast<size_t>(B) * std::max(1, max_pages), nullptr);
  std::vector<const uint16_t*> sink_ptrs, open_ptrs;
  size_t page_at = 0;
  for (int b = 0; b < B; ++b) {
    for (int p = 0; p < num_pages[static_cast<size_t>(b)]; ++p, page_at += layout.page_bytes())
      table[static_cast<size_t>(b) * std::max(1, max_pages) + static_cast<size_t>(p)] =
          static_cast<const uint8_t*>(pages_dev.data()) + page_at;
    sink_ptrs.push_back(static_cast<const uint16_t*>(sinks_dev.data()) + static_cast<size_t>(b) * sink_elems);
    open_ptrs.push_back(static_cast<const uint16_t*>(opens_dev.data()) + static_cast<size_t>(b) * open_elems);
  }
  const Buffer table_dev = upload(table), sink_ptrs_dev = upload(sink_ptrs), open_ptrs_dev = upload(open_ptrs);
  const Buffer num_pages_dev = upload(num_pages), sink_tokens_dev = upload(sink_tokens),
               open_tokens_dev = upload(open_tokens), q_dev = upload(q);
  Buffer out_dev = Buffer::allocate(MemoryKind::device, q.size() * sizeof(float));

  cuda::HackDecodeBatch in;
  in.batch = B;
  in.group_size = G;
  in.scale = scale;
  in.q = static_cast<const float*>(q_dev.data());
  in.out = static_cast<float*>(out_dev.data());
  in.page_table = static_cast<const void* const*>(table_dev.data());
  in.max_pages = std::max(1, max_pages);
  in.num_pages = static_cast<const int*>(num_pages_dev.data());
  in.sink_kv = static_cast<const uint16_t* const*>(sink_ptrs_dev.data());
  in.sink_tokens = static_cast<const int*>(sink_tokens_dev.data());
  in.sink_capacity = S;
  in.open_kv = static_cast<const uint16_t* const*>(open_ptrs_dev.data());
  in.open_tokens = static_cast<const int*>(open_tokens_dev.data());
  auto run_gpu = [&](const HackDecodePlan& plan) {
    Buffer work = Buffer::allocate(MemoryKind::device, cuda::hack_decode_workspace_bytes(g, B, G, plan));
    check_cuda(cudaMemset(out_dev.data(), 0xff, q.size() * sizeof(float)));  // NaN until written
    cuda::hack_decode_attention(g, in, plan, work.data(), work.bytes(), nullptr);
    check_cuda(cudaDeviceSynchronize());
    return download<float>(out_dev, q.size());
  };

  // (a) One split: the same single pass as CpuPagedKvCache::attend.
  std::vector<float> cpu_single(q.size());
  {
    std::vector<float> scratch;
    for (int b = 0; b < B; ++b) {
      const int len = lengths[static_cast<size_t>(b)];
      scratch.resize(cache.attend_scratch_floats(1, len));
      for (int h = 0; h < H; ++h) {
        const size_t at = (static_cast<size_t>(b) * rows_per_seq + static_cast<size_t>(h) * G) * D;
        cache.attend(0, b, h, len - 1, 1, q.data() + at, rows_per_seq * D, cpu_single.data() + at, D, scale,
                     scratch.data());
      }
    }
  }
  HackDecodePlan single;
  single.splits = 1;
  single.pages_per_split = std::max(1, max_pages);
  test::require_close(run_gpu(single), cpu_single, "one split vs CpuPagedKvCache::attend");

  // (b) The planned split, and (c) one page per split (sequences with fewer pages leave
  //     empty splits, which the combine skips): the CPU kernels over the same ranges,
  //     merged in split order.
  HackDecodePlanInput plan_in;
  plan_in.sm_count = sm_count;
  plan_in.batch = B;
  plan_in.kv_heads = H;
  plan_in.max_pages = max_pages;
  HackDecodePlan one_page;
  one_page.splits = std::max(1, max_pages);
  one_page.pages_per_split = 1;
  for (const HackDecodePlan& plan : {plan_hack_decode(plan_in), one_page}) {
    INFO("plan: " << plan.splits << " splits of " << plan.pages_per_split << " pages");
    std::vector<float> cpu_split(q.size());
    {
      const cpu::HackAttentionKernels& kernels = cpu::hack_attention_kernels(cpu_isa());
      const HackHeadLayout& hl = layout.head(0);
      std::vector<float> work(
          std::max(cpu::hack_block_work_floats(T, D, D, hl.k_group, hl.v_group), cpu::exact_block_work_floats(T)) + 64);
      const size_t states = static_cast<size_t>(plan.splits);
      std::vector<float> qs(static_cast<size_t>(G) * D), mx(states * G), sum(states * G), acc(states * G * D);
      std::vector<int> visible(static_cast<size_t>(G), T);
      for (int b = 0; b < B; ++b) {
        const size_t pages_before = [&] {
          size_t n = 0;
          for (int i = 0; i < b; ++i) n += static_cast<size_t>(num_pages[static_cast<size_t>(i)]);
          return n;
        }();
        for (int h = 0; h < H; ++h) {
          const size_t at = (static_cast<size_t>(b) * rows_per_seq + static_cast<size_t>(h) * G) * D;
          for (size_t i = 0; i < qs.size(); ++i) qs[i] = q[at + i] * scale;
          auto rows_of = [&](int s) {
            const size_t st = static_cast<size_t>(s);
            return cpu::AttentionRows{
                G, D, D, qs.data(), visible.data(), mx.data() + st * G, sum.data() + st * G, acc.data() + st * G * D};
          };
          auto exact = [&](const uint16_t* base, size_t capacity, int tokens, const cpu::AttentionRows& rows) {
            cpu::ExactHeadView v;
            v.bf16 = true;
            v.tokens = tokens;
            v.k_dim = v.v_dim = D;
            v.k = base + static_cast<size_t>(h) * capacity * D;
            v.v = base + static_cast<size_t>(H + h) * capacity * D;
            v.k_stride = v.v_stride = static_cast<size_t>(D);
            kernels.exact_block(v, rows, work.data());
          };
          for (int s = 0; s < plan.splits; ++s) {
            const cpu::AttentionRows rows = rows_of(s);
            cpu::attention_rows_reset(rows);
            const HackSplitRange range = hack_split_range(plan, s, num_pages[static_cast<size_t>(b)]);
            if (range.sinks && sink_tokens[static_cast<size_t>(b)] > 0)
              exact(sinks.data() + static_cast<size_t>(b) * sink_elems, S, sink_tokens[static_cast<size_t>(b)], rows);
            for (int p = range.page_begin; p < range.page_end; ++p) {
              const auto* page = reinterpret_cast<const std::byte*>(page_bytes.data()) +
                                 (pages_before + static_cast<size_t>(p)) * layout.page_bytes();
              kernels.hack_block(hack_head_view(layout, page, h), rows, work.data());
            }
            if (range.open && open_tokens[static_cast<size_t>(b)] > 0)
              exact(opens.data() + static_cast<size_t>(b) * open_elems, T, open_tokens[static_cast<size_t>(b)], rows);
          }
          for (int s = 1; s < plan.splits; ++s) cpu::attention_rows_merge(rows_of(0), rows_of(s));
          cpu::attention_rows_finish(rows_of(0), cpu_split.data() + at, D);
        }
      }
    }
    test::require_close(run_gpu(plan), cpu_split, "split plan vs the CPU kernels over the same splits");
  }
}

}  // namespace

TEST_CASE("device decode attention matches the CPU homomorphic attention", "[gpu][hack]") {
  int sm_count = 0;
  check_cuda(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  const uint32_t seed = 4242;
  for (int bits : {2, 4, 8})
    for (int dim : {64, 128})
      for (int group : {1, 4, 8}) {
        INFO("bits " << bits << " head_dim " << dim << " group " << group << " seed " << seed);
        run_decode_case(bits, dim, group, sm_count, seed + static_cast<uint32_t>(bits * 100 + dim + group));
      }
}
