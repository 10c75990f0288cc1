#include "src/tokenizer/json_util.h"

#include "src/tokenizer/utf8.h"

namespace hack::tok {

char32_t get_char(const json& j, std::string_view key, const std::string& where) {
  const std::string s = get_string(j, key, where);
  HACK_CHECK(!s.empty() && valid_utf8_prefix(s) == s.size(), "{}: expected one character, got \"{}\"",
             field(where, key), s);
  size_t pos = 0;
  const char32_t cp = next_code_point(s, pos);
  HACK_CHECK(pos == s.size(), "{}: expected one character, got \"{}\"", field(where, key), s);
  return cp;
}

PatternSpec get_pattern(const json& j, std::string_view key, const std::string& where) {
  const json& p = require(j, key, where);
  const std::string at = field(where, key);
  HACK_CHECK(p.is_object() && p.size() == 1, "{}: expected {{\"String\": ...}} or {{\"Regex\": ...}}", at);
  PatternSpec spec;
  if (p.contains("String")) {
    spec.text = get_string(p, "String", at);
  } else if (p.contains("Regex")) {
    spec.is_regex = true;
    spec.text = get_string(p, "Regex", at);
  } else {
    fail("{}: unknown pattern kind \"{}\" (expected String or Regex)", at, p.begin().key());
  }
  return spec;
}

}  // namespace hack::tok
