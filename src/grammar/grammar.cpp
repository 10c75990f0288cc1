// GBNF parser and compiler. The parser builds rules of alternatives of items (a byte set or
// a rule reference); groups, repetitions and non-ASCII character classes become synthetic
// rules ("name-N"), so the compiled grammar has only two kinds of element. Repetition is
// right-recursive (x* is R ::= x R | ε), which the matcher runs without growing its stacks.
#include "hack/grammar/grammar.h"

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <utility>

#include "hack/core/error.h"
#include "src/tokenizer/utf8.h"

namespace hack::grammar {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxRepetition = 10000;  // {m,n} bounds; each unit of n - m is one rule

using ByteSet = std::array<uint64_t, 4>;

struct Item {
  bool ref = false;
  uint32_t rule = 0;
  ByteSet bytes{};
};
using Sequence = std::vector<Item>;
using Alternatives = std::vector<Sequence>;

Item byte_item(uint8_t lo, uint8_t hi) {
  Item it;
  for (int b = lo; b <= hi; ++b) it.bytes[static_cast<size_t>(b) >> 6] |= uint64_t{1} << (b & 63);
  return it;
}

Item ref_item(uint32_t rule) {
  Item it;
  it.ref = true;
  it.rule = rule;
  return it;
}

using tok::append_utf8;  // the tokenizer's UTF-8 encoder (src/tokenizer/utf8.h)

// The UTF-8 encodings of the code points [lo, hi] (same encoded length, no surrogates) as
// sequences of byte ranges, by splitting the range until every byte position varies
// independently (the construction RE2 and Rust's utf8-ranges use).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  if (lo > hi) return;
  for (uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= boundary && hi > boundary) {
      utf8_sequences(lo, boundary, out);
      utf8_sequences(boundary + 1, hi, out);
      return;
    }
  }
  const int n = lo <= 0x7F ? 1 : lo <= 0x7FF ? 2 : lo <= 0xFFFF ? 3 : 4;
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(a, lo);
  append_utf8(b, hi);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t k = 0; k < a.size(); ++k) seq.emplace_back(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
  out.push_back(std::move(seq));
}

class Parser {
 public:
  explicit Parser(std::string_view src) : src_(src) {}

  CompiledGrammar run() {
    skip_space();
    while (!eof()) {
      const size_t at = pos_;
      const std::string name = parse_name();
      skip_space();
      if (src_.substr(pos_, 3) != "::=") error(pos_, "expected '::=' after rule name '{}'", name);
      pos_ += 3;
      const uint32_t id = rule_id(name, at);
      if (defined_[id]) error(at, "rule '{}' is defined twice", name);
      defined_[id] = true;
      rules_[id] = parse_alternatives(false);
      skip_space();
    }
    for (uint32_t r = 0; r < rules_.size(); ++r) {
      if (!defined_[r]) error(first_use_[r], "undefined rule '{}'", names_[r]);
    }
    const auto root = ids_.find("root");
    if (root == ids_.end()) fail("grammar: no 'root' rule");
    check_left_recursion();
    return compile(root->second);
  }

 private:
  template <class... Args>
  [[noreturn]] void error(size_t at, fmt::format_string<Args...> format, Args&&... args) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    fail("grammar:{}:{}: {}", line, col, fmt::format(format, std::forward<Args>(args)...));
  }

  bool eof() const { return pos_ >= src_.size(); }
  char peek() const { return eof() ? '\0' : src_[pos_]; }

  static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }

  void skip_space() {
    while (!eof()) {
      const char c = src_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (!eof() && src_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!eof() && is_name_char(src_[pos_])) ++pos_;
    if (pos_ == start) error(start, "expected a rule name, found '{}'", std::string(1, peek()));
    return std::string(src_.substr(start, pos_ - start));
  }

  // Whether a rule definition (`name ::=`) starts at pos_.
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < src_.size() && is_name_char(src_[p])) ++p;
    if (p == pos_) return false;
    while (p < src_.size() && (src_[p] == ' ' || src_[p] == '\t' || src_[p] == '\n' || src_[p] == '\r')) ++p;
    return src_.substr(p, 3) == "::=";
  }

  uint32_t rule_id(const std::string& name, size_t at) {
    const auto [it, inserted] = ids_.emplace(name, static_cast<uint32_t>(rules_.size()));
    if (inserted) {
      rules_.emplace_back();
      names_.push_back(name);
      defined_.push_back(false);
      first_use_.push_back(at);
    }
    return it->second;
  }

  uint32_t synthetic_rule(Alternatives alts) {
    const uint32_t id = static_cast<uint32_t>(rules_.size());
    rules_.push_back(std::move(alts));
    names_.push_back(fmt::format("rule-{}", id));
    defined_.push_back(true);
    first_use_.push_back(pos_);
    return id;
  }

  Alternatives parse_alternatives(bool nested) {
    Alternatives alts;
    for (;;) {
      alts.push_back(parse_sequence(nested));
      skip_space();
      if (peek() != '|') break;
      ++pos_;
    }
    return alts;
  }

  Sequence parse_sequence(bool nested) {
    Sequence seq;
    for (;;) {
      skip_space();
      if (eof() || peek() == '|' || peek() == ')') break;
      if (!nested && at_rule_start()) break;
      Sequence atom = parse_atom();
      for (;;) {
        const char c = peek();
        if (c == '*' || c == '+' || c == '?') {
          ++pos_;
          atom = repeat(std::move(atom), c == '+' ? 1 : 0, c == '?' ? 1 : -1);
        } else if (c == '{') {
          const size_t at = pos_++;
          const int m = parse_int(at);
          int n = m;
          if (peek() == ',') {
            ++pos_;
            n = peek() == '}' ? -1 : parse_int(at);
          }
          if (peek() != '}') error(pos_, "expected '}}' to close the repetition");
          ++pos_;
          if (n != -1 && n < m) error(at, "repetition {{{},{}}} has max < min", m, n);
          if (m > kMaxRepetition || n > kMaxRepetition) error(at, "repetition bounds above {}", kMaxRepetition);
          atom = repeat(std::move(atom), m, n);
        } else {
          break;
        }
      }
      seq.insert(seq.end(), atom.begin(), atom.end());
    }
    return seq;
  }

  int parse_int(size_t at) {
    while (peek() == ' ') ++pos_;
    const size_t start = pos_;
    long v = 0;
    while (!eof() && src_[pos_] >= '0' && src_[pos_] <= '9') {
      v = v * 10 + (src_[pos_] - '0');
      if (v > 1000000) error(at, "repetition bound too large");
      ++pos_;
    }
    if (pos_ == start) error(pos_, "expected a number in the repetition");
    while (peek() == ' ') ++pos_;
    return static_cast<int>(v);
  }

  Item as_item(Sequence atom) {
    if (atom.size() == 1) return atom[0];
    return ref_item(synthetic_rule({std::move(atom)}));
  }

  // atom{m,n}; n = -1: unbounded.
  Sequence repeat(Sequence atom, int m, int n) {
    const Item x = as_item(std::move(atom));
    Sequence out(static_cast<size_t>(m), x);
    if (n == -1) {
      const uint32_t star = synthetic_rule({});
      rules_[star] = {{x, ref_item(star)}, {}};
      out.push_back(ref_item(star));
    } else if (n > m) {
      uint32_t opt = synthetic_rule({{x}, {}});
      for (int k = 1; k < n - m; ++k) opt = synthetic_rule({{x, ref_item(opt)}, {}});
      out.push_back(ref_item(opt));
    }
    return out;
  }

  Sequence parse_atom() {
    const size_t at = pos_;
    const char c = peek();
    if (c == '"') {
      ++pos_;
      Sequence seq;
      std::string bytes;
      while (peek() != '"') {
        if (eof() || peek() == '\n') error(at, "unterminated string literal");
        bytes.clear();
        append_utf8(bytes, parse_char());
        for (char b : bytes) seq.push_back(byte_item(static_cast<uint8_t>(b), static_cast<uint8_t>(b)));
      }
      ++pos_;
      return seq;
    }
    if (c == '[') return parse_class();
    if (c == '.') {
      ++pos_;
      return class_items({{0, kMaxCodePoint}});
    }
    if (c == '(') {
      ++pos_;
      Alternatives alts = parse_alternatives(true);
      skip_space();
      if (peek() != ')') error(at, "unclosed '('");
      ++pos_;
      if (alts.size() == 1) return alts[0];
      return {ref_item(synthetic_rule(std::move(alts)))};
    }
    if (is_name_char(c)) {
      const std::string name = parse_name();
      return {ref_item(rule_id(name, at))};
    }
    if (c == '=' || c == ':') error(at, "unexpected '{}' (a rule is written 'name ::= ...')", std::string(1, c));
    error(at, "unexpected '{}'", std::string(1, c));
  }

  // One character of a literal or class (the backslash escapes, or one UTF-8 character).
  uint32_t parse_char() {
    const size_t at = pos_;
    const auto c = static_cast<unsigned char>(src_[pos_++]);
    if (c == '\\') {
      if (eof()) error(at, "dangling '\\'");
      const char e = src_[pos_++];
      switch (e) {
        case 'n': return '\n';
        case 't': return '\t';
        case 'r': return '\r';
        case '0': return 0;
        case 'x': return parse_hex(at, 2);
        case 'u': return parse_hex(at, 4);
        case 'U': return parse_hex(at, 8);
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': case '/': case '.':
          return static_cast<unsigned char>(e);
        default: error(at, "unknown escape '\\{}'", std::string(1, e));
      }
    }
    if (c < 0x80) return c;
    // A UTF-8 character of the grammar text.
    const int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || pos_ + static_cast<size_t>(n) - 1 > src_.size()) error(at, "invalid UTF-8 in the grammar");
    uint32_t cp = c & (0x7F >> n);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(src_[pos_++]) & 0x3F);
    return cp;
  }

  uint32_t parse_hex(size_t at, int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const char h = peek();
      int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) error(at, "expected {} hex digits", digits);
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (v > kMaxCodePoint) error(at, "code point {:#x} is beyond U+10FFFF", v);
    return v;
  }

  Sequence parse_class() {
    const size_t at = pos_++;
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    while (peek() != ']') {
      if (eof()) error(at, "unclosed character class");
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < src_.size() && src_[pos_ + 1] != ']') {
        ++pos_;
        hi = parse_char();
        if (hi < lo) error(at, "character range is out of order");
      }
      ranges.emplace_back(lo, hi);
    }
    ++pos_;
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (const auto& r : ranges) {
      if (!merged.empty() && r.first <= merged.back().second + 1) {
        merged.back().second = std::max(merged.back().second, r.second);
      } else {
        merged.push_back(r);
      }
    }
    if (negated) {
      std::vector<std::pair<uint32_t, uint32_t>> complement;
      uint32_t next = 0;
      for (const auto& [lo, hi] : merged) {
        if (lo > next) complement.emplace_back(next, lo - 1);
        next = hi + 1;
      }
      if (next <= kMaxCodePoint) complement.emplace_back(next, kMaxCodePoint);
      merged = std::move(complement);
    }
    if (merged.empty()) error(at, "character class matches nothing");
    return class_items(merged);
  }

  // The items matching one character of `ranges` (sorted, disjoint): one byte set when all
  // are ASCII, else a rule whose alternatives are UTF-8 byte-range sequences.
  Sequence class_items(const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
    Item ascii;
    bool any_ascii = false;
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    for (auto [lo, hi] : ranges) {
      if (lo < 0x80) {
        const uint32_t top = std::min<uint32_t>(hi, 0x7F);
        const Item it = byte_item(static_cast<uint8_t>(lo), static_cast<uint8_t>(top));
        for (size_t w = 0; w < 4; ++w) ascii.bytes[w] |= it.bytes[w];
        any_ascii = true;
        lo = 0x80;
      }
      // Surrogates are not characters: split them out.
      if (lo <= hi && lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, seqs);
        if (hi > 0xDFFF) utf8_sequences(0xE000, hi, seqs);
      } else {
        utf8_sequences(lo, hi, seqs);
      }
    }
    if (seqs.empty()) return {ascii};
    Alternatives alts;
    if (any_ascii) alts.push_back({ascii});
    for (const auto& s : seqs) {
      Sequence seq;
      for (const auto& [a, b] : s) seq.push_back(byte_item(a, b));
      alts.push_back(std::move(seq));
    }
    return {ref_item(synthetic_rule(std::move(alts)))};
  }

  void check_left_recursion() const {
    const size_t n = rules_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Sequence& seq : rules_[r]) {
          if (std::all_of(seq.begin(), seq.end(), [&](const Item& it) { return it.ref && nullable[it.rule]; })) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    // Rules reachable at the left edge of each rule.
    std::vector<std::vector<uint32_t>> left(n);
    for (size_t r = 0; r < n; ++r) {
      for (const Sequence& seq : rules_[r]) {
        for (const Item& it : seq) {
          if (!it.ref) break;
          left[r].push_back(it.rule);
          if (!nullable[it.rule]) break;
        }
      }
    }
    std::vector<int> color(n, 0);  // 0 unvisited, 1 on the path, 2 done
    std::function<void(uint32_t)> visit = [&](uint32_t r) {
      color[r] = 1;
      for (uint32_t s : left[r]) {
        if (color[s] == 1) error(first_use_[s], "rule '{}' is left-recursive", names_[s]);
        if (color[s] == 0) visit(s);
      }
      color[r] = 2;
    };
    for (uint32_t r = 0; r < n; ++r) {
      if (color[r] == 0) visit(r);
    }
  }

  CompiledGrammar compile(uint32_t root) {
    CompiledGrammar g;
    g.text = std::string(src_);
    g.root = root;
    g.rule_names = names_;
    g.rules.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      for (const Sequence& seq : rules_[r]) {
        g.rules[r].push_back(static_cast<uint32_t>(g.elements.size()));
        for (const Item& it : seq) {
          GrammarElement e;
          e.kind = it.ref ? GrammarElement::Kind::rule_ref : GrammarElement::Kind::bytes;
          e.rule = it.rule;
          e.bytes = it.bytes;
          g.elements.push_back(e);
        }
        g.elements.push_back(GrammarElement{});
      }
    }
    return g;
  }

  std::string_view src_;
  size_t pos_ = 0;
  std::vector<Alternatives> rules_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::vector<size_t> first_use_;
  std::unordered_map<std::string, uint32_t> ids_;
};

}  // namespace

CompiledGrammar compile_gbnf(std::string_view text) { return Parser(text).run(); }

std::string gbnf_literal(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          out += fmt::format("\\x{:02X}", c);
        } else {
          out.push_back(ch);  // UTF-8 passes through: the parser reads it back as characters
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace hack::grammar
