// Model::synthetic: random weights of a given shape, reproducible from a seed, for
// benchmarks and tests that need a real-sized model without a checkpoint.
//
// Every tensor is cut into chunks of kChunkElems; chunk j of tensor i draws from its own
// xoshiro256** stream seeded by splitmix64(seed, i, j), so the weights depend only on
// (config, seed, dtype) and not on how many threads generate them. Normals come from a
// ziggurat (a few ns a sample; Box-Muller's log + sincos cost ~13 ns, 8 s for Llama 3.2
// 1B's 1.24e9 on two cores).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "hack/core/error.h"
#include "hack/model/weights.h"

namespace hack {

namespace {

constexpr int64_t kChunkElems = int64_t{1} << 20;

uint64_t splitmix64_next(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class Xoshiro256 {
 public:
  Xoshiro256(uint64_t seed, uint64_t tensor, uint64_t chunk) {
    uint64_t sm = seed;
    sm = splitmix64_next(sm) ^ (tensor * 0xd1b54a32d192ed03ull);
    sm = splitmix64_next(sm) ^ (chunk * 0xabc98388fb8fac03ull);
    for (uint64_t& s : s_) s = splitmix64_next(sm);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Standard normal samples by the ziggurat method (Marsaglia & Tsang 2000) with 128 layers:
// one 64-bit draw and a table lookup for ~98.8% of samples, exp/log only on the edges and
// the tail. The layer index (bits 0-6) and the value (bits 11-63) use disjoint bits, which
// avoids the correlation of the original RNOR.
class ZigguratNormal {
 public:
  static const ZigguratNormal& instance() {
    static const ZigguratNormal z;
    return z;
  }

  double sample(Xoshiro256& rng) const {
    for (;;) {
      const uint64_t r = rng.next();
      const size_t i = r & (kLayers - 1);
      const double u = static_cast<double>(static_cast<int64_t>(r) >> 11) * 0x1.0p-52;  // [-1, 1)
      const double x = u * x_[i];
      if (std::fabs(x) < x_[i + 1]) return x;  // inside the layer's rectangle: under the curve
      if (i == 0) return tail(rng, u < 0);
      const double y = f_[i] + uniform(rng) * (f_[i + 1] - f_[i]);
      if (y < std::exp(-0.5 * x * x)) return x;
    }
  }

 private:
  static constexpr size_t kLayers = 128;
  static constexpr double kR = 3.442619855899;         // start of the tail
  static constexpr double kV = 9.91256303526217e-3;    // area of each layer

  // x_[0] > x_[1] = R > ... > x_[128] = 0: layer i spans heights f(x_[i]) .. f(x_[i+1]) and
  // has width x_[i]; layer 0 is the base strip plus the tail beyond R.
  ZigguratNormal() {
    auto f = [](double x) { return std::exp(-0.5 * x * x); };
    x_[0] = kV / f(kR);
    x_[1] = kR;
    for (size_t i = 1; i < kLayers; ++i) {
      const double h = f(x_[i]) + kV / x_[i];
      x_[i + 1] = h < 1.0 ? std::sqrt(-2.0 * std::log(h)) : 0.0;
    }
    x_[kLayers] = 0.0;
    for (size_t i = 0; i <= kLayers; ++i) f_[i] = f(x_[i]);
  }

  static double uniform(Xoshiro256& rng) { return static_cast<double>(rng.next() >> 11) * 0x1.0p-53; }

  static double tail(Xoshiro256& rng, bool negative) {
    double a = 0, b = 0;
    do {
      a = -std::log(1.0 - uniform(rng)) / kR;
      b = -std::log(1.0 - uniform(rng));
    } while (b + b < a * a);
    return negative ? -(kR + a) : kR + a;
  }

  double x_[kLayers + 1];
  double f_[kLayers + 1];
};

// What one tensor is filled with: mean + std * N(0, 1).
struct FillJob {
  Tensor tensor;
  float mean = 0.0f;
  float std = 0.02f;
};

template <class Store>
void fill_range(const FillJob& job, Xoshiro256& rng, int64_t begin, int64_t end, Store store) {
  const ZigguratNormal& normal = ZigguratNormal::instance();
  for (int64_t i = begin; i < end; ++i) {
    store(i, job.mean + job.std * static_cast<float>(normal.sample(rng)));
  }
}

void fill_chunk(const FillJob& job, uint64_t seed, uint64_t tensor_index, int64_t chunk) {
  const int64_t n = job.tensor.numel();
  const int64_t begin = chunk * kChunkElems;
  const int64_t end = std::min(n, begin + kChunkElems);
  Xoshiro256 rng(seed, tensor_index, static_cast<uint64_t>(chunk));
  void* base = job.tensor.raw();
  switch (job.tensor.dtype()) {
    case DType::f32:
      fill_range(job, rng, begin, end, [base](int64_t i, float v) { static_cast<float*>(base)[i] = v; });
      break;
    case DType::bf16:
      fill_range(job, rng, begin, end, [base](int64_t i, float v) { static_cast<uint16_t*>(base)[i] = f32_to_bf16(v); });
      break;
    case DType::f16:
      fill_range(job, rng, begin, end, [base](int64_t i, float v) { static_cast<uint16_t*>(base)[i] = f32_to_f16(v); });
      break;
    default: fail("synthetic model: cannot fill a {} tensor", dtype_name(job.tensor.dtype()));
  }
}

void fill_all(const std::vector<FillJob>& jobs, uint64_t seed) {
  struct Work {
    uint32_t job;
    int64_t chunk;
  };
  std::vector<Work> work;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int64_t chunks = (jobs[j].tensor.numel() + kChunkElems - 1) / kChunkElems;
    for (int64_t c = 0; c < chunks; ++c) work.push_back({static_cast<uint32_t>(j), c});
  }
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t w = next.fetch_add(1); w < work.size(); w = next.fetch_add(1)) {
      fill_chunk(jobs[work[w].job], seed, work[w].job, work[w].chunk);
    }
  };
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t n_threads = std::min({hw, size_t{16}, std::max<size_t>(1, work.size())});
  std::vector<std::jthread> threads;
  for (size_t t = 1; t < n_threads; ++t) threads.emplace_back(worker);
  worker();
}

void check_synthetic_config(const ModelConfig& c) {
  HACK_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_layers > 0 &&
                 c.num_heads > 0 && c.num_kv_heads > 0 && c.head_dim > 0,
             "synthetic model: every size must be > 0 (vocab {}, hidden {}, intermediate {}, layers {}, heads {}, "
             "kv heads {}, head_dim {})",
             c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim);
  HACK_CHECK(c.num_heads % c.num_kv_heads == 0, "synthetic model: num_kv_heads {} must divide num_heads {}",
             c.num_kv_heads, c.num_heads);
}

}  // namespace

Model Model::synthetic(const ModelConfig& config, uint64_t seed, DType dtype) {
  HACK_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16,
             "synthetic model: dtype must be f32, f16 or bf16, got {}", dtype_name(dtype));
  check_synthetic_config(config);
  Model m;
  m.config = config;
  m.config.torch_dtype = dtype;
  const ModelConfig& c = m.config;
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), ffn = c.intermediate_size, hd = c.head_dim;

  // GPT-2 style init: 0.02 everywhere, residual-stream outputs (o, down) scaled by
  // 1/sqrt(2 * layers) so the residual's variance does not grow with depth.
  constexpr float kStd = 0.02f;
  const float out_std = kStd / std::sqrt(2.0f * static_cast<float>(c.num_layers));
  constexpr float kNormNoise = 0.05f;  // norms 1 ± noise, so a mis-indexed norm shows up in tests
  std::vector<FillJob> jobs;
  auto matrix = [&](int64_t rows, int64_t cols, float std) {
    Tensor t = Tensor::empty(dtype, {rows, cols});
    jobs.push_back({t, 0.0f, std});
    return t;
  };
  auto vector = [&](int64_t n, float mean, float std) {
    Tensor t = Tensor::empty(DType::f32, {n});
    jobs.push_back({t, mean, std});
    return t;
  };

  m.weights.embed = matrix(c.vocab_size, h, kStd);
  m.weights.layers.resize(static_cast<size_t>(c.num_layers));
  for (LayerWeights& l : m.weights.layers) {
    l.attn_norm = vector(h, 1.0f, kNormNoise);
    l.wq = matrix(q, h, kStd);
    l.wk = matrix(kv, h, kStd);
    l.wv = matrix(kv, h, kStd);
    l.wo = matrix(h, q, out_std);
    if (c.attention_bias) {
      l.bq = vector(q, 0.0f, kStd);
      l.bk = vector(kv, 0.0f, kStd);
      l.bv = vector(kv, 0.0f, kStd);
    }
    if (c.attention_out_bias) l.bo = vector(h, 0.0f, kStd);
    if (c.qk_norm) {
      l.q_norm = vector(hd, 1.0f, kNormNoise);
      l.k_norm = vector(hd, 1.0f, kNormNoise);
    }
    l.ffn_norm = vector(h, 1.0f, kNormNoise);
    l.w_gate = matrix(ffn, h, kStd);
    l.w_up = matrix(ffn, h, kStd);
    l.w_down = matrix(h, ffn, out_std);
  }
  m.weights.final_norm = vector(h, 1.0f, kNormNoise);
  m.weights.lm_head = c.tie_word_embeddings ? m.weights.embed : matrix(c.vocab_size, h, kStd);
  fill_all(jobs, seed);
  return m;
}

}  // namespace hack
