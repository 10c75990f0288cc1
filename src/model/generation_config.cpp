#include "hack/model/generation_config.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hack/core/error.h"
#include "hack/core/gguf_file.h"
#include "hack/core/read_file.h"

namespace hack {

GenerationConfig load_generation_config(const std::filesystem::path& dir) {
  GenerationConfig g;
  if (is_gguf_file(dir)) return g;  // a GGUF has none: its eos id is in the model config
  const auto path = dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return g;
  const std::string text = read_file(path, "generation config");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed JSON: {}", path.string(), e.what());
  }
  HACK_CHECK(j.is_object(), "{}: expected a JSON object", path.string());
  auto field_error = [&](const char* name, const char* want) {
    fail("{}: field '{}' must be {}", path.string(), name, want);
  };
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const auto& e = j["eos_token_id"];
    if (e.is_number_integer()) {
      g.eos_token_ids.push_back(e.get<int>());
    } else if (e.is_array()) {
      for (const auto& x : e) {
        if (!x.is_number_integer()) field_error("eos_token_id", "an integer or a list of integers");
        g.eos_token_ids.push_back(x.get<int>());
      }
    } else {
      field_error("eos_token_id", "an integer or a list of integers");
    }
  }
  auto opt_float = [&](const char* name, std::optional<float>& out) {
    if (!j.contains(name) || j[name].is_null()) return;
    if (!j[name].is_number()) field_error(name, "a number");
    out = j[name].get<float>();
  };
  opt_float("temperature", g.temperature);
  opt_float("top_p", g.top_p);
  opt_float("repetition_penalty", g.repetition_penalty);
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    if (!j["top_k"].is_number_integer()) field_error("top_k", "an integer");
    g.top_k = j["top_k"].get<int>();
  }
  return g;
}

std::vector<int> merge_eos_ids(const std::vector<int>& config_eos, const GenerationConfig& gen, int tokenizer_eos) {
  std::vector<int> out;
  auto add = [&](int id) {
    if (id >= 0 && std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  for (int id : config_eos) add(id);
  for (int id : gen.eos_token_ids) add(id);
  add(tokenizer_eos);
  return out;
}

}  // namespace hack
