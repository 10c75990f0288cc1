// FDC calibration (calibrate/fdc_calibrate.h) on a small synthetic model. The bases are
// checked against the definition, from rows this test captures itself: R diagonalises the
// stacked Q/K rows (each block at unit Frobenius norm) with the artifact's singular values
// squared on the diagonal, U likewise for W_V (weights) or the V rows (whitened). Then:
// the same seed gives the same artifact bit for bit (whatever the thread count), r = 0 keeps
// every dim and scores as the fp32 reference, and the rate search keeps its KL target.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <random>

#include "hack/backend/cpu_engine.h"
#include "hack/backend/engine.h"
#include "hack/calibrate/fdc_calibrate.h"
#include "hack/core/thread_pool.h"
#include "hack/model/weights.h"
#include "support/synthetic_model.h"

using namespace hack;
using Catch::Contains;

namespace {

// Every layer's observed rows, as the backend shows them.
struct Captured {
  std::vector<std::vector<float>> q, k, v;  // [layer][rows · dim]
};

Captured capture(const Model& model, ThreadPool& pool, const std::vector<std::vector<int>>& sequences, int chunk) {
  const ModelConfig& c = model.config;
  Captured out;
  out.q.resize(static_cast<size_t>(c.num_layers));
  out.k.resize(static_cast<size_t>(c.num_layers));
  out.v.resize(static_cast<size_t>(c.num_layers));
  KvCacheOptions fp32;
  fp32.mode = KvMode::fp;
  fp32.fp_dtype = DType::f32;
  CpuEngine run = make_cpu_engine(model, pool, fp32, EngineOptions{chunk});
  run.backend->set_activation_observer([&](int layer, size_t rows, const float* q, const float* k, const float* v) {
    const size_t l = static_cast<size_t>(layer);
    out.q[l].insert(out.q[l].end(), q, q + rows * static_cast<size_t>(c.q_dim()));
    out.k[l].insert(out.k[l].end(), k, k + rows * static_cast<size_t>(c.kv_dim()));
    out.v[l].insert(out.v[l].end(), v, v + rows * static_cast<size_t>(c.kv_dim()));
  });
  std::vector<float> logits;
  for (size_t i = 0; i < sequences.size(); ++i) {
    run.engine->add_sequence(static_cast<int>(i), static_cast<int>(sequences[i].size()));
    run.engine->prefill(static_cast<int>(i), sequences[i], logits);
    run.engine->remove_sequence(static_cast<int>(i));
  }
  return out;
}

using Matrix = std::vector<double>;  // [hd][hd]

// Σ x xᵀ·scale over rows of `hd` values at `offset`, `stride` apart.
void add_gram(Matrix& g, const std::vector<float>& rows, size_t stride, size_t offset, size_t hd, double scale) {
  for (size_t r = 0; r + stride <= rows.size(); r += stride)
    for (size_t i = 0; i < hd; ++i)
      for (size_t j = 0; j < hd; ++j) g[i * hd + j] += scale * rows[r + offset + i] * rows[r + offset + j];
}

double frobenius2(const std::vector<float>& rows, size_t stride, size_t offset, size_t hd) {
  double s = 0;
  for (size_t r = 0; r + stride <= rows.size(); r += stride)
    for (size_t i = 0; i < hd; ++i) s += static_cast<double>(rows[r + offset + i]) * rows[r + offset + i];
  return s;
}

// Bᵀ G B == diag(σ²) within tol·σ_0², B orthonormal, each column's largest component positive.
void require_diagonalises(const Matrix& g, const float* basis, const float* singular, size_t hd, double tol) {
  for (size_t i = 0; i < hd; ++i) {
    size_t top = 0;
    for (size_t r = 0; r < hd; ++r)
      if (std::abs(basis[r * hd + i]) > std::abs(basis[top * hd + i])) top = r;
    REQUIRE(basis[top * hd + i] > 0);
    for (size_t j = 0; j < hd; ++j) {
      double bgb = 0, bb = 0;
      for (size_t r = 0; r < hd; ++r) {
        bb += static_cast<double>(basis[r * hd + i]) * basis[r * hd + j];
        for (size_t s = 0; s < hd; ++s) bgb += basis[r * hd + i] * g[r * hd + s] * basis[s * hd + j];
      }
      const double want = i == j ? static_cast<double>(singular[i]) * singular[i] : 0.0;
      INFO("columns " << i << ", " << j << ": BᵀGB " << bgb << " want " << want << ", BᵀB " << bb);
      REQUIRE(std::abs(bgb - want) <= tol * singular[0] * singular[0]);
      REQUIRE(std::abs(bb - (i == j ? 1.0 : 0.0)) <= 1e-5);
    }
    if (i > 0) REQUIRE(singular[i] <= singular[i - 1]);
  }
}

KvCacheOptions fp32_options() {
  KvCacheOptions o;
  o.mode = KvMode::fp;
  o.fp_dtype = DType::f32;
  return o;
}

}  // namespace

TEST_CASE("FDC calibration sequences: BOS-opened, seeded random ids or the text in order", "[calibrate][fdc]") {
  const ModelConfig cfg = test::small_synthetic_config();  // BOS 1, vocab 512, 4096 positions
  const auto a = fdc_calibration_sequences(cfg, 1000, 300, 7);
  REQUIRE(a.size() == 4);
  REQUIRE(a[0].size() == 300);
  REQUIRE(a[2].size() == 300);
  REQUIRE(a[3].size() == 100);
  std::mt19937_64 rng(7);  // the documented generator: ids = rng() mod vocab after the BOS
  for (const auto& s : a) {
    REQUIRE(s[0] == 1);
    for (size_t i = 1; i < s.size(); ++i) REQUIRE(s[i] == static_cast<int>(rng() % 512));
  }
  REQUIRE(fdc_calibration_sequences(cfg, 1000, 300, 7) == a);
  REQUIRE(fdc_calibration_sequences(cfg, 1000, 300, 8) != a);

  std::vector<int> text(2000);
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<int>(i % 500) + 3;
  const auto t = fdc_calibration_sequences(cfg, 600, 300, 7, text);
  REQUIRE(t.size() == 2);
  REQUIRE(t[0][0] == 1);
  REQUIRE(t[0][1] == 3);
  REQUIRE(t[0][299] == 301);
  REQUIRE(t[1][0] == 1);
  REQUIRE(t[1][1] == 302);  // continues where the first stopped
  REQUIRE_THROWS_WITH(fdc_calibration_sequences(cfg, 3000, 300, 7, text), Contains("text has 2000 tokens"));
  REQUIRE_THROWS_WITH(fdc_calibration_sequences(cfg, 8192, 8192, 7), Contains("4096 positions"));
}

TEST_CASE("FDC bases are the singular vectors of the stacked rows they were calibrated on", "[calibrate][fdc]") {
  const ModelConfig cfg = test::small_synthetic_config();  // 3 layers, 4 query / 2 KV heads, head_dim 32
  const Model model = Model::synthetic(cfg, 7);
  ThreadPool pool(2);
  const auto sequences = fdc_calibration_sequences(cfg, 600, 256, 3);
  const std::string method = GENERATE("weights", "whitened");
  INFO("v_method " << method);
  FdcCalibrationOptions options;
  options.v_method = method;
  options.prefill_chunk_tokens = 100;  // several chunks per sequence
  const FdcArtifact a = calibrate_fdc(model, pool, sequences, options);
  REQUIRE(a.model_digest == weights_digest(model));
  REQUIRE(a.v_method == method);
  for (const FdcRanks& r : a.ranks) REQUIRE(r == FdcRanks{32, 32});  // r = 0 keeps every dim
  const nlohmann::json cal = nlohmann::json::parse(a.calibration_json);
  REQUIRE(cal["tokens"] == 600);
  REQUIRE(cal["sequences"] == 3);
  REQUIRE(cal["max_position"] == 255);

  const Captured rows = capture(model, pool, sequences, 77);
  const size_t hd = 32, qd = 128, kvd = 64, H = 128;
  for (int l = 0; l < cfg.num_layers; ++l) {
    for (int h = 0; h < cfg.num_kv_heads; ++h) {
      INFO("layer " << l << " KV head " << h);
      const size_t L = static_cast<size_t>(l), kh = static_cast<size_t>(h);
      double q2 = 0;
      for (size_t qh = 2 * kh; qh < 2 * kh + 2; ++qh) q2 += frobenius2(rows.q[L], qd, qh * hd, hd);
      const double k2 = frobenius2(rows.k[L], kvd, kh * hd, hd);
      Matrix qk(hd * hd, 0.0);
      for (size_t qh = 2 * kh; qh < 2 * kh + 2; ++qh) add_gram(qk, rows.q[L], qd, qh * hd, hd, 1 / q2);
      add_gram(qk, rows.k[L], kvd, kh * hd, hd, 1 / k2);
      // f32 basis of a double eigensolve: 1e-5 of the top eigenvalue.
      require_diagonalises(qk, a.qk(l, h), &a.qk_singular[(L * 2 + kh) * hd], hd, 1e-5);

      Matrix v(hd * hd, 0.0);
      if (method == "whitened") {
        add_gram(v, rows.v[L], kvd, kh * hd, hd, 1.0);
      } else {
        std::vector<float> w(static_cast<size_t>(model.weights.layers[L].wv.numel()));
        convert_to_f32(model.weights.layers[L].wv.dtype(), model.weights.layers[L].wv.raw(), w.data(), w.size());
        for (size_t i = 0; i < hd; ++i)
          for (size_t j = 0; j < hd; ++j)
            for (size_t x = 0; x < H; ++x) v[i * hd + j] += static_cast<double>(w[(kh * hd + i) * H + x]) * w[(kh * hd + j) * H + x];
      }
      require_diagonalises(v, a.v(l, h), &a.v_singular[(L * 2 + kh) * hd], hd, 1e-5);
    }
  }
}

TEST_CASE("FDC calibration is deterministic for a seed, whatever the thread count", "[calibrate][fdc]") {
  const ModelConfig cfg = test::small_synthetic_config();
  const Model model = Model::synthetic(cfg, 7);
  ThreadPool one(1), two(2);
  FdcCalibrationOptions options;
  options.v_method = "whitened";
  options.removal_rate = 0.2;
  const FdcArtifact a = calibrate_fdc(model, one, fdc_calibration_sequences(cfg, 400, 200, 5), options);
  const FdcArtifact b = calibrate_fdc(model, two, fdc_calibration_sequences(cfg, 400, 200, 5), options);
  REQUIRE(a.qk_basis == b.qk_basis);
  REQUIRE(a.qk_singular == b.qk_singular);
  REQUIRE(a.v_basis == b.v_basis);
  REQUIRE(a.v_singular == b.v_singular);
  REQUIRE(a.ranks == b.ranks);
  REQUIRE(a.removal_rate == 0.2);
  REQUIRE(a.ranks == fdc_ranks_for_rate(a, 0.2));
  const FdcArtifact c = calibrate_fdc(model, two, fdc_calibration_sequences(cfg, 400, 200, 6), options);
  REQUIRE(c.qk_basis != a.qk_basis);

  REQUIRE_THROWS_WITH(calibrate_fdc(apply_fdc(model, a), one, fdc_calibration_sequences(cfg, 400, 200, 5), options),
                      Contains("plain model"));
  options.v_method = "magic";
  REQUIRE_THROWS_WITH(calibrate_fdc(model, one, fdc_calibration_sequences(cfg, 400, 200, 5), options), Contains("magic"));
}

TEST_CASE("FDC at r = 0 scores as the fp32 reference, and the rate search keeps its KL target", "[calibrate][fdc]") {
  const ModelConfig cfg = test::small_synthetic_config();
  const Model model = Model::synthetic(cfg, 7);
  ThreadPool pool(2);
  const FdcArtifact full = calibrate_fdc(model, pool, fdc_calibration_sequences(cfg, 600, 256, 3), {});
  const DecodePathReference reference(model, pool,
                                      {test::random_prompt(80, cfg.vocab_size, 1), test::random_prompt(80, cfg.vocab_size, 2)},
                                      64, 32);
  const KvCacheOptions fp32 = fp32_options();
  REQUIRE(reference.score(fp32, &model).mean_kl == reference.score(fp32).mean_kl);

  // Full rank: exact up to f32 rounding of the fused W_V'/W_O' (KL ~1e-12 measured).
  const DecodePathScore at0 = score_fdc(reference, model, full, fp32);
  REQUIRE(at0.mean_kl == Approx(0).margin(1e-7));
  REQUIRE(at0.top1 == 1.0);
  // Random weights have flat spectra: the lower half of a head's singular values holds ~45 %
  // of the QK sum and ~39 % of V's, so r = 0.47 halves most heads.
  const FdcArtifact cut = fdc_artifact_at_rate(full, 0.47);
  REQUIRE(cut.removal_rate == 0.47);
  REQUIRE(cut.digest.empty());
  bool reduced = false;
  for (const FdcRanks& r : cut.ranks) reduced = reduced || r.d_qk < 32 || r.d_v < 32;
  REQUIRE(reduced);
  const double kl_cut = score_fdc(reference, model, cut, fp32).mean_kl;
  REQUIRE(kl_cut > 1e-5);

  std::vector<std::string> lines;
  auto log = [&](const std::string& s) { lines.push_back(s); };
  SECTION("a target every rate meets takes the largest rate, measured once") {
    FdcRateSearch search;
    search.max_kl = 1e9;
    const FdcRateResult r = search_fdc_rate(reference, model, full, fp32, search, log);
    REQUIRE(r.removal_rate == 0.5);
    REQUIRE(r.measurements == 1);
    REQUIRE(lines.size() == 1);
  }
  SECTION("a target between r = 0 and r = 0.47 is kept") {
    FdcRateSearch search;
    search.max_kl = kl_cut / 2;
    const FdcRateResult r = search_fdc_rate(reference, model, full, fp32, search, log);
    REQUIRE(r.score.mean_kl <= search.max_kl);
    REQUIRE(r.removal_rate < 0.47);
    REQUIRE(r.score.mean_kl == score_fdc(reference, model, fdc_artifact_at_rate(full, r.removal_rate), fp32).mean_kl);
    REQUIRE(r.measurements >= 2);
    REQUIRE(r.measurements <= search.iterations + 2);
    REQUIRE(lines.size() == static_cast<size_t>(r.measurements));
  }
  SECTION("FDC + HACK scores over HACK pages") {
    KvCacheOptions hack;
    hack.block_tokens = 16;
    hack.k_bits = hack.v_bits = 4;
    const DecodePathScore s = score_fdc(reference, model, cut, hack);
    REQUIRE(std::isfinite(s.mean_kl));
    REQUIRE(s.mean_kl > 0);
  }
}
