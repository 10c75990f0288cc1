#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>

#include "hack/core/error.h"
#include "hack/model/safetensors.h"
#include "hack/model/weights.h"
#include "model_test_util.h"
#include "support/test_support.h"

using namespace hack;
using Catch::Contains;
using json = nlohmann::json;

namespace {

ModelConfig tiny_config(ModelArch arch = ModelArch::llama, bool tied = false) {
  ModelConfig c = synthetic_model_config("tiny");
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.intermediate_size = 80;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.arch = arch;
  c.tie_word_embeddings = tied;
  c.attention_bias = arch == ModelArch::qwen2 || arch == ModelArch::qwen3;  // qwen3: the optional bias too
  c.attention_out_bias = arch == ModelArch::qwen3;
  c.qk_norm = arch == ModelArch::qwen3;
  return c;
}

json config_json(const ModelConfig& c) {
  const char* archs[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"};
  return {{"architectures", {archs[static_cast<int>(c.arch)]}},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_layers},
          {"num_attention_heads", c.num_heads},
          {"num_key_value_heads", c.num_kv_heads},
          {"head_dim", c.head_dim},
          {"max_position_embeddings", c.max_position_embeddings},
          {"rms_norm_eps", c.rms_norm_eps},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"attention_bias", c.attention_bias},
          {"torch_dtype", "bfloat16"}};
}

Tensor to_bf16(const Tensor& t) {
  REQUIRE(t.dtype() == DType::f32);
  Tensor out = Tensor::empty(DType::bf16, t.shape(), t.ndim());
  for (int64_t i = 0; i < t.numel(); ++i) out.data<uint16_t>()[i] = f32_to_bf16(t.data<float>()[i]);
  return out;
}

// HF names of a model's tensors (lm_head omitted when tied, as save_pretrained does).
std::vector<std::pair<std::string, Tensor>> hf_tensors(const Model& m) {
  std::vector<std::pair<std::string, Tensor>> out;
  const ModelWeights& w = m.weights;
  out.emplace_back("model.embed_tokens.weight", w.embed);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const LayerWeights& l = w.layers[i];
    out.emplace_back(p + "input_layernorm.weight", l.attn_norm);
    out.emplace_back(p + "self_attn.q_proj.weight", l.wq);
    out.emplace_back(p + "self_attn.k_proj.weight", l.wk);
    out.emplace_back(p + "self_attn.v_proj.weight", l.wv);
    out.emplace_back(p + "self_attn.o_proj.weight", l.wo);
    if (l.bo.defined()) out.emplace_back(p + "self_attn.o_proj.bias", l.bo);
    if (l.bq.defined()) {
      out.emplace_back(p + "self_attn.q_proj.bias", l.bq);
      out.emplace_back(p + "self_attn.k_proj.bias", l.bk);
      out.emplace_back(p + "self_attn.v_proj.bias", l.bv);
    }
    if (l.q_norm.defined()) {
      out.emplace_back(p + "self_attn.q_norm.weight", l.q_norm);
      out.emplace_back(p + "self_attn.k_norm.weight", l.k_norm);
    }
    out.emplace_back(p + "post_attention_layernorm.weight", l.ffn_norm);
    out.emplace_back(p + "mlp.gate_proj.weight", l.w_gate);
    out.emplace_back(p + "mlp.up_proj.weight", l.w_up);
    out.emplace_back(p + "mlp.down_proj.weight", l.w_down);
  }
  out.emplace_back("model.norm.weight", w.final_norm);
  if (!m.config.tie_word_embeddings) out.emplace_back("lm_head.weight", w.lm_head);
  return out;
}

void write_model_dir(const std::filesystem::path& dir, const Model& m,
                     std::vector<std::pair<std::string, Tensor>> tensors) {
  test::write_text(dir / "config.json", config_json(m.config).dump(2));
  write_safetensors(dir / "model.safetensors", tensors);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.ndim() == b.ndim() &&
         std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

// Every matrix and vector of `w`, in a fixed order.
std::vector<const Tensor*> all_tensors(const ModelWeights& w) {
  std::vector<const Tensor*> out = {&w.embed, &w.final_norm, &w.lm_head};
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.bo, &l.q_norm, &l.k_norm,
                            &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down}) {
      out.push_back(t);
    }
  }
  return out;
}

void check_shapes(const Model& m) {
  const ModelConfig& c = m.config;
  const ModelWeights& w = m.weights;
  auto shape = [](const Tensor& t) {
    std::vector<int64_t> s;
    for (int i = 0; i < t.ndim(); ++i) s.push_back(t.dim(i));
    return s;
  };
  using S = std::vector<int64_t>;
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size;
  CHECK(shape(w.embed) == S{c.vocab_size, h});
  CHECK(shape(w.lm_head) == S{c.vocab_size, h});
  CHECK(shape(w.final_norm) == S{h});
  CHECK(w.final_norm.dtype() == DType::f32);
  REQUIRE(w.layers.size() == static_cast<size_t>(c.num_layers));
  for (const LayerWeights& l : w.layers) {
    CHECK(shape(l.attn_norm) == S{h});
    CHECK(shape(l.ffn_norm) == S{h});
    CHECK(shape(l.wq) == S{q, h});
    CHECK(shape(l.wk) == S{kv, h});
    CHECK(shape(l.wv) == S{kv, h});
    CHECK(shape(l.wo) == S{h, q});
    CHECK(shape(l.w_gate) == S{f, h});
    CHECK(shape(l.w_up) == S{f, h});
    CHECK(shape(l.w_down) == S{h, f});
    CHECK(l.bq.defined() == c.attention_bias);
    if (c.attention_bias) {
      CHECK(shape(l.bq) == S{q});
      CHECK(shape(l.bk) == S{kv});
      CHECK(l.bv.dtype() == DType::f32);
    }
    CHECK(l.bo.defined() == c.attention_out_bias);
    if (c.attention_out_bias) CHECK(shape(l.bo) == S{h});
    CHECK(l.q_norm.defined() == c.qk_norm);
    if (c.qk_norm) {
      CHECK(shape(l.q_norm) == S{c.head_dim});
      CHECK(shape(l.k_norm) == S{c.head_dim});
      CHECK(l.k_norm.dtype() == DType::f32);
    }
    CHECK(l.attn_norm.dtype() == DType::f32);
    CHECK(l.wq.dtype() == l.w_down.dtype());
  }
}

}  // namespace

TEST_CASE("Model::load: a checkpoint written from a synthetic model loads back exactly", "[model][weights]") {
  for (ModelArch arch : {ModelArch::llama, ModelArch::qwen2, ModelArch::qwen3}) {
    for (bool tied : {false, true}) {
      INFO("arch " << model_arch_name(arch) << " tied " << tied);
      test::TempDir dir;
      const Model src = Model::synthetic(tiny_config(arch, tied), 11);
      write_model_dir(dir.path(), src, hf_tensors(src));
      const Model m = Model::load(dir.path());
      CHECK(m.directory == dir.path());
      CHECK(m.config.arch == arch);
      CHECK(m.config.attention_bias == (arch != ModelArch::llama));
      CHECK(m.config.attention_out_bias == (arch == ModelArch::qwen3));
      CHECK(m.config.qk_norm == (arch == ModelArch::qwen3));
      check_shapes(m);
      const auto a = all_tensors(src.weights), b = all_tensors(m.weights);
      for (size_t i = 0; i < a.size(); ++i) {
        CHECK(a[i]->defined() == b[i]->defined());
        if (a[i]->defined()) CHECK(same_bytes(*a[i], *b[i]));
      }
      // Matrices are views of the mapping; vectors are f32 copies.
      CHECK(m.weights.embed.memory_kind() == MemoryKind::borrowed);
      CHECK(m.weights.layers[1].w_down.memory_kind() == MemoryKind::borrowed);
      CHECK(m.weights.final_norm.memory_kind() == MemoryKind::host);
      CHECK((m.weights.lm_head.raw() == m.weights.embed.raw()) == tied);
      CHECK(m.weight_bytes() == src.weight_bytes());
    }
  }
}

TEST_CASE("Model::place_in_huge_pages keeps every byte and the tie", "[model][weights]") {
  for (bool tied : {false, true}) {
    INFO("tied " << tied);
    test::TempDir dir;
    const Model src = Model::synthetic(tiny_config(ModelArch::llama, tied), 13);
    write_model_dir(dir.path(), src, hf_tensors(src));
    Model m = Model::load(dir.path());
    const void* mapped = m.weights.layers[0].wq.raw();
    const size_t copied = m.place_in_huge_pages();
    CHECK(copied >= m.weight_bytes() - m.weights.final_norm.bytes() * (1 + 2 * m.weights.layers.size()));
    CHECK(m.weights.layers[0].wq.raw() != mapped);
    CHECK(reinterpret_cast<uintptr_t>(m.weights.embed.raw()) % (size_t{2} << 20) == 0);  // the arena's start
    CHECK((m.weights.lm_head.raw() == m.weights.embed.raw()) == tied);
    const auto a = all_tensors(src.weights), b = all_tensors(m.weights);
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i]->defined()) CHECK(same_bytes(*a[i], *b[i]));
  }
}

TEST_CASE("Model::load: bf16 norms and biases are converted to f32", "[model][weights]") {
  test::TempDir dir;
  const Model src = Model::synthetic(tiny_config(ModelArch::qwen2), 3, DType::bf16);
  auto tensors = hf_tensors(src);
  for (auto& [name, t] : tensors) {
    if (t.ndim() == 1) t = to_bf16(t);
  }
  write_model_dir(dir.path(), src, tensors);
  const Model m = Model::load(dir.path());
  const Tensor& norm = m.weights.layers[0].attn_norm;
  const Tensor& bias = m.weights.layers[1].bk;
  REQUIRE(norm.dtype() == DType::f32);
  REQUIRE(bias.dtype() == DType::f32);
  for (int i = 0; i < 64; ++i) {
    CHECK(norm.data<float>()[i] == bf16_to_f32(f32_to_bf16(src.weights.layers[0].attn_norm.data<float>()[i])));
  }
  CHECK(bias.data<float>()[5] == bf16_to_f32(f32_to_bf16(src.weights.layers[1].bk.data<float>()[5])));
}

TEST_CASE("Model::load errors name the file and tensor", "[model][weights]") {
  test::TempDir dir;
  const Model src = Model::synthetic(tiny_config(), 5);
  const std::string file = (dir / "model.safetensors").string();

  SECTION("mis-shaped tensor") {
    auto tensors = hf_tensors(src);
    for (auto& [name, t] : tensors) {
      if (name == "model.layers.1.self_attn.k_proj.weight") t = Tensor::empty(DType::bf16, {48, 64});
    }
    write_model_dir(dir.path(), src, tensors);
    REQUIRE_THROWS_WITH(Model::load(dir.path()),
                        Contains("tensor model.layers.1.self_attn.k_proj.weight in " + file +
                                 ": expected [32, 64], got [48, 64]"));
  }
  SECTION("transposed matrix") {
    auto tensors = hf_tensors(src);
    for (auto& [name, t] : tensors) {
      if (name == "model.layers.0.mlp.down_proj.weight") t = Tensor::empty(DType::bf16, {80, 64});
    }
    write_model_dir(dir.path(), src, tensors);
    REQUIRE_THROWS_WITH(Model::load(dir.path()), Contains("model.layers.0.mlp.down_proj.weight") &&
                                                     Contains("expected [64, 80], got [80, 64]"));
  }
  SECTION("wrong rank") {
    auto tensors = hf_tensors(src);
    for (auto& [name, t] : tensors) {
      if (name == "model.norm.weight") t = Tensor::empty(DType::f32, {1, 64});
    }
    write_model_dir(dir.path(), src, tensors);
    REQUIRE_THROWS_WITH(Model::load(dir.path()),
                        Contains("tensor model.norm.weight in " + file + ": expected [64], got [1, 64]"));
  }
  SECTION("untied model without lm_head") {
    auto tensors = hf_tensors(src);
    tensors.pop_back();
    REQUIRE(tensors.back().first == "model.norm.weight");
    write_model_dir(dir.path(), src, tensors);
    REQUIRE_THROWS_WITH(Model::load(dir.path()),
                        Contains("tensor lm_head.weight not found in " + dir.path().string()));
  }
  SECTION("missing layer tensor") {
    auto tensors = hf_tensors(src);
    std::erase_if(tensors, [](const auto& p) { return p.first == "model.layers.1.mlp.up_proj.weight"; });
    write_model_dir(dir.path(), src, tensors);
    REQUIRE_THROWS_WITH(Model::load(dir.path()),
                        Contains("tensor model.layers.1.mlp.up_proj.weight not found") && Contains("looked in"));
  }
  SECTION("integer weights") {
    auto tensors = hf_tensors(src);
    for (auto& [name, t] : tensors) {
      if (name == "model.layers.0.self_attn.q_proj.weight") t = Tensor::empty(DType::i8, {64, 64});
    }
    write_model_dir(dir.path(), src, tensors);
    REQUIRE_THROWS_WITH(Model::load(dir.path()), Contains("tensor model.layers.0.self_attn.q_proj.weight in " + file) &&
                                                     Contains("dtype i8"));
  }
  SECTION("missing config") {
    write_safetensors(dir / "model.safetensors", hf_tensors(src));
    REQUIRE_THROWS_WITH(Model::load(dir.path()), Contains("config.json"));
  }
  SECTION("truncated checkpoint") {
    write_model_dir(dir.path(), src, hf_tensors(src));
    std::filesystem::resize_file(dir / "model.safetensors", std::filesystem::file_size(dir / "model.safetensors") / 2);
    REQUIRE_THROWS_WITH(Model::load(dir.path()), Contains(file) && Contains("truncated"));
  }
}

TEST_CASE("Model::synthetic: reproducible, seed-dependent, right shapes and scale", "[model][weights][synthetic]") {
  const ModelConfig c = tiny_config();
  const Model a = Model::synthetic(c, 42);
  const Model b = Model::synthetic(c, 42);
  const Model other = Model::synthetic(c, 43);
  check_shapes(a);
  CHECK(a.directory.empty());
  CHECK(a.weights.embed.dtype() == DType::bf16);
  CHECK(a.config.torch_dtype == DType::bf16);

  const auto ta = all_tensors(a.weights), tb = all_tensors(b.weights), to = all_tensors(other.weights);
  for (size_t i = 0; i < ta.size(); ++i) {
    if (!ta[i]->defined()) continue;
    CHECK(same_bytes(*ta[i], *tb[i]));
    CHECK_FALSE(same_bytes(*ta[i], *to[i]));
  }
  // Different tensors of one model are different streams.
  CHECK_FALSE(std::memcmp(a.weights.layers[0].wk.raw(), a.weights.layers[0].wv.raw(), a.weights.layers[0].wk.bytes()) == 0);

  // Storage dtype only rounds: the bf16 model is the f32 model rounded.
  const Model f32 = Model::synthetic(c, 42, DType::f32);
  const Model f16 = Model::synthetic(c, 42, DType::f16);
  for (int64_t i = 0; i < f32.weights.embed.numel(); ++i) {
    const float v = f32.weights.embed.data<float>()[i];
    REQUIRE(a.weights.embed.data<uint16_t>()[i] == f32_to_bf16(v));
    REQUIRE(f16.weights.embed.data<uint16_t>()[i] == f32_to_f16(v));
  }
  CHECK(same_bytes(f32.weights.final_norm, a.weights.final_norm));

  // Scale: N(0, 0.02) matrices, output projections scaled by 1/sqrt(2 * layers), norms ~1.
  auto moments = [](const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    convert_to_f32(t.dtype(), t.raw(), v.data(), v.size());
    double s = 0, s2 = 0;
    for (float x : v) {
      s += x;
      s2 += static_cast<double>(x) * x;
    }
    const double mean = s / static_cast<double>(v.size());
    return std::pair<double, double>(mean, std::sqrt(s2 / static_cast<double>(v.size()) - mean * mean));
  };
  const auto [embed_mean, embed_std] = moments(f32.weights.embed);  // 6144 samples
  CHECK(std::fabs(embed_mean) < 0.002);
  CHECK(embed_std == Approx(0.02).epsilon(0.05));
  const auto [down_mean, down_std] = moments(f32.weights.layers[0].w_down);
  CHECK(down_std == Approx(0.02 / std::sqrt(4.0)).epsilon(0.05));
  const auto [norm_mean, norm_std] = moments(f32.weights.layers[1].ffn_norm);
  CHECK(norm_mean == Approx(1.0).epsilon(0.05));
  CHECK(norm_std < 0.2);

  REQUIRE_THROWS_WITH(Model::synthetic(c, 1, DType::i8), Contains("dtype"));
  ModelConfig bad = c;
  bad.num_kv_heads = 3;
  REQUIRE_THROWS_WITH(Model::synthetic(bad, 1), Contains("num_kv_heads"));
}

TEST_CASE("Model::synthetic: weights are normally distributed", "[model][weights][synthetic]") {
  // 2M samples of the embedding, standardised. Reference values of N(0, 1): kurtosis 3,
  // P(z < -1) = 0.158655, P(|z| > 2) = 0.045500, P(|z| > 3) = 0.002700, P(|z| > 4) = 6.3e-5.
  // Bounds are ~5 standard errors of each estimate at this sample size.
  ModelConfig c = tiny_config();
  c.vocab_size = 8192;
  c.hidden_size = 256;
  c.num_layers = 1;
  const Model m = Model::synthetic(c, 2024, DType::f32);
  const Tensor& e = m.weights.embed;
  const int64_t n = e.numel();
  double s1 = 0, s2 = 0, s4 = 0;
  int64_t below_m1 = 0, beyond2 = 0, beyond3 = 0, beyond4 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double z = e.data<float>()[i] / 0.02;
    s1 += z;
    s2 += z * z;
    s4 += z * z * z * z;
    below_m1 += z < -1;
    beyond2 += std::fabs(z) > 2;
    beyond3 += std::fabs(z) > 3;
    beyond4 += std::fabs(z) > 4;
  }
  const double dn = static_cast<double>(n);
  CHECK(std::fabs(s1 / dn) < 0.004);
  CHECK(s2 / dn == Approx(1.0).margin(0.005));
  CHECK(s4 / dn == Approx(3.0).margin(0.035));
  CHECK(below_m1 / dn == Approx(0.158655).margin(0.0013));
  CHECK(beyond2 / dn == Approx(0.045500).margin(0.0008));
  CHECK(beyond3 / dn == Approx(0.002700).margin(0.00019));
  CHECK(beyond4 / dn == Approx(6.3e-5).margin(3e-5));
}

TEST_CASE("Model::synthetic: tied lm_head, qwen tensors, weight_bytes", "[model][weights][synthetic]") {
  const Model tied = Model::synthetic(tiny_config(ModelArch::llama, true), 1);
  CHECK(tied.weights.lm_head.raw() == tied.weights.embed.raw());
  const Model q3 = Model::synthetic(tiny_config(ModelArch::qwen3, false), 1);
  check_shapes(q3);
  const Model q2 = Model::synthetic(tiny_config(ModelArch::qwen2, true), 1);
  check_shapes(q2);

  // weight_bytes = 2 bytes per matrix element (bf16) + 4 per vector element (f32), the tied
  // lm_head once. Counted from the config, independently of the tensors.
  for (const Model* m : {&tied, &q3, &q2}) {
    const ModelConfig& c = m->config;
    const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size;
    const int64_t matrices = c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2) +
                             c.num_layers * (2 * q * h + 2 * kv * h + 3 * f * h);
    const int64_t vectors = h + c.num_layers * (2 * h + (c.attention_bias ? q + 2 * kv : 0) +
                                                (c.attention_out_bias ? h : 0) +
                                                (c.qk_norm ? 2 * c.head_dim : 0));
    CHECK(matrices + vectors == c.parameter_count());
    CHECK(m->weight_bytes() == static_cast<size_t>(2 * matrices + 4 * vectors));
  }
}

TEST_CASE("fixture models load and match their config.json", "[model][weights][fixtures]") {
  std::vector<std::filesystem::path> dirs;
  const auto models = test::fixtures_dir() / "models";
  if (std::filesystem::is_directory(models)) {
    for (const auto& e : std::filesystem::directory_iterator(models)) {
      if (std::filesystem::exists(e.path() / "config.json")) dirs.push_back(e.path());
    }
  }
  if (std::filesystem::exists(test::source_dir() / "models" / "hack-tiny" / "config.json")) {
    dirs.push_back(test::source_dir() / "models" / "hack-tiny");
  }
  if (dirs.empty()) WARN("no fixture models found under " << models.string());

  for (const auto& dir : dirs) {
    INFO("model " << dir.string());
    json j;
    {
      std::ifstream in(dir / "config.json");
      j = json::parse(in);
    }
    const Model m = Model::load(dir);
    const ModelConfig& c = m.config;
    CHECK(c.architecture == j["architectures"][0].get<std::string>());
    CHECK(c.vocab_size == j["vocab_size"].get<int>());
    CHECK(c.hidden_size == j["hidden_size"].get<int>());
    CHECK(c.intermediate_size == j["intermediate_size"].get<int>());
    CHECK(c.num_layers == j["num_hidden_layers"].get<int>());
    CHECK(c.num_heads == j["num_attention_heads"].get<int>());
    CHECK(c.num_kv_heads == j.value("num_key_value_heads", c.num_heads));
    if (j.contains("head_dim")) CHECK(c.head_dim == j["head_dim"].get<int>());
    CHECK(c.rms_norm_eps == j["rms_norm_eps"].get<float>());
    CHECK(c.tie_word_embeddings == j.value("tie_word_embeddings", false));
    CHECK(c.bos_token_id == j["bos_token_id"].get<int>());
    CHECK(c.eos_token_ids == std::vector<int>{j["eos_token_id"].get<int>()});
    if (j.contains("rope_theta")) CHECK(c.rope_theta == j["rope_theta"].get<float>());
    if (j.contains("rope_parameters") && j["rope_parameters"].contains("rope_theta")) {
      CHECK(c.rope_theta == j["rope_parameters"]["rope_theta"].get<float>());
    }
    const json rope = j.contains("rope_scaling") && !j["rope_scaling"].is_null() ? j["rope_scaling"]
                      : j.contains("rope_parameters")                             ? j["rope_parameters"]
                                                                                  : json();
    const std::string rope_type = rope.is_object() ? rope.value("rope_type", rope.value("type", "default")) : "default";
    CHECK(c.rope_scaling.type == (rope_type == "llama3"   ? RopeScalingType::llama3
                                  : rope_type == "linear" ? RopeScalingType::linear
                                                          : RopeScalingType::none));
    if (rope_type != "default") CHECK(c.rope_scaling.factor == rope["factor"].get<float>());
    CHECK(c.qk_norm == (c.arch == ModelArch::qwen3));
    CHECK(c.attention_bias == (c.arch == ModelArch::qwen2 || j.value("attention_bias", false)));

    check_shapes(m);
    const DType dtype = c.torch_dtype;
    CHECK(m.weights.embed.dtype() == dtype);
    CHECK(m.weights.layers[0].wq.dtype() == dtype);
    CHECK((m.weights.lm_head.raw() == m.weights.embed.raw()) == c.tie_word_embeddings);

    // Values, for the random-weight fixtures: scripts/make_fixtures.py (randomize_) draws
    // norms from U(0.7, 1.3), the final norm from U(3, 5), embeddings from N(0, 0.05) and
    // projections from N(0, 0.1); misread bytes would not land in those ranges.
    if (dir.parent_path() == models) {
      auto in_range = [](const Tensor& t, float lo, float hi) {
        for (int64_t i = 0; i < t.numel(); ++i) {
          if (!(t.data<float>()[i] >= lo && t.data<float>()[i] <= hi)) return false;
        }
        return true;
      };
      auto rms = [](const Tensor& t) {
        REQUIRE(t.dtype() == DType::f32);
        double s2 = 0;
        for (int64_t i = 0; i < t.numel(); ++i) s2 += static_cast<double>(t.data<float>()[i]) * t.data<float>()[i];
        return std::sqrt(s2 / static_cast<double>(t.numel()));
      };
      CHECK(in_range(m.weights.final_norm, 3.0f, 5.0f));
      for (const LayerWeights& l : m.weights.layers) {
        CHECK(in_range(l.attn_norm, 0.7f, 1.3f));
        CHECK(in_range(l.ffn_norm, 0.7f, 1.3f));
        if (l.q_norm.defined()) CHECK(in_range(l.k_norm, 0.7f, 1.3f));
        CHECK(rms(l.w_up) == Approx(0.1).epsilon(0.05));
      }
      CHECK(rms(m.weights.embed) == Approx(0.05).epsilon(0.05));
    }

    // Golden parameter count from transformers, where the index records it.
    if (std::filesystem::exists(dir / "model.safetensors.index.json")) {
      std::ifstream in(dir / "model.safetensors.index.json");
      const json index = json::parse(in);
      if (index.contains("metadata") && index["metadata"].contains("total_parameters")) {
        CHECK(c.parameter_count() == index["metadata"]["total_parameters"].get<int64_t>());
      }
    }
    // f32 checkpoints: the loaded bytes are exactly the checkpoint's tensor bytes.
    if (dtype == DType::f32) {
      const SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(dir);
      size_t file_bytes = 0;
      for (const auto& f : ck.files()) {
        for (const SafetensorsEntry& e : f->entries()) file_bytes += e.end - e.begin;
      }
      CHECK(m.weight_bytes() == file_bytes);
    }
  }
}

TEST_CASE("Model::synthetic from a config.json (synthetic mode with a file)", "[model][weights][synthetic]") {
  const auto path = test::fixtures_dir() / "models" / "tiny-qwen3" / "config.json";
  if (!std::filesystem::exists(path)) return;
  const Model m = Model::synthetic(load_model_config(path), 9, DType::f16);
  CHECK(m.config.arch == ModelArch::qwen3);
  CHECK(m.weights.layers[0].wq.dtype() == DType::f16);
  check_shapes(m);
}

// Timing of the 1B synthetic model; hidden (run with `unit_model "[.slow]"`), as timing
// never decides a test.
TEST_CASE("Model::synthetic llama-1b generation time", "[.slow][model][synthetic]") {
  const auto t0 = std::chrono::steady_clock::now();
  const Model m = Model::synthetic(synthetic_model_config("llama-1b"), 1);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "llama-1b synthetic: " << m.config.parameter_count() << " params, " << m.weight_bytes() << " bytes in "
            << s << " s\n";
  CHECK(m.weight_bytes() > 2'000'000'000u);
}
