// Loading the tokenizers the goldens were made from (scripts/make_tokenizer_goldens.py),
// including the patched variants, and printing strings readably in failure messages.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hack/core/read_file.h"
#include "hack/tokenizer/tokenizer.h"
#include "support/test_support.h"

namespace hack::test {


inline std::filesystem::path golden_dir() { return fixtures_dir() / "tokenizers" / "goldens"; }

/// "shared:tokenizers/qwen3" or "repo:tests/fixtures/..." -> directory.
inline std::filesystem::path resolve_source(const std::string& source) {
  const size_t colon = source.find(':');
  const std::string kind = source.substr(0, colon), rel = source.substr(colon + 1);
  return kind == "shared" ? shared_fixtures_dir() / rel : source_dir() / rel;
}

/// The tokenizer a golden file describes: its source directory, with the patch applied.
inline Tokenizer load_golden_tokenizer(const nlohmann::json& golden) {
  const std::filesystem::path dir = resolve_source(golden.at("source").get<std::string>());
  if (!golden.contains("patch")) return Tokenizer::load(dir);
  nlohmann::json tok = nlohmann::json::parse(read_file(dir / "tokenizer.json", "fixture"));
  nlohmann::json config = std::filesystem::exists(dir / "tokenizer_config.json")
                              ? nlohmann::json::parse(read_file(dir / "tokenizer_config.json", "fixture"))
                              : nlohmann::json::object();
  for (const auto& [key, value] : golden["patch"].items()) {
    if (key == "added_tokens_extra") {
      for (const auto& t : value) tok["added_tokens"].push_back(t);
    } else if (key == "model_extra") {
      for (const auto& [k, v] : value.items()) tok["model"][k] = v;
    } else if (key == "config_patch") {
      for (const auto& [k, v] : value.items()) {
        if (v.is_null()) {
          config.erase(k);
        } else {
          config[k] = v;
        }
      }
    } else {
      tok[key] = value;
    }
  }
  return Tokenizer::from_json(tok.dump(), config.dump(), golden.at("name").get<std::string>());
}

/// Printable form of a string: JSON-escaped, shortened.
inline std::string show(const std::string& s, size_t max = 160) {
  std::string j = nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (j.size() > max) j = j.substr(0, max) + "...";
  return j;
}

inline std::string show_ids(const std::vector<int>& ids, size_t max = 40) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size() && i < max; ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  if (ids.size() > max) out += ",...";
  return out + "] (" + std::to_string(ids.size()) + ")";
}

/// Feeds ids one by one; returns the concatenated output including finish().
inline std::string incremental_decode(const Tokenizer& t, const std::vector<int>& ids, bool skip_special) {
  IncrementalDecoder d(t, skip_special);
  std::string out;
  for (int id : ids) out += d.step(id);
  out += d.finish();
  return out;
}

}  // namespace hack::test
