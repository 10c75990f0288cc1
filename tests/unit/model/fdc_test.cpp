// FDC artifacts and apply_fdc (model/fdc.h): the file round-trips bit-exactly under a
// digest sha256sum agrees with; bad or foreign artifacts are refused naming the file and the
// problem; ranks follow the removal rate (paper Eq. 1, rounded up to 16); and the fused
// W_V'/W_O' give what the unfused formula gives on V projected onto U[:, :d_v] (exactly W_O·V
// at full rank), computed here in double from the original weights.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <random>

#include "hack/core/error.h"
#include "hack/model/fdc.h"
#include "hack/model/safetensors.h"
#include "model_test_util.h"

using namespace hack;
using Catch::Contains;
using json = nlohmann::ordered_json;

namespace {

// Gram–Schmidt of a random normal matrix (double), columns orthonormal; [n][n] row-major.
std::vector<float> random_orthonormal(int n, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  std::vector<double> m(static_cast<size_t>(n * n));
  for (double& x : m) x = normal(rng);
  auto at = [&](int r, int c) -> double& { return m[static_cast<size_t>(r * n + c)]; };
  for (int j = 0; j < n; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int k = 0; k < j; ++k) {
        double dot = 0;
        for (int r = 0; r < n; ++r) dot += at(r, j) * at(r, k);
        for (int r = 0; r < n; ++r) at(r, j) -= dot * at(r, k);
      }
    }
    double norm = 0;
    for (int r = 0; r < n; ++r) norm += at(r, j) * at(r, j);
    for (int r = 0; r < n; ++r) at(r, j) /= std::sqrt(norm);
  }
  return std::vector<float>(m.begin(), m.end());
}

// An artifact for `model` with random orthonormal bases, random descending singular values
// and ranks at r = 0.2.
FdcArtifact random_artifact(const Model& model, uint64_t seed) {
  const ModelConfig& c = model.config;
  std::mt19937_64 rng(seed);
  FdcArtifact a;
  a.num_layers = c.num_layers;
  a.num_kv_heads = c.num_kv_heads;
  a.head_dim = c.head_dim;
  a.hidden_size = c.hidden_size;
  a.model_digest = weights_digest(model);
  a.v_method = "whitened";
  a.calibration_json = R"({"tokens":8192,"seed":3,"source":"random","max_position":2047})";
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int h = 0; h < c.num_layers * c.num_kv_heads; ++h) {
    for (auto* basis : {&a.qk_basis, &a.v_basis}) {
      const std::vector<float> b = random_orthonormal(c.head_dim, rng);
      basis->insert(basis->end(), b.begin(), b.end());
    }
    for (auto* singular : {&a.qk_singular, &a.v_singular}) {
      float s = 10.0f;
      for (int i = 0; i < c.head_dim; ++i) singular->push_back(s *= 0.6f + 0.4f * u(rng));
    }
  }
  a.removal_rate = 0.2;
  a.ranks = fdc_ranks_for_rate(a, a.removal_rate);
  return a;
}

ModelConfig fdc_config(bool bias) {
  ModelConfig c = synthetic_model_config("tiny");  // 2 layers, 4 q heads over 2 KV heads, head_dim 32
  c.attention_bias = bias;
  return c;
}

// sha256sum's hex digest of a file: an implementation independent of the library's.
std::string sha256sum(const std::filesystem::path& path) {
  FILE* p = popen(("sha256sum '" + path.string() + "'").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[65] = {};
  REQUIRE(std::fread(buf, 1, 64, p) == 64);
  pclose(p);
  return std::string(buf, 64);
}

// Rewrites a saved artifact with its "fdc" JSON and tensors edited.
void rewrite(const std::filesystem::path& path, const std::function<void(json&)>& edit_json,
             const std::function<void(const std::string&, std::vector<float>&)>& edit_tensor = {}) {
  const auto file = SafetensorsFile::open(path);
  json j = json::parse(file->metadata().at("fdc"));
  edit_json(j);
  std::vector<std::vector<float>> data;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const SafetensorsEntry& e : file->entries()) {
    const Tensor t = file->tensor(e);
    data.emplace_back(t.data<float>(), t.data<float>() + t.numel());
    if (edit_tensor) edit_tensor(e.name, data.back());
    shapes.emplace_back(e.name, e.shape);
  }
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (size_t i = 0; i < data.size(); ++i) {
    Tensor::Shape s{1, 1, 1, 1};
    for (size_t d = 0; d < shapes[i].second.size(); ++d) s[d] = shapes[i].second[d];
    tensors.emplace_back(shapes[i].first, Tensor::view(DType::f32, s, static_cast<int>(shapes[i].second.size()),
                                                       data[i].data(), nullptr));
  }
  write_safetensors(path, tensors, {{"fdc", j.dump()}});
}

std::vector<double> to_double(const Tensor& t) {
  std::vector<float> f(static_cast<size_t>(t.numel()));
  convert_to_f32(t.dtype(), t.raw(), f.data(), f.size());
  return std::vector<double>(f.begin(), f.end());
}

}  // namespace

TEST_CASE("an FDC artifact round-trips bit-exactly and its digest is the file's SHA-256", "[model][fdc]") {
  const Model model = Model::synthetic(fdc_config(false), 11);
  FdcArtifact a = random_artifact(model, 1);
  test::TempDir dir;
  save_fdc_artifact(a, dir / "fdc.safetensors");
  REQUIRE(a.digest == sha256sum(dir / "fdc.safetensors"));
  const FdcArtifact b = load_fdc_artifact(dir / "fdc.safetensors");
  REQUIRE(b.digest == a.digest);
  REQUIRE(b.num_layers == a.num_layers);
  REQUIRE(b.num_kv_heads == a.num_kv_heads);
  REQUIRE(b.head_dim == a.head_dim);
  REQUIRE(b.hidden_size == a.hidden_size);
  REQUIRE(b.model_digest == a.model_digest);
  REQUIRE(b.removal_rate == a.removal_rate);
  REQUIRE(b.v_method == a.v_method);
  REQUIRE(b.ranks == a.ranks);
  REQUIRE(b.qk_basis == a.qk_basis);
  REQUIRE(b.qk_singular == a.qk_singular);
  REQUIRE(b.v_basis == a.v_basis);
  REQUIRE(b.v_singular == a.v_singular);
  REQUIRE(b.calibration_json == a.calibration_json);
  REQUIRE(b.qk(1, 1) == &b.qk_basis[3 * 32 * 32]);
  REQUIRE(b.v(1, 0) == &b.v_basis[2 * 32 * 32]);

  // Same artifact, same bytes; a different one, a different digest.
  FdcArtifact again = b;
  save_fdc_artifact(again, dir / "again.safetensors");
  REQUIRE(again.digest == a.digest);
  again.ranks[0].d_v = again.ranks[0].d_v == 32 ? 16 : 32;
  save_fdc_artifact(again, dir / "again.safetensors");
  REQUIRE(again.digest != a.digest);
  REQUIRE(again.digest == sha256sum(dir / "again.safetensors"));
}

TEST_CASE("bad FDC artifacts are refused naming the file and the problem", "[model][fdc]") {
  const Model model = Model::synthetic(fdc_config(false), 11);
  FdcArtifact a = random_artifact(model, 2);
  test::TempDir dir;
  const auto path = dir / "fdc.safetensors";
  save_fdc_artifact(a, path);
  REQUIRE_NOTHROW(load_fdc_artifact(path));
  auto refused = [&](const std::string& what) {
    INFO(what);
    REQUIRE_THROWS_WITH(load_fdc_artifact(path), Contains(path.string()) && Contains(what));
  };

  SECTION("wrong version") {
    rewrite(path, [](json& j) { j["version"] = 2; });
    refused("version 2");
  }
  SECTION("truncated") {
    std::filesystem::resize_file(path, std::filesystem::file_size(path) - 100);
    REQUIRE_THROWS_WITH(load_fdc_artifact(path), Contains(path.string()));
  }
  SECTION("missing file") { REQUIRE_THROWS_WITH(load_fdc_artifact(dir / "none.safetensors"), Contains("none.safetensors")); }
  SECTION("no fdc metadata") {
    write_safetensors(path, {{"x", Tensor::empty(DType::f32, {4})}});
    refused("not an FDC artifact");
  }
  SECTION("dims that do not match the tensors") {
    rewrite(path, [](json& j) { j["head_dim"] = 64; });
    refused("qk_basis");
  }
  SECTION("a layer count that does not match the rank tables") {
    rewrite(path, [](json& j) { j["num_layers"] = 3; });
    refused("\"d_qk\" must list 3 layers");
  }
  SECTION("a rank that is not a multiple of 16") {
    rewrite(path, [](json& j) { j["d_qk"][1][0] = 24; });
    refused("rank 24");
  }
  SECTION("a rank above head_dim") {
    rewrite(path, [](json& j) { j["d_v"][0][1] = 48; });
    refused("rank 48");
  }
  SECTION("a non-finite value") {
    rewrite(path, [](json&) {}, [](const std::string& name, std::vector<float>& v) {
      if (name == "v_basis") v[100] = std::numeric_limits<float>::quiet_NaN();
    });
    refused("v_basis");
  }
  SECTION("a basis that is not orthonormal") {
    rewrite(path, [](json&) {}, [](const std::string& name, std::vector<float>& v) {
      if (name == "qk_basis") v[32 * 32 + 5] += 0.05f;  // layer 0, head 1, row 0, column 5
    });
    refused("not orthonormal");
  }
  SECTION("singular values out of order") {
    rewrite(path, [](json&) {}, [](const std::string& name, std::vector<float>& v) {
      if (name == "qk_singular") std::swap(v[3], v[4]);
    });
    refused("not descending");
  }
  SECTION("an unknown v_method") {
    rewrite(path, [](json& j) { j["v_method"] = "magic"; });
    refused("magic");
  }
  SECTION("saving an invalid artifact is refused too") {
    a.ranks[0].d_qk = 8;
    REQUIRE_THROWS_WITH(save_fdc_artifact(a, dir / "bad.safetensors"), Contains("bad.safetensors") && Contains("rank 8"));
    REQUIRE_FALSE(std::filesystem::exists(dir / "bad.safetensors"));
  }
}

TEST_CASE("FDC ranks: the fewest leading singular values whose removed tail is within r, rounded up to 16",
          "[model][fdc]") {
  // 16 × 10, 16 × 1, 32 × 0.1: total 179.2.
  std::vector<float> s(64, 0.1f);
  std::fill(s.begin(), s.begin() + 16, 10.0f);
  std::fill(s.begin() + 16, s.begin() + 32, 1.0f);
  REQUIRE(fdc_rank_for_rate(s.data(), 64, 0.0) == 64);
  REQUIRE(fdc_rank_for_rate(s.data(), 64, 0.0005) == 64);  // removes 0 (budget 0.09 < 0.1)
  REQUIRE(fdc_rank_for_rate(s.data(), 64, 0.01) == 48);    // budget 1.79: 17 × 0.1 removed, 47 kept -> 48
  REQUIRE(fdc_rank_for_rate(s.data(), 64, 0.02) == 32);    // budget 3.58: the 32 × 0.1, not a 1 more
  REQUIRE(fdc_rank_for_rate(s.data(), 64, 0.1) == 32);     // budget 17.9: 3.2 + 14 × 1 removed, 18 kept -> 32
  REQUIRE(fdc_rank_for_rate(s.data(), 64, 0.11) == 16);    // budget 19.7: 3.2 + 16 removed
  REQUIRE(fdc_rank_for_rate(s.data(), 64, 0.9) == 16);     // never below 16
  REQUIRE_THROWS_WITH(fdc_rank_for_rate(s.data(), 64, 1.0), Contains("[0, 1)"));
  REQUIRE_THROWS_WITH(fdc_rank_for_rate(s.data(), 64, -0.1), Contains("[0, 1)"));

  const Model model = Model::synthetic(fdc_config(false), 11);
  const FdcArtifact a = random_artifact(model, 3);
  for (const FdcRanks& r : fdc_ranks_for_rate(a, 0.0)) REQUIRE(r == FdcRanks{32, 32});
  // Ranks never grow as r grows, and somewhere they shrink.
  std::vector<FdcRanks> prev = fdc_ranks_for_rate(a, 0.0);
  bool shrank = false;
  for (double r = 0.02; r < 0.9; r += 0.02) {
    const std::vector<FdcRanks> now = fdc_ranks_for_rate(a, r);
    for (size_t i = 0; i < now.size(); ++i) {
      REQUIRE(now[i].d_qk <= prev[i].d_qk);
      REQUIRE(now[i].d_v <= prev[i].d_v);
      shrank = shrank || now[i].d_qk < prev[i].d_qk || now[i].d_v < prev[i].d_v;
    }
    prev = now;
  }
  REQUIRE(shrank);
  // Per head, from that head's own values.
  const std::vector<FdcRanks> r = fdc_ranks_for_rate(a, 0.3);
  for (int l = 0; l < a.num_layers; ++l) {
    for (int h = 0; h < a.num_kv_heads; ++h) {
      const size_t i = static_cast<size_t>(l * a.num_kv_heads + h);
      REQUIRE(r[i].d_qk == fdc_rank_for_rate(&a.qk_singular[i * 32], 32, 0.3));
      REQUIRE(r[i].d_v == fdc_rank_for_rate(&a.v_singular[i * 32], 32, 0.3));
    }
  }
}

TEST_CASE("apply_fdc: fused W_V'/W_O' equal W_O·(U_d U_dᵀ)·V per query head, and W_O·V at full rank",
          "[model][fdc]") {
  const bool bias = GENERATE(false, true);
  const DType dtype = GENERATE(DType::bf16, DType::f32);
  const ModelConfig c = fdc_config(bias);
  const Model base = Model::synthetic(c, 5, dtype);
  FdcArtifact artifact = random_artifact(base, 4);
  const bool full = GENERATE(true, false);
  const std::vector<FdcRanks> ranks = full ? fdc_ranks_for_rate(artifact, 0.0) : std::vector<FdcRanks>{{16, 16}, {32, 16}, {16, 32}, {32, 32}};
  INFO("bias " << bias << ", dtype " << dtype_name(dtype) << ", full rank " << full);
  const Model fused = apply_fdc(base, artifact, ranks);

  const size_t hd = 32, H = 128, KV = 2, NQ = 4, group = 2, kvd = KV * hd, qd = NQ * hd, T = 3;
  std::mt19937_64 rng(9);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform(0.1, 1.0);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& bw = base.weights.layers[static_cast<size_t>(l)];
    const LayerWeights& fw = fused.weights.layers[static_cast<size_t>(l)];
    REQUIRE(fw.wv.dtype() == DType::f32);
    REQUIRE(fw.wo.dtype() == DType::f32);
    REQUIRE(fw.wv.dim(0) == static_cast<int64_t>(kvd));
    REQUIRE(fw.wv.dim(1) == static_cast<int64_t>(H));
    REQUIRE(fw.wo.dim(0) == static_cast<int64_t>(H));
    REQUIRE(fw.wo.dim(1) == static_cast<int64_t>(qd));
    REQUIRE(fw.wq.raw() == bw.wq.raw());  // shared, not copied
    REQUIRE(fw.w_down.raw() == bw.w_down.raw());
    const std::vector<double> wv = to_double(bw.wv), wo = to_double(bw.wo), wv2 = to_double(fw.wv), wo2 = to_double(fw.wo);
    const std::vector<double> bv = bias ? to_double(bw.bv) : std::vector<double>(kvd, 0.0);
    const std::vector<double> bv2 = bias ? to_double(fw.bv) : std::vector<double>(kvd, 0.0);

    // Slots past d_v are exactly zero.
    for (size_t h = 0; h < KV; ++h) {
      const size_t dv = static_cast<size_t>(ranks[static_cast<size_t>(l) * KV + h].d_v);
      for (size_t i = dv; i < hd; ++i) {
        for (size_t x = 0; x < H; ++x) REQUIRE(wv2[(h * hd + i) * H + x] == 0.0);
        REQUIRE(bv2[h * hd + i] == 0.0);
        for (size_t qh = h * group; qh < (h + 1) * group; ++qh)
          for (size_t o = 0; o < H; ++o) REQUIRE(wo2[o * qd + qh * hd + i] == 0.0);
      }
    }

    // T tokens of random inputs, per query head a random mix of the T values (attention
    // weights), then o_proj: unfused on V projected onto U[:, :d_v], and fused.
    std::vector<double> x(T * H), p(NQ * T);
    for (double& v : x) v = normal(rng);
    for (double& v : p) v = uniform(rng);
    std::vector<double> attn(qd, 0.0), attn2(qd, 0.0);
    for (size_t qh = 0; qh < NQ; ++qh) {
      const size_t h = qh / group;
      const size_t dv = static_cast<size_t>(ranks[static_cast<size_t>(l) * KV + h].d_v);
      const float* U = artifact.v(l, static_cast<int>(h));
      for (size_t t = 0; t < T; ++t) {
        std::vector<double> v(hd), v2(hd), coef(dv, 0.0);
        for (size_t j = 0; j < hd; ++j) {
          v[j] = bv[h * hd + j];
          v2[j] = bv2[h * hd + j];
          for (size_t k = 0; k < H; ++k) {
            v[j] += wv[(h * hd + j) * H + k] * x[t * H + k];
            v2[j] += wv2[(h * hd + j) * H + k] * x[t * H + k];
          }
        }
        for (size_t i = 0; i < dv; ++i)
          for (size_t j = 0; j < hd; ++j) coef[i] += U[j * hd + i] * v[j];
        for (size_t j = 0; j < hd; ++j) {
          double proj = 0;
          for (size_t i = 0; i < dv; ++i) proj += U[j * hd + i] * coef[i];
          attn[qh * hd + j] += p[qh * T + t] * (full ? v[j] : proj);
          attn2[qh * hd + j] += p[qh * T + t] * v2[j];
        }
      }
    }
    double err = 0, ref = 0;
    for (size_t o = 0; o < H; ++o) {
      double y = 0, y2 = 0;
      for (size_t i = 0; i < qd; ++i) {
        y += wo[o * qd + i] * attn[i];
        y2 += wo2[o * qd + i] * attn2[i];
      }
      err = std::max(err, std::abs(y - y2));
      ref = std::max(ref, std::abs(y));
    }
    // f32 fused weights: each a ≤ 32-term f32 sum, ~1e-7 relative; 1e-5 of the output's scale.
    INFO("layer " << l << ": max |fused − unfused| " << err << " of max |y| " << ref);
    REQUIRE(ref > 0);
    REQUIRE(err <= 1e-5 * ref);
  }

  // The runtime: ranks, R with columns ≥ d_qk zeroed, a digest that names these ranks.
  REQUIRE(fused.fdc);
  const FdcRuntime& rt = *fused.fdc;
  REQUIRE(rt.ranks == ranks);
  REQUIRE(rt.head_dim == 32);
  for (int l = 0; l < c.num_layers; ++l) {
    for (int h = 0; h < c.num_kv_heads; ++h) {
      const float* R = artifact.qk(l, h);
      const float* P = rt.proj(l, h);
      const size_t dqk = static_cast<size_t>(rt.rank(l, h).d_qk);
      for (size_t i = 0; i < hd; ++i)
        for (size_t j = 0; j < hd; ++j) REQUIRE(P[i * hd + j] == (j < dqk ? R[i * hd + j] : 0.0f));
    }
  }
  REQUIRE(base.fdc == nullptr);
}

TEST_CASE("apply_fdc names the digest of the ranks it applies and refuses what does not fit", "[model][fdc]") {
  const Model base = Model::synthetic(fdc_config(false), 5);
  FdcArtifact artifact = random_artifact(base, 6);
  test::TempDir dir;
  save_fdc_artifact(artifact, dir / "fdc.safetensors");
  const Model same = apply_fdc(base, artifact);
  REQUIRE(same.fdc->digest == artifact.digest);
  REQUIRE(same.fdc->ranks == artifact.ranks);
  REQUIRE(same.fdc->removal_rate == artifact.removal_rate);
  const Model other = apply_fdc(base, artifact, fdc_ranks_for_rate(artifact, 0.0));
  REQUIRE(other.fdc->ranks != artifact.ranks);
  REQUIRE(other.fdc->digest != artifact.digest);
  REQUIRE(other.fdc->digest.size() == 64);
  REQUIRE(apply_fdc(base, artifact, fdc_ranks_for_rate(artifact, 0.0)).fdc->digest == other.fdc->digest);

  SECTION("another model") {
    const Model stranger = Model::synthetic(fdc_config(false), 6);
    REQUIRE_THROWS_WITH(apply_fdc(stranger, artifact), Contains("calibrated on another model"));
  }
  SECTION("other dims") {
    ModelConfig c = fdc_config(false);
    c.num_layers = 3;
    REQUIRE_THROWS_WITH(apply_fdc(Model::synthetic(c, 5), artifact), Contains("this model has 3 layers"));
  }
  SECTION("twice") { REQUIRE_THROWS_WITH(apply_fdc(same, artifact), Contains("already")); }
  SECTION("bad ranks") {
    REQUIRE_THROWS_WITH(apply_fdc(base, artifact, std::vector<FdcRanks>(4, {32, 20})), Contains("rank 20"));
    REQUIRE_THROWS_WITH(apply_fdc(base, artifact, std::vector<FdcRanks>(3, {32, 32})), Contains("3 ranks"));
  }
}
