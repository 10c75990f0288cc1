#include "hack/router/api_keys.h"

#include <algorithm>

#include "hack/core/error.h"
#include "hack/core/read_file.h"

namespace hack::server {

namespace {

std::string_view trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\r\n\f\v";
  const size_t begin = s.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(kSpace) - begin + 1);
}

// 0 when equal. Reads max(|a|, |b|) bytes whatever they hold; the length difference is
// folded into the result instead of returning early.
unsigned constant_time_diff(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned diff = static_cast<unsigned>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned>(x ^ y);
  }
  return diff;
}

}  // namespace

ApiKeys ApiKeys::from_flags(std::span<const std::string> keys, const std::filesystem::path& key_file) {
  ApiKeys out;
  for (const std::string& k : keys) out.add(k);
  if (!key_file.empty()) out.load_file(key_file);
  return out;
}

void ApiKeys::add(std::string_view key) {
  key = trim(key);
  if (!key.empty()) keys_.emplace_back(key);
}

void ApiKeys::load_file(const std::filesystem::path& path) {
  const std::string text = read_file(path, "API key file");
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view line = trim(std::string_view(text).substr(pos, end - pos));
    if (!line.empty() && line.front() != '#') keys_.emplace_back(line);
    pos = end + 1;
  }
}

bool ApiKeys::authorized(std::string_view header) const {
  if (keys_.empty()) return true;
  header = trim(header);
  constexpr std::string_view kScheme = "bearer";
  bool scheme_ok = header.size() > kScheme.size();
  for (size_t i = 0; scheme_ok && i < kScheme.size(); ++i) {
    const char c = header[i];
    scheme_ok = (c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c) == kScheme[i];
  }
  scheme_ok = scheme_ok && (header[kScheme.size()] == ' ' || header[kScheme.size()] == '\t');
  const std::string_view token = scheme_ok ? trim(header.substr(kScheme.size())) : std::string_view();
  // Every key is compared, to the last byte, even after a match.
  unsigned matched = 0;
  for (const std::string& key : keys_) matched |= static_cast<unsigned>(constant_time_diff(token, key) == 0);
  return scheme_ok && !token.empty() && matched != 0;
}

}  // namespace hack::server
