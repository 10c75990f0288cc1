// bench/matmul_bench: one transformer layer's matmuls (cpu::matmul on bf16 weights, or on
// GGUF blocks with --dtype) per CPU tier, the tiers interleaved repeat by repeat — on a shared
// machine the load falls on every tier alike, and the median of the repeats compares them.
//   matmul_bench [--shape 576,192,1536] [--layers 30] [--rows 1,4,8,512] [--threads 1,2]
//                [--repeats 9] [--precision fp32,bf16] [--isas avx2,avx512,avx512bf16]
//                [--dtype bf16|q4_0|q4_1|q8_0|q4_k|q5_k|q6_k]
// --shape hidden,kv_width,intermediate gives a layer's seven matrices (q, k, v, o, gate, up,
// down; the default is SmolLM2-135M's, 30 layers). Rows ≤ 8 are the decode GEMV: one pass
// over all --layers distinct layers (more than the last-level cache holds, as a decode step
// streams the model; in huge pages, as hack-run keeps its weights), weight GB/s against the read bandwidth measured in the same run. More
// rows are the prefill GEMM on the first layer, compute-bound: GFLOP/s (2 per multiply-add)
// against cpu_peak's per-core rates.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hack/core/cpu_features.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/core/huge_pages.h"
#include "hack/core/membw.h"
#include "hack/core/tensor.h"
#include "hack/core/thread_pool.h"
#include "hack/kernels/cpu/matmul.h"

namespace {

// Random bf16 [out][in] at arena + *offset (advanced past it, 64-byte aligned).
hack::Tensor random_bf16(int64_t out, int64_t in, const std::shared_ptr<const hack::HugePageMapping>& arena,
                         size_t* offset, std::mt19937& rng) {
  auto* data = reinterpret_cast<uint16_t*>(arena->data() + *offset);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  for (int64_t i = 0; i < out * in; ++i) data[i] = hack::f32_to_bf16(dist(rng));
  *offset += (static_cast<size_t>(out * in) * 2 + 63) / 64 * 64;
  return hack::Tensor::view(hack::DType::bf16, {out, in}, data, arena);
}

// Random blocks of a GGUF block type: random codes, f16 scales of a trained model's size.
hack::Tensor random_blocks(hack::DType t, int64_t out, int64_t in,
                           const std::shared_ptr<const hack::HugePageMapping>& arena, size_t* offset,
                           std::mt19937& rng) {
  auto* data = reinterpret_cast<unsigned char*>(arena->data() + *offset);
  const size_t bytes = hack::dtype_bytes(t, static_cast<size_t>(out * in));
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(rng());
  const size_t block = hack::dtype_block_bytes(t);
  const uint16_t scale = hack::f32_to_f16(0.002f);
  const size_t scale_at = t == hack::DType::q6_k ? 208 : 0;
  for (size_t b = 0; b < bytes / block; ++b) std::memcpy(data + b * block + scale_at, &scale, 2);
  *offset += (bytes + 63) / 64 * 64;
  return hack::Tensor::view(t, {out, in}, data, arena);
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape_flag = "576,192,1536", rows_flag = "1,4,8,512", threads_flag = "1,2";
  std::string precision_flag = "fp32,bf16", isas_flag = "avx2,avx512,avx512bf16";
  std::string dtype_flag = "bf16";
  int repeats = 9, layers = 30;
  hack::FlagSet flags("matmul_bench", "One layer's bf16 matmuls per CPU tier, tiers interleaved.", "HACK_MATMUL_BENCH");
  flags.add_string("shape", &shape_flag, "hidden,kv_width,intermediate of the layer");
  flags.add_int("layers", &layers, "distinct layers the GEMV rows stream through");
  flags.add_string("rows", &rows_flag, "activation rows, comma-separated (<= 8: GEMV)");
  flags.add_string("threads", &threads_flag, "thread counts, comma-separated");
  flags.add_int("repeats", &repeats, "timed repeats per tier (median reported)");
  flags.add_string("precision", &precision_flag, "matmul precisions: fp32, bf16");
  flags.add_string("isas", &isas_flag, "tiers to force through HACK_CPU_ISA (ones above the CPU's are skipped)");
  flags.add_string("dtype", &dtype_flag, "weight type: bf16, or a GGUF block type (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k)");
  std::vector<int> shape, rows_list, threads_list;
  hack::DType wtype = hack::DType::bf16;
  try {
    if (!flags.parse(argc, argv)) return 0;
    wtype = hack::parse_dtype(dtype_flag);
    HACK_CHECK(wtype == hack::DType::bf16 || hack::dtype_is_quantized(wtype), "--dtype must be bf16 or a block type");
    shape = hack::parse_int_list(shape_flag, "shape");
    rows_list = hack::parse_int_list(rows_flag, "rows");
    threads_list = hack::parse_int_list(threads_flag, "threads");
    HACK_CHECK(shape.size() == 3, "--shape takes hidden,kv_width,intermediate");
    HACK_CHECK(repeats >= 1 && layers >= 1, "--repeats and --layers must be at least 1");
  } catch (const hack::Error& e) {
    std::fprintf(stderr, "matmul_bench: %s\n", e.what());
    return 2;
  }
  std::vector<hack::CpuIsa> isas;
  for (const std::string& name : hack::split_list(isas_flag)) {
    for (hack::CpuIsa isa : {hack::CpuIsa::scalar, hack::CpuIsa::avx2, hack::CpuIsa::avx512, hack::CpuIsa::avx512bf16})
      if (name == hack::cpu_isa_name(isa) && hack::cpu_supports(isa)) isas.push_back(isa);
  }
  const int64_t h = shape[0], kv = shape[1], ff = shape[2];
  std::mt19937 rng(5);
  // Per layer, [out][in] as the checkpoint stores them: q, k, v, o, gate, up, down; in memory
  // advised for huge pages, as hack-run places the weights (--weights-memory huge-pages).
  const int64_t dims[7][2] = {{h, h}, {kv, h}, {kv, h}, {h, h}, {ff, h}, {ff, h}, {h, ff}};
  size_t arena_bytes = 0;
  for (const auto& d : dims) arena_bytes += (hack::dtype_bytes(wtype, static_cast<size_t>(d[0] * d[1])) + 63) / 64 * 64;
  const auto arena = std::make_shared<const hack::HugePageMapping>(arena_bytes * static_cast<size_t>(layers),
                                                                   "the weights", /*populate=*/true);
  size_t offset = 0;
  std::vector<std::vector<hack::Tensor>> model(static_cast<size_t>(layers));
  for (std::vector<hack::Tensor>& ws : model)
    for (const auto& d : dims)
      ws.push_back(wtype == hack::DType::bf16 ? random_bf16(d[0], d[1], arena, &offset, rng)
                                              : random_blocks(wtype, d[0], d[1], arena, &offset, rng));
  double layer_bytes = 0, macs_per_row = 0;
  for (const hack::Tensor& w : model[0]) {
    layer_bytes += static_cast<double>(w.bytes());
    macs_per_row += static_cast<double>(w.dim(0) * w.dim(1));
  }
  std::printf("cpu: %s\nlayer %lld,%lld,%lld: %.2f MB of %s weights, GEMV over %d layers (%.0f MB); tiers "
              "interleaved, median of %d repeats\n",
              hack::cpu_features().describe().c_str(), static_cast<long long>(h), static_cast<long long>(kv),
              static_cast<long long>(ff), layer_bytes / 1e6, hack::dtype_name(wtype).data(), layers,
              layer_bytes * layers / 1e6, repeats);
  for (int threads : threads_list) {
    hack::ThreadPool pool(threads);
    const double membw = hack::measure_read_bandwidth_gbs(pool, size_t{1} << 30, 3);
    std::printf("threads %d: read bandwidth %.2f GB/s\n", threads, membw);
    for (const std::string& precision : hack::split_list(precision_flag)) {
      hack::cpu::MatmulWorkspace mw;
      mw.precision = hack::cpu::parse_matmul_precision(precision);
      for (int rows : rows_list) {
        const size_t r = static_cast<size_t>(rows);
        std::vector<float> x(r * static_cast<size_t>(std::max(h, ff))), y(r * static_cast<size_t>(std::max(h, ff)));
        std::normal_distribution<float> dist(0.0f, 1.0f);
        for (float& v : x) v = dist(rng);
        const size_t n_layers = rows <= 8 ? model.size() : 1;
        const double bytes = layer_bytes * static_cast<double>(n_layers);
        std::vector<std::vector<double>> seconds(isas.size());
        for (int rep = -1; rep < repeats; ++rep) {  // rep -1: untimed warm-up of every tier
          for (size_t k = 0; k < isas.size(); ++k) {
            const size_t i = (k + static_cast<size_t>(std::max(rep, 0))) % isas.size();  // rotate who goes first
            setenv("HACK_CPU_ISA", hack::cpu_isa_name(isas[i]), 1);
            const auto t0 = std::chrono::steady_clock::now();
            for (size_t l = 0; l < n_layers; ++l)
              for (const hack::Tensor& w : model[l]) hack::cpu::matmul(x.data(), r, w, y.data(), pool, mw);
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (rep >= 0) seconds[i].push_back(s);
          }
        }
        for (size_t i = 0; i < isas.size(); ++i) {
          std::vector<double>& v = seconds[i];
          std::sort(v.begin(), v.end());
          const double med = v[v.size() / 2], best = v.front();
          if (rows <= 8) {
            std::printf("  %-4s rows %3d %-10s %zu layers %7.3f ms (best %7.3f) | weights %5.1f GB/s = %3.0f%% of read "
                        "bandwidth\n",
                        precision.c_str(), rows, hack::cpu_isa_name(isas[i]), n_layers, med * 1e3, best * 1e3,
                        bytes / med / 1e9, 100 * bytes / med / 1e9 / membw);
          } else {
            std::printf("  %-4s rows %3d %-10s 1 layer  %7.3f ms (best %7.3f) | %6.1f GFLOP/s (best %6.1f)\n",
                        precision.c_str(), rows, hack::cpu_isa_name(isas[i]), med * 1e3, best * 1e3,
                        2 * macs_per_row * rows / med / 1e9, 2 * macs_per_row * rows / best / 1e9);
          }
        }
      }
    }
  }
  return 0;
}
