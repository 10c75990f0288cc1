/// @file config.h
/// @brief Model hyper-parameters, parsed from a Hugging Face config.json or built from a
/// named synthetic shape.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "hack/core/dtype.h"

namespace hack {

enum class ModelArch { llama, mistral, qwen2, qwen3 };

enum class RopeScalingType { none, linear, llama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;                 // llama3
  float high_freq_factor = 4.0f;                // llama3
  int original_max_position_embeddings = 8192;  // llama3
};

struct ModelConfig {
  ModelArch arch = ModelArch::llama;
  std::string architecture;  ///< as in config.json, e.g. "LlamaForCausalLM"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  ///< given, or hidden_size / num_heads
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  ///< q/k/v projections have biases (Qwen2)
  bool attention_out_bias = false;  ///< o_proj has a bias too (Llama/Qwen3 with attention_bias; not Qwen2)
  bool qk_norm = false;         ///< per-head RMSNorm on q and k before RoPE (Qwen3)
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  DType torch_dtype = DType::f32;  ///< dtype the checkpoint declares

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  int group_size() const { return num_heads / num_kv_heads; }
  /// Number of parameters (embeddings counted once when tied).
  int64_t parameter_count() const;
};

/// Parses config.json text; `source` names the file in errors. Validates every field
/// (positive sizes, heads divisible by kv heads, supported architecture and rope scaling).
ModelConfig parse_model_config(std::string_view json_text, const std::string& source);
/// Reads and parses `path` (a config.json, or a directory holding one); a GGUF file gives the
/// config its metadata stands for (gguf_model_config).
ModelConfig load_model_config(const std::filesystem::path& path);

/// Shape of a named synthetic model: "llama-1b" (Llama 3.2 1B), "llama-3b", "llama-8b"
/// (Llama 3.1 8B), "qwen3-0.6b", "tiny". Throws on an unknown name, listing the names.
ModelConfig synthetic_model_config(std::string_view name);
/// Names accepted by synthetic_model_config.
std::vector<std::string> synthetic_model_names();

const char* model_arch_name(ModelArch arch);

}  // namespace hack
