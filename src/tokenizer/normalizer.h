// tokenizer.json "normalizer": NFC / NFD / NFKC / NFKD (utf8proc), Prepend, Replace (string
// or regex), Strip, StripAccents, Lowercase, ByteLevel and Sequence.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace hack::tok {

class RegexScratch;

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  /// Rewrites `text` (valid UTF-8) in place.
  virtual void normalize(std::string& text, RegexScratch& scratch) const = 0;
};

/// Builds the normalizer described by `spec` (a tokenizer.json "normalizer" object).
/// `where` names the file and JSON field for error messages. Returns null for JSON null.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec, const std::string& where);

/// Rust char::is_whitespace (the Unicode White_Space property).
bool is_unicode_whitespace(char32_t cp);

}  // namespace hack::tok
