#include "hack/calibrate/hack_bits.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "hack/backend/cpu_engine.h"
#include "hack/backend/engine.h"
#include "hack/core/error.h"

namespace hack {

namespace {

void log_softmax(std::span<const float> logits, std::vector<float>& out) {
  out.assign(logits.begin(), logits.end());
  const float m = *std::max_element(out.begin(), out.end());
  double s = 0;
  for (float v : out) s += std::exp(static_cast<double>(v - m));
  const float lse = m + static_cast<float>(std::log(s));
  for (float& v : out) v -= lse;
}

}  // namespace

DecodePathReference::DecodePathReference(const Model& model, ThreadPool& pool, std::vector<std::vector<int>> windows,
                                         int prefill_tokens, int prefill_chunk)
    : model_(model), pool_(pool), windows_(std::move(windows)), prefill_tokens_(prefill_tokens), prefill_chunk_(prefill_chunk) {
  HACK_CHECK(!windows_.empty(), "calibration: no windows");
  for (const auto& w : windows_)
    HACK_CHECK(static_cast<int>(w.size()) > prefill_tokens_ + 1 && prefill_tokens_ > 0,
               "calibration: a window of {} tokens leaves nothing to decode after {} prefill tokens", w.size(),
               prefill_tokens_);
  KvCacheOptions fp;
  fp.mode = KvMode::fp;
  fp.fp_dtype = DType::f32;
  size_t n = 0;
  for (const auto& w : windows_) {
    ref_.push_back(run(model_, fp, w));
    for (size_t i = 0; i < ref_.back().size(); ++i) {
      ref_nll_ -= ref_.back()[i][static_cast<size_t>(w[static_cast<size_t>(prefill_tokens_) + i])];
      ++n;
    }
  }
  ref_nll_ /= static_cast<double>(n);
}

// Prefill window[0, P), then decode window[P .. end−1) one token at a time: the log-probs
// predicting window[P], ..., window[end−1] (the first from the prefill's last logits).
std::vector<std::vector<float>> DecodePathReference::run(const Model& model, const KvCacheOptions& options,
                                                         const std::vector<int>& window) const {
  CpuEngine run = make_cpu_engine(model, pool_, options, EngineOptions{prefill_chunk_});
  Engine& engine = *run.engine;
  const int seq = 0;
  engine.add_sequence(seq, static_cast<int>(window.size()));
  const size_t vocab = static_cast<size_t>(model.config.vocab_size);
  std::vector<float> logits;
  engine.prefill(seq, std::span<const int>(window.data(), static_cast<size_t>(prefill_tokens_)), logits);
  std::vector<std::vector<float>> out;
  for (size_t t = static_cast<size_t>(prefill_tokens_);; ++t) {
    out.emplace_back();
    log_softmax(std::span<const float>(logits.data(), vocab), out.back());
    if (t + 1 >= window.size()) break;
    engine.decode(std::span<const int>(&seq, 1), std::span<const int>(&window[t], 1), logits);
  }
  return out;
}

DecodePathScore DecodePathReference::score(const KvCacheOptions& options, const Model* model) const {
  DecodePathScore s;
  for (size_t w = 0; w < windows_.size(); ++w) {
    const auto got = run(model ? *model : model_, options, windows_[w]);
    for (size_t i = 0; i < got.size(); ++i) {
      const std::vector<float>& p = ref_[w][i];
      const std::vector<float>& q = got[i];
      double kl = 0;
      size_t ap = 0, aq = 0;
      for (size_t v = 0; v < p.size(); ++v) {
        kl += std::exp(static_cast<double>(p[v])) * (static_cast<double>(p[v]) - q[v]);
        if (p[v] > p[ap]) ap = v;
        if (q[v] > q[aq]) aq = v;
      }
      s.mean_kl += kl;
      s.top1 += ap == aq;
      s.nll -= q[static_cast<size_t>(windows_[w][static_cast<size_t>(prefill_tokens_) + i])];
      ++s.positions;
    }
  }
  const double n = static_cast<double>(s.positions);
  s.mean_kl /= n;
  s.top1 /= n;
  s.nll /= n;
  return s;
}

HackBitsResult search_hack_bits(const DecodePathReference& reference, const KvShape& shape,
                                const KvCacheOptions& options, const HackBitsSearch& search,
                                const std::function<void(const std::string&)>& log) {
  const int L = shape.num_layers;
  HackBitsResult r;
  auto with = [&](const std::vector<HackLayerBits>& bits) {
    KvCacheOptions o = options;
    o.mode = KvMode::hack;
    o.layer_bits = bits;
    return o;
  };
  auto fraction = [&](const std::vector<HackLayerBits>& bits) {
    return kv_bytes_per_token(shape, with(bits)) / bf16_kv_bytes_per_token(shape);
  };
  auto measure = [&](const std::vector<HackLayerBits>& bits, const std::string& what) {
    const DecodePathScore s = reference.score(with(bits));
    ++r.measurements;
    log(fmt::format("{:<28} KL {:.5f}  top-1 {:.4f}  ppl Δ {:+.2f} %  bytes {:.1f} % of bf16", what, s.mean_kl, s.top1,
                    100 * (std::exp(s.nll - reference.reference_nll()) - 1), 100 * fraction(bits)));
    return s;
  };
  const std::vector<HackLayerBits> base(static_cast<size_t>(L), search.base);
  HACK_CHECK(fraction(base) <= search.max_bytes_fraction,
             "calibration: the base configuration k{}v{} already needs {:.1f} % of bf16's bytes, over the {:.1f} % budget",
             search.base.k_bits, search.base.v_bits, 100 * fraction(base), 100 * search.max_bytes_fraction);
  r.base_score = measure(base, fmt::format("base k{}v{}", search.base.k_bits, search.base.v_bits));
  r.layer_gain_kl.resize(static_cast<size_t>(L));
  for (int l = 0; l < L; ++l) {
    std::vector<HackLayerBits> bits = base;
    bits[static_cast<size_t>(l)] = search.upgrade;
    r.layer_gain_kl[static_cast<size_t>(l)] =
        r.base_score.mean_kl - measure(bits, fmt::format("layer {} k{}v{}", l, search.upgrade.k_bits, search.upgrade.v_bits)).mean_kl;
  }
  // Equal byte cost per layer (same shapes), so gain per byte ranks as gain.
  r.ranking.resize(static_cast<size_t>(L));
  std::iota(r.ranking.begin(), r.ranking.end(), 0);
  std::stable_sort(r.ranking.begin(), r.ranking.end(), [&](int a, int b) {
    return r.layer_gain_kl[static_cast<size_t>(a)] > r.layer_gain_kl[static_cast<size_t>(b)];
  });
  auto prefix = [&](int n) {
    std::vector<HackLayerBits> bits = base;
    for (int i = 0; i < n; ++i) bits[static_cast<size_t>(r.ranking[static_cast<size_t>(i)])] = search.upgrade;
    return bits;
  };
  int max_n = 0;
  while (max_n < L && fraction(prefix(max_n + 1)) <= search.max_bytes_fraction) ++max_n;
  int chosen = max_n;
  DecodePathScore chosen_score;
  bool scored = false;
  if (search.max_kl > 0) {
    // Shortest prefix within max_kl (KL falls as layers are raised; measured, not assumed).
    int lo = 0, hi = max_n;
    if (r.base_score.mean_kl <= search.max_kl) {
      hi = 0;
      chosen_score = r.base_score;
      scored = true;
    }
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      const DecodePathScore s = measure(prefix(mid), fmt::format("top {} layers raised", mid));
      if (s.mean_kl <= search.max_kl) {
        hi = mid;
        chosen_score = s;
        scored = true;
      } else {
        lo = mid + 1;
      }
    }
    chosen = hi;
  }
  r.upgraded = chosen;
  r.layers = prefix(chosen);
  r.final_score = scored ? chosen_score : measure(r.layers, fmt::format("chosen: top {} layers raised", chosen));
  r.bytes_fraction = fraction(r.layers);
  return r;
}

}  // namespace hack
