/// @file api_keys.h
/// @brief Optional API keys for the public endpoint: `Authorization: Bearer <key>`, checked
/// in constant time against every configured key.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hack::server {

class ApiKeys {
 public:
  /// No keys: every request is authorized (auth off).
  ApiKeys() = default;
  /// Keys from --api-key values and, when `key_file` is not empty, --api-key-file. Throws
  /// hack::Error naming the file when it cannot be read.
  static ApiKeys from_flags(std::span<const std::string> keys, const std::filesystem::path& key_file);

  /// Adds one key; surrounding whitespace is trimmed, an empty key is ignored.
  void add(std::string_view key);
  /// Adds the keys of a file: one per line, surrounding whitespace trimmed, blank lines and
  /// lines starting with '#' ignored. Throws hack::Error naming the file if unreadable.
  void load_file(const std::filesystem::path& path);

  /// Whether any key is configured.
  bool enabled() const { return !keys_.empty(); }
  size_t size() const { return keys_.size(); }

  /// Whether `authorization_header` (the header's value, "" when absent) is "Bearer <key>"
  /// for a configured key; always true when none is configured. The scheme is
  /// case-insensitive (RFC 9110). The token is compared with every key and every byte,
  /// whatever matches, so timing does not reveal how much of a key was right.
  bool authorized(std::string_view authorization_header) const;

 private:
  std::vector<std::string> keys_;
};

}  // namespace hack::server
