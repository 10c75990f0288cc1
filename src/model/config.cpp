// config.json parsing for the Llama family (Llama 2/3/3.1/3.2, Mistral, Qwen2, Qwen3) and
// the named synthetic shapes.
//
// Defaults follow the transformers configuration classes (LlamaConfig, MistralConfig,
// Qwen2Config, Qwen3Config of transformers 5), so a config.json that omits a field means
// what it means to Hugging Face:
//   rms_norm_eps 1e-6, rope_theta 10000, tie_word_embeddings false (all four);
//   max_position_embeddings 2048 (llama), 131072 (mistral), 32768 (qwen2, qwen3);
//   head_dim hidden / heads, except Qwen3 where it defaults to 128;
//   sliding_window 4096 for Mistral; Qwen2/Qwen3 use it only when use_sliding_window.
// Rope parameters come from `rope_scaling` (transformers 4) or `rope_parameters`
// (transformers 5, which also carries rope_theta); rope_scaling wins when both are set,
// as in PreTrainedConfig.convert_rope_params_to_dict.
#include "hack/model/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "hack/core/error.h"
#include "hack/core/read_file.h"
#include "hack/model/gguf_weights.h"

namespace hack {

namespace {

using json = nlohmann::json;

const char* json_type_name(const json& v) {
  if (v.is_number_integer()) return "integer";
  return v.type_name();
}

// Typed access to the fields of one JSON object; every error names the file and the field.
class FieldReader {
 public:
  FieldReader(const json& object, const std::string& source, std::string prefix = "")
      : object_(object), source_(source), prefix_(std::move(prefix)) {}

  bool has(const char* key) const {
    auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }

  const json& at(const char* key) const { return object_.at(key); }

  int require_int(const char* key) const {
    if (!has(key)) fail("{}: missing required field '{}{}'", source_, prefix_, key);
    return to_int(key, object_.at(key));
  }
  std::optional<int> optional_int(const char* key) const {
    if (!has(key)) return std::nullopt;
    return to_int(key, object_.at(key));
  }
  int int_or(const char* key, int fallback) const { return optional_int(key).value_or(fallback); }

  float require_float(const char* key) const {
    if (!has(key)) fail("{}: missing required field '{}{}'", source_, prefix_, key);
    return to_float(key, object_.at(key));
  }
  std::optional<float> optional_float(const char* key) const {
    if (!has(key)) return std::nullopt;
    return to_float(key, object_.at(key));
  }
  float float_or(const char* key, float fallback) const { return optional_float(key).value_or(fallback); }

  bool bool_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = object_.at(key);
    if (!v.is_boolean()) type_error(key, "a boolean", v);
    return v.get<bool>();
  }

  std::optional<std::string> optional_string(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = object_.at(key);
    if (!v.is_string()) type_error(key, "a string", v);
    return v.get<std::string>();
  }

  [[noreturn]] void type_error(const char* key, const char* expected, const json& v) const {
    fail("{}: field '{}{}' must be {}, got {} {}", source_, prefix_, key, expected, json_type_name(v), v.dump());
  }
  [[noreturn]] void value_error(const char* key, const std::string& what) const {
    fail("{}: field '{}{}' {}", source_, prefix_, key, what);
  }

  int to_int(const char* key, const json& v) const {
    int64_t x = 0;
    if (v.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        value_error(key, fmt::format("is out of range: {}", v.dump()));
      }
      x = v.get<int64_t>();
    } else if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!(std::floor(d) == d)) type_error(key, "an integer", v);
      if (std::fabs(d) > 9.0e18) value_error(key, fmt::format("is out of range: {}", v.dump()));
      x = static_cast<int64_t>(d);
    } else {
      type_error(key, "an integer", v);
    }
    if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) {
      value_error(key, fmt::format("is out of range: {}", x));
    }
    return static_cast<int>(x);
  }
  float to_float(const char* key, const json& v) const {
    if (!v.is_number()) type_error(key, "a number", v);
    return static_cast<float>(v.get<double>());
  }

  const std::string& source() const { return source_; }

 private:
  const json& object_;
  const std::string& source_;
  std::string prefix_;
};

struct ArchInfo {
  const char* hf_name;
  const char* model_type;
  ModelArch arch;
  int default_max_position_embeddings;
};

constexpr ArchInfo kArchs[] = {
    {"LlamaForCausalLM", "llama", ModelArch::llama, 2048},
    {"MistralForCausalLM", "mistral", ModelArch::mistral, 131072},
    {"Qwen2ForCausalLM", "qwen2", ModelArch::qwen2, 32768},
    {"Qwen3ForCausalLM", "qwen3", ModelArch::qwen3, 32768},
};

std::string supported_arch_list() {
  std::string s;
  for (const ArchInfo& a : kArchs) {
    if (!s.empty()) s += ", ";
    s += a.hf_name;
  }
  return s;
}

const ArchInfo& find_arch(const FieldReader& f, const json& root) {
  if (f.has("architectures")) {
    const json& archs = root.at("architectures");
    if (!archs.is_array() || archs.empty() || !archs.front().is_string()) {
      f.type_error("architectures", "a non-empty list of strings", archs);
    }
    const std::string name = archs.front().get<std::string>();
    for (const ArchInfo& a : kArchs) {
      if (name == a.hf_name) return a;
    }
    fail("{}: unsupported architecture '{}' in field 'architectures' (supported: {})", f.source(), name,
         supported_arch_list());
  }
  // No architectures list: fall back to model_type, as AutoModelForCausalLM would.
  if (const auto model_type = f.optional_string("model_type")) {
    for (const ArchInfo& a : kArchs) {
      if (*model_type == a.model_type) return a;
    }
    fail("{}: unsupported model_type '{}' and no 'architectures' field (supported: {})", f.source(), *model_type,
         supported_arch_list());
  }
  fail("{}: missing required field 'architectures' (or 'model_type')", f.source());
}

DType parse_torch_dtype(const FieldReader& f) {
  const char* key = f.has("torch_dtype") ? "torch_dtype" : "dtype";
  const auto name = f.optional_string(key);
  if (!name) return DType::f32;  // transformers' default when a checkpoint says nothing
  if (*name == "float32") return DType::f32;
  if (*name == "float16") return DType::f16;
  if (*name == "bfloat16") return DType::bf16;
  f.value_error(key, fmt::format("has unsupported dtype '{}' (supported: float32, float16, bfloat16)", *name));
}

// Reads rope scaling and theta into `c` (needs c.max_position_embeddings already set).
void parse_rope(const FieldReader& f, const json& root, ModelConfig& c) {
  const char* dict_key = nullptr;
  if (f.has("rope_scaling")) {
    dict_key = "rope_scaling";
  } else if (f.has("rope_parameters")) {
    dict_key = "rope_parameters";
  }
  c.rope_theta = f.float_or("rope_theta", 10000.0f);
  c.rope_scaling = RopeScaling{};
  if (dict_key == nullptr) return;

  const json& dict = root.at(dict_key);
  if (!dict.is_object()) f.type_error(dict_key, "an object or null", dict);
  for (const auto& [k, v] : dict.items()) {
    if (v.is_object()) {
      fail("{}: field '{}' has per-layer-type rope parameters ('{}'), which are unsupported", f.source(), dict_key, k);
    }
  }
  const FieldReader r(dict, f.source(), std::string(dict_key) + ".");
  if (const auto theta = r.optional_float("rope_theta")) c.rope_theta = *theta;
  if (const auto partial = r.optional_float("partial_rotary_factor"); partial && *partial != 1.0f) {
    r.value_error("partial_rotary_factor", fmt::format("is {}; only full rotary embeddings (1.0) are supported", *partial));
  }

  const char* type_key = r.has("rope_type") ? "rope_type" : "type";
  const std::string type = r.optional_string(type_key).value_or("default");
  if (type == "default") return;
  if (type == "linear") {
    c.rope_scaling.type = RopeScalingType::linear;
    c.rope_scaling.factor = r.require_float("factor");
  } else if (type == "llama3") {
    c.rope_scaling.type = RopeScalingType::llama3;
    c.rope_scaling.factor = r.require_float("factor");
    c.rope_scaling.low_freq_factor = r.require_float("low_freq_factor");
    c.rope_scaling.high_freq_factor = r.require_float("high_freq_factor");
    c.rope_scaling.original_max_position_embeddings =
        r.int_or("original_max_position_embeddings", c.max_position_embeddings);
    if (!(c.rope_scaling.low_freq_factor > 0)) {
      r.value_error("low_freq_factor", fmt::format("must be > 0, got {}", c.rope_scaling.low_freq_factor));
    }
    if (!(c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor)) {
      r.value_error("high_freq_factor", fmt::format("must be > low_freq_factor ({}), got {}",
                                                    c.rope_scaling.low_freq_factor, c.rope_scaling.high_freq_factor));
    }
    if (c.rope_scaling.original_max_position_embeddings <= 0) {
      r.value_error("original_max_position_embeddings",
                    fmt::format("must be > 0, got {}", c.rope_scaling.original_max_position_embeddings));
    }
  } else {
    fail("{}: unsupported rope_scaling type '{}' in field '{}.{}' (supported: default, linear, llama3)", f.source(),
         type, dict_key, type_key);
  }
  if (!(c.rope_scaling.factor > 0) || !std::isfinite(c.rope_scaling.factor)) {
    r.value_error("factor", fmt::format("must be > 0, got {}", c.rope_scaling.factor));
  }
}

// Sliding-window attention is not implemented: accept only configs where the window never
// binds (null, disabled, or at least the context length).
void check_sliding_window(const FieldReader& f, const json& root, const ModelConfig& c) {
  std::optional<int> window;
  if (c.arch == ModelArch::mistral) {
    window = root.contains("sliding_window") ? f.optional_int("sliding_window") : std::optional<int>(4096);
  } else if (c.arch == ModelArch::qwen2 || c.arch == ModelArch::qwen3) {
    if (f.bool_or("use_sliding_window", false)) window = f.optional_int("sliding_window").value_or(4096);
  }
  if (window && *window < c.max_position_embeddings) {
    fail("{}: field 'sliding_window' is {} (< max_position_embeddings {}); sliding-window attention is unsupported",
         f.source(), *window, c.max_position_embeddings);
  }
  if (f.has("layer_types")) {
    const json& types = root.at("layer_types");
    if (!types.is_array()) f.type_error("layer_types", "a list of strings", types);
    for (const json& t : types) {
      if (!t.is_string()) f.type_error("layer_types", "a list of strings", types);
      const std::string s = t.get<std::string>();
      if (s != "full_attention" && !(s == "sliding_attention" && !window)) {
        fail("{}: field 'layer_types' contains '{}'; only full attention is supported", f.source(), s);
      }
    }
  }
}

std::vector<int> parse_eos(const FieldReader& f, const json& root) {
  std::vector<int> ids;
  if (!f.has("eos_token_id")) return ids;
  const json& v = root.at("eos_token_id");
  if (v.is_array()) {
    for (const json& e : v) ids.push_back(f.to_int("eos_token_id", e));
  } else {
    ids.push_back(f.to_int("eos_token_id", v));
  }
  for (int id : ids) {
    if (id < 0) f.value_error("eos_token_id", fmt::format("must be >= 0, got {}", id));
  }
  return ids;
}

void require_positive(const FieldReader& f, const char* field, int value) {
  if (value <= 0) f.value_error(field, fmt::format("must be > 0, got {}", value));
}

}  // namespace

ModelConfig parse_model_config(std::string_view json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", source, e.what());
  }
  if (!root.is_object()) fail("{}: expected a JSON object, got {}", source, json_type_name(root));
  const FieldReader f(root, source);

  ModelConfig c;
  const ArchInfo& arch = find_arch(f, root);
  c.arch = arch.arch;
  c.architecture = arch.hf_name;

  c.vocab_size = f.require_int("vocab_size");
  c.hidden_size = f.require_int("hidden_size");
  c.intermediate_size = f.require_int("intermediate_size");
  c.num_layers = f.require_int("num_hidden_layers");
  c.num_heads = f.require_int("num_attention_heads");
  require_positive(f, "vocab_size", c.vocab_size);
  require_positive(f, "hidden_size", c.hidden_size);
  require_positive(f, "intermediate_size", c.intermediate_size);
  require_positive(f, "num_hidden_layers", c.num_layers);
  require_positive(f, "num_attention_heads", c.num_heads);

  c.num_kv_heads = f.int_or("num_key_value_heads", c.num_heads);
  require_positive(f, "num_key_value_heads", c.num_kv_heads);
  if (c.num_heads % c.num_kv_heads != 0) {
    f.value_error("num_key_value_heads", fmt::format("({}) must divide num_attention_heads ({})", c.num_kv_heads,
                                                     c.num_heads));
  }
  if (f.has("head_dim")) {
    c.head_dim = f.require_int("head_dim");
  } else if (c.arch == ModelArch::qwen3) {
    c.head_dim = 128;  // Qwen3Config's default; not derived from hidden_size
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      f.value_error("hidden_size", fmt::format("({}) is not divisible by num_attention_heads ({}) and no head_dim is "
                                               "given", c.hidden_size, c.num_heads));
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  require_positive(f, "head_dim", c.head_dim);
  if (c.head_dim % 2 != 0) f.value_error("head_dim", fmt::format("must be even for RoPE, got {}", c.head_dim));

  c.max_position_embeddings = f.int_or("max_position_embeddings", arch.default_max_position_embeddings);
  require_positive(f, "max_position_embeddings", c.max_position_embeddings);

  c.rms_norm_eps = f.float_or("rms_norm_eps", 1e-6f);
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps)) {
    f.value_error("rms_norm_eps", fmt::format("must be > 0, got {}", c.rms_norm_eps));
  }
  parse_rope(f, root, c);
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) {
    f.value_error("rope_theta", fmt::format("must be > 0, got {}", c.rope_theta));
  }
  check_sliding_window(f, root, c);

  c.tie_word_embeddings = f.bool_or("tie_word_embeddings", false);
  switch (c.arch) {
    case ModelArch::llama:
      // LlamaAttention's attention_bias covers o_proj as well as q/k/v (so does Qwen3's).
      c.attention_bias = f.bool_or("attention_bias", false);
      c.attention_out_bias = c.attention_bias;
      if (f.bool_or("mlp_bias", false)) f.value_error("mlp_bias", "is true; MLP biases are unsupported");
      break;
    case ModelArch::mistral: c.attention_bias = false; break;  // MistralAttention has no biases
    case ModelArch::qwen2: c.attention_bias = true; break;     // Qwen2Attention: q/k/v always biased
    case ModelArch::qwen3:
      c.attention_bias = f.bool_or("attention_bias", false);
      c.attention_out_bias = c.attention_bias;
      c.qk_norm = true;
      break;
  }
  if (const auto act = f.optional_string("hidden_act"); act && *act != "silu") {
    f.value_error("hidden_act", fmt::format("is '{}'; only 'silu' is supported", *act));
  }

  c.bos_token_id = f.int_or("bos_token_id", -1);
  if (f.has("bos_token_id") && c.bos_token_id < 0) {
    f.value_error("bos_token_id", fmt::format("must be >= 0, got {}", c.bos_token_id));
  }
  c.eos_token_ids = parse_eos(f, root);
  c.torch_dtype = parse_torch_dtype(f);
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& path) {
  if (is_gguf_file(path)) return gguf_model_config(GgufFile::open(path));
  const std::filesystem::path file = std::filesystem::is_directory(path) ? path / "config.json" : path;
  return parse_model_config(read_file(file, "model config"), file.string());
}

int64_t ModelConfig::parameter_count() const {
  const int64_t h = hidden_size, q = q_dim(), kv = kv_dim(), ffn = intermediate_size;
  int64_t layer = 2 * h                     // input and post-attention norms
                  + q * h + 2 * kv * h + h * q  // q, k, v, o
                  + 3 * ffn * h;            // gate, up, down
  if (attention_bias) layer += q + 2 * kv;
  if (attention_out_bias) layer += h;
  if (qk_norm) layer += 2 * static_cast<int64_t>(head_dim);
  const int64_t embed = static_cast<int64_t>(vocab_size) * h;
  return embed + num_layers * layer + h + (tie_word_embeddings ? 0 : embed);
}

const char* model_arch_name(ModelArch arch) {
  switch (arch) {
    case ModelArch::llama: return "llama";
    case ModelArch::mistral: return "mistral";
    case ModelArch::qwen2: return "qwen2";
    case ModelArch::qwen3: return "qwen3";
  }
  return "?";
}

namespace {

ModelConfig llama3_shape(int hidden, int ffn, int layers, int heads, int kv_heads, int head_dim, bool tied,
                         float rope_factor) {
  ModelConfig c;
  c.arch = ModelArch::llama;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 128256;
  c.hidden_size = hidden;
  c.intermediate_size = ffn;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 500000.0f;
  c.rope_scaling = RopeScaling{RopeScalingType::llama3, rope_factor, 1.0f, 4.0f, 8192};
  c.tie_word_embeddings = tied;
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001, 128008, 128009};
  c.torch_dtype = DType::bf16;
  return c;
}

}  // namespace

ModelConfig synthetic_model_config(std::string_view name) {
  // Shapes copied from the published config.json files.
  if (name == "llama-1b") return llama3_shape(2048, 8192, 16, 32, 8, 64, true, 32.0f);   // Llama-3.2-1B
  if (name == "llama-3b") return llama3_shape(3072, 8192, 28, 24, 8, 128, true, 32.0f);  // Llama-3.2-3B
  if (name == "llama-8b") return llama3_shape(4096, 14336, 32, 32, 8, 128, false, 8.0f); // Llama-3.1-8B
  if (name == "qwen3-0.6b") {  // Qwen3-0.6B
    ModelConfig c;
    c.arch = ModelArch::qwen3;
    c.architecture = "Qwen3ForCausalLM";
    c.vocab_size = 151936;
    c.hidden_size = 1024;
    c.intermediate_size = 3072;
    c.num_layers = 28;
    c.num_heads = 16;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.max_position_embeddings = 40960;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 1000000.0f;
    c.tie_word_embeddings = true;
    c.qk_norm = true;
    c.bos_token_id = 151643;
    c.eos_token_ids = {151645};
    c.torch_dtype = DType::bf16;
    return c;
  }
  if (name == "tiny") {
    // Matches the KJV fixture tokenizer (tests/fixtures/tokenizers/kjv-bpe): vocab 4096,
    // bos <|begin_of_text|> = 4091, eos <|end_of_text|> = 4092.
    ModelConfig c;
    c.arch = ModelArch::llama;
    c.architecture = "LlamaForCausalLM";
    c.vocab_size = 4096;
    c.hidden_size = 128;
    c.intermediate_size = 256;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 32;
    c.max_position_embeddings = 1024;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.tie_word_embeddings = false;
    c.bos_token_id = 4091;
    c.eos_token_ids = {4092};
    c.torch_dtype = DType::f32;
    return c;
  }
  std::string names;
  for (const std::string& n : synthetic_model_names()) names += (names.empty() ? "" : ", ") + n;
  fail("unknown synthetic model '{}' (known: {})", name, names);
}

std::vector<std::string> synthetic_model_names() { return {"llama-1b", "llama-3b", "llama-8b", "qwen3-0.6b", "tiny"}; }

}  // namespace hack
