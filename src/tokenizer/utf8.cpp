#include "src/tokenizer/utf8.h"

namespace hack::tok {
namespace {

// Scans one sequence at p[0..n). Returns the number of bytes it covers; *valid says whether
// they form a complete valid character, *truncated whether the input ended inside a
// sequence that was valid so far. Invalid sequences cover their maximal subpart (at least
// one byte), per Unicode §3.9 "U+FFFD substitution of maximal subparts".
size_t scan_sequence(const unsigned char* p, size_t n, bool* valid, bool* truncated) {
  *truncated = false;
  const unsigned char b0 = p[0];
  if (b0 < 0x80) {
    *valid = true;
    return 1;
  }
  int need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *valid = false;
    return 1;
  }
  size_t i = 1;
  for (int k = 0; k < need; ++k, ++i) {
    if (i >= n) {
      *valid = false;
      *truncated = true;
      return i;
    }
    const unsigned char b = p[i];
    const unsigned char l = k == 0 ? lo : 0x80;
    const unsigned char h = k == 0 ? hi : 0xBF;
    if (b < l || b > h) {
      *valid = false;
      return i;
    }
  }
  *valid = true;
  return i;
}

}  // namespace

char32_t last_code_point(std::string_view s, int* len) {
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t pos = start;
  const char32_t cp = next_code_point(s, pos);
  if (len) *len = static_cast<int>(s.size() - start);
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

size_t valid_utf8_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    bool valid = false, truncated = false;
    const size_t len = scan_sequence(p + i, n - i, &valid, &truncated);
    if (!valid) return i;
    i += len;
  }
  return n;
}

void append_utf8_lossy(std::string& out, std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const size_t good = valid_utf8_prefix(bytes.substr(i));
    out.append(bytes.data() + i, good);
    i += good;
    if (i >= n) break;
    bool valid = false, truncated = false;
    i += scan_sequence(p + i, n - i, &valid, &truncated);
    out.append(kReplacementUtf8);
  }
}

size_t incomplete_utf8_tail(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  // A truncated sequence is at most 3 bytes: try each possible lead position.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t start = n - back;
    if ((p[start] & 0xC0) == 0x80) continue;  // continuation byte cannot lead
    bool valid = false, truncated = false;
    const size_t len = scan_sequence(p + start, back, &valid, &truncated);
    return (truncated && len == back) ? back : 0;
  }
  return 0;
}

}  // namespace hack::tok
