/// @file json_schema.h
/// @brief JSON Schema, regex and choice lists compiled to GBNF.
///
/// JSON Schema subset: type (object, array, string, number, integer, boolean, null, or a
/// list of them), properties + required, additionalProperties (false, true or a schema;
/// absent = false when properties are given, as xgrammar's strict mode does), enum, const,
/// items + minItems/maxItems, minLength/maxLength, pattern (regex_to_gbnf's subset, matched
/// as the whole string), format date, time, date-time, uuid, email (loosely), anyOf/oneOf
/// (oneOf is not exclusive), single-schema allOf, local $ref (#, #/$defs/..,
/// #/definitions/..), nullable. Properties come out in the order the schema lists them;
/// optional ones may be left out. minimum/maximum (and exclusive ones) enforce the sign
/// only (a bound >= 0 forbids '-'); other bounds are not enforced. Annotations (title,
/// description, default, examples, $schema, $id, $comment, readOnly, writeOnly,
/// deprecated) and unknown formats are ignored. Any other keyword (not, if/then/else,
/// patternProperties, prefixItems, uniqueItems, contains, multipleOf, minProperties, ...)
/// is an error naming it.
///
/// Whitespace between tokens is bounded (at most 20 of space, tab, newline) so a model
/// cannot loop on whitespace; numbers have at most 16 integer, 16 fraction and 2 exponent digits.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace hack::grammar {

struct GbnfOptions {
  /// Prefix of every rule name, so the rules embed in a larger grammar; the top rule is
  /// `<prefix>root` (with the empty prefix: `root`, a complete grammar).
  std::string rule_prefix;
};

/// GBNF for JSON matching `schema`. Throws hack::Error naming an unsupported keyword or a
/// malformed value ("json_schema: properties.age: unsupported keyword 'multipleOf'").
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema, const GbnfOptions& options = {});
/// GBNF for any JSON object (response_format json_object).
std::string json_object_gbnf(const GbnfOptions& options = {});
/// GBNF for strings fully matching `pattern`: literals, ., classes (with \d \w \s), groups
/// ((?:...) too), |, * + ? {m} {m,} {m,n} (lazy forms alike), ^ and $ at the ends.
/// Backreferences, lookaround and word boundaries are errors.
std::string regex_to_gbnf(std::string_view pattern, const GbnfOptions& options = {});
/// GBNF for exactly one of `choices`.
std::string choice_to_gbnf(const std::vector<std::string>& choices, const GbnfOptions& options = {});

/// The GBNF expression for `pattern` (no rule): inside_json_string = true makes it match the
/// JSON-escaped form of the strings (quote, backslash and control characters escaped).
std::string regex_expression(std::string_view pattern, bool inside_json_string);

}  // namespace hack::grammar
