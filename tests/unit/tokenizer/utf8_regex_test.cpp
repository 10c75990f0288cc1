// UTF-8 repair and the Oniguruma-compatible regex layer.
#include <catch2/catch.hpp>
#include <vector>

#include "hack/core/error.h"
#include "src/tokenizer/regex.h"
#include "src/tokenizer/utf8.h"

namespace {

std::string lossy(std::string_view s) {
  std::string out;
  hack::tok::append_utf8_lossy(out, s);
  return out;
}

std::vector<std::pair<size_t, size_t>> matches(const char* pattern, std::string_view text) {
  hack::tok::Regex re(pattern);
  hack::tok::RegexScratch scratch;
  std::vector<std::pair<size_t, size_t>> out;
  re.for_each_match(text, scratch, [&](size_t s, size_t e) { out.emplace_back(s, e); });
  return out;
}

}  // namespace

TEST_CASE("lossy UTF-8 replaces maximal subparts (Unicode 3.9, Rust from_utf8_lossy)", "[tokenizer][utf8]") {
  const std::string r = "\xEF\xBF\xBD";
  CHECK(lossy("abc") == "abc");
  CHECK(lossy("a\xFF" "b") == "a" + r + "b");
  CHECK(lossy("\xE2\x82") == r);                        // truncated 3-byte sequence: one U+FFFD
  CHECK(lossy("\xE2\x82" "A") == r + "A");
  CHECK(lossy("\xE0\x80\x80") == r + r + r);            // overlong: E0 needs A0..BF next
  CHECK(lossy("\xED\xA0\x80") == r + r + r);            // surrogate
  CHECK(lossy("\xF4\x90\x80\x80") == r + r + r + r);    // above U+10FFFF
  CHECK(lossy("\xF0\x9F\xA4") == r);
  CHECK(lossy("\xC0\xAF") == r + r);
}

TEST_CASE("incomplete UTF-8 tails", "[tokenizer][utf8]") {
  using hack::tok::incomplete_utf8_tail;
  CHECK(incomplete_utf8_tail("ab") == 0);
  CHECK(incomplete_utf8_tail("a\xE2") == 1);
  CHECK(incomplete_utf8_tail("a\xE2\x82") == 2);
  CHECK(incomplete_utf8_tail("a\xE2\x82\xAC") == 0);
  CHECK(incomplete_utf8_tail("\xF0\x9F\xA4") == 3);
  CHECK(incomplete_utf8_tail("\xE2\x41") == 0);
  CHECK(incomplete_utf8_tail("\xFF") == 0);  // invalid, not incomplete
  CHECK(incomplete_utf8_tail("\xE0\x80") == 0);
}

TEST_CASE("Oniguruma pattern translation", "[tokenizer][regex]") {
  using hack::tok::translate_onig_pattern;
  // \s loses U+180E; \p{L} / \p{N} gain Unicode 15-16 characters; other escapes stay.
  const std::string s = translate_onig_pattern(R"(\s+(?!\S))");
  CHECK(s.starts_with(R"([\t\n)"));
  CHECK(s.find("(?![^") != std::string::npos);
  CHECK(translate_onig_pattern(R"([^\s\p{L}\p{N}])").find(R"(\p{L}\x{1C89})") != std::string::npos);
  CHECK(translate_onig_pattern(R"(a\d\x{41}\[\])") == R"(a\d\x{41}\[\])");
  CHECK(translate_onig_pattern(R"([]\s])").starts_with(R"([]\t)"));
}

TEST_CASE("regex matching follows Oniguruma's classes and find_iter", "[tokenizer][regex]") {
  CHECK(matches(R"(\s)", "a\xE1\xA0\x8E" "b c").size() == 1);  // U+180E is not \s
  CHECK(matches(R"(\p{L}+)", "x\xF0\x90\x97\x80y") == std::vector<std::pair<size_t, size_t>>{{0, 6}});  // U+105C0
  // An empty match right after a match is skipped; elsewhere it is reported.
  CHECK(matches("a*", "baa") == std::vector<std::pair<size_t, size_t>>{{0, 0}, {1, 3}});
  CHECK(matches("x?", "ab") == std::vector<std::pair<size_t, size_t>>{{0, 0}, {1, 1}, {2, 2}});
  CHECK_THROWS_AS(hack::tok::Regex("(unclosed"), hack::Error);
}
