// FDC artifacts (include/hack/model/fdc.h): the safetensors file and its validation, ranks
// from a singular-value removal rate, and apply_fdc, which folds the V bases into W_V / W_O.
#include "hack/model/fdc.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "hack/core/error.h"
#include "hack/core/read_file.h"
#include "hack/model/safetensors.h"

namespace hack {

namespace {

using ojson = nlohmann::ordered_json;  // not `json`: config.cpp's is nlohmann::json (unity builds)

constexpr int kRankStep = 16;           // ranks are multiples of 16 (tensor-core tiles)
constexpr double kOrthonormalTol = 1e-3;  // max |BᵀB − I| of a stored basis (f32 of a double eigensolve: ~1e-6)

std::string sha256_hex(const void* data, size_t bytes) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HACK_CHECK(EVP_Digest(data, bytes, out, &n, EVP_sha256(), nullptr) == 1, "SHA-256 failed");
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) hex += fmt::format("{:02x}", out[i]);
  return hex;
}

size_t head_count(const FdcArtifact& a) { return static_cast<size_t>(a.num_layers) * static_cast<size_t>(a.num_kv_heads); }

bool valid_rank(int d, int head_dim) { return d >= kRankStep && d <= head_dim && d % kRankStep == 0; }

void check_ranks(const std::vector<FdcRanks>& ranks, const FdcArtifact& a, const std::string& where) {
  HACK_CHECK(ranks.size() == head_count(a), "{}: {} ranks for {} layers × {} KV heads", where, ranks.size(),
             a.num_layers, a.num_kv_heads);
  for (size_t i = 0; i < ranks.size(); ++i) {
    for (const int d : {ranks[i].d_qk, ranks[i].d_v})
      HACK_CHECK(valid_rank(d, a.head_dim), "{}: layer {} KV head {}: rank {} is not a multiple of 16 in [16, {}]", where,
                 i / static_cast<size_t>(a.num_kv_heads), i % static_cast<size_t>(a.num_kv_heads), d, a.head_dim);
  }
}

// Sizes, finite values, descending non-negative singular values and orthonormal bases.
void check_basis(const std::vector<float>& basis, const std::vector<float>& singular, const char* name,
                 const FdcArtifact& a, const std::string& where) {
  const size_t hd = static_cast<size_t>(a.head_dim);
  HACK_CHECK(basis.size() == head_count(a) * hd * hd && singular.size() == head_count(a) * hd,
             "{}: {}_basis / {}_singular hold {} / {} values, the shape [{}][{}][{}] needs {} / {}", where, name, name,
             basis.size(), singular.size(), a.num_layers, a.num_kv_heads, hd, head_count(a) * hd * hd, head_count(a) * hd);
  for (size_t h = 0; h < head_count(a); ++h) {
    const size_t layer = h / static_cast<size_t>(a.num_kv_heads), head = h % static_cast<size_t>(a.num_kv_heads);
    const float* s = &singular[h * hd];
    for (size_t i = 0; i < hd; ++i) {
      HACK_CHECK(std::isfinite(s[i]) && s[i] >= 0, "{}: {}_singular of layer {} KV head {}: value {} is {}", where, name,
                 layer, head, i, s[i]);
      HACK_CHECK(i == 0 || s[i] <= s[i - 1], "{}: {}_singular of layer {} KV head {} is not descending at {}", where,
                 name, layer, head, i);
    }
    const float* b = &basis[h * hd * hd];
    for (size_t i = 0; i < hd * hd; ++i)
      HACK_CHECK(std::isfinite(b[i]), "{}: {}_basis of layer {} KV head {}: element ({}, {}) is {}", where, name, layer,
                 head, i / hd, i % hd, b[i]);
    for (size_t i = 0; i < hd; ++i) {
      for (size_t j = i; j < hd; ++j) {
        double dot = 0;
        for (size_t r = 0; r < hd; ++r) dot += static_cast<double>(b[r * hd + i]) * b[r * hd + j];
        const double err = std::abs(dot - (i == j ? 1.0 : 0.0));
        HACK_CHECK(err <= kOrthonormalTol,
                   "{}: {}_basis of layer {} KV head {} is not orthonormal: columns {} · {} = {:.6f} (tolerance {})",
                   where, name, layer, head, i, j, dot, kOrthonormalTol);
      }
    }
  }
}

// What every other check sizes its loops by.
void check_dims(const FdcArtifact& a, const std::string& where) {
  HACK_CHECK(a.num_layers > 0 && a.num_kv_heads > 0 && a.hidden_size > 0,
             "{}: num_layers, num_kv_heads and hidden_size must be positive, got {}, {}, {}", where, a.num_layers,
             a.num_kv_heads, a.hidden_size);
  HACK_CHECK(a.head_dim >= kRankStep && a.head_dim % kRankStep == 0,
             "{}: head_dim {}: FDC needs a multiple of 16 (ranks are multiples of 16)", where, a.head_dim);
}

void check_artifact(const FdcArtifact& a, const std::string& where) {
  check_dims(a, where);
  HACK_CHECK(!a.model_digest.empty(), "{}: no model_digest", where);
  HACK_CHECK(a.removal_rate >= 0 && a.removal_rate < 1, "{}: removal_rate {} is outside [0, 1)", where, a.removal_rate);
  HACK_CHECK(a.v_method == "weights" || a.v_method == "whitened", "{}: v_method \"{}\" is neither \"weights\" nor \"whitened\"",
             where, a.v_method);
  check_ranks(a.ranks, a, where);
  check_basis(a.qk_basis, a.qk_singular, "qk", a, where);
  check_basis(a.v_basis, a.v_singular, "v", a, where);
}

int json_int(const ojson& j, const char* key, const std::string& where) {
  HACK_CHECK(j.contains(key) && j[key].is_number_integer(), "{}: \"fdc\" metadata needs an integer \"{}\"", where, key);
  return j[key].get<int>();
}

// [layer][head] ints of key `key` into ranks[·].*field.
void read_rank_table(const ojson& j, const char* key, int FdcRanks::*field, FdcArtifact& a, const std::string& where) {
  HACK_CHECK(j.contains(key) && j[key].is_array() && j[key].size() == static_cast<size_t>(a.num_layers),
             "{}: \"{}\" must list {} layers", where, key, a.num_layers);
  a.ranks.resize(head_count(a));
  for (size_t l = 0; l < j[key].size(); ++l) {
    const ojson& row = j[key][l];
    HACK_CHECK(row.is_array() && row.size() == static_cast<size_t>(a.num_kv_heads),
               "{}: \"{}\"[{}] must list {} KV heads", where, key, l, a.num_kv_heads);
    for (size_t h = 0; h < row.size(); ++h) {
      HACK_CHECK(row[h].is_number_integer(), "{}: \"{}\"[{}][{}] is not an integer", where, key, l, h);
      a.ranks[l * static_cast<size_t>(a.num_kv_heads) + h].*field = row[h].get<int>();
    }
  }
}

ojson rank_table(const FdcArtifact& a, int FdcRanks::*field) {
  ojson t = ojson::array();
  for (int l = 0; l < a.num_layers; ++l) {
    ojson row = ojson::array();
    for (int h = 0; h < a.num_kv_heads; ++h) row.push_back(a.rank(l, h).*field);
    t.push_back(std::move(row));
  }
  return t;
}

std::vector<float> read_f32(const SafetensorsFile& file, const char* name, std::vector<int64_t> shape,
                            const std::string& where) {
  const SafetensorsEntry* e = file.find(name);
  HACK_CHECK(e != nullptr, "{}: tensor {} is missing", where, name);
  SafetensorsEntry want;
  want.dtype = DType::f32;
  want.shape = std::move(shape);
  HACK_CHECK(e->dtype == DType::f32 && e->shape == want.shape, "{}: tensor {} is {}, expected {}", where, name,
             e->describe(), want.describe());
  const Tensor t = file.tensor(*e);
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}

// Row-major f32 copy of a weight matrix in any of its dtypes.
std::vector<float> to_f32(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  convert_to_f32(t.dtype(), t.raw(), out.data(), out.size());
  return out;
}

}  // namespace

const float* FdcArtifact::qk(int layer, int head) const {
  const size_t hd = static_cast<size_t>(head_dim);
  return &qk_basis[static_cast<size_t>(layer * num_kv_heads + head) * hd * hd];
}

const float* FdcArtifact::v(int layer, int head) const {
  const size_t hd = static_cast<size_t>(head_dim);
  return &v_basis[static_cast<size_t>(layer * num_kv_heads + head) * hd * hd];
}

FdcArtifact load_fdc_artifact(const std::filesystem::path& path) {
  const std::string where = "FDC artifact " + path.string();
  const std::string bytes = read_file(path, "FDC artifact");
  const auto file = SafetensorsFile::open(path);
  const auto meta = file->metadata().find("fdc");
  HACK_CHECK(meta != file->metadata().end(), "{}: not an FDC artifact (no \"fdc\" metadata)", where);
  ojson j;
  try {
    j = ojson::parse(meta->second);
  } catch (const ojson::parse_error& e) {
    fail("{}: \"fdc\" metadata is not JSON: {}", where, e.what());
  }
  HACK_CHECK(j.is_object(), "{}: \"fdc\" metadata must be a JSON object", where);
  const int version = json_int(j, "version", where);
  HACK_CHECK(version == kFdcArtifactVersion, "{}: version {}, this build reads version {}", where, version,
             kFdcArtifactVersion);
  FdcArtifact a;
  a.num_layers = json_int(j, "num_layers", where);
  a.num_kv_heads = json_int(j, "num_kv_heads", where);
  a.head_dim = json_int(j, "head_dim", where);
  a.hidden_size = json_int(j, "hidden_size", where);
  check_dims(a, where);
  HACK_CHECK(j.contains("model_digest") && j["model_digest"].is_string(), "{}: \"model_digest\" must be a string", where);
  a.model_digest = j["model_digest"].get<std::string>();
  HACK_CHECK(j.contains("removal_rate") && j["removal_rate"].is_number(), "{}: \"removal_rate\" must be a number", where);
  a.removal_rate = j["removal_rate"].get<double>();
  HACK_CHECK(j.contains("v_method") && j["v_method"].is_string(), "{}: \"v_method\" must be a string", where);
  a.v_method = j["v_method"].get<std::string>();
  read_rank_table(j, "d_qk", &FdcRanks::d_qk, a, where);
  read_rank_table(j, "d_v", &FdcRanks::d_v, a, where);
  if (j.contains("calibration")) {
    HACK_CHECK(j["calibration"].is_object(), "{}: \"calibration\" must be a JSON object", where);
    a.calibration_json = j["calibration"].dump();
  }
  const int64_t L = a.num_layers, KV = a.num_kv_heads, hd = a.head_dim;
  a.qk_basis = read_f32(*file, "qk_basis", {L, KV, hd, hd}, where);
  a.qk_singular = read_f32(*file, "qk_singular", {L, KV, hd}, where);
  a.v_basis = read_f32(*file, "v_basis", {L, KV, hd, hd}, where);
  a.v_singular = read_f32(*file, "v_singular", {L, KV, hd}, where);
  check_artifact(a, where);
  a.digest = sha256_hex(bytes.data(), bytes.size());
  return a;
}

void save_fdc_artifact(FdcArtifact& a, const std::filesystem::path& path) {
  const std::string where = "FDC artifact " + path.string();
  check_artifact(a, where);
  ojson j;
  j["version"] = kFdcArtifactVersion;
  j["num_layers"] = a.num_layers;
  j["num_kv_heads"] = a.num_kv_heads;
  j["head_dim"] = a.head_dim;
  j["hidden_size"] = a.hidden_size;
  j["model_digest"] = a.model_digest;
  j["removal_rate"] = a.removal_rate;
  j["v_method"] = a.v_method;
  j["d_qk"] = rank_table(a, &FdcRanks::d_qk);
  j["d_v"] = rank_table(a, &FdcRanks::d_v);
  if (!a.calibration_json.empty()) {
    try {
      j["calibration"] = ojson::parse(a.calibration_json);
    } catch (const ojson::parse_error& e) {
      fail("{}: calibration_json is not JSON: {}", where, e.what());
    }
    HACK_CHECK(j["calibration"].is_object(), "{}: calibration_json must be a JSON object", where);
  }
  const int64_t L = a.num_layers, KV = a.num_kv_heads, hd = a.head_dim;
  auto view = [](const std::vector<float>& v, std::initializer_list<int64_t> shape) {
    return Tensor::view(DType::f32, shape, v.data(), nullptr);
  };
  const std::filesystem::path tmp = path.string() + ".tmp";
  write_safetensors(tmp,
                    {{"qk_basis", view(a.qk_basis, {L, KV, hd, hd})},
                     {"qk_singular", view(a.qk_singular, {L, KV, hd})},
                     {"v_basis", view(a.v_basis, {L, KV, hd, hd})},
                     {"v_singular", view(a.v_singular, {L, KV, hd})}},
                    {{"fdc", j.dump()}});
  const std::string bytes = read_file(tmp, "FDC artifact");
  std::filesystem::rename(tmp, path);
  a.digest = sha256_hex(bytes.data(), bytes.size());
}

int fdc_rank_for_rate(const float* singular_desc, int count, double removal_rate) {
  HACK_CHECK(removal_rate >= 0 && removal_rate < 1, "FDC removal rate {} is outside [0, 1)", removal_rate);
  HACK_CHECK(count > 0, "FDC ranks: no singular values");
  double total = 0;
  for (int i = 0; i < count; ++i) total += singular_desc[i];
  // Smallest kept count j whose removed tail Σ_{i ≥ j} θ_i is at most r · Σ θ (paper Eq. 1).
  const double budget = removal_rate * total;
  int kept = count;
  double tail = 0;
  while (kept > 0 && tail + singular_desc[kept - 1] <= budget) tail += singular_desc[--kept];
  const int rounded = (kept + kRankStep - 1) / kRankStep * kRankStep;
  return std::min(std::max(rounded, kRankStep), count);
}

std::vector<FdcRanks> fdc_ranks_for_rate(const FdcArtifact& a, double removal_rate) {
  std::vector<FdcRanks> ranks(head_count(a));
  const size_t hd = static_cast<size_t>(a.head_dim);
  for (size_t h = 0; h < ranks.size(); ++h) {
    ranks[h].d_qk = fdc_rank_for_rate(&a.qk_singular[h * hd], a.head_dim, removal_rate);
    ranks[h].d_v = fdc_rank_for_rate(&a.v_singular[h * hd], a.head_dim, removal_rate);
  }
  return ranks;
}

Model apply_fdc(const Model& base, const FdcArtifact& artifact, const std::vector<FdcRanks>& ranks_in) {
  const ModelConfig& c = base.config;
  const std::string where = artifact.digest.empty() ? std::string("FDC artifact") : "FDC artifact " + artifact.digest;
  HACK_CHECK(!base.fdc, "apply_fdc: the model already has FDC applied (artifact {})", base.fdc ? base.fdc->digest : "");
  HACK_CHECK(artifact.num_layers == c.num_layers && artifact.num_kv_heads == c.num_kv_heads &&
                 artifact.head_dim == c.head_dim && artifact.hidden_size == c.hidden_size,
             "{}: made for {} layers, {} KV heads, head_dim {}, hidden {}; this model has {} layers, {} KV heads, "
             "head_dim {}, hidden {}", where,
             artifact.num_layers, artifact.num_kv_heads, artifact.head_dim, artifact.hidden_size, c.num_layers,
             c.num_kv_heads, c.head_dim, c.hidden_size);
  const std::string digest = weights_digest(base);
  HACK_CHECK(artifact.model_digest == digest,
             "{}: calibrated on another model (weights digest {}, this model's is {})", where, artifact.model_digest,
             digest);
  check_artifact(artifact, where);
  const std::vector<FdcRanks>& ranks = ranks_in.empty() ? artifact.ranks : ranks_in;
  check_ranks(ranks, artifact, where);

  const size_t hd = static_cast<size_t>(c.head_dim), H = static_cast<size_t>(c.hidden_size);
  const size_t KV = static_cast<size_t>(c.num_kv_heads), NQ = static_cast<size_t>(c.num_heads);
  const size_t kvd = KV * hd, qd = NQ * hd, group = static_cast<size_t>(c.group_size());
  Model m = base;
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& w = m.weights.layers[static_cast<size_t>(l)];
    const std::vector<float> wv = to_f32(w.wv), wo = to_f32(w.wo);
    Tensor wv_f = Tensor::empty(DType::f32, {static_cast<int64_t>(kvd), static_cast<int64_t>(H)});
    Tensor wo_f = Tensor::empty(DType::f32, {static_cast<int64_t>(H), static_cast<int64_t>(qd)});
    Tensor bv_f = w.bv.defined() ? Tensor::empty(DType::f32, {static_cast<int64_t>(kvd)}) : Tensor();
    float* wv_out = wv_f.data<float>();
    float* wo_out = wo_f.data<float>();
    for (size_t h = 0; h < KV; ++h) {
      const float* U = artifact.v(l, static_cast<int>(h));  // [hd][hd], U[j][i]
      const size_t dv = static_cast<size_t>(ranks[static_cast<size_t>(l) * KV + h].d_v);
      // Row h·hd + i of W_V' = Σ_j U[j][i] · row h·hd + j of W_V (i < d_v); rows ≥ d_v stay 0.
      for (size_t i = 0; i < dv; ++i) {
        float* out = &wv_out[(h * hd + i) * H];
        for (size_t j = 0; j < hd; ++j) {
          const float u = U[j * hd + i];
          const float* in = &wv[(h * hd + j) * H];
          for (size_t x = 0; x < H; ++x) out[x] += u * in[x];
        }
        if (bv_f.defined()) {
          float b = 0;
          for (size_t j = 0; j < hd; ++j) b += U[j * hd + i] * w.bv.data<float>()[h * hd + j];
          bv_f.data<float>()[h * hd + i] = b;
        }
      }
      // Columns qh·hd + i of W_O' = W_O[:, qh·hd : (qh+1)·hd] · U[:, i] for every query head of the group.
      for (size_t qh = h * group; qh < (h + 1) * group; ++qh) {
        for (size_t o = 0; o < H; ++o) {
          const float* in = &wo[o * qd + qh * hd];
          float* out = &wo_out[o * qd + qh * hd];
          for (size_t j = 0; j < hd; ++j) {
            const float a = in[j];
            const float* u = &U[j * hd];
            for (size_t i = 0; i < dv; ++i) out[i] += a * u[i];
          }
        }
      }
    }
    w.wv = wv_f;
    w.wo = wo_f;
    if (bv_f.defined()) w.bv = bv_f;
  }

  auto rt = std::make_shared<FdcRuntime>();
  rt->num_layers = c.num_layers;
  rt->num_kv_heads = c.num_kv_heads;
  rt->head_dim = c.head_dim;
  rt->ranks = ranks;
  rt->removal_rate = artifact.removal_rate;
  rt->qk_proj.assign(artifact.qk_basis.size(), 0.0f);
  for (int l = 0; l < c.num_layers; ++l) {
    for (int h = 0; h < c.num_kv_heads; ++h) {
      const float* R = artifact.qk(l, h);
      float* P = &rt->qk_proj[static_cast<size_t>(l * c.num_kv_heads + h) * hd * hd];
      const size_t dqk = static_cast<size_t>(rt->rank(l, h).d_qk);
      for (size_t i = 0; i < hd; ++i) std::copy(R + i * hd, R + i * hd + dqk, P + i * hd);
    }
  }
  // Ranks other than the artifact's change the KV bytes, so they change the digest too.
  if (ranks == artifact.ranks) {
    rt->digest = artifact.digest;
  } else {
    std::string text = artifact.digest + " ranks";
    for (const FdcRanks& r : ranks) text += fmt::format(" {},{}", r.d_qk, r.d_v);
    rt->digest = sha256_hex(text.data(), text.size());
  }
  m.fdc = std::move(rt);
  return m;
}

}  // namespace hack
