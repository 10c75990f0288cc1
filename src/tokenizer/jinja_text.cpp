// Python str semantics on UTF-8 (see jinja_text.h). Case mapping and character classes
// come from utf8proc; CPython's full special casing is reproduced only for the common
// cases (ß upper-cases to "SS", İ lower-cases to "i̇").
#include "hack/tokenizer/jinja_text.h"

#include <utf8proc.h>

#include <algorithm>

#include "hack/core/error.h"

namespace hack::jinja::text {
namespace {

constexpr char32_t kEscapeBase = 0xDC00;  // invalid byte b <-> code point 0xDC00 + b

bool is_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

utf8proc_category_t category(char32_t cp) {
  if (cp > 0x10FFFF) return UTF8PROC_CATEGORY_CN;
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp));
}

bool is_cased(char32_t cp) {
  const auto c = category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

bool is_escape(char32_t cp) { return cp >= kEscapeBase + 0x80 && cp <= kEscapeBase + 0xFF; }

void append_upper(std::string& out, char32_t cp) {
  if (cp == 0xDF) {  // ß
    out += "SS";
    return;
  }
  if (is_escape(cp) || cp > 0x10FFFF) return append_code_point(out, cp);
  append_code_point(out, static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))));
}

void append_lower(std::string& out, char32_t cp) {
  if (cp == 0x130) {  // İ
    out += "i\xCC\x87";
    return;
  }
  if (is_escape(cp) || cp > 0x10FFFF) return append_code_point(out, cp);
  append_code_point(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
}

void append_title(std::string& out, char32_t cp) {
  if (cp == 0xDF) {  // ß title-cases to "Ss"
    out += "Ss";
    return;
  }
  if (is_escape(cp) || cp > 0x10FFFF) return append_code_point(out, cp);
  append_code_point(out, static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(cp))));
}

bool in_chars(char32_t cp, const std::u32string& chars) {
  return chars.find(cp) != std::u32string::npos;
}

// Byte length of the code point that ends at s[end - 1].
size_t last_code_point_size(std::string_view s, size_t end) {
  size_t start = end - 1;
  int back = 0;
  while (start > 0 && back < 3 && is_continuation(static_cast<unsigned char>(s[start]))) {
    --start;
    ++back;
  }
  size_t pos = start;
  next_code_point(s, pos);
  if (pos == end) return end - start;
  return 1;  // the bytes did not form one sequence ending here: treat the last byte alone
}

}  // namespace

char32_t next_code_point(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  int n = 0;
  char32_t cp = 0;
  char32_t min = 0;
  if (b0 >= 0xC2 && b0 < 0xE0) {
    n = 2, cp = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 < 0xF0) {
    n = 3, cp = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 < 0xF5) {
    n = 4, cp = b0 & 0x07, min = 0x10000;
  }
  if (n == 0 || pos + n > s.size()) {
    ++pos;
    return kEscapeBase + b0;
  }
  for (int i = 1; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[pos + i]);
    if (!is_continuation(b)) {
      ++pos;
      return kEscapeBase + b0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++pos;
    return kEscapeBase + b0;
  }
  pos += n;
  return cp;
}

void append_code_point(std::string& out, char32_t cp) {
  if (is_escape(cp)) {
    out += static_cast<char>(cp - kEscapeBase);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) out += next_code_point(s, pos);
  return out;
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) append_code_point(out, cp);
  return out;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

size_t length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  size_t n = 0, pos = 0;
  while (pos < s.size()) {
    next_code_point(s, pos);
    ++n;
  }
  return n;
}

size_t byte_offset(std::string_view s, size_t cp_index) {
  size_t pos = 0;
  for (size_t i = 0; i < cp_index && pos < s.size(); ++i) next_code_point(s, pos);
  return pos;
}

size_t code_point_index(std::string_view s, size_t byte_pos) {
  size_t pos = 0, n = 0;
  while (pos < byte_pos && pos < s.size()) {
    next_code_point(s, pos);
    ++n;
  }
  return n;
}

bool is_space(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D:
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x20:
    case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_printable(char32_t cp) {
  if (cp == ' ') return true;
  if (is_escape(cp)) return false;
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::u32string set;
  if (chars) set = decode(*chars);
  auto strippable = [&](char32_t cp) { return chars ? in_chars(cp, set) : is_space(cp); };
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end) {
      size_t pos = begin;
      if (!strippable(next_code_point(s, pos))) break;
      begin = pos;
    }
  }
  if (right) {
    while (end > begin) {
      const size_t n = last_code_point_size(s, end);
      size_t pos = end - n;
      if (!strippable(next_code_point(s, pos))) break;
      end -= n;
    }
  }
  return std::string(s.substr(begin, end - begin));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    HACK_CHECK(!sep->empty(), "empty separator");
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t hit = s.find(*sep, start);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(start, hit - start));
      start = hit + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  size_t pos = 0;
  while (true) {
    // skip whitespace
    size_t word = pos;
    while (word < s.size()) {
      size_t next = word;
      if (!is_space(next_code_point(s, next))) break;
      word = next;
    }
    if (word >= s.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.emplace_back(s.substr(word));
      break;
    }
    size_t end = word;
    while (end < s.size()) {
      size_t next = end;
      if (is_space(next_code_point(s, next))) break;
      end = next;
    }
    out.emplace_back(s.substr(word, end - word));
    pos = end;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    HACK_CHECK(!sep->empty(), "empty separator");
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  const std::u32string cps = decode(s);
  size_t end = cps.size();
  while (true) {
    while (end > 0 && is_space(cps[end - 1])) --end;
    if (end == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.push_back(encode(std::u32string_view(cps).substr(0, end)));
      break;
    }
    size_t begin = end;
    while (begin > 0 && !is_space(cps[begin - 1])) --begin;
    out.push_back(encode(std::u32string_view(cps).substr(begin, end - begin)));
    end = begin;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t line_start = 0, pos = 0;
  while (pos < s.size()) {
    const size_t cp_start = pos;
    const char32_t cp = next_code_point(s, pos);
    const bool boundary = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C ||
                          cp == 0x1D || cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!boundary) continue;
    if (cp == '\r' && pos < s.size() && s[pos] == '\n') ++pos;
    out.emplace_back(s.substr(line_start, (keepends ? pos : cp_start) - line_start));
    line_start = pos;
  }
  if (line_start < s.size()) out.emplace_back(s.substr(line_start));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view replacement,
                    int64_t count_limit, size_t max_bytes) {
  std::string out;
  if (old.empty()) {
    const size_t n = length(s) + 1;
    const size_t uses = count_limit < 0 ? n : std::min<size_t>(n, static_cast<size_t>(count_limit));
    HACK_CHECK(s.size() + uses * replacement.size() <= max_bytes,
               "string too long (replace result exceeds {} bytes)", max_bytes);
    size_t pos = 0, used = 0;
    while (true) {
      if (used < uses) {
        out += replacement;
        ++used;
      }
      if (pos >= s.size()) break;
      const size_t start = pos;
      next_code_point(s, pos);
      out += s.substr(start, pos - start);
    }
    return out;
  }
  const size_t hits = count(s, old);
  const size_t uses = count_limit < 0 ? hits : std::min<size_t>(hits, static_cast<size_t>(count_limit));
  if (replacement.size() > old.size()) {
    HACK_CHECK(s.size() + uses * (replacement.size() - old.size()) <= max_bytes,
               "string too long (replace result exceeds {} bytes)", max_bytes);
  }
  size_t start = 0, used = 0;
  while (used < uses) {
    const size_t hit = s.find(old, start);
    if (hit == std::string_view::npos) break;
    out += s.substr(start, hit - start);
    out += replacement;
    start = hit + old.size();
    ++used;
  }
  out += s.substr(start);
  return out;
}

size_t count(std::string_view s, std::string_view needle) {
  if (needle.empty()) return length(s) + 1;
  size_t n = 0, start = 0;
  while (true) {
    const size_t hit = s.find(needle, start);
    if (hit == std::string_view::npos) return n;
    ++n;
    start = hit + needle.size();
  }
}

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) append_upper(out, next_code_point(s, pos));
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) append_lower(out, next_code_point(s, pos));
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool previous_cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = next_code_point(s, pos);
    if (previous_cased) {
      append_lower(out, cp);
    } else {
      append_title(out, cp);
    }
    previous_cased = is_cased(cp);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  bool first = true;
  while (pos < s.size()) {
    const char32_t cp = next_code_point(s, pos);
    if (first) {
      append_title(out, cp);
      first = false;
    } else {
      append_lower(out, cp);
    }
  }
  return out;
}

std::string title_filter(std::string_view s) {
  // "".join(item[0].upper() + item[1:].lower() for item in re.split(r"([-\s({\[<]+)", s))
  auto is_break = [](char32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || is_space(cp);
  };
  std::string out;
  out.reserve(s.size());
  bool at_item_start = true;
  bool in_break = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = next_code_point(s, pos);
    const bool brk = is_break(cp);
    if (brk != in_break) at_item_start = true;
    in_break = brk;
    if (at_item_start) {
      append_upper(out, cp);
      at_item_start = false;
    } else {
      append_lower(out, cp);
    }
  }
  return out;
}

std::string swapcase(std::string_view s) {
  std::string out;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = next_code_point(s, pos);
    const auto c = category(cp);
    if (c == UTF8PROC_CATEGORY_LU) {
      append_lower(out, cp);
    } else if (c == UTF8PROC_CATEGORY_LL) {
      append_upper(out, cp);
    } else {
      append_code_point(out, cp);
    }
  }
  return out;
}

namespace {
template <class Pred>
bool all_code_points(std::string_view s, Pred pred) {
  if (s.empty()) return false;
  size_t pos = 0;
  while (pos < s.size()) {
    if (!pred(next_code_point(s, pos))) return false;
  }
  return true;
}

bool alpha_cp(char32_t cp) {
  const auto c = category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
         c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_LO;
}
bool digit_cp(char32_t cp) { return category(cp) == UTF8PROC_CATEGORY_ND; }
bool numeric_cp(char32_t cp) {
  const auto c = category(cp);
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

// islower / isupper: at least one cased character and none of the other case.
bool cased_all(std::string_view s, utf8proc_category_t want) {
  bool any = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const auto c = category(next_code_point(s, pos));
    if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT) {
      if (c != want) return false;
      any = true;
    }
  }
  return any;
}
}  // namespace

bool is_alpha(std::string_view s) { return all_code_points(s, alpha_cp); }
bool is_digit(std::string_view s) { return all_code_points(s, digit_cp); }
bool is_alnum(std::string_view s) {
  return all_code_points(s, [](char32_t cp) { return alpha_cp(cp) || numeric_cp(cp); });
}
bool is_all_space(std::string_view s) { return all_code_points(s, is_space); }
bool is_lower(std::string_view s) { return cased_all(s, UTF8PROC_CATEGORY_LL); }
bool is_upper(std::string_view s) { return cased_all(s, UTF8PROC_CATEGORY_LU); }

void append_repr(std::string& out, std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out += quote;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = next_code_point(s, pos);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(cp));
    } else if (cp < 0x7F) {
      out += static_cast<char>(cp);
    } else if (is_escape(cp)) {
      // An invalid byte: Python would have failed to decode it; show it as \x.. like a
      // surrogateescape'd string does.
      out += fmt::format("\\udc{:02x}", static_cast<unsigned>(cp - kEscapeBase));
    } else if (is_printable(cp)) {
      append_code_point(out, cp);
    } else if (cp <= 0xFF) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(cp));
    } else if (cp <= 0xFFFF) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(cp));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<unsigned>(cp));
    }
  }
  out += quote;
}

}  // namespace hack::jinja::text
