#include "src/tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include "src/tokenizer/byte_level.h"
#include "src/tokenizer/hf_unicode_tables.h"
#include "src/tokenizer/json_util.h"
#include "src/tokenizer/text_pattern.h"
#include "src/tokenizer/utf8.h"

namespace hack::tok {

bool is_unicode_whitespace(char32_t cp) {
  // PropList.txt White_Space.
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {

enum class UnicodeForm { kNfc, kNfd, kNfkc, kNfkd };

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(UnicodeForm form) : form_(form) {}

  void normalize(std::string& text, RegexScratch&) const override {
    if (is_fixed_point(text)) return;
    // Characters HF's tables do not know pass through unchanged and split the text: they
    // are starters there, so nothing reorders or composes across them.
    std::string out;
    size_t segment = 0, pos = 0;
    while (pos < text.size()) {
      const size_t start = pos;
      if (!is_hf_unnormalized(next_code_point(text, pos))) continue;
      if (out.empty()) out.reserve(text.size());
      append_normalized(std::string_view(text).substr(segment, start - segment), out);
      out.append(text, start, pos - start);
      segment = pos;
    }
    if (segment == 0) {
      out.clear();
      append_normalized(text, out);
    } else {
      append_normalized(std::string_view(text).substr(segment), out);
    }
    text.swap(out);
  }

 private:
  void append_normalized(std::string_view text, std::string& out) const {
    if (text.empty()) return;
    int options = UTF8PROC_STABLE;
    switch (form_) {
      case UnicodeForm::kNfc: options |= UTF8PROC_COMPOSE; break;
      case UnicodeForm::kNfd: options |= UTF8PROC_DECOMPOSE; break;
      case UnicodeForm::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
      case UnicodeForm::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t* result = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                            static_cast<utf8proc_ssize_t>(text.size()), &result,
                                            static_cast<utf8proc_option_t>(options));
    HACK_CHECK(n >= 0, "tokenizer: Unicode normalization failed: {}", utf8proc_errmsg(n));
    out.append(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
    std::free(result);
  }

  // Text the form leaves unchanged without looking at it closely: ASCII for every form, and
  // for NFC anything below U+0300 (no character there decomposes under NFC, none combines).
  bool is_fixed_point(std::string_view text) const {
    const unsigned char limit = form_ == UnicodeForm::kNfc ? 0xCC : 0x80;
    for (unsigned char c : text)
      if (c >= limit) return false;
    return true;
  }

  UnicodeForm form_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text, RegexScratch&) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(const PatternSpec& pattern, std::string content) : pattern_(pattern), content_(std::move(content)) {}
  void normalize(std::string& text, RegexScratch& scratch) const override {
    if (!pattern_.could_match(text)) return;
    std::string out;
    out.reserve(text.size() + text.size() / 2);
    pattern_.replace_all(text, content_, scratch, out);
    text.swap(out);
  }

 private:
  TextPattern pattern_;
  std::string content_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text, RegexScratch&) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t pos = begin;
        if (!is_unicode_whitespace(next_code_point(text, pos))) break;
        begin = pos;
      }
    }
    if (right_) {
      while (end > begin) {
        int len = 0;
        if (!is_unicode_whitespace(last_code_point(std::string_view(text).substr(begin, end - begin), &len))) break;
        end -= static_cast<size_t>(len);
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

// Rust char::to_lowercase per character: the simple mapping plus U+0130's two-character
// lowercase form (the only unconditional multi-character one).
class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text, RegexScratch&) const override {
    std::string out;
    out.reserve(text.size());
    size_t pos = 0;
    while (pos < text.size()) {
      const char32_t cp = next_code_point(text, pos);
      if (cp == 0x130) {
        out.append("i\xCC\x87");
      } else {
        append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
      }
    }
    text.swap(out);
  }
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text, RegexScratch&) const override {
    std::string out;
    out.reserve(text.size());
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t start = pos;
      const char32_t cp = next_code_point(text, pos);
      if (is_hf_combining_mark(cp)) continue;
      out.append(text, start, pos - start);
    }
    text.swap(out);
  }
};

class ByteLevelNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text, RegexScratch&) const override {
    std::string out;
    out.reserve(text.size() * 2);
    ByteLevelTable::get().encode_append(out, text);
    text.swap(out);
  }
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text, RegexScratch& scratch) const override {
    for (const auto& step : steps_) step->normalize(text, scratch);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const std::string type = get_type(spec, where);
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UnicodeForm::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UnicodeForm::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(UnicodeForm::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(UnicodeForm::kNfkd);
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(get_string(spec, "prepend", where));
  if (type == "Replace") {
    const PatternSpec pattern = get_pattern(spec, "pattern", where);
    try {
      return std::make_unique<ReplaceNormalizer>(pattern, get_string(spec, "content", where));
    } catch (const Error& e) {
      fail("{}: {}", field(where, "pattern"), e.what());
    }
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(get_bool_or(spec, "strip_left", true, where),
                                             get_bool_or(spec, "strip_right", true, where));
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  if (type == "Sequence") {
    const json& list = require(spec, "normalizers", where);
    HACK_CHECK(list.is_array(), "{}: expected an array", field(where, "normalizers"));
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto step = make_normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i));
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  fail("{}: unsupported normalizer type \"{}\" (supported: NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, "
       "Lowercase, StripAccents, ByteLevel, Sequence)",
       where, type);
}

}  // namespace hack::tok
