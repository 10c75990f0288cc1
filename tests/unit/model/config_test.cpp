#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <random>

#include "hack/core/error.h"
#include "hack/model/config.h"
#include "model_test_util.h"

using namespace hack;
using Catch::Contains;
using json = nlohmann::json;

namespace {

// Published config.json files (Hugging Face hub), verbatim apart from whitespace.
const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

const char* kLlama2_7B = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "tie_word_embeddings": false, "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})";

const char* kLlama31_8B_Instruct = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3", "use_cache": true, "vocab_size": 128256})";

const char* kMistral7B_v03 = R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.42.0.dev0", "use_cache": true, "vocab_size": 32768})";

const char* kQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
  "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
  "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

ModelConfig parse(const json& j) { return parse_model_config(j.dump(), "test/config.json"); }

// A small valid Llama config to mutate in error tests.
json small_llama() {
  return json::parse(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 512})");
}

}  // namespace

TEST_CASE("Llama 3.2 1B config.json", "[model][config]") {
  const ModelConfig c = parse_model_config(kLlama32_1B, "llama/config.json");
  CHECK(c.arch == ModelArch::llama);
  CHECK(c.architecture == "LlamaForCausalLM");
  CHECK(c.vocab_size == 128256);
  CHECK(c.hidden_size == 2048);
  CHECK(c.intermediate_size == 8192);
  CHECK(c.num_layers == 16);
  CHECK(c.num_heads == 32);
  CHECK(c.num_kv_heads == 8);
  CHECK(c.head_dim == 64);
  CHECK(c.group_size() == 4);
  CHECK(c.q_dim() == 2048);
  CHECK(c.kv_dim() == 512);
  CHECK(c.max_position_embeddings == 131072);
  CHECK(c.rms_norm_eps == 1e-5f);
  CHECK(c.rope_theta == 500000.0f);
  CHECK(c.rope_scaling.type == RopeScalingType::llama3);
  CHECK(c.rope_scaling.factor == 32.0f);
  CHECK(c.rope_scaling.low_freq_factor == 1.0f);
  CHECK(c.rope_scaling.high_freq_factor == 4.0f);
  CHECK(c.rope_scaling.original_max_position_embeddings == 8192);
  CHECK(c.tie_word_embeddings);
  CHECK_FALSE(c.attention_bias);
  CHECK_FALSE(c.qk_norm);
  CHECK(c.bos_token_id == 128000);
  CHECK(c.eos_token_ids == std::vector<int>{128001});
  CHECK(c.torch_dtype == DType::bf16);
  // Published parameter count of Llama 3.2 1B (embeddings tied, counted once).
  CHECK(c.parameter_count() == 1235814400);
}

TEST_CASE("Llama 2 config: no head_dim, null rope_scaling, MHA", "[model][config]") {
  const ModelConfig c = parse_model_config(kLlama2_7B, "llama2/config.json");
  CHECK(c.head_dim == 128);  // 4096 / 32
  CHECK(c.num_kv_heads == 32);
  CHECK(c.rope_scaling.type == RopeScalingType::none);
  CHECK(c.rope_theta == 10000.0f);  // absent: transformers' default
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK(c.torch_dtype == DType::f16);
  CHECK(c.parameter_count() == 6738415616);  // Llama-2-7b: 6.74B
}

TEST_CASE("Llama 3.1 8B: eos list, untied, rope factor 8", "[model][config]") {
  const ModelConfig c = parse_model_config(kLlama31_8B_Instruct, "llama31/config.json");
  CHECK(c.eos_token_ids == std::vector<int>{128001, 128008, 128009});
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK(c.rope_scaling.factor == 8.0f);
  CHECK(c.head_dim == 128);
  CHECK(c.parameter_count() == 8030261248);  // published: 8.03B
}

TEST_CASE("defaults follow transformers when fields are absent", "[model][config]") {
  json j = small_llama();
  j.erase("num_key_value_heads");
  j.erase("max_position_embeddings");
  ModelConfig c = parse(j);
  CHECK(c.num_kv_heads == 4);                  // = num_attention_heads
  CHECK(c.head_dim == 16);                     // 64 / 4
  CHECK(c.max_position_embeddings == 2048);    // LlamaConfig
  CHECK(c.rms_norm_eps == 1e-6f);              // LlamaConfig
  CHECK(c.rope_theta == 10000.0f);
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK(c.bos_token_id == -1);
  CHECK(c.eos_token_ids.empty());
  CHECK(c.torch_dtype == DType::f32);

  j["model_type"] = "llama";
  j.erase("architectures");  // model_type alone identifies the family
  CHECK(parse(j).arch == ModelArch::llama);

  j["bos_token_id"] = nullptr;
  j["eos_token_id"] = nullptr;
  j["dtype"] = "float16";  // transformers 5 name
  c = parse(j);
  CHECK(c.bos_token_id == -1);
  CHECK(c.eos_token_ids.empty());
  CHECK(c.torch_dtype == DType::f16);
}

TEST_CASE("Llama attention_bias biases q, k, v and o", "[model][config]") {
  json j = small_llama();
  CHECK_FALSE(parse(j).attention_bias);
  j["attention_bias"] = true;
  const ModelConfig c = parse(j);
  CHECK(c.attention_bias);
  CHECK(c.attention_out_bias);
  CHECK(c.parameter_count() == 107200);  // transformers LlamaConfig(..., attention_bias=True)
  j["architectures"] = {"MistralForCausalLM"};  // MistralAttention has no biases at all
  CHECK_FALSE(parse(j).attention_bias);
}

TEST_CASE("rope scaling: legacy 'type', linear, default, transformers 5 rope_parameters", "[model][config]") {
  json j = small_llama();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  ModelConfig c = parse(j);
  CHECK(c.rope_scaling.type == RopeScalingType::linear);
  CHECK(c.rope_scaling.factor == 2.0f);

  j["rope_scaling"] = {{"rope_type", "default"}};
  CHECK(parse(j).rope_scaling.type == RopeScalingType::none);

  // transformers 5 writes rope_theta inside rope_parameters.
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}};
  c = parse(j);
  CHECK(c.rope_theta == 500000.0f);
  CHECK(c.rope_scaling.type == RopeScalingType::llama3);
  CHECK(c.rope_scaling.factor == 8.0f);
  // original_max_position_embeddings absent: transformers uses max_position_embeddings.
  CHECK(c.rope_scaling.original_max_position_embeddings == 512);

  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  j["rope_theta"] = 10.0;  // the dict wins over the top-level field
  c = parse(j);
  CHECK(c.rope_theta == 1e6f);
  CHECK(c.rope_scaling.type == RopeScalingType::none);
}

TEST_CASE("Mistral: sliding window accepted only when it never binds", "[model][config]") {
  ModelConfig c = parse_model_config(kMistral7B_v03, "mistral/config.json");
  CHECK(c.arch == ModelArch::mistral);
  CHECK(c.head_dim == 128);
  CHECK(c.rope_theta == 1e6f);
  CHECK_FALSE(c.attention_bias);

  json j = json::parse(kMistral7B_v03);
  j["sliding_window"] = 32768;
  CHECK(parse(j).max_position_embeddings == 32768);

  j["sliding_window"] = 4096;  // Mistral 7B v0.1
  REQUIRE_THROWS_WITH(parse(j), Contains("test/config.json") && Contains("sliding_window") &&
                                    Contains("sliding-window attention is unsupported"));
  j.erase("sliding_window");  // MistralConfig's default is 4096
  REQUIRE_THROWS_WITH(parse(j), Contains("sliding-window attention is unsupported"));
}

TEST_CASE("Qwen2: q/k/v biases always, sliding window only with use_sliding_window", "[model][config]") {
  const ModelConfig c = parse_model_config(kQwen25_05B, "qwen2/config.json");
  CHECK(c.arch == ModelArch::qwen2);
  CHECK(c.attention_bias);
  CHECK_FALSE(c.attention_out_bias);  // Qwen2Attention: o_proj has none
  CHECK_FALSE(c.qk_norm);
  CHECK(c.head_dim == 64);  // 896 / 14
  CHECK(c.num_kv_heads == 2);
  CHECK(c.tie_word_embeddings);
  CHECK(c.rms_norm_eps == 1e-6f);
  CHECK(c.parameter_count() == 494032768);  // Qwen2.5-0.5B: 0.49B

  json j = json::parse(kQwen25_05B);
  j["sliding_window"] = 4096;  // ignored while use_sliding_window is false
  CHECK(parse(j).arch == ModelArch::qwen2);
  j["use_sliding_window"] = true;
  REQUIRE_THROWS_WITH(parse(j), Contains("sliding-window attention is unsupported"));
}

TEST_CASE("Qwen3: qk_norm, attention_bias honoured, head_dim default 128", "[model][config]") {
  const ModelConfig c = parse_model_config(kQwen3_06B, "qwen3/config.json");
  CHECK(c.arch == ModelArch::qwen3);
  CHECK(c.qk_norm);
  CHECK_FALSE(c.attention_bias);
  CHECK(c.head_dim == 128);
  CHECK(c.q_dim() == 2048);  // != hidden_size 1024
  CHECK(c.max_position_embeddings == 40960);
  CHECK(c.eos_token_ids == std::vector<int>{151645});
  CHECK(c.parameter_count() == 596049920);  // Qwen3-0.6B: 0.6B (0.44B non-embedding)

  json j = json::parse(kQwen3_06B);
  j["attention_bias"] = true;
  CHECK(parse(j).attention_bias);
  CHECK(parse(j).attention_out_bias);  // Qwen3Attention biases o_proj too
  CHECK(parse(j).parameter_count() == 596193280);  // transformers, attention_bias=True
  j.erase("head_dim");
  j["hidden_size"] = 512;
  CHECK(parse(j).head_dim == 128);  // Qwen3Config default, not 512 / 16
}

TEST_CASE("config errors name the file and the field", "[model][config]") {
  const std::string file = "test/config.json";
  SECTION("bad JSON") {
    REQUIRE_THROWS_WITH(parse_model_config("{\"vocab_size\": 12,", file), Contains(file) && Contains("invalid JSON"));
    REQUIRE_THROWS_WITH(parse_model_config("[1, 2]", file), Contains(file) && Contains("object"));
  }
  SECTION("unsupported architecture") {
    json j = small_llama();
    j["architectures"] = {"GPT2LMHeadModel"};
    REQUIRE_THROWS_WITH(parse(j), Contains(file) && Contains("GPT2LMHeadModel") && Contains("LlamaForCausalLM"));
    j.erase("architectures");
    REQUIRE_THROWS_WITH(parse(j), Contains(file) && Contains("architectures"));
    j["model_type"] = "gpt2";
    REQUIRE_THROWS_WITH(parse(j), Contains("gpt2"));
    j["architectures"] = "LlamaForCausalLM";  // not a list
    REQUIRE_THROWS_WITH(parse(j), Contains("'architectures'"));
  }
  SECTION("missing required field") {
    for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads"}) {
      json j = small_llama();
      j.erase(field);
      INFO(field);
      REQUIRE_THROWS_WITH(parse(j), Contains(file) && Contains("missing required field") && Contains(field));
    }
  }
  SECTION("wrong types") {
    json j = small_llama();
    j["hidden_size"] = "64";
    REQUIRE_THROWS_WITH(parse(j), Contains(file) && Contains("'hidden_size'") && Contains("integer"));
    j = small_llama();
    j["hidden_size"] = 64.5;
    REQUIRE_THROWS_WITH(parse(j), Contains("'hidden_size'") && Contains("integer"));
    j = small_llama();
    j["rms_norm_eps"] = "1e-5";
    REQUIRE_THROWS_WITH(parse(j), Contains("'rms_norm_eps'") && Contains("number"));
    j = small_llama();
    j["tie_word_embeddings"] = 1;
    REQUIRE_THROWS_WITH(parse(j), Contains("'tie_word_embeddings'") && Contains("boolean"));
    j = small_llama();
    j["eos_token_id"] = {1, "two"};
    REQUIRE_THROWS_WITH(parse(j), Contains("'eos_token_id'"));
    j = small_llama();
    j["rope_scaling"] = "llama3";
    REQUIRE_THROWS_WITH(parse(j), Contains("'rope_scaling'"));
    j = small_llama();
    j["torch_dtype"] = "float8_e4m3fn";
    REQUIRE_THROWS_WITH(parse(j), Contains("'torch_dtype'") && Contains("float8_e4m3fn"));
    j = small_llama();
    j["num_hidden_layers"] = 1e12;
    REQUIRE_THROWS_WITH(parse(j), Contains("'num_hidden_layers'") && Contains("out of range"));
  }
  SECTION("nonsense values") {
    json j = small_llama();
    j["num_key_value_heads"] = 3;
    REQUIRE_THROWS_WITH(parse(j), Contains(file) && Contains("num_key_value_heads") && Contains("divide"));
    for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "num_key_value_heads", "max_position_embeddings"}) {
      j = small_llama();
      j[field] = 0;
      INFO(field);
      REQUIRE_THROWS_WITH(parse(j), Contains(field) && Contains("must be > 0, got 0"));
    }
    j = small_llama();
    j["hidden_size"] = 66;  // not divisible by 4 heads, no head_dim
    REQUIRE_THROWS_WITH(parse(j), Contains("hidden_size") && Contains("head_dim"));
    j["head_dim"] = 15;
    REQUIRE_THROWS_WITH(parse(j), Contains("head_dim") && Contains("even"));
    j = small_llama();
    j["rms_norm_eps"] = -1.0;
    REQUIRE_THROWS_WITH(parse(j), Contains("rms_norm_eps"));
    j = small_llama();
    j["rope_theta"] = 0;
    REQUIRE_THROWS_WITH(parse(j), Contains("rope_theta"));
    j = small_llama();
    j["bos_token_id"] = -5;
    REQUIRE_THROWS_WITH(parse(j), Contains("bos_token_id"));
  }
  SECTION("unsupported rope scaling") {
    for (const char* type : {"yarn", "dynamic", "longrope"}) {
      json j = small_llama();
      j["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}};
      INFO(type);
      REQUIRE_THROWS_WITH(parse(j), Contains(file) && Contains("unsupported rope_scaling type") && Contains(type));
    }
    json j = small_llama();
    j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};  // legacy key
    REQUIRE_THROWS_WITH(parse(j), Contains("unsupported rope_scaling type 'dynamic'"));
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}};
    REQUIRE_THROWS_WITH(parse(j), Contains("missing required field 'rope_scaling.high_freq_factor'"));
    j["rope_scaling"] = {{"rope_type", "linear"}};
    REQUIRE_THROWS_WITH(parse(j), Contains("'rope_scaling.factor'"));
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -2.0}};
    REQUIRE_THROWS_WITH(parse(j), Contains("'rope_scaling.factor'") && Contains("> 0"));
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0}, {"high_freq_factor", 4.0}};
    REQUIRE_THROWS_WITH(parse(j), Contains("high_freq_factor"));
    j["rope_scaling"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
    REQUIRE_THROWS_WITH(parse(j), Contains("partial_rotary_factor"));
  }
  SECTION("unsupported features") {
    json j = small_llama();
    j["mlp_bias"] = true;
    REQUIRE_THROWS_WITH(parse(j), Contains("mlp_bias"));
    j = small_llama();
    j["hidden_act"] = "gelu";
    REQUIRE_THROWS_WITH(parse(j), Contains("hidden_act") && Contains("gelu"));
  }
}

TEST_CASE("load_model_config reads a file or a directory", "[model][config]") {
  test::TempDir dir;
  REQUIRE_THROWS_WITH(load_model_config(dir / "config.json"), Contains("config.json") && Contains("cannot read"));
  test::write_text(dir / "config.json", small_llama().dump());
  CHECK(load_model_config(dir / "config.json").hidden_size == 64);
  CHECK(load_model_config(dir.path()).hidden_size == 64);
  test::write_text(dir / "config.json", "{\"hidden_size\": }");
  REQUIRE_THROWS_WITH(load_model_config(dir.path()), Contains((dir / "config.json").string()) &&
                                                         Contains("invalid JSON"));
}

TEST_CASE("synthetic presets have the published shapes", "[model][config]") {
  // Each preset equals the published config.json it copies (eos aside: the presets carry
  // the instruct models' eos list).
  ModelConfig published = parse_model_config(kLlama32_1B, "llama/config.json");
  ModelConfig preset = synthetic_model_config("llama-1b");
  CHECK(preset.hidden_size == published.hidden_size);
  CHECK(preset.intermediate_size == published.intermediate_size);
  CHECK(preset.num_layers == published.num_layers);
  CHECK(preset.num_heads == published.num_heads);
  CHECK(preset.num_kv_heads == published.num_kv_heads);
  CHECK(preset.head_dim == published.head_dim);
  CHECK(preset.vocab_size == published.vocab_size);
  CHECK(preset.tie_word_embeddings == published.tie_word_embeddings);
  CHECK(preset.rope_theta == published.rope_theta);
  CHECK(preset.rope_scaling.type == RopeScalingType::llama3);
  CHECK(preset.rope_scaling.factor == 32.0f);
  CHECK(preset.parameter_count() == published.parameter_count());

  CHECK(synthetic_model_config("llama-8b").parameter_count() ==
        parse_model_config(kLlama31_8B_Instruct, "x").parameter_count());
  CHECK(synthetic_model_config("llama-3b").parameter_count() == 3212749824);  // Llama 3.2 3B: 3.21B
  const ModelConfig q = synthetic_model_config("qwen3-0.6b");
  CHECK(q.parameter_count() == parse_model_config(kQwen3_06B, "x").parameter_count());
  CHECK(q.qk_norm);
  const ModelConfig tiny = synthetic_model_config("tiny");
  CHECK(tiny.vocab_size == 4096);
  CHECK(tiny.parameter_count() < 2'000'000);

  const std::vector<std::string> names = synthetic_model_names();
  CHECK(names.size() == 5);
  for (const std::string& n : names) CHECK_NOTHROW(synthetic_model_config(n));
  REQUIRE_THROWS_WITH(synthetic_model_config("gpt-5"), Contains("gpt-5") && Contains("llama-1b") && Contains("tiny"));
  CHECK(std::string(model_arch_name(ModelArch::qwen3)) == "qwen3");
}

TEST_CASE("config: corrupted text gives hack::Error or a valid config", "[model][config]") {
  const std::string good = kLlama32_1B;
  const uint64_t seed = 77;
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  int ok = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string t = good;
    for (int e = 0; e < 1 + static_cast<int>(rng() % 3); ++e) {
      const char alphabet[] = "0123456789-.eE[]{},:\" nul";
      t[rng() % t.size()] = alphabet[rng() % (sizeof(alphabet) - 1)];
    }
    try {
      const ModelConfig c = parse_model_config(t, "fuzz.json");
      REQUIRE(c.num_heads % c.num_kv_heads == 0);
      REQUIRE(c.head_dim > 0);
      ++ok;
    } catch (const Error&) {
      ++rejected;
    }
  }
  CHECK(ok > 0);
  CHECK(rejected > 0);
}
