#define PCRE2_CODE_UNIT_WIDTH 8
#include "src/tokenizer/regex.h"

#include <pcre2.h>

#include "hack/core/error.h"
#include "src/tokenizer/utf8.h"

namespace hack::tok {

namespace {

// HF tokenizers matches Split patterns with Oniguruma (Unicode 16 tables); PCRE2 10.42 has
// Unicode 14 and counts U+180E as \s. These bodies make \s, \p{L} and \p{N} match what
// Oniguruma matches: the letters / numbers added in Unicode 15-16 (found by comparing
// every code point under tokenizers 0.23.3 and PCRE2 10.42), and White_Space for \s.
constexpr std::string_view kSpaceBody = R"(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
constexpr std::string_view kLetterExtra =
    R"(\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65}\x{10D6F}-\x{10D85})"
    R"(\x{10EC2}-\x{10EC4}\x{1123F}-\x{11240}\x{11380}-\x{11389}\x{1138B}\x{1138E}\x{11390}-\x{113B5}\x{113B7})"
    R"(\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{11F02}\x{11F04}-\x{11F10}\x{11F12}-\x{11F33}\x{1342F})"
    R"(\x{13441}-\x{13446}\x{13460}-\x{143FA}\x{16100}-\x{1611D}\x{16D40}-\x{16D6C}\x{18CFF}\x{1B132}\x{1B155})"
    R"(\x{1DF25}-\x{1DF2A}\x{1E030}-\x{1E06D}\x{1E4D0}-\x{1E4EB}\x{1E5D0}-\x{1E5ED}\x{1E5F0}\x{2B739})"
    R"(\x{2EBF0}-\x{2EE5D}\x{31350}-\x{323AF})";
constexpr std::string_view kNumberExtra =
    R"(\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{11F50}-\x{11F59}\x{16130}-\x{16139})"
    R"(\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1D2C0}-\x{1D2D3}\x{1E4F0}-\x{1E4F9}\x{1E5F1}-\x{1E5FA})";

// Class body (without brackets) for \s, \p{L} or \p{N}; empty for other escapes.
std::string class_body(std::string_view escape) {
  if (escape == "s") return std::string(kSpaceBody);
  if (escape == "p{L}" || escape == "pL") return std::string(R"(\p{L})") + std::string(kLetterExtra);
  if (escape == "p{N}" || escape == "pN") return std::string(R"(\p{N})") + std::string(kNumberExtra);
  return {};
}

}  // namespace

std::string translate_onig_pattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() * 2);
  bool in_class = false;
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      // The escape: \X, or \p{...} / \P{...} / \x{...} with its braces.
      size_t end = i + 2;
      const char e = pattern[i + 1];
      if ((e == 'p' || e == 'P' || e == 'x') && end < pattern.size() && pattern[end] == '{') {
        const size_t close = pattern.find('}', end);
        end = close == std::string_view::npos ? pattern.size() : close + 1;
      } else if ((e == 'p' || e == 'P') && end < pattern.size()) {
        end += 1;  // \pL
      } else if (static_cast<unsigned char>(e) >= 0x80) {
        end = i + 1 + static_cast<size_t>(utf8_seq_len(static_cast<unsigned char>(e)));
      }
      std::string_view escape = pattern.substr(i + 1, end - i - 1);
      const bool negated = escape == "S" || escape.starts_with("P");
      std::string positive(escape);
      if (negated) positive[0] = positive[0] == 'S' ? 's' : 'p';
      const std::string body = class_body(positive);
      if (body.empty() || (negated && in_class)) {
        out.append(pattern.substr(i, end - i));
      } else if (in_class) {
        out.append(body);
      } else {
        out.append(negated ? "[^" : "[").append(body).append("]");
      }
      i = end;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      ++i;
      if (i < pattern.size() && pattern[i] == '^') out.push_back(pattern[i++]);
      if (i < pattern.size() && pattern[i] == ']') out.push_back(pattern[i++]);  // a leading ] is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t close = pattern.find(":]", i + 2);
      const size_t end = close == std::string_view::npos ? pattern.size() : close + 2;
      out.append(pattern.substr(i, end - i));
      i = end;
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
    ++i;
  }
  return out;
}

RegexScratch::RegexScratch() {
  match_data_ = pcre2_match_data_create(1, nullptr);
  context_ = pcre2_match_context_create(nullptr);
  // JIT code runs on this stack; long runs of one class (`\s+(?!\S)` over megabytes of
  // spaces) need more than the 32 KiB default machine stack.
  jit_stack_ = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
  HACK_CHECK(match_data_ && context_ && jit_stack_, "tokenizer: out of memory creating PCRE2 match data");
  pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
}

RegexScratch::~RegexScratch() {
  pcre2_jit_stack_free(jit_stack_);
  pcre2_match_context_free(context_);
  pcre2_match_data_free(match_data_);
}

Regex::Regex(std::string_view pattern) : pattern_(pattern) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  const std::string translated = translate_onig_pattern(pattern_);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), PCRE2_UTF | PCRE2_UCP,
                        &error, &error_offset, nullptr);
  if (!code_) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail("regex /{}/ does not compile at offset {}: {}", pattern_, error_offset, reinterpret_cast<char*>(message));
  }
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(code_); }

bool Regex::find(std::string_view text, size_t offset, RegexScratch& scratch, size_t* start, size_t* end) const {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), offset, 0, scratch.match_data_, scratch.context_)
                : pcre2_match(code_, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, scratch.match_data_,
                              scratch.context_);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    // Fall back to the interpreter (heap frames) for pathological subjects.
    rc = pcre2_match(code_, subject, text.size(), offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, scratch.match_data_,
                     scratch.context_);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    fail("regex /{}/ failed on a {}-byte input: {}", pattern_, text.size(), reinterpret_cast<char*>(message));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.match_data_);
  *start = ov[0];
  *end = ov[1];
  return true;
}

size_t Regex::next_char_end(std::string_view text, size_t pos) {
  if (pos >= text.size()) return pos + 1;
  return pos + utf8_seq_len(static_cast<unsigned char>(text[pos]));
}

}  // namespace hack::tok
