/// @file generation_config.h
/// @brief generation_config.json beside a model: its EOS ids and default sampling values
/// (vLLM, like transformers, uses both).
#pragma once

#include <filesystem>
#include <optional>
#include <vector>

namespace hack {

struct GenerationConfig {
  std::vector<int> eos_token_ids;
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> repetition_penalty;
};

/// Reads `dir`/generation_config.json; an absent file (or a GGUF file for `dir`) gives an empty config. Malformed JSON
/// or a wrongly typed field throws hack::Error naming the file and field.
GenerationConfig load_generation_config(const std::filesystem::path& dir);

/// The ids that end generation: config.json's eos ids, generation_config.json's, and the
/// tokenizer's EOS (pass -1 when unknown), deduplicated in that order.
std::vector<int> merge_eos_ids(const std::vector<int>& config_eos, const GenerationConfig& gen, int tokenizer_eos);

}  // namespace hack
