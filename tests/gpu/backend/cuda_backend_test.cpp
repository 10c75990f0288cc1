// The CUDA backend against the CPU reference backend, whole model, on every fixture model
// (tests/fixtures/models/*: Llama with llama3 and linear RoPE scaling, Mistral, Qwen2
// biases, Qwen3 q/k norms) and models/hack-tiny.
//
// The reference is the CPU backend on the same weights rounded to bf16 (what the GPU
// holds) with a bf16 paged KV cache (what the GPU pool holds) and, for the prompt's
// many-row matmuls, bf16 GEMM inputs (--matmul-precision bf16: normed activations,
// attention output, SwiGLU output rounded as the GPU rounds them). What remains is the
// order of sums and, in decode, the CPU's f32 GEMV inputs.
//
// Logits tolerance: max |Δ| ≤ 2e-2 · max |logit| per row. Measured on the CPU alone, bf16
// GEMM inputs against f32 ones move these random-weight models' prompt logits by up to
// 2.3e-2 (tiny-llama-linear, 421-token prompt, position 160); the first H100 run
// (2026-11-26), still against the f32 reference, failed there at 2.4e-2 for that reason,
// so the prompt is compared against the bf16-input reference. A wrong formula (RoPE, norm,
// bias, mask, page lookup) moves logits by O(1) relative.
// Greedy: 32 tokens, each side feeding its own choice, must be identical; the one
// exemption is a divergence where the reference's own top-2 are closer than that logits
// tolerance (a near tie, which bf16 inputs may legitimately flip). It is reported as a
// warning and ends the comparison for that prompt.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>

#include <cuda_runtime.h>

#include "hack/backend/cuda_backend.h"
#include "hack/backend/engine.h"
#include "hack/core/error.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "hack/model/weights.h"
#include "support/test_support.h"

using namespace hack;
namespace fs = std::filesystem;

namespace {

constexpr double kLogitsRelTol = 2e-2;
constexpr int kPageTokens = 16;

std::vector<fs::path> model_dirs() {
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(test::fixtures_dir() / "models"))
    if (fs::exists(e.path() / "config.json")) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  const fs::path tiny = test::source_dir() / "models" / "hack-tiny";
  if (fs::exists(tiny / "config.json")) dirs.push_back(tiny);
  return dirs;
}

Tensor rounded_to_bf16(const Tensor& t) {
  if (!t.defined() || t.dtype() == DType::bf16) return t;
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> f(n);
  convert_to_f32(t.dtype(), t.raw(), f.data(), n);
  Tensor r = Tensor::empty(DType::bf16, t.shape(), t.ndim());
  auto* dst = r.data<uint16_t>();
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(f[i]);
  return r;
}

// The model with every matrix (and the embedding) rounded to bf16; norms and biases stay f32.
Model bf16_weights(const Model& m) {
  Model r = m;
  const bool tied = m.weights.lm_head.defined() && m.weights.lm_head.raw() == m.weights.embed.raw();
  r.weights.embed = rounded_to_bf16(m.weights.embed);
  r.weights.lm_head = tied ? r.weights.embed : rounded_to_bf16(m.weights.lm_head);
  for (LayerWeights& w : r.weights.layers) {
    for (Tensor* t : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) *t = rounded_to_bf16(*t);
  }
  return r;
}

// --kv hack as the tests run it: Π = 16 (a page), 4 sinks, 2-bit K and V unless given.
KvCacheOptions hack_options(int k_bits = 2, int v_bits = 2) {
  KvCacheOptions o;
  o.mode = KvMode::hack;
  o.block_tokens = kPageTokens;
  o.sinks = 4;
  o.k_bits = k_bits;
  o.v_bits = v_bits;
  return o;
}

struct CpuRef {
  explicit CpuRef(const Model& model, int chunk = 512, const KvCacheOptions& kv_options = options())
      : model(bf16_weights(model)),
        pool(2),
        kv(make_paged_kv_cache(KvShape{this->model.config.num_layers, this->model.config.num_kv_heads,
                                       this->model.config.head_dim, this->model.config.group_size()},
                               kv_options)),
        backend(make_cpu_backend(this->model, pool, *kv, cpu::MatmulPrecision::bf16)),
        engine(*backend, EngineOptions{chunk}) {}
  static KvCacheOptions options() {
    KvCacheOptions o;
    o.mode = KvMode::fp;
    o.fp_dtype = DType::bf16;
    o.block_tokens = kPageTokens;
    return o;
  }
  Model model;
  ThreadPool pool;
  std::unique_ptr<CpuPagedKvCache> kv;
  std::unique_ptr<Backend> backend;
  Engine engine;
};

struct GpuRun {
  explicit GpuRun(const Model& model, int chunk = 512, int pages = 256,
                  const std::optional<KvCacheOptions>& hack = std::nullopt, bool plan_attention = false)
      : kv(make_cuda_kv_cache(model.config, kv_options(pages, hack))),
        backend(make_cuda_backend(model, *kv, backend_options(chunk, plan_attention))),
        engine(*backend, EngineOptions{chunk}) {}
  static CudaBackendOptions backend_options(int chunk, bool plan_attention = false) {
    CudaBackendOptions o;
    o.plan_attention = plan_attention;
    o.max_batch_tokens = std::max(chunk, 64);
    o.max_sequences = 8;
    o.max_logit_rows = 24;  // smaller than a prompt: several lm_head passes
    return o;
  }
  static CudaKvOptions kv_options(int pages, const std::optional<KvCacheOptions>& hack = std::nullopt) {
    CudaKvOptions o;
    o.page_tokens = kPageTokens;
    o.num_pages = pages;
    o.hack = hack;
    return o;
  }
  std::unique_ptr<CudaPagedKvCache> kv;
  std::unique_ptr<Backend> backend;
  Engine engine;
};

// max |a − b| and max |b| over one row.
std::pair<float, float> row_diff(const float* a, const float* b, size_t n) {
  float diff = 0, mag = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    mag = std::max(mag, std::fabs(b[i]));
  }
  return {diff, mag};
}

int argmax(const float* x, size_t n) { return static_cast<int>(std::max_element(x, x + n) - x); }

std::vector<std::vector<int>> prompts_for(const fs::path& dir, int vocab) {
  std::vector<std::vector<int>> prompts;
  if (fs::exists(dir / "goldens.json")) {
    std::ifstream in(dir / "goldens.json");
    const nlohmann::json g = nlohmann::json::parse(in);
    for (const auto& p : g["prompts"]) prompts.push_back(p["ids"].get<std::vector<int>>());
  }
  std::vector<int> synthetic;  // crosses several pages: 1, Π−1, Π, Π+1 are all visited by decode after it
  for (int i = 0; i < 3 * kPageTokens + 5; ++i) synthetic.push_back((i * 97 + 13) % vocab);
  prompts.push_back(synthetic);
  return prompts;
}

// Opens `seq` on both sides and prefills `ids` with the logits of every position (a, b): each
// row within kLogitsRelTol · max|logit|. Returns the worst max|Δ| / max|logit|.
double prefill_both(CpuRef& cpu, GpuRun& gpu, int seq, const std::vector<int>& ids, std::vector<float>& a,
                    std::vector<float>& b) {
  const size_t vocab = static_cast<size_t>(cpu.model.config.vocab_size);
  cpu.engine.add_sequence(seq, static_cast<int>(ids.size()) + 40);
  gpu.engine.add_sequence(seq, static_cast<int>(ids.size()) + 40);
  cpu.engine.prefill(seq, ids, a, /*all_logits=*/true);
  gpu.engine.prefill(seq, ids, b, /*all_logits=*/true);
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t r = 0; r < ids.size(); ++r) {
    const auto [diff, mag] = row_diff(&b[r * vocab], &a[r * vocab], vocab);
    INFO("position " << r << " max|Δ| " << diff << " max|logit| " << mag);
    REQUIRE(diff <= kLogitsRelTol * mag);
    if (mag > 0) worst = std::max(worst, static_cast<double>(diff / mag));
  }
  return worst;
}

// One forward of `batch` on `batched` (expected_rows logits rows) against each chunk alone on
// `single` (both caches in the same state): every logits row within rel_tol · max|logit|.
void require_batch_equals_single_runs(GpuRun& batched, GpuRun& single, std::span<const SequenceChunk> batch,
                                      size_t expected_rows, size_t vocab, double rel_tol) {
  std::vector<float> got;
  const size_t total = batched.backend->forward(batch, got);
  REQUIRE(total == expected_rows);
  size_t row = 0;
  for (const SequenceChunk& c : batch) {
    std::vector<float> ref;
    const size_t rows = single.backend->forward(std::span<const SequenceChunk>(&c, 1), ref);
    for (size_t r = 0; r < rows; ++r, ++row) {
      const auto [diff, mag] = row_diff(&got[row * vocab], &ref[r * vocab], vocab);
      INFO("sequence " << c.seq_id << " row " << r << " max|Δ| " << diff);
      REQUIRE(diff <= rel_tol * mag);
    }
  }
  REQUIRE(row == total);
}

}  // namespace

TEST_CASE("cuda backend logits and greedy tokens match the cpu backend on every fixture model",
          "[gpu][backend]") {
  const auto dirs = model_dirs();
  REQUIRE(dirs.size() >= 6);
  for (const fs::path& dir : dirs) {
    INFO("model " << dir.string());
    const Model model = Model::load(dir);
    const size_t vocab = static_cast<size_t>(model.config.vocab_size);
    CpuRef cpu(model);
    GpuRun gpu(model);
    const auto prompts = prompts_for(dir, model.config.vocab_size);
    int seq = 0;
    double worst_prompt = 0, worst_decode = 0;  // max |Δ| / max |logit|, printed for RESULTS
    for (const std::vector<int>& ids : prompts) {
      INFO("prompt of " << ids.size() << " tokens");
      // Prefill, logits of every position.
      std::vector<float> a, b;
      worst_prompt = std::max(worst_prompt, prefill_both(cpu, gpu, seq, ids, a, b));

      // Greedy decode, 32 tokens, each side on its own choices.
      std::vector<float> la(a.end() - static_cast<std::ptrdiff_t>(vocab), a.end());
      std::vector<float> lb(b.end() - static_cast<std::ptrdiff_t>(vocab), b.end());
      for (int step = 0; step < 32; ++step) {
        const int ta = argmax(la.data(), vocab), tb = argmax(lb.data(), vocab);
        if (ta != tb) {
          const auto [diff, mag] = row_diff(lb.data(), la.data(), vocab);
          const float margin = la[static_cast<size_t>(ta)] - la[static_cast<size_t>(tb)];
          INFO("step " << step << ": cpu " << ta << ", gpu " << tb << ", cpu margin " << margin << ", max|Δ| " << diff);
          REQUIRE(margin <= kLogitsRelTol * mag);
          WARN("near tie at greedy step " << step << " (margin " << margin << "): comparison stops there");
          break;
        }
        const auto [diff, mag] = row_diff(lb.data(), la.data(), vocab);
        INFO("step " << step << " max|Δ| " << diff << " max|logit| " << mag);
        REQUIRE(diff <= kLogitsRelTol * mag);
        if (mag > 0) worst_decode = std::max(worst_decode, static_cast<double>(diff / mag));
        if (step + 1 == 32) break;
        cpu.engine.decode(std::span<const int>(&seq, 1), std::span<const int>(&ta, 1), la);
        gpu.engine.decode(std::span<const int>(&seq, 1), std::span<const int>(&tb, 1), lb);
      }
      cpu.engine.remove_sequence(seq);
      gpu.engine.remove_sequence(seq);
      ++seq;
    }
    std::printf("%s: worst max|Δ|/max|logit| %.4f over prompts, %.4f over greedy steps\n",
                dir.filename().string().c_str(), worst_prompt, worst_decode);
  }
}

TEST_CASE("cuda backend: chunked prefill equals whole prefill, mixed batches equal single runs", "[gpu][backend]") {
  const fs::path dir = test::fixtures_dir() / "models" / "tiny-qwen3";
  const Model model = Model::load(dir);
  const size_t vocab = static_cast<size_t>(model.config.vocab_size);
  std::vector<int> ids;
  for (int i = 0; i < 45; ++i) ids.push_back((i * 37 + 11) % model.config.vocab_size);

  // Chunks of 7 attend to a paged past through the prefill kernel; the whole prompt is one
  // chunk. Same kernels, other GEMM shapes and tile boundaries: fp32 order only, except
  // where a bf16 rounding flips, hence 1e-3 relative.
  GpuRun whole(model), chunked(model, 7);
  std::vector<float> a, b;
  whole.engine.add_sequence(0, 64);
  chunked.engine.add_sequence(0, 64);
  whole.engine.prefill(0, ids, a, true);
  chunked.engine.prefill(0, ids, b, true);
  for (size_t r = 0; r < ids.size(); ++r) {
    const auto [diff, mag] = row_diff(&b[r * vocab], &a[r * vocab], vocab);
    INFO("position " << r << " max|Δ| " << diff);
    REQUIRE(diff <= 1e-3 * mag);
  }

  // One forward holding a prefill chunk and two decode tokens vs each alone.
  GpuRun batched(model), single(model);
  const std::vector<std::vector<int>> prompts{{5, 6, 7}, {100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100,
                                                          1200, 1300, 1400, 1500, 1600, 1700}};
  std::vector<float> logits;
  for (int s = 0; s < 2; ++s) {
    for (GpuRun* g : {&batched, &single}) {
      g->engine.add_sequence(s, 64);
      g->engine.prefill(s, prompts[static_cast<size_t>(s)], logits);
    }
  }
  const std::vector<int> new_prompt{42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59};
  batched.kv->add_sequence(2, 64);
  single.kv->add_sequence(2, 64);
  const int d0 = 9, d1 = 10;
  const SequenceChunk mixed[] = {
      {0, static_cast<int>(prompts[0].size()), std::span<const int>(&d0, 1), false},
      {2, 0, new_prompt, true},
      {1, static_cast<int>(prompts[1].size()), std::span<const int>(&d1, 1), false},
  };
  require_batch_equals_single_runs(batched, single, mixed, 2 + new_prompt.size(), vocab, 1e-3);
}

TEST_CASE("cuda backend: an append observer sees every token the device stores, as stored", "[gpu][backend]") {
  // A decode node recording a conversation for the vault observes its sequence: host appends
  // (imports) as given, the backend's device-written tokens as the bf16 the device keeps.
  const Model model = Model::load(test::fixtures_dir() / "models" / "tiny-qwen3");
  const KvShape shape = kv_shape(model);
  const size_t row = static_cast<size_t>(shape.num_kv_heads) * static_cast<size_t>(shape.head_dim);
  struct Recorder : KvAppendObserver {
    std::map<int, std::vector<float>> k, v;  // per layer, tokens in order
    std::map<int, int> next;                 // per layer: the position the next append must start at
    size_t row = 0;
    void on_append(int layer, int start_pos, int n_tokens, const float* kp, const float* vp) override {
      REQUIRE(start_pos == next[layer]);
      next[layer] += n_tokens;
      k[layer].insert(k[layer].end(), kp, kp + static_cast<size_t>(n_tokens) * row);
      v[layer].insert(v[layer].end(), vp, vp + static_cast<size_t>(n_tokens) * row);
    }
  } recorder;
  recorder.row = row;
  GpuRun gpu(model, 8);
  gpu.engine.add_sequence(0, 64);
  // Host tokens first (what an import appends), then a prefill in chunks of 8 and two decode steps.
  std::vector<float> hk(3 * row), hv(3 * row);
  for (size_t i = 0; i < hk.size(); ++i) {
    hk[i] = 0.01f * static_cast<float>(i % 97);
    hv[i] = -0.02f * static_cast<float>(i % 89);
  }
  gpu.kv->set_append_observer(0, &recorder);
  for (int l = 0; l < shape.num_layers; ++l) gpu.kv->append(l, 0, 0, 3, hk.data(), hv.data());
  gpu.engine.adopt_sequence(0);
  std::vector<int> ids;
  for (int i = 0; i < 20; ++i) ids.push_back((i * 53 + 7) % model.config.vocab_size);
  std::vector<float> logits;
  gpu.engine.prefill(0, ids, logits);
  const int seq = 0, d[] = {17, 23};
  gpu.engine.decode(std::span<const int>(&seq, 1), std::span<const int>(&d[0], 1), logits);
  gpu.engine.decode(std::span<const int>(&seq, 1), std::span<const int>(&d[1], 1), logits);
  gpu.kv->set_append_observer(0, nullptr);
  const int n = 3 + 20 + 2;
  for (int l = 0; l < shape.num_layers; ++l) {
    INFO("layer " << l);
    REQUIRE(recorder.next[l] == n);
    // The host tokens exactly as given.
    REQUIRE(std::equal(hk.begin(), hk.end(), recorder.k[l].begin()));
    REQUIRE(std::equal(hv.begin(), hv.end(), recorder.v[l].begin()));
    // Every token as the device stores it.
    std::vector<uint16_t> k16(static_cast<size_t>(n) * row), v16(k16.size());
    gpu.kv->copy_exact_tokens(0, l, 0, n, reinterpret_cast<std::byte*>(k16.data()), reinterpret_cast<std::byte*>(v16.data()));
    for (size_t i = 3 * row; i < k16.size(); ++i) {
      REQUIRE(recorder.k[l][i] == bf16_to_f32(k16[i]));
      REQUIRE(recorder.v[l][i] == bf16_to_f32(v16[i]));
    }
  }
}

TEST_CASE("cuda backend rejects a cache of another shape and malformed batches", "[gpu][backend]") {
  const Model model = Model::load(test::fixtures_dir() / "models" / "tiny-llama");
  GpuRun gpu(model);
  ModelConfig other = model.config;
  other.num_layers += 1;
  const auto wrong_kv = make_cuda_kv_cache(other, GpuRun::kv_options(8));
  REQUIRE_THROWS_AS(make_cuda_backend(model, *wrong_kv, GpuRun::backend_options(64)), hack::Error);
  const int token = 1;
  std::vector<float> logits;
  const SequenceChunk c{0, 0, std::span<const int>(&token, 1), false};
  REQUIRE_THROWS_AS(gpu.backend->forward(std::span<const SequenceChunk>(&c, 1), logits), hack::Error);  // unknown seq
  gpu.kv->add_sequence(0, 8);
  const SequenceChunk late{0, 3, std::span<const int>(&token, 1), false};  // start_pos ≠ length
  REQUIRE_THROWS_AS(gpu.backend->forward(std::span<const SequenceChunk>(&late, 1), logits), hack::Error);
  const int bad = model.config.vocab_size;
  const SequenceChunk oob{0, 0, std::span<const int>(&bad, 1), false};
  REQUIRE_THROWS_AS(gpu.backend->forward(std::span<const SequenceChunk>(&oob, 1), logits), hack::Error);
  const SequenceChunk twice[] = {c, c};
  REQUIRE_THROWS_AS(gpu.backend->forward(twice, logits), hack::Error);
  REQUIRE(gpu.backend->forward(std::span<const SequenceChunk>(&c, 1), logits) == 1);
  REQUIRE(logits.size() == static_cast<size_t>(model.config.vocab_size));
}

namespace {

// What a sequence of the device cache holds exactly: tokens [0, n) of every layer as f32
// [n][kv_heads][head_dim] K and V, read back from its bf16 pages through kv_row.
void read_device_tokens(const CudaPagedKvCache& kv, int seq, int layer, int n, std::vector<float>& k,
                        std::vector<float>& v) {
  const KvShape& sh = kv.shape();
  const size_t D = static_cast<size_t>(sh.head_dim), H = static_cast<size_t>(sh.num_kv_heads);
  const size_t P = static_cast<size_t>(kv.page_tokens());
  std::vector<uint16_t> page(kv.page_bytes() / sizeof(uint16_t));
  k.assign(static_cast<size_t>(n) * H * D, 0.0f);
  v.assign(k.size(), 0.0f);
  const std::span<const int> table = kv.page_table(seq);
  int loaded = -1;
  for (int pos = 0; pos < n; ++pos) {
    const int row = cuda::kv_row(pos, kv.page_tokens(), kv.sinks());
    const int page_id = table[static_cast<size_t>(row) / P];
    if (page_id != loaded) {
      REQUIRE(cudaMemcpy(page.data(), kv.exact_page(layer, page_id), kv.page_bytes(), cudaMemcpyDeviceToHost) ==
              cudaSuccess);
      loaded = page_id;
    }
    const size_t r = static_cast<size_t>(row) % P;
    for (size_t h = 0; h < H; ++h)
      for (size_t d = 0; d < D; ++d) {
        k[(static_cast<size_t>(pos) * H + h) * D + d] = bf16_to_f32(page[(h * P + r) * D + d]);
        v[(static_cast<size_t>(pos) * H + h) * D + d] = bf16_to_f32(page[((H + h) * P + r) * D + d]);
      }
  }
}

// Every HACK page the device closed for `seq` equals, byte for byte, the page the CPU cache
// writes for the same exact tokens (the device's own bf16 K/V, appended to a CPU cache with
// the same options): sinks offset, block strides, first token, header and layer all agree.
void require_device_pages_equal_cpu(const CudaPagedKvCache& kv, int seq, const KvCacheOptions& options) {
  const KvShape& sh = kv.shape();
  const int length = kv.length(seq, 0), closed = kv.closed_blocks(seq);
  auto cpu = make_paged_kv_cache(sh, options);
  cpu->add_sequence(0, length);
  cpu->begin_prefill(0);
  std::vector<float> k, v;
  for (int l = 0; l < sh.num_layers; ++l) {
    read_device_tokens(kv, seq, l, length, k, v);
    cpu->append(l, 0, 0, length, k.data(), v.data());
  }
  cpu->end_prefill(0);
  std::vector<std::byte> page;
  for (int l = 0; l < sh.num_layers; ++l) {
    REQUIRE(cpu->hack_page_count(0, l) >= closed);
    for (int b = 0; b < closed; ++b) {
      const std::span<const std::byte> want = cpu->hack_page(0, l, b);
      page.resize(want.size());
      REQUIRE(cudaMemcpy(page.data(), kv.hack_page(l, kv.hack_page_table(seq)[static_cast<size_t>(b)]), page.size(),
                         cudaMemcpyDeviceToHost) == cudaSuccess);
      INFO("layer " << l << " block " << b);
      REQUIRE(std::equal(page.begin(), page.end(), want.begin()));
    }
  }
}

}  // namespace

// --kv hack on the device against the CPU HACK cache (bf16 weights, bf16 GEMM inputs, as
// above). Three checks:
// - Page bytes, exactly: after the prompt and after every step that closes a block, each
//   HACK page on the device equals the page the CPU quantizer writes from the device's own
//   bf16 K/V (sinks offset, block strides, first token, header, layer).
// - The prompt's logits keep the fp tolerance: nothing is quantized inside a prefill.
// - Greedy decode over the pages: K/V/q differ by the GEMMs' rounding, and where a value
//   sits on a code boundary its code flips, which moves a score by a whole code step. How
//   far that goes was measured on the CPU alone (2026-11-26), with f32 against bf16-rounded
//   weights of the same fixture models, greedy to the first divergence: worst max|Δ| /
//   max|logit| 0.029 with fp KV, 0.045 with k8v8, 0.155 with k4v4, 0.258 with k2v2. The H100
//   (2026-11-26) then showed worst drifts of 0.028–0.045 with k8v8 and 0.025–0.220 with k2v2
//   against the CPU cache, the same as the CPU alone. So k8v8 gets 8e-2 (the worst seen
//   ×1.8; it checks the decode wiring: a wrong page, count or offset moves logits by O(1))
//   and k2v2 3e-1 (its pages are checked exactly).
TEST_CASE("cuda backend --kv hack: device pages equal the cpu quantizer's, logits and greedy tokens match the cpu "
          "hack cache",
          "[gpu][backend][hack]") {
  struct Config {
    int k_bits, v_bits;
    double decode_tol;
    int recent = 0;               // --hack-recent: exact blocks behind the open one
    bool plan_attention = false;  // --cuda-attention plan (a recent window needs it)
  };
  for (const Config& config : {Config{8, 8, 8e-2}, Config{2, 2, 3e-1}, Config{8, 8, 8e-2, 16, true},
                               Config{4, 4, 2e-1, 32, true}}) {
    KvCacheOptions options = hack_options(config.k_bits, config.v_bits);
    options.recent_tokens = config.recent;
    for (const fs::path& dir : model_dirs()) {
      INFO("model " << dir.string() << " k" << config.k_bits << "v" << config.v_bits << " recent " << config.recent
                    << (config.plan_attention ? " plan" : " kernels"));
      const Model model = Model::load(dir);
      const size_t vocab = static_cast<size_t>(model.config.vocab_size);
      CpuRef cpu(model, 512, options);
      GpuRun gpu(model, 512, 256, options, config.plan_attention);
      REQUIRE(gpu.kv->name() == "hack-k" + std::to_string(config.k_bits) + "v" + std::to_string(config.v_bits) + "-cuda");
      int seq = 0, pages_checked = 0;
      double worst_prompt = 0, worst_decode = 0;
      for (const std::vector<int>& ids : prompts_for(dir, model.config.vocab_size)) {
        INFO("prompt of " << ids.size() << " tokens");
        std::vector<float> a, b;
        worst_prompt = std::max(worst_prompt, prefill_both(cpu, gpu, seq, ids, a, b));
        int closed = gpu.kv->closed_blocks(seq);
        // Every full block, or with a recent window those that have left it, as on the CPU.
        REQUIRE(closed == cpu.kv->hack_page_count(seq, 0));
        if (config.recent == 0) REQUIRE(closed == gpu.kv->full_blocks(static_cast<int>(ids.size())));
        require_device_pages_equal_cpu(*gpu.kv, seq, options);
        pages_checked += closed;
        std::vector<float> la(a.end() - static_cast<std::ptrdiff_t>(vocab), a.end());
        std::vector<float> lb(b.end() - static_cast<std::ptrdiff_t>(vocab), b.end());
        for (int step = 0; step < 32; ++step) {
          const int ta = argmax(la.data(), vocab), tb = argmax(lb.data(), vocab);
          const auto [diff, mag] = row_diff(lb.data(), la.data(), vocab);
          if (ta != tb) {
            const float margin = la[static_cast<size_t>(ta)] - la[static_cast<size_t>(tb)];
            INFO("step " << step << ": cpu " << ta << ", gpu " << tb << ", cpu margin " << margin << ", max|Δ| "
                         << diff);
            REQUIRE(margin <= config.decode_tol * mag);
            WARN("near tie at greedy step " << step << " (margin " << margin << "): comparison stops there");
            break;
          }
          INFO("step " << step << " max|Δ| " << diff << " max|logit| " << mag);
          REQUIRE(diff <= config.decode_tol * mag);
          if (mag > 0) worst_decode = std::max(worst_decode, static_cast<double>(diff / mag));
          if (step + 1 == 32) break;
          cpu.engine.decode(std::span<const int>(&seq, 1), std::span<const int>(&ta, 1), la);
          gpu.engine.decode(std::span<const int>(&seq, 1), std::span<const int>(&tb, 1), lb);
          if (gpu.kv->closed_blocks(seq) != closed) {
            closed = gpu.kv->closed_blocks(seq);
            INFO("after greedy step " << step);
            require_device_pages_equal_cpu(*gpu.kv, seq, options);
            ++pages_checked;
          }
        }
        cpu.engine.remove_sequence(seq);
        gpu.engine.remove_sequence(seq);
        ++seq;
      }
      CHECK(pages_checked > 0);
      std::printf("hack k%dv%d %s: worst max|Δ|/max|logit| %.4f over prompts, %.4f over greedy steps\n", config.k_bits,
                  config.v_bits, dir.filename().string().c_str(), worst_prompt, worst_decode);
    }
  }
}

TEST_CASE("cuda backend --kv hack: a mixed batch equals single runs; what the device cannot run is refused",
          "[gpu][backend][hack][hack-batch]") {
  const Model model = Model::load(test::fixtures_dir() / "models" / "tiny-qwen3");
  const size_t vocab = static_cast<size_t>(model.config.vocab_size);
  const KvCacheOptions options = hack_options();
  GpuRun batched(model, 512, 256, options), single(model, 512, 256, options);
  // Two prompts with the same number of closed blocks (2 of Π = 16 past 4 sinks), so the
  // decode plan (pages per split) is the same alone and together.
  std::vector<std::vector<int>> prompts(2);
  for (int i = 0; i < 40; ++i) prompts[0].push_back((i * 31 + 7) % model.config.vocab_size);
  for (int i = 0; i < 45; ++i) prompts[1].push_back((i * 53 + 3) % model.config.vocab_size);
  std::vector<float> logits;
  for (int s = 0; s < 2; ++s)
    for (GpuRun* g : {&batched, &single}) {
      g->engine.add_sequence(s, 96);
      g->engine.prefill(s, prompts[static_cast<size_t>(s)], logits);
    }
  const std::vector<int> new_prompt{42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59};
  for (GpuRun* g : {&batched, &single}) {
    g->kv->add_sequence(2, 64);
    g->kv->begin_prefill(2);
  }
  const int d0 = 9, d1 = 10;
  // The prefill chunk first: decode rows 1 and 19 are not rows 0 .. n − 1 (the gather path).
  const SequenceChunk mixed[] = {
      {2, 0, new_prompt, true},
      {0, static_cast<int>(prompts[0].size()), std::span<const int>(&d0, 1), false},
      {1, static_cast<int>(prompts[1].size()), std::span<const int>(&d1, 1), false},
  };
  require_batch_equals_single_runs(batched, single, mixed, 2 + new_prompt.size(), vocab, 5e-3);
  // A prompt chunk over a quantized past (sequence 0 has closed blocks) is refused, and so
  // are the options the device has no kernel for.
  const int more[] = {1, 2};
  const SequenceChunk late{0, static_cast<int>(prompts[0].size()) + 1, more, false};
  REQUIRE_THROWS_WITH(batched.backend->forward(std::span<const SequenceChunk>(&late, 1), logits),
                      Catch::Contains("quantized past"));
  // A recent window keeps exact blocks behind the open one: the plan runner attends to them,
  // the kernels path's HACK decode does not, so it asks for --cuda-attention plan.
  KvCacheOptions recent = options;
  recent.recent_tokens = 16;
  const auto recent_kv = make_cuda_kv_cache(model.config, GpuRun::kv_options(8, recent));
  REQUIRE_THROWS_WITH(make_cuda_backend(model, *recent_kv, GpuRun::backend_options(64)),
                      Catch::Contains("--cuda-attention plan"));
  REQUIRE_NOTHROW(make_cuda_backend(model, *recent_kv, GpuRun::backend_options(64, true)));
  KvCacheOptions select = options;
  select.select.ratio = 0.5;
  REQUIRE_THROWS_WITH(make_cuda_kv_cache(model.config, GpuRun::kv_options(8, select)), Catch::Contains("--kv-select"));
}

TEST_CASE("cuda backend: the activation observer shows the cpu backend's q, k and v; static eviction prunes a "
          "prompt on the device as on the cpu",
          "[gpu][backend][keep]") {
  const Model model = Model::load(test::fixtures_dir() / "models" / "tiny-qwen3");
  const ModelConfig& cfg = model.config;
  CpuRef cpu(model);
  GpuRun gpu(model);
  // What each backend showed: per layer, the rows of q, k and v.
  struct Seen {
    std::map<int, std::vector<float>> q, k, v;
    std::map<int, size_t> rows;
    ActivationObserverFn fn(const ModelConfig& c) {
      return [this, &c](int layer, size_t n, const float* qp, const float* kp, const float* vp) {
        rows[layer] = n;
        q[layer].assign(qp, qp + n * static_cast<size_t>(c.q_dim()));
        k[layer].assign(kp, kp + n * static_cast<size_t>(c.kv_dim()));
        v[layer].assign(vp, vp + n * static_cast<size_t>(c.kv_dim()));
      };
    }
  } on_cpu, on_gpu;
  cpu.backend->set_activation_observer(on_cpu.fn(cfg));
  gpu.backend->set_activation_observer(on_gpu.fn(cfg));
  std::vector<int> ids;
  for (int i = 0; i < 37; ++i) ids.push_back((i * 61 + 5) % cfg.vocab_size);
  std::vector<float> a, b;
  cpu.engine.add_sequence(0, 64);
  gpu.engine.add_sequence(0, 64);
  cpu.engine.prefill(0, ids, a);
  gpu.engine.prefill(0, ids, b);
  cpu.backend->set_activation_observer({});
  gpu.backend->set_activation_observer({});
  for (int l = 0; l < cfg.num_layers; ++l) {
    INFO("layer " << l);
    REQUIRE(on_gpu.rows[l] == ids.size());
    for (auto [got, want] : {std::pair{&on_gpu.q[l], &on_cpu.q[l]}, std::pair{&on_gpu.k[l], &on_cpu.k[l]},
                             std::pair{&on_gpu.v[l], &on_cpu.v[l]}}) {
      REQUIRE(got->size() == want->size());
      const auto [diff, mag] = row_diff(got->data(), want->data(), got->size());
      INFO("max|Δ| " << diff << " max|x| " << mag);
      REQUIRE(diff <= kLogitsRelTol * mag);
    }
  }

  // Static eviction (--kv-keep-ratio 0.5, one kept set for the model) of a 120-token prompt:
  // both devices keep the budget in every layer, new tokens take positions after the whole
  // prompt, and decode goes on with the cpu's logits (the same kept set: a differing one
  // would move them by O(1)).
  EngineOptions eo{512};
  eo.keep.ratio = 0.5f;
  eo.keep.recent = 8;
  eo.keep.scope = KeepScope::model;
  Engine cpu_keep(*cpu.backend, eo), gpu_keep(*gpu.backend, eo);
  std::vector<int> prompt;
  for (int i = 0; i < 120; ++i) prompt.push_back((i * 89 + 11) % cfg.vocab_size);
  constexpr int kSeq = 5;
  cpu_keep.add_sequence(kSeq, 160);
  gpu_keep.add_sequence(kSeq, 160);
  cpu_keep.prefill(kSeq, prompt, a);
  gpu_keep.prefill(kSeq, prompt, b);
  const int budget = eo.keep.budget(static_cast<int>(prompt.size()));
  REQUIRE(budget < static_cast<int>(prompt.size()));
  for (int l = 0; l < cfg.num_layers; ++l) {
    REQUIRE(cpu.kv->length(kSeq, l) == budget);
    REQUIRE(gpu.kv->length(kSeq, l) == budget);
  }
  REQUIRE(gpu_keep.position(kSeq) == static_cast<int>(prompt.size()));
  const size_t vocab = static_cast<size_t>(cfg.vocab_size);
  {
    const auto [diff, mag] = row_diff(b.data(), a.data(), vocab);
    REQUIRE(diff <= kLogitsRelTol * mag);
  }
  int token = argmax(a.data(), vocab);
  for (int step = 0; step < 4; ++step) {
    cpu_keep.decode(std::span<const int>(&kSeq, 1), std::span<const int>(&token, 1), a);
    gpu_keep.decode(std::span<const int>(&kSeq, 1), std::span<const int>(&token, 1), b);
    const auto [diff, mag] = row_diff(b.data(), a.data(), vocab);
    INFO("decode step " << step << " max|Δ| " << diff << " max|logit| " << mag);
    REQUIRE(diff <= kLogitsRelTol * mag);
    token = argmax(a.data(), vocab);
  }
}

TEST_CASE("cuda backend: a batched prefill step (hack-prefill --prefill-batch-jobs) equals one prefill per prompt",
          "[gpu][backend][prefill-batch]") {
  // Engine::prefill_batch puts several whole prompts in one forward: several prefill chunks
  // side by side in the plan. Each prompt's last-token logits must be its own prefill's
  // (other GEMM shapes: 1e-3 relative, as the mixed batch above), on fp and HACK KV, on the
  // kernels path and the plan runner; and decode goes on from the batched KV.
  const Model model = Model::load(test::fixtures_dir() / "models" / "tiny-qwen3");
  const size_t vocab = static_cast<size_t>(model.config.vocab_size);
  const std::vector<std::vector<int>> prompts{{5, 6, 7, 8, 9},
                                              {100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100, 1200, 1300,
                                               1400, 1500, 1600, 1700, 1800, 1900, 2000, 2100, 2200, 2300, 2400},
                                              {42}};
  for (const bool hack : {false, true})
    for (const bool plan : {false, true}) {
      INFO((hack ? "--kv hack" : "--kv fp") << (plan ? ", plan runner" : ", kernels"));
      const std::optional<KvCacheOptions> kv = hack ? std::optional(hack_options(4, 4)) : std::nullopt;
      GpuRun batched(model, 512, 256, kv, plan), single(model, 512, 256, kv, plan);
      std::vector<Engine::PrefillItem> items;
      for (int s = 0; s < 3; ++s) {
        batched.engine.add_sequence(s, 64);
        single.engine.add_sequence(s, 64);
        items.push_back({s, prompts[static_cast<size_t>(s)]});
      }
      std::vector<float> got, ref;
      batched.engine.prefill_batch(items, got);
      REQUIRE(got.size() == 3 * vocab);
      for (int s = 0; s < 3; ++s) {
        single.engine.prefill(s, prompts[static_cast<size_t>(s)], ref);
        const auto [diff, mag] = row_diff(&got[static_cast<size_t>(s) * vocab], ref.data(), vocab);
        INFO("prompt " << s << " max|Δ| " << diff);
        REQUIRE(diff <= 1e-3 * mag);
        REQUIRE(batched.kv->length(s, 0) == static_cast<int>(prompts[static_cast<size_t>(s)].size()));
      }
      const std::vector<int> seqs{0, 1, 2}, next{11, 12, 13};
      batched.engine.decode(seqs, next, got);
      single.engine.decode(seqs, next, ref);
      for (size_t r = 0; r < 3; ++r) {
        const auto [diff, mag] = row_diff(&got[r * vocab], &ref[r * vocab], vocab);
        INFO("decode row " << r << " max|Δ| " << diff);
        // HACK: the closed block was quantized from KV that differs in its last bits (the
        // mixed-batch hack test's 5e-3).
        REQUIRE(diff <= (hack ? 5e-3 : 1e-3) * mag);
      }
    }
}
