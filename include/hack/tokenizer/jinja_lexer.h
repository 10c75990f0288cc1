/// @file jinja_lexer.h
/// @brief Lexer of the Jinja interpreter: template text -> tokens, with jinja2's whitespace
/// control as transformers configures it (trim_blocks=True, lstrip_blocks=True,
/// keep_trailing_newline=False, newlines normalized to "\n").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hack::jinja {

/// Where a token or node starts in the (newline-normalized) template; 1-based.
struct SourcePos {
  int line = 0;
  int column = 0;
};

enum class TokenKind : uint8_t {
  kData,           // template text to output as is (also the content of {% raw %})
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,   // text = decoded value
  kInteger,  // int_value
  kFloat,    // float_value
  kOperator, // text = the operator ("+", "//", "(", ...)
  kEof,
};

struct Token {
  TokenKind kind = TokenKind::kEof;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0.0;
  SourcePos pos;
};

/// Splits a template into tokens. Throws hack::Error naming line and column for text
/// jinja2 cannot lex (unknown character, unterminated string or tag, bad escape).
std::vector<Token> lex(std::string_view source);

/// Describes a token for error messages ("name 'endfor'", "end of print statement").
std::string describe(const Token& token);

}  // namespace hack::jinja
