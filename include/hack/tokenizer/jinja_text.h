/// @file jinja_text.h
/// @brief Python str semantics on UTF-8 std::string for the Jinja interpreter: lengths and
/// indexes count code points, whitespace is str.isspace(), split/strip/title behave like
/// CPython's str methods.
///
/// Bytes that are not valid UTF-8 (possible only in template source) count as one code
/// point each and are copied through unchanged, never read past the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hack::jinja::text {

/// Code points of `s`; an invalid byte b decodes to 0xDC00 + b (and encodes back to b).
std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
void append_code_point(std::string& out, char32_t cp);
/// Decodes one code point at s[pos] (invalid bytes as above) and advances pos.
char32_t next_code_point(std::string_view s, size_t& pos);

bool is_ascii(std::string_view s);
/// len(s): number of code points.
size_t length(std::string_view s);
/// Byte offset of code point index `cp_index` (clamped to s.size()).
size_t byte_offset(std::string_view s, size_t cp_index);
/// Code point index of byte offset `byte_pos` (a code point boundary).
size_t code_point_index(std::string_view s, size_t byte_pos);

/// str.isspace() for one code point (also what `\s` and str.split() use).
bool is_space(char32_t cp);
/// A character Python's repr() prints as is (str.isprintable()).
bool is_printable(char32_t cp);

/// str.strip / lstrip / rstrip; `chars` unset strips whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
/// str.split(sep, maxsplit) (maxsplit < 0 = no limit); sep unset splits on whitespace runs.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit);
/// str.rsplit(sep, maxsplit).
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit);
/// str.splitlines(keepends).
std::vector<std::string> splitlines(std::string_view s, bool keepends);
/// str.replace(old, new, count) (count < 0 = all); empty `old` inserts between code points.
/// Throws hack::Error when the result would exceed max_bytes.
std::string replace(std::string_view s, std::string_view old, std::string_view replacement,
                    int64_t count, size_t max_bytes);
/// Number of non-overlapping occurrences (str.count); empty needle counts len+1.
size_t count(std::string_view s, std::string_view needle);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
/// str.title(): a cased character after an uncased one starts a word ("it's" -> "It'S").
std::string title(std::string_view s);
/// str.capitalize(): first code point title-cased, the rest lower-cased.
std::string capitalize(std::string_view s);
/// jinja2's `title` filter: words start after [-\s({[<] runs.
std::string title_filter(std::string_view s);
/// str.swapcase().
std::string swapcase(std::string_view s);

bool is_alpha(std::string_view s);
bool is_digit(std::string_view s);
bool is_alnum(std::string_view s);
bool is_all_space(std::string_view s);
bool is_lower(std::string_view s);
bool is_upper(std::string_view s);

/// Appends Python's repr of the string (quotes chosen like CPython).
void append_repr(std::string& out, std::string_view s);

}  // namespace hack::jinja::text
