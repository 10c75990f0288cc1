// Regex (the common ECMA/Python subset JSON Schema patterns and guided_regex use) to a GBNF
// expression. Character classes are parsed to code-point ranges and written back as GBNF
// classes, so escapes, negation and the JSON-string restriction are one range operation.
#include <algorithm>
#include <utility>

#include "hack/core/error.h"
#include "hack/grammar/grammar.h"
#include "hack/grammar/json_schema.h"

namespace hack::grammar {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMax = 0x10FFFF;

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalize(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMax) out.emplace_back(next, kMax);
  return out;
}

Ranges subtract(const Ranges& a, const Ranges& b) {
  Ranges out;
  const Ranges nb = complement(b);
  for (const auto& [lo, hi] : normalize(a)) {
    for (const auto& [clo, chi] : nb) {
      const uint32_t l = std::max(lo, clo), h = std::min(hi, chi);
      if (l <= h) out.emplace_back(l, h);
    }
  }
  return out;
}

std::string class_char(uint32_t cp) {
  if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9')) {
    return std::string(1, static_cast<char>(cp));
  }
  if (cp < 0x80) return fmt::format("\\x{:02X}", cp);
  if (cp <= 0xFFFF) return fmt::format("\\u{:04X}", cp);
  return fmt::format("\\U{:08X}", cp);
}

std::string class_text(const Ranges& ranges) {
  std::string out = "[";
  for (const auto& [lo, hi] : ranges) {
    out += class_char(lo);
    if (hi > lo) out += "-" + class_char(hi);
  }
  return out + "]";
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};
// Characters that stand for themselves inside a JSON string: not ", \ or a control character.
const Ranges kJsonUnsafe = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};

class RegexParser {
 public:
  RegexParser(std::string_view p, bool json) : p_(p), json_(json) {}

  std::string run() {
    if (!p_.empty() && p_[0] == '^') ++pos_;
    std::string e = alternatives();
    if (pos_ < p_.size()) error("unexpected ')'");
    return e;
  }

 private:
  template <class... Args>
  [[noreturn]] void error(fmt::format_string<Args...> format, Args&&... args) const {
    fail("regex {:?} at {}: {}", std::string(p_), pos_, fmt::format(format, std::forward<Args>(args)...));
  }
  bool eof() const { return pos_ >= p_.size(); }
  char peek() const { return eof() ? '\0' : p_[pos_]; }

  std::string alternatives() {
    std::vector<std::string> alts{sequence()};
    while (peek() == '|') {
      ++pos_;
      alts.push_back(sequence());
    }
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out + ")";
  }

  std::string sequence() {
    std::string out;
    while (!eof() && peek() != '|' && peek() != ')') {
      if (peek() == '$' && pos_ + 1 == p_.size()) {
        ++pos_;
        break;
      }
      std::string a = atom();
      for (;;) {
        const char c = peek();
        if (c == '*' || c == '+' || c == '?') {
          ++pos_;
          a = "(" + a + ")" + std::string(1, c);
        } else if (c == '{' && pos_ + 1 < p_.size() && p_[pos_ + 1] >= '0' && p_[pos_ + 1] <= '9') {
          const size_t close = p_.find('}', pos_);
          if (close == std::string_view::npos) error("unclosed '{{'");
          a = "(" + a + ")" + std::string(p_.substr(pos_, close + 1 - pos_));
          pos_ = close + 1;
        } else {
          break;
        }
        if (peek() == '?' || peek() == '+') ++pos_;  // lazy / possessive: same language
      }
      out += (out.empty() ? "" : " ") + a;
    }
    return out.empty() ? "\"\"" : out;
  }

  std::string ranges_atom(Ranges r) {
    if (json_) r = subtract(r, kJsonUnsafe);
    r = normalize(r);
    if (r.empty()) error("character class matches nothing");
    // Inside a JSON string the class keeps only characters written as themselves; escaped
    // forms of quote, backslash and controls are not offered (a documented limitation).
    return class_text(r);
  }

  std::string literal(uint32_t cp) {
    std::string s;
    if (json_) {
      if (cp == '"') return gbnf_literal("\\\"");
      if (cp == '\\') return gbnf_literal("\\\\");
      if (cp == '\n') return gbnf_literal("\\n");
      if (cp == '\t') return gbnf_literal("\\t");
      if (cp == '\r') return gbnf_literal("\\r");
      if (cp < 0x20) return gbnf_literal(fmt::format("\\u{:04x}", cp));
    }
    if (cp < 0x80) return gbnf_literal(std::string(1, static_cast<char>(cp)));
    return class_text({{cp, cp}});
  }

  uint32_t utf8_char() {
    const auto c = static_cast<unsigned char>(p_[pos_++]);
    if (c < 0x80) return c;
    const int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    uint32_t cp = c & (0x7F >> n);
    for (int k = 1; k < n && !eof(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(p_[pos_++]) & 0x3F);
    return cp;
  }

  // After '\': a class escape's ranges (\d, \w, \s and negations) or one character.
  Ranges escape() {
    if (eof()) error("dangling '\\'");
    const char e = p_[pos_++];
    switch (e) {
      case 'd': return kDigit;
      case 'w': return kWord;
      case 's': return kSpace;
      case 'D': return complement(kDigit);
      case 'W': return complement(kWord);
      case 'S': return complement(kSpace);
      case 'n': return {{'\n', '\n'}};
      case 't': return {{'\t', '\t'}};
      case 'r': return {{'\r', '\r'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case 'x': case 'u': {
        const size_t digits = e == 'x' ? 2 : 4;
        if (pos_ + digits > p_.size()) error("short \\{} escape", std::string(1, e));
        const uint32_t v = static_cast<uint32_t>(std::stoul(std::string(p_.substr(pos_, digits)), nullptr, 16));
        pos_ += digits;
        return {{v, v}};
      }
      case 'b': case 'B': error("word boundaries (\\b) are not supported");
      default:
        if (e >= '1' && e <= '9') error("backreferences are not supported");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) error("unknown escape '\\{}'", std::string(1, e));
        return {{static_cast<unsigned char>(e), static_cast<unsigned char>(e)}};
    }
  }

  std::string atom() {
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (peek() == '?') {
        ++pos_;
        if (peek() == ':') {
          ++pos_;
        } else if (peek() == '<' && pos_ + 1 < p_.size() && p_[pos_ + 1] != '=' && p_[pos_ + 1] != '!') {
          const size_t close = p_.find('>', pos_);
          if (close == std::string_view::npos) error("unclosed group name");
          pos_ = close + 1;
        } else if (peek() == 'P' && pos_ + 1 < p_.size() && p_[pos_ + 1] == '<') {
          const size_t close = p_.find('>', pos_);
          if (close == std::string_view::npos) error("unclosed group name");
          pos_ = close + 1;
        } else {
          error("lookaround and inline flags are not supported");
        }
      }
      std::string inner = alternatives();
      if (peek() != ')') error("unclosed '('");
      ++pos_;
      return "(" + inner + ")";
    }
    if (c == '[') return ranges_atom(parse_class());
    if (c == '.') {
      ++pos_;
      return ranges_atom(complement({{'\n', '\n'}}));
    }
    if (c == '\\') {
      ++pos_;
      const size_t before = pos_;
      Ranges r = escape();
      const char e = p_[before];
      if (r.size() == 1 && r[0].first == r[0].second && e != 'd' && e != 'w' && e != 's') return literal(r[0].first);
      return ranges_atom(std::move(r));
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') error("quantifier with nothing to repeat");
    if (c == '^') error("'^' is supported only at the start");
    if (c == '$') error("'$' is supported only at the end");
    return literal(utf8_char());
  }

  Ranges parse_class() {
    ++pos_;  // '['
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    Ranges r;
    bool first = true;
    while (eof() || peek() != ']' || first) {
      if (eof()) error("unclosed '['");
      first = false;
      Ranges item;
      if (peek() == '\\') {
        ++pos_;
        item = escape();
      } else {
        const uint32_t cp = utf8_char();
        item = {{cp, cp}};
      }
      if (item.size() == 1 && item[0].first == item[0].second && peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi;
        if (peek() == '\\') {
          ++pos_;
          const Ranges h = escape();
          hi = h[0].first;
        } else {
          hi = utf8_char();
        }
        if (hi < item[0].first) error("character range out of order");
        item[0].second = hi;
      }
      r.insert(r.end(), item.begin(), item.end());
    }
    ++pos_;
    return negated ? complement(r) : normalize(r);
  }

  std::string_view p_;
  bool json_;
  size_t pos_ = 0;
};

}  // namespace

std::string regex_expression(std::string_view pattern, bool inside_json_string) {
  return RegexParser(pattern, inside_json_string).run();
}

std::string regex_to_gbnf(std::string_view pattern, const GbnfOptions& options) {
  return options.rule_prefix + "root ::= " + regex_expression(pattern, false) + "\n";
}

std::string choice_to_gbnf(const std::vector<std::string>& choices, const GbnfOptions& options) {
  HACK_CHECK(!choices.empty(), "choice: the list of choices is empty");
  std::string out = options.rule_prefix + "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) out += (i ? " | " : "") + gbnf_literal(choices[i]);
  return out + "\n";
}

}  // namespace hack::grammar
