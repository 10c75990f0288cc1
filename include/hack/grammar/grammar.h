/// @file grammar.h
/// @brief GBNF (llama.cpp's grammar format) parsed and compiled to byte-level rules.
///
/// Text format: `name ::= alternatives` rules; string literals "..." (escapes \n \t \r \\ \"
/// \xHH \uHHHH \UHHHHHHHH), character classes [a-z], [^"\\], `.` (any character), rule
/// references, ( groups ), `|`, postfix `*` `+` `?` `{m}` `{m,}` `{m,n}`, `#` comments.
/// Newlines are whitespace: a rule ends where the next `name ::=` begins. The start rule is
/// `root`. Left recursion is refused (the matcher expands rules top-down).
///
/// Compiled form: every character class becomes bytes — an ASCII-only class is one byte-set
/// element, a class with non-ASCII code points a rule whose alternatives are the UTF-8 byte
/// sequences of its ranges — so the matcher works on bytes (tokens are byte strings).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hack::grammar {

/// One element of a compiled rule alternative.
struct GrammarElement {
  enum class Kind : uint8_t { bytes, rule_ref, end };
  Kind kind = Kind::end;
  uint32_t rule = 0;                  ///< Kind::rule_ref: the rule index
  std::array<uint64_t, 4> bytes{};    ///< Kind::bytes: bit b set = byte b matches

  bool matches(uint8_t b) const { return (bytes[b >> 6] >> (b & 63)) & 1; }
};

/// A grammar compiled to byte-level rules. Immutable once built; share it between matchers.
struct CompiledGrammar {
  /// Every alternative of every rule, each a run of elements ending with Kind::end.
  std::vector<GrammarElement> elements;
  /// rules[r]: the element index where each alternative of rule r starts.
  std::vector<std::vector<uint32_t>> rules;
  std::vector<std::string> rule_names;  ///< for errors and debugging (synthetic rules: "name-3")
  uint32_t root = 0;
  std::string text;  ///< the GBNF it was compiled from
};

/// Parses and compiles GBNF text. Throws hack::Error "grammar:LINE:COL: what is wrong" on
/// bad syntax, an undefined rule, a missing `root`, or left recursion.
CompiledGrammar compile_gbnf(std::string_view text);

/// `s` as a GBNF string literal ("..." with \", \\, \n, \r, \t and \xHH escapes).
std::string gbnf_literal(std::string_view s);

}  // namespace hack::grammar
