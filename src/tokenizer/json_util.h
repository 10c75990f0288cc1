// Typed access to tokenizer.json fields with errors that name the file and field.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "hack/core/error.h"

namespace hack::tok {

using nlohmann::json;

/// `where` + "." + key, for the next level of error context.
inline std::string field(const std::string& where, std::string_view key) {
  return where + "." + std::string(key);
}

inline const json& require(const json& j, std::string_view key, const std::string& where) {
  HACK_CHECK(j.is_object(), "{}: expected an object, got {}", where, j.type_name());
  const auto it = j.find(key);
  HACK_CHECK(it != j.end(), "{}: missing field \"{}\"", where, key);
  return *it;
}

inline std::string get_string(const json& j, std::string_view key, const std::string& where) {
  const json& v = require(j, key, where);
  HACK_CHECK(v.is_string(), "{}: expected a string, got {}", field(where, key), v.type_name());
  return v.get<std::string>();
}

inline std::string get_string_or(const json& j, std::string_view key, std::string fallback, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  HACK_CHECK(it->is_string(), "{}: expected a string, got {}", field(where, key), it->type_name());
  return it->get<std::string>();
}

inline bool get_bool_or(const json& j, std::string_view key, bool fallback, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  HACK_CHECK(it->is_boolean(), "{}: expected a boolean, got {}", field(where, key), it->type_name());
  return it->get<bool>();
}

inline long long get_int_or(const json& j, std::string_view key, long long fallback, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  HACK_CHECK(it->is_number_integer(), "{}: expected an integer, got {}", field(where, key), it->type_name());
  return it->get<long long>();
}

/// A single Unicode character given as a JSON string (Metaspace "replacement", Strip
/// "content").
char32_t get_char(const json& j, std::string_view key, const std::string& where);

/// The "type" tag of a component object.
inline std::string get_type(const json& j, const std::string& where) { return get_string(j, "type", where); }

/// {"String": "..."} or {"Regex": "..."} as used by Split and Replace.
struct PatternSpec {
  bool is_regex = false;
  std::string text;
};
PatternSpec get_pattern(const json& j, std::string_view key, const std::string& where);

}  // namespace hack::tok
