// cuda_attention_bench: decode attention on the GPU, one query token per sequence, over a
// paged KV pool — the bf16 paged kernel (kernels/cuda/ops_attention.cu) against HACK's
// homomorphic kernel (kernels/cuda/hack_attention.cu) on the same shape and context.
//
// For each (mode, context, batch): enough layers are built that cycling through them
// reads more than the L2 many times over, each layer is one kernel call, and the time per
// call is the median over trials of CUDA-event time / calls. Bytes counted are those the
// kernel must read (the pages' bytes, sinks and open block for HACK; K and V for bf16;
// queries); GB/s is that over the time, next to the device-to-device copy bandwidth
// measured in the same run (bytes read + written). The peer (PyTorch's SDPA) is
// bench/cuda/sdpa_bench.py on the same shapes.
//
//   cuda_attention_bench --contexts 4096,32768,131072 --batch 1,8,32 --modes bf16,hack2
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/core/tensor.h"
#include "hack/kernels/cuda/hack.h"
#include "hack/kernels/cuda/ops.h"
#include "hack/backend/hack_attention_plan.h"
#include "hack/kv/hack_page.h"

void bench_fill_bf16(void* out, size_t n, uint32_t seed, int dim, float offset_scale);
void bench_fill_f32(void* out, size_t n, uint32_t seed);

using namespace hack;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Random bench data on the device (fill.cu): never zeros (zeros hide unwritten outputs).
void fill(void* p, size_t elems, uint32_t seed, int dim, float offset_scale) {
  bench_fill_bf16(p, elems, seed, dim, offset_scale);
  check(cudaGetLastError(), "fill");
}

void fill_f32(void* p, size_t elems, uint32_t seed) {
  bench_fill_f32(p, elems, seed);
  check(cudaGetLastError(), "fill");
}

struct Args {
  std::vector<int> contexts{4096, 8192, 32768, 65536, 131072};
  std::vector<int> batches{1, 8, 32, 64};
  std::vector<std::string> modes{"bf16", "hack2", "hack4"};
  int kv_heads = 8, head_dim = 128, group = 4, block = 64, sinks = 4;
  float max_gb = 24.0f;     // most bf16-equivalent KV bytes of one configuration
  double l2_multiple = 8.0; // layers cycled read at least this many L2s
  int trials = 7;
  bool json = false;
  HackDecodePlanInput plan;  // warps_per_sm, min_pages_per_split, max_splits (HACK modes)
};

struct Device {
  int sm_count = 0;
  size_t l2_bytes = 0;
  std::string name;
  double copy_gbs = 0;  // read + written
};

// Median time of `calls` invocations of f(i), CUDA events, after one warm-up pass.
template <class F>
double median_call_us(int calls, int trials, F&& f) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  for (int i = 0; i < calls; ++i) f(i);
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> t;
  for (int r = 0; r < trials; ++r) {
    check(cudaEventRecord(a), "record");
    for (int i = 0; i < calls; ++i) f(i);
    check(cudaEventRecord(b), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(1e3 * ms / calls);
  }
  check(cudaGetLastError(), "kernel");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double copy_bandwidth() {
  const size_t bytes = size_t{2} << 30;
  Buffer a = Buffer::allocate(MemoryKind::device, bytes), b = Buffer::allocate(MemoryKind::device, bytes);
  fill(a.data(), bytes / 2, 1, 128, 0.0f);
  const double us = median_call_us(4, 7, [&](int) {
    check(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice), "copy");
  });
  return 2.0 * static_cast<double>(bytes) / (us * 1e3);
}

struct Result {
  double us = 0, bytes = 0;
  int layers = 0, splits = 0;
  bool finite = true;
};

bool all_finite(const void* dev, size_t n, bool bf16) {
  std::vector<uint32_t> h(bf16 ? (n + 1) / 2 : n);
  check(cudaMemcpy(h.data(), dev, n * (bf16 ? 2 : 4), cudaMemcpyDeviceToHost), "download");
  if (bf16) {
    const auto* u = reinterpret_cast<const uint16_t*>(h.data());
    for (size_t i = 0; i < n; ++i)
      if ((u[i] & 0x7f80) == 0x7f80) return false;
  } else {
    for (size_t i = 0; i < n; ++i)
      if ((h[i] & 0x7f800000u) == 0x7f800000u) return false;
  }
  return true;
}

// A device copy of a host vector (at least 1 byte, so empty tables still have an address).
template <class T>
Buffer upload(const std::vector<T>& host) {
  const size_t bytes = host.size() * sizeof(T);
  Buffer b = Buffer::allocate(MemoryKind::device, std::max<size_t>(bytes, 1));
  if (bytes != 0) check(cudaMemcpy(b.data(), host.data(), bytes, cudaMemcpyHostToDevice), "upload");
  return b;
}

// Page p of a sequence's `pages` goes to slot scattered_page(p) of its range, as a real
// pool's pages scatter (7919 is prime, so this permutes the range).
int scattered_page(int p, int pages) { return static_cast<int>((static_cast<long long>(p) * 7919) % pages); }

int layers_for(double bytes_per_layer, const Device& dev, const Args& a) {
  const double want = a.l2_multiple * static_cast<double>(dev.l2_bytes);
  return std::clamp(static_cast<int>(std::ceil(want / bytes_per_layer)), 1, 64);
}

Result run_bf16(const Args& a, const Device& dev, int context, int batch) {
  const int H = a.kv_heads, D = a.head_dim, G = a.group, P = a.block, QH = H * G;
  const int pages = (context + P - 1) / P;
  const size_t page_elems = 2 * static_cast<size_t>(H) * P * D;
  const size_t layer_elems = page_elems * static_cast<size_t>(pages) * batch;
  Result r;
  r.layers = layers_for(static_cast<double>(layer_elems) * 2, dev, a);
  std::vector<Buffer> pools;
  for (int l = 0; l < r.layers; ++l) {
    pools.push_back(Buffer::allocate(MemoryKind::device, layer_elems * 2));
    fill(pools.back().data(), layer_elems, 100 + l, D, 0.5f);
  }
  // Sequence s owns pages [s·pages, (s+1)·pages), in a scattered order (a real pool's).
  std::vector<int> table(static_cast<size_t>(batch) * pages), offsets(batch), lengths(batch, context),
      rows(batch);
  for (int s = 0; s < batch; ++s) {
    offsets[s] = s * pages;
    rows[s] = s;
    for (int p = 0; p < pages; ++p)
      table[static_cast<size_t>(s) * pages + p] = s * pages + scattered_page(p, pages);
  }
  const Buffer table_d = upload(table), offsets_d = upload(offsets), lengths_d = upload(lengths),
               rows_d = upload(rows);
  const size_t q_elems = static_cast<size_t>(batch) * QH * D;
  Buffer q = Buffer::allocate(MemoryKind::device, q_elems * 4), out = Buffer::allocate(MemoryKind::device, q_elems * 2);
  fill_f32(q.data(), q_elems, 7);
  const int splits = cuda::decode_attention_splits(dev.sm_count, batch, H, pages, 64);  // the backend's plan
  cuda::DecodeAttentionArgs args;
  args.q = static_cast<const float*>(q.data());
  args.out = static_cast<cuda::bf16*>(out.data());
  args.q_row_stride = QH * D;
  args.rows = static_cast<const int*>(rows_d.data());
  args.kv_lengths = static_cast<const int*>(lengths_d.data());
  args.page_tables = static_cast<const int*>(table_d.data());
  args.page_table_offsets = static_cast<const int*>(offsets_d.data());
  args.n_seqs = batch;
  args.group_size = G;
  args.scale = 1.0f / std::sqrt(static_cast<float>(D));
  args.pages_per_split = (pages + splits - 1) / splits;
  args.n_splits = (pages + args.pages_per_split - 1) / args.pages_per_split;
  r.splits = args.n_splits;
  Buffer partial = Buffer::allocate(
      MemoryKind::device, static_cast<size_t>(cuda::decode_attention_workspace_floats(batch, QH, args.n_splits, D)) * 4);
  args.partial = static_cast<float*>(partial.data());
  check(cudaMemset(out.data(), 0xff, q_elems * 2), "poison");
  r.us = median_call_us(r.layers * 4, a.trials, [&](int i) {
    args.kv = cuda::PagedKvLayer{static_cast<cuda::bf16*>(pools[static_cast<size_t>(i % r.layers)].data()), P, H, D};
    cuda::decode_attention(args, nullptr);
  });
  r.finite = all_finite(out.data(), q_elems, true);
  r.bytes = static_cast<double>(batch) * context * H * D * 2 * 2 + static_cast<double>(q_elems) * 6;
  return r;
}

Result run_hack(const Args& a, const Device& dev, int context, int batch, int bits) {
  const int H = a.kv_heads, D = a.head_dim, G = a.group, T = a.block, S = a.sinks;
  // context = S sinks + pages·Π + open tokens (half a block open, the average).
  const int open = std::min(T / 2, std::max(0, context - S));
  const int pages = std::max(0, context - S - open) / T;
  const int open_tokens = context - S - pages * T;
  HackPageParams pp;
  pp.k_bits = pp.v_bits = bits;
  pp.block_tokens = T;
  pp.k_group = 64;
  pp.v_group = 64;
  pp.heads.assign(static_cast<size_t>(H), HackHeadDims{D, D});
  const HackPageLayout layout(pp);
  const HackPageGeometry g = page_geometry(layout);
  const size_t page_bytes = layout.page_bytes();
  const size_t layer_bytes = page_bytes * static_cast<size_t>(pages) * batch;
  const size_t sink_elems = 2 * static_cast<size_t>(H) * S * D, open_elems = 2 * static_cast<size_t>(H) * T * D;
  Result r;
  r.layers = layers_for(static_cast<double>(layer_bytes), dev, a);

  // One source of bf16 K/V blocks, quantized into every page (each page its own bytes).
  const int src_blocks = 64;
  const size_t block_elems = static_cast<size_t>(T) * H * D;
  Buffer k_src = Buffer::allocate(MemoryKind::device, block_elems * src_blocks * 2),
         v_src = Buffer::allocate(MemoryKind::device, block_elems * src_blocks * 2);
  fill(k_src.data(), block_elems * src_blocks, 11, D, 0.5f);
  fill(v_src.data(), block_elems * src_blocks, 12, D, 0.0f);
  std::vector<Buffer> pools, sinks_d, opens_d;
  const int chunk = 4096;  // blocks per quantize launch
  std::vector<const void*> ks(chunk), vs(chunk);
  std::vector<void*> ps(chunk);
  std::vector<int64_t> first(chunk);
  Buffer ks_d = Buffer::allocate(MemoryKind::device, chunk * 8), vs_d = Buffer::allocate(MemoryKind::device, chunk * 8),
         ps_d = Buffer::allocate(MemoryKind::device, chunk * 8), first_d = Buffer::allocate(MemoryKind::device, chunk * 8);
  const Buffer header_d = upload(page_header_template(layout, 0));
  for (int l = 0; l < r.layers; ++l) {
    pools.push_back(Buffer::allocate(MemoryKind::device, std::max<size_t>(64, layer_bytes)));
    sinks_d.push_back(Buffer::allocate(MemoryKind::device, sink_elems * batch * 2));
    opens_d.push_back(Buffer::allocate(MemoryKind::device, open_elems * batch * 2));
    fill(sinks_d.back().data(), sink_elems * batch, 200 + l, D, 0.5f);
    fill(opens_d.back().data(), open_elems * batch, 300 + l, D, 0.5f);
    const long long total = static_cast<long long>(pages) * batch;
    for (long long at = 0; at < total; at += chunk) {
      const int n = static_cast<int>(std::min<long long>(chunk, total - at));
      for (int i = 0; i < n; ++i) {
        const long long blk = at + i;
        const size_t src = static_cast<size_t>((blk * 31 + l) % src_blocks) * block_elems * 2;
        ks[i] = static_cast<const uint8_t*>(k_src.data()) + src;
        vs[i] = static_cast<const uint8_t*>(v_src.data()) + src;
        ps[i] = static_cast<uint8_t*>(pools.back().data()) + static_cast<size_t>(blk) * page_bytes;
        first[i] = S + (blk % std::max(1, pages)) * T;
      }
      check(cudaMemcpy(ks_d.data(), ks.data(), n * 8, cudaMemcpyHostToDevice), "upload");
      check(cudaMemcpy(vs_d.data(), vs.data(), n * 8, cudaMemcpyHostToDevice), "upload");
      check(cudaMemcpy(ps_d.data(), ps.data(), n * 8, cudaMemcpyHostToDevice), "upload");
      check(cudaMemcpy(first_d.data(), first.data(), n * 8, cudaMemcpyHostToDevice), "upload");
      cuda::HackQuantizeBlocks in;
      in.blocks = n;
      in.bf16 = true;
      in.k_src = static_cast<const void* const*>(ks_d.data());
      in.v_src = static_cast<const void* const*>(vs_d.data());
      in.token_stride = static_cast<size_t>(H) * D;
      in.head_stride = static_cast<size_t>(D);
      in.pages = static_cast<void* const*>(ps_d.data());
      in.first_tokens = static_cast<const int64_t*>(first_d.data());
      in.header = static_cast<const uint8_t*>(header_d.data());
      // The next chunk's table uploads wait for this launch (both on the legacy stream).
      cuda::hack_quantize_blocks(g, in, nullptr);
    }
  }
  check(cudaDeviceSynchronize(), "quantize");

  // Per-layer pointer tables: pages of sequence s in a scattered order.
  const int mp = std::max(1, pages);
  std::vector<Buffer> table_d, sink_ptr_d, open_ptr_d;
  for (int l = 0; l < r.layers; ++l) {
    std::vector<const void*> table(static_cast<size_t>(batch) * mp, nullptr);
    std::vector<const uint16_t*> sp(batch), op(batch);
    for (int s = 0; s < batch; ++s) {
      for (int p = 0; p < pages; ++p)
        table[static_cast<size_t>(s) * mp + p] =
            static_cast<const uint8_t*>(pools[l].data()) +
            (static_cast<size_t>(s) * pages + static_cast<size_t>(scattered_page(p, pages))) * page_bytes;
      sp[s] = static_cast<const uint16_t*>(sinks_d[l].data()) + static_cast<size_t>(s) * sink_elems;
      op[s] = static_cast<const uint16_t*>(opens_d[l].data()) + static_cast<size_t>(s) * open_elems;
    }
    table_d.push_back(upload(table));
    sink_ptr_d.push_back(upload(sp));
    open_ptr_d.push_back(upload(op));
  }
  const Buffer np_d = upload(std::vector<int>(batch, pages));
  const Buffer st_d = upload(std::vector<int>(batch, std::min(S, context)));
  const Buffer ot_d = upload(std::vector<int>(batch, open_tokens));
  const size_t q_elems = static_cast<size_t>(batch) * H * G * D;
  Buffer q = Buffer::allocate(MemoryKind::device, q_elems * 4), out = Buffer::allocate(MemoryKind::device, q_elems * 4);
  fill_f32(q.data(), q_elems, 7);
  HackDecodePlanInput pin = a.plan;
  pin.sm_count = dev.sm_count;
  pin.batch = batch;
  pin.kv_heads = H;
  pin.max_pages = mp;
  const HackDecodePlan plan = plan_hack_decode(pin);
  r.splits = plan.splits;
  const size_t work_bytes = cuda::hack_decode_workspace_bytes(g, batch, G, plan);
  Buffer work = Buffer::allocate(MemoryKind::device, std::max<size_t>(work_bytes, 64));
  cuda::HackDecodeBatch in;
  in.batch = batch;
  in.group_size = G;
  in.scale = 1.0f / std::sqrt(static_cast<float>(D));
  in.q = static_cast<const float*>(q.data());
  in.out = static_cast<float*>(out.data());
  in.max_pages = mp;
  in.num_pages = static_cast<const int*>(np_d.data());
  in.sink_tokens = static_cast<const int*>(st_d.data());
  in.sink_capacity = S;
  in.open_tokens = static_cast<const int*>(ot_d.data());
  check(cudaMemset(out.data(), 0xff, q_elems * 4), "poison");
  r.us = median_call_us(r.layers * 4, a.trials, [&](int i) {
    const size_t l = static_cast<size_t>(i % r.layers);
    in.page_table = static_cast<const void* const*>(table_d[l].data());
    in.sink_kv = static_cast<const uint16_t* const*>(sink_ptr_d[l].data());
    in.open_kv = static_cast<const uint16_t* const*>(open_ptr_d[l].data());
    cuda::hack_decode_attention(g, in, plan, work.data(), work.bytes(), nullptr);
  });
  r.finite = all_finite(out.data(), q_elems, false);
  r.bytes = static_cast<double>(batch) *
                (static_cast<double>(pages) * page_bytes + 2.0 * H * D * 2 * (std::min(S, context) + open_tokens)) +
            static_cast<double>(q_elems) * 8;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a;
    std::string contexts, batches, modes;
    FlagSet flags("cuda_attention_bench", "GPU decode attention: bf16 paged vs HACK homomorphic", "HACK_CUDA_ATTN_BENCH");
    flags.add_string("contexts", &contexts, "context lengths, comma-separated");
    flags.add_string("batch", &batches, "batch sizes, comma-separated");
    flags.add_string("modes", &modes, "bf16, hack2, hack4, hack8");
    flags.add_int("kv-heads", &a.kv_heads, "KV heads");
    flags.add_int("head-dim", &a.head_dim, "head dimension");
    flags.add_int("group", &a.group, "query heads per KV head");
    flags.add_int("block", &a.block, "tokens per page (Π)");
    flags.add_float("max-gb", &a.max_gb, "skip configurations whose bf16 KV exceeds this (GB)");
    flags.add_int("trials", &a.trials, "timed trials (median)");
    flags.add_bool("json", &a.json, "JSON lines output");
    flags.add_int("warps-per-sm", &a.plan.warps_per_sm, "HACK plan: split warps per SM to aim for");
    flags.add_int("min-pages-per-split", &a.plan.min_pages_per_split, "HACK plan: fewest pages of a split");
    flags.add_int("max-splits", &a.plan.max_splits, "HACK plan: most splits per (sequence, KV head)");
    if (!flags.parse(argc, argv)) return 2;
    if (!contexts.empty()) a.contexts = parse_int_list(contexts, "contexts");
    if (!batches.empty()) a.batches = parse_int_list(batches, "batch");
    if (!modes.empty()) a.modes = split_list(modes);

    Device dev;
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "device properties");
    dev.sm_count = prop.multiProcessorCount;
    dev.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
    dev.name = prop.name;
    dev.copy_gbs = copy_bandwidth();
    std::printf("# %s, %d SMs, L2 %.0f MB; device-to-device copy %.0f GB/s (read + written)\n", dev.name.c_str(),
                dev.sm_count, dev.l2_bytes / 1e6, dev.copy_gbs);
    std::printf("# shape: %d KV heads x %d dims, group %d, page %d tokens; HACK plan: %d warps/SM, >= %d pages per "
                "split, <= %d splits\n",
                a.kv_heads, a.head_dim, a.group, a.block, a.plan.warps_per_sm, a.plan.min_pages_per_split,
                a.plan.max_splits);
    if (!a.json)
      std::printf("%-6s %7s %5s %6s %6s %10s %9s %8s %s\n", "mode", "context", "batch", "layers", "splits", "us/call",
                  "GB/s", "%copy", "finite");
    for (const std::string& mode : a.modes)
      for (int ctx : a.contexts)
        for (int batch : a.batches) {
          const double bf16_gb = static_cast<double>(batch) * ctx * a.kv_heads * a.head_dim * 4 / 1e9;
          if (bf16_gb > a.max_gb) {
            std::printf("# skip %s ctx %d batch %d: %.1f GB of bf16 KV > --max-gb\n", mode.c_str(), ctx, batch, bf16_gb);
            continue;
          }
          Result r;
          if (mode == "bf16")
            r = run_bf16(a, dev, ctx, batch);
          else if (mode.rfind("hack", 0) == 0)
            r = run_hack(a, dev, ctx, batch, std::stoi(mode.substr(4)));
          else
            throw Error("unknown mode " + mode);
          const double gbs = r.bytes / (r.us * 1e3);
          if (a.json)
            std::printf(
                "{\"device\":\"%s\",\"mode\":\"%s\",\"context\":%d,\"batch\":%d,\"layers\":%d,\"splits\":%d,"
                "\"us\":%.2f,\"bytes\":%.0f,\"gbs\":%.1f,\"copy_gbs\":%.1f,\"finite\":%s}\n",
                dev.name.c_str(), mode.c_str(), ctx, batch, r.layers, r.splits, r.us, r.bytes, gbs, dev.copy_gbs,
                r.finite ? "true" : "false");
          else
            std::printf("%-6s %7d %5d %6d %6d %10.1f %9.0f %7.0f%% %s\n", mode.c_str(), ctx, batch, r.layers, r.splits,
                        r.us, gbs, 100.0 * gbs / dev.copy_gbs, r.finite ? "yes" : "NO");
          std::fflush(stdout);
          check(cudaDeviceSynchronize(), "configuration");
        }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_attention_bench: %s\n", e.what());
    return 1;
  }
}
