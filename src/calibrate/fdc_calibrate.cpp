// FDC calibration (include/hack/calibrate/fdc_calibrate.h): Gram matrices of the captured
// activations, their eigenvectors as the artifact's bases, and the removal-rate search.
#include "hack/calibrate/fdc_calibrate.h"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "hack/backend/cpu_engine.h"
#include "hack/backend/engine.h"
#include "hack/core/error.h"

namespace hack {

namespace {

using Gram = Eigen::MatrixXd;  // [head_dim][head_dim]; only the lower triangle is accumulated
using RowsF = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0,
                         Eigen::OuterStride<>>;

// G += Σ_r x_rᵀ x_r over `rows` rows of head_dim floats, `stride` floats apart.
void add_rows(Gram& g, const float* x, size_t rows, size_t stride) {
  const RowsF m(x, static_cast<Eigen::Index>(rows), g.rows(), Eigen::OuterStride<>(static_cast<Eigen::Index>(stride)));
  const Eigen::MatrixXd d = m.cast<double>();
  g.selfadjointView<Eigen::Lower>().rankUpdate(d.transpose());
}

// Eigenvectors of the symmetric `g` (lower triangle) by descending eigenvalue into basis
// [hd][hd] (column j = vector j, largest-magnitude component positive) and the square roots
// of the eigenvalues (clamped at 0) into singular [hd].
void eigen_basis(const Gram& g, float* basis, float* singular) {
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(g);
  HACK_CHECK(solver.info() == Eigen::Success, "FDC calibration: the eigensolver did not converge");
  const Eigen::Index n = g.rows();
  for (Eigen::Index j = 0; j < n; ++j) {
    const Eigen::Index src = n - 1 - j;  // the solver sorts ascending
    Eigen::VectorXd v = solver.eigenvectors().col(src);
    Eigen::Index top = 0;
    v.cwiseAbs().maxCoeff(&top);
    if (v(top) < 0) v = -v;
    for (Eigen::Index i = 0; i < n; ++i) basis[i * n + j] = static_cast<float>(v(i));
    singular[j] = static_cast<float>(std::sqrt(std::max(solver.eigenvalues()(src), 0.0)));
  }
}

// The Gram matrices of every (layer, KV head), fed by the backend's activation observer.
class GramAccumulator {
 public:
  GramAccumulator(const ModelConfig& c, bool with_v, ThreadPool& pool)
      : cfg_(c), with_v_(with_v), pool_(pool), hd_(static_cast<size_t>(c.head_dim)) {
    const size_t heads = static_cast<size_t>(c.num_layers * c.num_kv_heads);
    const Gram zero = Gram::Zero(c.head_dim, c.head_dim);
    q_.assign(heads, zero);
    k_.assign(heads, zero);
    if (with_v_) v_.assign(heads, zero);
  }

  // q: [rows][num_heads · hd], k, v: [rows][num_kv_heads · hd]. One task per (KV head, Q|K|V),
  // each owning its Gram matrix, so the sums do not depend on the thread count.
  void observe(int layer, size_t rows, const float* q, const float* k, const float* v) {
    const size_t KV = static_cast<size_t>(cfg_.num_kv_heads), group = static_cast<size_t>(cfg_.group_size());
    const size_t qd = static_cast<size_t>(cfg_.q_dim()), kvd = static_cast<size_t>(cfg_.kv_dim());
    const size_t base = static_cast<size_t>(layer) * KV;
    const size_t kinds = with_v_ ? 3 : 2;
    pool_.parallel_for_dynamic(KV * kinds, 1, [&](size_t begin, size_t end) {
      for (size_t t = begin; t < end; ++t) {
        const size_t h = t / kinds, kind = t % kinds;
        if (kind == 0) {
          for (size_t qh = h * group; qh < (h + 1) * group; ++qh) add_rows(q_[base + h], q + qh * hd_, rows, qd);
        } else if (kind == 1) {
          add_rows(k_[base + h], k + h * hd_, rows, kvd);
        } else {
          add_rows(v_[base + h], v + h * hd_, rows, kvd);
        }
      }
    });
  }

  const Gram& q(size_t head) const { return q_[head]; }
  const Gram& k(size_t head) const { return k_[head]; }
  const Gram& v(size_t head) const { return v_[head]; }

 private:
  const ModelConfig& cfg_;
  bool with_v_;
  ThreadPool& pool_;
  size_t hd_;
  std::vector<Gram> q_, k_, v_;  // [layer · num_kv_heads + head]
};

// W_V,h · W_V,hᵀ: rows [h·hd, (h+1)·hd) of wv [kv_dim][hidden], any weight dtype.
Gram weight_gram(const Tensor& wv, size_t h, size_t hd) {
  const size_t H = static_cast<size_t>(wv.dim(1));
  std::vector<float> rows(hd * H);
  convert_to_f32(wv.dtype(), static_cast<const char*>(wv.raw()) + dtype_bytes(wv.dtype(), h * hd * H), rows.data(),
                 rows.size());
  const RowsF m(rows.data(), static_cast<Eigen::Index>(hd), static_cast<Eigen::Index>(H),
                Eigen::OuterStride<>(static_cast<Eigen::Index>(H)));
  const Eigen::MatrixXd d = m.cast<double>();
  return d * d.transpose();
}

}  // namespace

std::vector<std::vector<int>> fdc_calibration_sequences(const ModelConfig& config, int tokens, int seq_len,
                                                        uint64_t seed, std::span<const int> text) {
  HACK_CHECK(tokens > 0 && seq_len > 1, "FDC calibration: {} tokens in sequences of {}: both must be positive, the "
             "sequences longer than 1", tokens, seq_len);
  HACK_CHECK(seq_len <= config.max_position_embeddings,
             "FDC calibration: sequences of {} tokens exceed the model's {} positions", seq_len,
             config.max_position_embeddings);
  const bool bos = config.bos_token_id >= 0;
  const size_t n_seq = static_cast<size_t>((tokens + seq_len - 1) / seq_len);
  if (!text.empty()) {
    const size_t need = static_cast<size_t>(tokens) - (bos ? n_seq : 0);
    HACK_CHECK(text.size() >= need, "FDC calibration: the text has {} tokens, {} calibration tokens need {}", text.size(),
               tokens, need);
  }
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int>> out;
  size_t next = 0;  // into text
  for (int left = tokens; left > 0; left -= seq_len) {
    std::vector<int>& s = out.emplace_back();
    const int len = std::min(left, seq_len);
    if (bos) s.push_back(config.bos_token_id);
    while (static_cast<int>(s.size()) < len)
      s.push_back(text.empty() ? static_cast<int>(rng() % static_cast<uint64_t>(config.vocab_size)) : text[next++]);
  }
  return out;
}

FdcArtifact calibrate_fdc(const Model& model, ThreadPool& pool, const std::vector<std::vector<int>>& sequences,
                          const FdcCalibrationOptions& options) {
  const ModelConfig& c = model.config;
  HACK_CHECK(!model.fdc, "FDC calibration needs the plain model, not one with FDC applied");
  HACK_CHECK(options.v_method == "weights" || options.v_method == "whitened",
             "FDC calibration: v_method must be weights or whitened, got \"{}\"", options.v_method);
  HACK_CHECK(!sequences.empty(), "FDC calibration: no sequences");
  const bool whitened = options.v_method == "whitened";
  GramAccumulator grams(c, whitened, pool);

  KvCacheOptions fp32;
  fp32.mode = KvMode::fp;
  fp32.fp_dtype = DType::f32;
  CpuEngine run = make_cpu_engine(model, pool, fp32, EngineOptions{options.prefill_chunk_tokens});
  run.backend->set_activation_observer(
      [&](int layer, size_t rows, const float* q, const float* k, const float* v) { grams.observe(layer, rows, q, k, v); });
  std::vector<float> logits;
  size_t tokens = 0, longest = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const std::vector<int>& s = sequences[i];
    HACK_CHECK(!s.empty(), "FDC calibration: sequence {} is empty", i);
    const int id = static_cast<int>(i);
    run.engine->add_sequence(id, static_cast<int>(s.size()));
    run.engine->prefill(id, s, logits);
    run.engine->remove_sequence(id);
    tokens += s.size();
    longest = std::max(longest, s.size());
  }
  run.backend->set_activation_observer({});

  FdcArtifact a;
  a.num_layers = c.num_layers;
  a.num_kv_heads = c.num_kv_heads;
  a.head_dim = c.head_dim;
  a.hidden_size = c.hidden_size;
  a.model_digest = weights_digest(model);
  a.v_method = options.v_method;
  const size_t hd = static_cast<size_t>(c.head_dim), heads = static_cast<size_t>(c.num_layers * c.num_kv_heads);
  a.qk_basis.resize(heads * hd * hd);
  a.v_basis.resize(heads * hd * hd);
  a.qk_singular.resize(heads * hd);
  a.v_singular.resize(heads * hd);
  for (size_t h = 0; h < heads; ++h) {
    const size_t layer = h / static_cast<size_t>(c.num_kv_heads), head = h % static_cast<size_t>(c.num_kv_heads);
    const double tq = grams.q(h).trace(), tk = grams.k(h).trace();
    HACK_CHECK(tq > 0 && tk > 0, "FDC calibration: layer {} KV head {} saw no Q or K energy", layer, head);
    // a² G_q + b² G_k: the Q block and the K block at equal Frobenius norm.
    eigen_basis(grams.q(h) / tq + grams.k(h) / tk, &a.qk_basis[h * hd * hd], &a.qk_singular[h * hd]);
    eigen_basis(whitened ? grams.v(h) : weight_gram(model.weights.layers[layer].wv, head, hd), &a.v_basis[h * hd * hd],
                &a.v_singular[h * hd]);
  }
  nlohmann::ordered_json cal;
  cal["tokens"] = tokens;
  cal["sequences"] = sequences.size();
  cal["max_position"] = longest - 1;
  a.calibration_json = cal.dump();
  return fdc_artifact_at_rate(std::move(a), options.removal_rate);
}

FdcArtifact fdc_artifact_at_rate(FdcArtifact artifact, double removal_rate) {
  artifact.ranks = fdc_ranks_for_rate(artifact, removal_rate);
  artifact.removal_rate = removal_rate;
  artifact.digest.clear();
  return artifact;
}

DecodePathScore score_fdc(const DecodePathReference& reference, const Model& base, const FdcArtifact& artifact,
                          const KvCacheOptions& options) {
  const Model fused = apply_fdc(base, artifact);
  return reference.score(options, &fused);
}

FdcRateResult search_fdc_rate(const DecodePathReference& reference, const Model& base, const FdcArtifact& artifact,
                              const KvCacheOptions& options, const FdcRateSearch& search,
                              const std::function<void(const std::string&)>& log) {
  HACK_CHECK(search.max_kl > 0, "FDC rate search: max_kl must be positive, got {}", search.max_kl);
  HACK_CHECK(search.max_rate > 0 && search.max_rate < 1, "FDC rate search: max_rate {} is outside (0, 1)",
             search.max_rate);
  FdcRateResult result;
  // Ranks are multiples of 16, so many rates give the same ranks: each is measured once.
  std::vector<std::pair<std::vector<FdcRanks>, DecodePathScore>> measured;
  const double full_dims = 2.0 * artifact.num_layers * artifact.num_kv_heads * artifact.head_dim;
  auto measure = [&](double r) {
    const FdcArtifact at = fdc_artifact_at_rate(artifact, r);
    const auto seen = std::find_if(measured.begin(), measured.end(), [&](const auto& m) { return m.first == at.ranks; });
    if (seen != measured.end()) return seen->second;
    const DecodePathScore s = score_fdc(reference, base, at, options);
    ++result.measurements;
    double dims = 0;
    for (const FdcRanks& rk : at.ranks) dims += rk.d_qk + rk.d_v;
    log(fmt::format("r {:.4f}: KV dims {:.1f} % of full, KL {:.5f}  top-1 {:.4f}  ppl Δ {:+.2f} %", r,
                    100 * dims / full_dims, s.mean_kl, s.top1, 100 * (std::exp(s.nll - reference.reference_nll()) - 1)));
    measured.emplace_back(at.ranks, s);
    return s;
  };
  double lo = 0, hi = search.max_rate;
  if (measure(hi).mean_kl <= search.max_kl) {
    lo = hi;
  } else {
    for (int i = 0; i < search.iterations; ++i) {
      const double mid = (lo + hi) / 2;
      (measure(mid).mean_kl <= search.max_kl ? lo : hi) = mid;
    }
  }
  result.removal_rate = lo;
  result.score = measure(lo);
  return result;
}

}  // namespace hack
