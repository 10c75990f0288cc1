// Whole-model decode throughput of the CUDA backend, --kv fp against --kv hack, on a
// synthetic shape (default Llama-3-8B): batch B sequences each holding `context` tokens
// decode `steps` tokens together; tok/s = B · steps / wall time of the steps (each forward
// ends with its logits on the host, as a server's step does).
//
// The contexts are not prefilled (a 32K prompt through the prefill kernel takes minutes per
// sequence here): the bf16 pool is filled with pseudo-random K/V (fill.cu, K with channel
// offsets like post-RoPE keys), the lengths are committed as if appended, and under --kv
// hack the full blocks are closed (quantized on the device) exactly as end_prefill closes
// a prompt's. Decode then runs the product path unchanged. Weights are random (seed 42).
//
// Prefill is measured beside it (--prefill 512,2048): tok/s of one prompt chunk through the
// backend (fp KV), against what cuBLAS alone needs for that chunk's GEMMs (the 7 projections
// of every layer, same shapes, same gemm_bf16 call) and cuBLAS's rate on a large square GEMM.
//
//   cuda_decode_bench [--synthetic llama-8b] [--kv fp,hack] [--batch 1,32] [--contexts 4096,32768]
//                     [--steps 32] [--hack-bits 2] [--block 64] [--max-kv-gb 40] [--prefill 512,2048]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "hack/backend/cuda_backend.h"
#include "hack/backend/cuda_check.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/kernels/cuda/ops.h"
#include "hack/model/config.h"
#include "hack/model/weights.h"

void bench_fill_bf16(void* out, size_t n, uint32_t seed, int dim, float offset_scale);

using namespace hack;

namespace {

struct Args {
  std::string synthetic = "llama-8b";
  std::vector<std::string> kv{"fp", "hack"};
  std::vector<int> batches{1, 32};
  std::vector<int> contexts{4096, 32768};
  int steps = 32;
  int hack_bits = 2;
  int block = 64;
  float max_kv_gb = 40.0f;  // skip configurations whose bf16 KV exceeds this
  std::vector<int> prefill{512, 2048};
};

// Runs every (batch, context) of one KV mode on one cache + backend.
void run_mode(const Model& model, const Args& a, const std::string& kv_name) {
  const ModelConfig& c = model.config;
  const bool hack = kv_name == "hack";
  HACK_CHECK(hack || kv_name == "fp", "--kv: fp or hack, got {}", kv_name);
  CudaKvOptions ko;
  ko.page_tokens = a.block;
  if (hack) {
    KvCacheOptions h;
    h.mode = KvMode::hack;
    h.k_bits = h.v_bits = a.hack_bits;
    h.block_tokens = a.block;
    ko.hack = h;
  }
  // Enough pages for the largest configuration that fits --max-kv-gb.
  const double token_bytes = bf16_kv_bytes_per_token(kv_shape(c));
  int max_pages = 0, max_batch = 1;
  for (int b : a.batches)
    for (int ctx : a.contexts) {
      if (token_bytes * b * (ctx + a.steps) > a.max_kv_gb * 1e9) continue;
      max_pages = std::max(max_pages, b * (CudaPagedKvCache::pages_for(ctx + a.steps + 1, a.block) + 1));
      max_batch = std::max(max_batch, b);
    }
  if (max_pages == 0) return;
  ko.num_pages = max_pages;
  auto kv = make_cuda_kv_cache(c, ko);
  CudaBackendOptions bo;
  bo.max_batch_tokens = std::max(max_batch, 16);
  bo.max_sequences = max_batch;
  bo.max_logit_rows = max_batch;
  auto backend = make_cuda_backend(model, *kv, bo);
  for (int l = 0; l < c.num_layers; ++l)
    bench_fill_bf16(kv->layer(l).data, kv->page_bytes() / 2 * static_cast<size_t>(ko.num_pages), 1000u + l,
                    c.head_dim, 0.5f);
  HACK_CUDA_CHECK(cudaDeviceSynchronize());

  for (int b : a.batches)
    for (int ctx : a.contexts) {
      if (token_bytes * b * (ctx + a.steps) > a.max_kv_gb * 1e9) {
        std::printf("%-5s %5d %7d  skipped: bf16 KV %.1f GB > --max-kv-gb %.0f\n", kv_name.c_str(), b, ctx,
                    token_bytes * b * (ctx + a.steps) / 1e9, a.max_kv_gb);
        continue;
      }
      std::vector<int> lengths(static_cast<size_t>(b), ctx);
      for (int s = 0; s < b; ++s) {
        kv->add_sequence(s, ctx + a.steps + 1);
        for (int l = 0; l < c.num_layers; ++l) kv->commit_append(l, s, 0, ctx);
        if (hack) kv->close_blocks(s, kv->full_blocks(ctx));
      }
      std::vector<int> tokens(static_cast<size_t>(b));
      std::vector<SequenceChunk> chunks(static_cast<size_t>(b));
      std::vector<float> logits;
      auto step = [&](int i) {
        for (int s = 0; s < b; ++s) {
          const size_t k = static_cast<size_t>(s);
          tokens[k] = (s * 7919 + (i + 1) * 31 + 11) % c.vocab_size;
          chunks[k] = SequenceChunk{s, lengths[k], std::span<const int>(&tokens[k], 1), false};
          ++lengths[k];
        }
        backend->forward(chunks, logits);
      };
      step(-1);  // warm-up: first-use allocations, cuBLAS heuristics
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < a.steps; ++i) step(i);
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      bool finite = true;
      for (float x : logits) finite = finite && std::isfinite(x);
      std::printf("%-5s %5d %7d %9.2f %10.1f %7s  %s\n", kv_name.c_str(), b, ctx, 1e3 * sec / a.steps,
                  b * a.steps / sec, finite ? "yes" : "NO", kv->name().c_str());
      std::fflush(stdout);
      for (int s = 0; s < b; ++s) kv->remove_sequence(s);
    }
}

// Seconds per call of f, median of 5 timed runs of `calls` calls after one warm-up call.
template <class F>
double time_calls(int calls, F&& f) {
  f();
  HACK_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) f();
    HACK_CUDA_CHECK(cudaDeviceSynchronize());
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls);
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

void run_prefill(const Model& model, const Args& a) {
  const ModelConfig& c = model.config;
  const int max_n = *std::max_element(a.prefill.begin(), a.prefill.end());
  CudaKvOptions ko;
  ko.page_tokens = a.block;
  ko.num_pages = CudaPagedKvCache::pages_for(max_n, a.block) + 1;
  auto kv = make_cuda_kv_cache(c, ko);
  CudaBackendOptions bo;
  bo.max_batch_tokens = max_n;
  bo.max_sequences = 1;
  auto backend = make_cuda_backend(model, *kv, bo);
  // cuBLAS alone: the layer GEMMs of an n-row chunk on random bf16 matrices of the model's shapes.
  cublasHandle_t handle = nullptr;
  HACK_CHECK(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed");
  const int H = c.hidden_size, I = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const std::vector<std::pair<int, int>> shapes{{qd, H}, {kvd, H}, {kvd, H}, {H, qd}, {I, H}, {I, H}, {H, I}};
  std::vector<Buffer> w;
  for (const auto& [out, in] : shapes) {
    w.push_back(Buffer::allocate(MemoryKind::device, static_cast<size_t>(out) * in * 2));
    bench_fill_bf16(w.back().data(), static_cast<size_t>(out) * in, 7u + static_cast<uint32_t>(w.size()), in, 0.0f);
  }
  const size_t widest = static_cast<size_t>(std::max({H, I, qd}));
  Buffer x = Buffer::allocate(MemoryKind::device, static_cast<size_t>(max_n) * widest * 2);
  Buffer y = Buffer::allocate(MemoryKind::device, static_cast<size_t>(max_n) * widest * 4);
  bench_fill_bf16(x.data(), static_cast<size_t>(max_n) * widest, 3u, 128, 0.0f);
  double flop_per_row = 0;
  for (const auto& [out, in] : shapes) flop_per_row += 2.0 * out * in;
  {  // cuBLAS's rate on a large square GEMM, the peak the chunk's GEMMs are compared with
    const int n = 8192;
    Buffer ma = Buffer::allocate(MemoryKind::device, size_t{n} * n * 2);
    Buffer mb = Buffer::allocate(MemoryKind::device, size_t{n} * n * 2);
    Buffer mc = Buffer::allocate(MemoryKind::device, size_t{n} * n * 4);
    bench_fill_bf16(ma.data(), size_t{n} * n, 11u, 128, 0.0f);
    bench_fill_bf16(mb.data(), size_t{n} * n, 12u, 128, 0.0f);
    const double sec = time_calls(5, [&] {
      cuda::gemm_bf16(handle, static_cast<const cuda::bf16*>(ma.data()), n, n, static_cast<const cuda::bf16*>(mb.data()),
                      n, static_cast<float*>(mc.data()));
    });
    std::printf("# cuBLAS bf16 GEMM %d x %d x %d (fp32 out): %.0f TFLOP/s\n", n, n, n, 2.0 * n * n * n / sec / 1e12);
  }
  std::printf("%-8s %9s %10s %12s %14s %9s\n", "prefill", "tok/s", "TTFT ms", "GEMM-only ms", "GEMM TFLOP/s", "GEMM %");
  for (int n : a.prefill) {
    std::vector<int> ids(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = (i * 7919 + 11) % c.vocab_size;
    std::vector<float> logits;
    int seq = 0;
    const double sec = time_calls(1, [&] {
      if (kv->has_sequence(seq)) kv->remove_sequence(seq);
      kv->add_sequence(seq, n);
      const SequenceChunk chunk{seq, 0, ids, false};
      backend->forward(std::span<const SequenceChunk>(&chunk, 1), logits);
    });
    kv->remove_sequence(seq);
    const double gemm_sec = time_calls(1, [&] {
      for (int l = 0; l < c.num_layers; ++l)
        for (size_t i = 0; i < shapes.size(); ++i)
          cuda::gemm_bf16(handle, static_cast<const cuda::bf16*>(w[i].data()), shapes[i].first, shapes[i].second,
                          static_cast<const cuda::bf16*>(x.data()), n, static_cast<float*>(y.data()));
    });
    const double flop = flop_per_row * n * c.num_layers;
    std::printf("%-8d %9.0f %10.1f %12.1f %14.0f %8.0f%%\n", n, n / sec, 1e3 * sec, 1e3 * gemm_sec, flop / gemm_sec / 1e12,
                100.0 * gemm_sec / sec);
    std::fflush(stdout);
  }
  cublasDestroy(handle);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a;
    std::string kv, batches, contexts;
    FlagSet flags("cuda_decode_bench", "CUDA backend decode tok/s, --kv fp vs --kv hack, batch × context",
                  "HACK_CUDA_DECODE_BENCH");
    flags.add_string("synthetic", &a.synthetic, "synthetic model shape");
    flags.add_string("kv", &kv, "KV modes, comma-separated: fp, hack");
    flags.add_string("batch", &batches, "batch sizes, comma-separated");
    flags.add_string("contexts", &contexts, "context lengths, comma-separated");
    flags.add_int("steps", &a.steps, "timed decode steps");
    flags.add_int("hack-bits", &a.hack_bits, "HACK K and V bits");
    flags.add_int("block", &a.block, "tokens per page (Π)");
    flags.add_float("max-kv-gb", &a.max_kv_gb, "skip configurations whose bf16 KV exceeds this (GB)");
    std::string prefill;
    flags.add_string("prefill", &prefill, "prompt chunk lengths for the prefill rows, comma-separated; none = skip");
    if (!flags.parse(argc, argv)) return 2;
    if (!kv.empty()) a.kv = split_list(kv);
    if (!batches.empty()) a.batches = parse_int_list(batches, "batch");
    if (!contexts.empty()) a.contexts = parse_int_list(contexts, "contexts");
    if (prefill == "none") a.prefill.clear();
    else if (!prefill.empty()) a.prefill = parse_int_list(prefill, "prefill");
    HACK_CHECK(a.steps > 0, "--steps must be positive");

    cudaDeviceProp prop{};
    HACK_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const auto t0 = std::chrono::steady_clock::now();
    const Model model = Model::synthetic(synthetic_model_config(a.synthetic), 42);
    std::printf("# %s; synthetic %s (%d layers, %d q / %d KV heads, head_dim %d), weights made in %.1f s\n", prop.name,
                a.synthetic.c_str(), model.config.num_layers, model.config.num_heads, model.config.num_kv_heads,
                model.config.head_dim,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::printf("# %d timed steps after one warm-up; page %d tokens; hack = k%dv%d, 4 sinks, no recent window\n",
                a.steps, a.block, a.hack_bits, a.hack_bits);
    std::printf("%-5s %5s %7s %9s %10s %7s  %s\n", "kv", "batch", "context", "ms/step", "tok/s", "finite", "cache");
    for (const std::string& mode : a.kv) run_mode(model, a, mode);
    if (!a.prefill.empty()) run_prefill(model, a);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_decode_bench: %s\n", e.what());
    return 1;
  }
}
