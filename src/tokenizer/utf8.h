// UTF-8 helpers shared by the tokenizer pipeline: code point decoding, lossy repair of
// invalid input (the Unicode "maximal subpart" policy Rust's from_utf8_lossy uses), and
// the incomplete-tail test the incremental decoder needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace hack::tok {

inline constexpr char32_t kReplacementChar = 0xFFFD;
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

/// Length in bytes of the UTF-8 sequence led by `lead` (1 for ASCII and for bytes that
/// cannot lead a sequence).
inline int utf8_seq_len(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF8) return 4;
  return 1;
}

/// Decodes the code point at s[pos] of VALID UTF-8 and advances pos past it.
inline char32_t next_code_point(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  const int n = utf8_seq_len(b0);
  char32_t cp = n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  pos += n;
  return cp;
}

/// Decodes the last code point of VALID UTF-8 `s` (non-empty); `len` gets its byte length.
char32_t last_code_point(std::string_view s, int* len = nullptr);

/// Appends the UTF-8 encoding of `cp` to `out`.
void append_utf8(std::string& out, char32_t cp);

/// Number of code points of VALID UTF-8.
size_t count_code_points(std::string_view s);

/// Length of the longest valid UTF-8 prefix of `s` (s.size() when all of it is valid).
size_t valid_utf8_prefix(std::string_view s);

/// Appends `bytes` to `out`, replacing each maximal invalid subpart with U+FFFD, exactly like
/// Rust's String::from_utf8_lossy (and Python's errors="replace").
void append_utf8_lossy(std::string& out, std::string_view bytes);

/// Number of trailing bytes of `bytes` that form an incomplete but so far valid UTF-8
/// sequence (0..3): bytes a later continuation could still complete.
size_t incomplete_utf8_tail(std::string_view bytes);

}  // namespace hack::tok
