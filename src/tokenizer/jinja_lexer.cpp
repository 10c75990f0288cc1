// Jinja lexer, a port of jinja2.lexer's rules for the configuration transformers uses:
//   - `{%-` / `{{-` / `{#-` strip all whitespace before the tag, `-%}` / `-}}` / `-#}` all
//     whitespace after it;
//   - lstrip_blocks: spaces and tabs between the start of a line and a block or comment
//     tag are dropped (not before `{{`, not after `{%+`);
//   - trim_blocks: the first newline after a block or comment tag is dropped (not after `+%}`);
//   - one trailing newline of the template is dropped; \r\n and \r read as \n.
// Inside a tag, `}}` / `%}` close it only when brackets are balanced, as in jinja2.
#include "hack/tokenizer/jinja_lexer.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "hack/core/error.h"
#include "hack/tokenizer/jinja_text.h"

namespace hack::jinja {
namespace {

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t tag = find_tag_start(pos_);
      if (tag == std::string::npos) {
        emit_data(pos_, src_.size());
        pos_ = src_.size();
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      char sign = 0;
      if (tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+')) sign = src_[tag + 2];

      size_t raw_body = 0;
      const bool raw = kind == '%' && match_raw_begin(tag, &raw_body);
      size_t text_end = strip_before(pos_, tag, sign, kind != '{', line_starting);
      emit_data(pos_, text_end);

      if (raw) {
        line_starting = lex_raw(tag, raw_body);
      } else if (kind == '#') {
        line_starting = skip_comment(tag, sign);
      } else {
        line_starting = lex_tag(tag, kind, sign);
      }
    }
    Token eof;
    eof.kind = TokenKind::kEof;
    eof.pos = pos_at(src_.size());
    tokens_.push_back(std::move(eof));
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error_at(size_t offset, std::string_view what) const {
    const SourcePos p = pos_at(offset);
    fail("{} at line {}, column {}", what, p.line, p.column);
  }

  SourcePos pos_at(size_t offset) const {
    // Lines are counted incrementally: tokens are produced in order.
    while (line_scan_ < offset && line_scan_ < src_.size()) {
      if (src_[line_scan_] == '\n') {
        ++line_;
        line_start_ = line_scan_ + 1;
      }
      ++line_scan_;
    }
    if (offset < line_scan_) {
      // Rare (errors about an earlier offset): count from the start.
      int line = 1;
      size_t start = 0;
      for (size_t i = 0; i < offset && i < src_.size(); ++i) {
        if (src_[i] == '\n') {
          ++line;
          start = i + 1;
        }
      }
      return {line, static_cast<int>(offset - start + 1)};
    }
    return {line_, static_cast<int>(offset - line_start_ + 1)};
  }

  size_t find_tag_start(size_t from) const {
    size_t p = from;
    while (true) {
      p = src_.find('{', p);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      const char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      ++p;
    }
  }

  size_t skip_spaces(size_t p) const {
    while (p < src_.size()) {
      size_t next = p;
      if (!text::is_space(text::next_code_point(src_, next))) break;
      p = next;
    }
    return p;
  }

  bool starts_with(size_t p, std::string_view s) const {
    return p <= src_.size() && src_.compare(p, s.size(), s) == 0;
  }

  // {%(-|+|)\s*raw\s*(-%}\s*|%}) ; raw_body receives the offset after it.
  bool match_raw_begin(size_t tag, size_t* raw_body) const {
    size_t p = tag + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = skip_spaces(p);
    if (!starts_with(p, "raw")) return false;
    p = skip_spaces(p + 3);
    if (starts_with(p, "-%}")) {
      *raw_body = skip_spaces(p + 3);
      return true;
    }
    if (starts_with(p, "%}")) {
      *raw_body = p + 2;
      return true;
    }
    return false;
  }

  // Text [from, tag) after whitespace control; returns its new end.
  size_t strip_before(size_t from, size_t tag, char sign, bool lstrip_applies, bool line_starting) const {
    std::string_view text(src_.data() + from, tag - from);
    if (sign == '-') {  // text.rstrip()
      size_t keep = 0, p = 0;
      while (p < text.size()) {
        if (!text::is_space(text::next_code_point(text, p))) keep = p;
      }
      return from + keep;
    }
    if (sign != '+' && lstrip_applies) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting) {
        if (l_pos < text.size() && skip_spaces_in(text, l_pos) == text.size()) return from + l_pos;
      }
    }
    return tag;
  }

  static size_t skip_spaces_in(std::string_view text, size_t p) {
    while (p < text.size()) {
      size_t next = p;
      if (!text::is_space(text::next_code_point(text, next))) break;
      p = next;
    }
    return p;
  }

  void emit_data(size_t begin, size_t end) {
    if (end <= begin) return;
    Token t;
    t.kind = TokenKind::kData;
    t.text = src_.substr(begin, end - begin);
    t.pos = pos_at(begin);
    tokens_.push_back(std::move(t));
  }

  // After the closing `%}` / `#}`: "-" eats all whitespace, "+" nothing, else one "\n".
  // Returns the end offset.
  size_t after_block_end(size_t p, char sign) const {
    if (sign == '-') return skip_spaces(p);
    if (sign == '+') return p;
    if (p < src_.size() && src_[p] == '\n') return p + 1;
    return p;
  }

  bool ends_with_newline(size_t end) const { return end > 0 && src_[end - 1] == '\n'; }

  bool skip_comment(size_t tag, char sign) {
    const size_t body = tag + 2 + (sign ? 1 : 0);
    const size_t close = src_.find("#}", body);
    if (close == std::string::npos) error_at(tag, "missing end of comment tag");
    // `(.*?)(\+#}|\-#}\s*|#}\n?)`: the earliest match wins, so a sign directly before
    // `#}` belongs to the end marker.
    char end_sign = 0;
    if (close > body && (src_[close - 1] == '-' || src_[close - 1] == '+')) end_sign = src_[close - 1];
    const size_t end = after_block_end(close + 2, end_sign);
    pos_ = end;
    return ends_with_newline(end);
  }

  bool lex_raw(size_t tag, size_t body) {
    // Content runs to `{%(-|+|)\s*endraw\s*(+%}|-%}\s*|%}\n?)`.
    size_t search = body;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string::npos) error_at(tag, "missing end of raw directive");
      size_t p = open + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      p = skip_spaces(p);
      if (!starts_with(p, "endraw")) {
        search = open + 2;
        continue;
      }
      p = skip_spaces(p + 6);
      char end_sign = 0;
      size_t close = 0;
      if (starts_with(p, "+%}") || starts_with(p, "-%}")) {
        end_sign = src_[p];
        close = p + 3;
      } else if (starts_with(p, "%}")) {
        close = p + 2;
      } else {
        search = open + 2;
        continue;
      }
      // The raw begin tag ends with "%}" or "-%}\s*": a line starts after it only if
      // whitespace stripping ended on a newline.
      const bool line_starting = ends_with_newline(body);
      const size_t text_end = strip_before(body, open, sign, true, line_starting);
      emit_data(body, text_end);
      const size_t end = after_block_end(close, end_sign);
      pos_ = end;
      return ends_with_newline(end);
    }
  }

  // Lexes the inside of {{ }} or {% %} starting at the opener; returns line_starting.
  bool lex_tag(size_t tag, char kind, char sign) {
    const bool is_block = kind == '%';
    Token begin;
    begin.kind = is_block ? TokenKind::kBlockBegin : TokenKind::kVariableBegin;
    begin.pos = pos_at(tag);
    tokens_.push_back(std::move(begin));
    size_t p = tag + 2 + (sign ? 1 : 0);
    std::vector<char> balance;
    while (true) {
      p = skip_spaces(p);
      if (p >= src_.size()) {
        error_at(tag, is_block ? "unexpected end of template: unclosed block tag '{%'"
                               : "unexpected end of template: unclosed variable tag '{{'");
      }
      if (balance.empty()) {
        size_t end = 0;
        bool closed = false;
        if (is_block) {
          if (starts_with(p, "+%}")) {
            end = p + 3, closed = true;
          } else if (starts_with(p, "-%}")) {
            end = skip_spaces(p + 3), closed = true;
          } else if (starts_with(p, "%}")) {
            end = after_block_end(p + 2, 0), closed = true;
          }
        } else {
          if (starts_with(p, "-}}")) {
            end = skip_spaces(p + 3), closed = true;
          } else if (starts_with(p, "}}")) {
            end = p + 2, closed = true;
          }
        }
        if (closed) {
          Token t;
          t.kind = is_block ? TokenKind::kBlockEnd : TokenKind::kVariableEnd;
          t.pos = pos_at(p);
          tokens_.push_back(std::move(t));
          pos_ = end;
          return ends_with_newline(end);
        }
      }
      p = lex_one(p, balance);
    }
  }

  size_t lex_one(size_t p, std::vector<char>& balance) {
    Token t;
    t.pos = pos_at(p);
    const char c = src_[p];
    if (is_digit(c)) return lex_number(p, std::move(t));
    if (is_name_start(c)) {
      size_t e = p;
      while (e < src_.size() && is_name_char(src_[e])) ++e;
      t.kind = TokenKind::kName;
      t.text = src_.substr(p, e - p);
      tokens_.push_back(std::move(t));
      return e;
    }
    if (c == '\'' || c == '"') return lex_string(p, std::move(t));
    static constexpr std::string_view kTwoChar[] = {"//", "**", "==", "!=", ">=", "<="};
    for (auto op : kTwoChar) {
      if (starts_with(p, op)) {
        t.kind = TokenKind::kOperator;
        t.text = std::string(op);
        tokens_.push_back(std::move(t));
        return p + 2;
      }
    }
    if (std::strchr("+-/*%~[](){}<>=.:|,;", c) == nullptr || c == '\0') {
      size_t next = p;
      const char32_t cp = text::next_code_point(src_, next);
      std::string shown;
      text::append_code_point(shown, cp);
      error_at(p, fmt::format("unexpected char '{}'", shown));
    }
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) error_at(p, fmt::format("unexpected '{}'", c));
      if (balance.back() != c) error_at(p, fmt::format("unexpected '{}', expected '{}'", c, balance.back()));
      balance.pop_back();
    }
    t.kind = TokenKind::kOperator;
    t.text = std::string(1, c);
    tokens_.push_back(std::move(t));
    return p + 1;
  }

  // Digits with optional single underscores between them; returns the end.
  size_t digit_run(size_t p, bool (*ok)(char)) const {
    if (p >= src_.size() || !ok(src_[p])) return p;
    size_t e = p + 1;
    while (e < src_.size()) {
      if (ok(src_[e])) {
        ++e;
      } else if (src_[e] == '_' && e + 1 < src_.size() && ok(src_[e + 1])) {
        e += 2;
      } else {
        break;
      }
    }
    return e;
  }

  size_t lex_number(size_t p, Token t) {
    auto dec = [](char ch) { return ch >= '0' && ch <= '9'; };
    // Float: digits ((.digits)? e[+-]?digits | .digits); not right after a '.' (foo.0.1).
    const bool after_dot = p > 0 && src_[p - 1] == '.';
    size_t int_end = digit_run(p, dec);
    if (!after_dot) {
      size_t e = int_end;
      bool is_float = false;
      if (e < src_.size() && src_[e] == '.' && e + 1 < src_.size() && dec(src_[e + 1])) {
        e = digit_run(e + 1, dec);
        is_float = true;
      }
      if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t x = e + 1;
        if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
        if (x < src_.size() && dec(src_[x])) {
          e = digit_run(x, dec);
          is_float = true;
        }
      }
      if (is_float) {
        std::string digits;
        for (size_t i = p; i < e; ++i) {
          if (src_[i] != '_') digits += src_[i];
        }
        t.kind = TokenKind::kFloat;
        t.float_value = std::strtod(digits.c_str(), nullptr);
        t.text = src_.substr(p, e - p);
        tokens_.push_back(std::move(t));
        return e;
      }
    }
    // Integer: 0b.. / 0o.. / 0x.. / [1-9](_?\d)* / 0(_?0)*
    int base = 10;
    size_t e = p;
    if (src_[p] == '0' && p + 1 < src_.size()) {
      const char b = static_cast<char>(src_[p + 1] | 0x20);
      bool (*ok)(char) = nullptr;
      if (b == 'b') base = 2, ok = [](char ch) { return ch == '0' || ch == '1'; };
      if (b == 'o') base = 8, ok = [](char ch) { return ch >= '0' && ch <= '7'; };
      if (b == 'x') {
        base = 16, ok = [](char ch) {
          return (ch >= '0' && ch <= '9') || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f');
        };
      }
      if (ok) {
        // (_?[digit])+
        size_t x = p + 2;
        if (x < src_.size() && src_[x] == '_') ++x;
        const size_t run = digit_run(x, ok);
        if (run > x) {
          e = run;
        } else {
          base = 10;
        }
      }
    }
    if (base == 10) {
      if (src_[p] == '0') {
        e = p + 1;
        while (e < src_.size() && (src_[e] == '0' || (src_[e] == '_' && e + 1 < src_.size() && src_[e + 1] == '0'))) {
          e += src_[e] == '_' ? 2 : 1;
        }
      } else {
        e = int_end;
      }
    }
    std::string digits;
    for (size_t i = (base == 10 ? p : p + 2); i < e; ++i) {
      if (src_[i] != '_') digits += src_[i];
    }
    errno = 0;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(digits.c_str(), &end, base);
    if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX)) {
      error_at(p, "integer literal too large");
    }
    t.kind = TokenKind::kInteger;
    t.int_value = static_cast<int64_t>(v);
    t.text = src_.substr(p, e - p);
    tokens_.push_back(std::move(t));
    return e;
  }

  size_t lex_string(size_t p, Token t) {
    const char quote = src_[p];
    size_t e = p + 1;
    while (e < src_.size() && src_[e] != quote) {
      if (src_[e] == '\\') ++e;
      ++e;
    }
    if (e >= src_.size()) error_at(p, fmt::format("unexpected char '{}'", quote));
    t.kind = TokenKind::kString;
    t.text = decode_string(p, std::string_view(src_).substr(p + 1, e - p - 1));
    tokens_.push_back(std::move(t));
    return e + 1;
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    c = static_cast<char>(c | 0x20);
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }

  // jinja2 decodes string literals with Python's "unicode-escape" codec.
  std::string decode_string(size_t at, std::string_view s) const {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] != '\\') {
        out += s[i];
        continue;
      }
      if (i + 1 >= s.size()) error_at(at, "invalid string literal: \\ at end of string");
      const char c = s[++i];
      switch (c) {
        case '\n': break;  // line continuation
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            const int h = i + 1 + k < s.size() ? hex_value(s[i + 1 + k]) : -1;
            if (h < 0) error_at(at, fmt::format("invalid string literal: truncated \\{} escape", c));
            cp = cp * 16 + static_cast<uint32_t>(h);
          }
          if (cp > 0x10FFFF) error_at(at, "invalid string literal: illegal Unicode character");
          text::append_code_point(out, cp);
          i += n;
          break;
        }
        case 'N':
          error_at(at, "unsupported \\N{...} escape in string literal");
        default:
          if (c >= '0' && c <= '7') {
            uint32_t cp = static_cast<uint32_t>(c - '0');
            for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k) {
              cp = cp * 8 + static_cast<uint32_t>(s[++i] - '0');
            }
            text::append_code_point(out, cp);
          } else if (static_cast<unsigned char>(c) >= 0x80) {
            // Python first turns the non-ASCII character into a \x / \u escape
            // (backslashreplace), whose backslash the preceding one then escapes.
            size_t q = i;
            const char32_t cp = text::next_code_point(s, q);
            i = q - 1;
            out += '\\';
            if (cp <= 0xFF) {
              out += fmt::format("x{:02x}", static_cast<unsigned>(cp));
            } else if (cp <= 0xFFFF) {
              out += fmt::format("u{:04x}", static_cast<unsigned>(cp));
            } else {
              out += fmt::format("U{:08x}", static_cast<unsigned>(cp));
            }
          } else {
            out += '\\';
            out += c;
          }
      }
    }
    return out;
  }

  std::string src_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
  mutable size_t line_scan_ = 0;
  mutable int line_ = 1;
  mutable size_t line_start_ = 0;
};

}  // namespace

std::vector<Token> lex(std::string_view source) {
  Lexer lexer(normalize_newlines(source));
  return lexer.run();
}

std::string describe(const Token& token) {
  switch (token.kind) {
    case TokenKind::kData: return "template data";
    case TokenKind::kVariableBegin: return "begin of print statement";
    case TokenKind::kVariableEnd: return "end of print statement";
    case TokenKind::kBlockBegin: return "begin of statement block";
    case TokenKind::kBlockEnd: return "end of statement block";
    case TokenKind::kName: return fmt::format("name '{}'", token.text);
    case TokenKind::kString: return "string literal";
    case TokenKind::kInteger: return "integer";
    case TokenKind::kFloat: return "float";
    case TokenKind::kOperator: return fmt::format("'{}'", token.text);
    case TokenKind::kEof: return "end of template";
  }
  return "token";
}

}  // namespace hack::jinja
