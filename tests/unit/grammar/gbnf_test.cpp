// GBNF parser and byte matcher: accepted and rejected strings, error positions.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "hack/core/error.h"
#include "hack/grammar/grammar.h"
#include "hack/grammar/matcher.h"

using namespace hack::grammar;

namespace {

GrammarMatcher matcher_for(const std::string& gbnf) {
  auto g = std::make_shared<const CompiledGrammar>(compile_gbnf(gbnf));
  return GrammarMatcher(std::make_shared<GrammarStateTable>(g, nullptr));
}

bool full_match(const std::string& gbnf, std::string_view s) {
  GrammarMatcher m = matcher_for(gbnf);
  return m.accept_bytes(s) && m.can_end();
}

std::string error_of(const std::string& gbnf) {
  try {
    compile_gbnf(gbnf);
  } catch (const hack::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("gbnf: literals, classes, groups and repetition match exactly their language", "[grammar]") {
  const std::string g = R"(
# a comment
root ::= "ab" [0-9]+ ( "x" | "yz" )? tail
tail ::= [a-c]{2,3}   # bounded
)";
  CHECK(full_match(g, "ab1aa"));
  CHECK(full_match(g, "ab123xabc"));
  CHECK(full_match(g, "ab0yzcc"));
  CHECK_FALSE(full_match(g, "ab"));
  CHECK_FALSE(full_match(g, "abxaa"));         // needs a digit
  CHECK_FALSE(full_match(g, "ab1a"));          // tail too short
  CHECK_FALSE(full_match(g, "ab1aaaa"));       // tail too long
  CHECK_FALSE(full_match(g, "ab1yaa"));        // "y" without "z"
  CHECK(full_match("root ::= [^\"\\\\]*", "hello \xC3\xA9 \xE2\x82\xAC"));
  CHECK_FALSE(full_match("root ::= [^\"\\\\]*", "a\"b"));
  CHECK_FALSE(full_match("root ::= [^\"\\\\]*", "\xC3"));     // incomplete UTF-8 cannot end
  CHECK_FALSE(full_match("root ::= [^a]", "\xED\xA0\x80"));   // a surrogate is not a character
  CHECK(full_match("root ::= [α-ω]{3}", "αβω"));
  CHECK_FALSE(full_match("root ::= [α-ω]{3}", "αβa"));
  CHECK(full_match("root ::= \"\\x41\\u00e9\\n\"", "A\xC3\xA9\n"));
  CHECK(full_match("root ::= .{2}", "a\xF0\x9F\x98\x80"));
  CHECK(full_match("root ::= x{0} \"k\"\nx ::= \"q\"", "k"));
  CHECK(full_match("root ::= (\"a\" | \"\") \"b\"{1,}", "bbb"));
  // A rule spanning lines ends where the next "name ::=" begins.
  CHECK(full_match("root ::= \"a\"\n  | \"b\"\n  other\nother ::= \"c\"", "bc"));
}

TEST_CASE("gbnf: can_end and is_terminated", "[grammar]") {
  GrammarMatcher m = matcher_for("root ::= \"a\" \"b\"?");
  CHECK_FALSE(m.can_end());
  REQUIRE(m.accept_bytes("a"));
  CHECK(m.can_end());
  CHECK_FALSE(m.is_terminated());
  CHECK_FALSE(m.accept_bytes("c"));  // rejected, unchanged
  REQUIRE(m.accept_bytes("b"));
  CHECK(m.is_terminated());
  CHECK_FALSE(m.accept_bytes("b"));
}

TEST_CASE("gbnf: right recursion and nesting", "[grammar]") {
  const std::string g = "root ::= list\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [0-9] | list";
  CHECK(full_match(g, "[]"));
  CHECK(full_match(g, "[1,[2,[]],3]"));
  CHECK(full_match(g, "[[[[[[[[[[]]]]]]]]]]"));
  CHECK_FALSE(full_match(g, "[1,]"));
  CHECK_FALSE(full_match(g, "[[1]"));
}

TEST_CASE("gbnf: errors name the line and column", "[grammar]") {
  CHECK_THAT(error_of("root ::= \"a\"\nfoo = \"b\""), Catch::Contains("grammar:2:5") && Catch::Contains("name ::="));
  CHECK_THAT(error_of("root ::= bar"), Catch::Contains("grammar:1:10") && Catch::Contains("undefined rule 'bar'"));
  CHECK_THAT(error_of("root ::= \"abc"), Catch::Contains("grammar:1:10") && Catch::Contains("unterminated"));
  CHECK_THAT(error_of("root ::= [a-"), Catch::Contains("unclosed character class"));
  CHECK_THAT(error_of("root ::= (\"a\""), Catch::Contains("unclosed '('"));
  CHECK_THAT(error_of("x ::= \"a\""), Catch::Contains("no 'root' rule"));
  CHECK_THAT(error_of("root ::= root \"a\" | \"b\""), Catch::Contains("left-recursive"));
  CHECK_THAT(error_of("root ::= e\ne ::= \"\"? e \"x\""), Catch::Contains("left-recursive"));
  CHECK_THAT(error_of("root ::= \"a\"{3,1}"), Catch::Contains("max < min"));
  CHECK_THAT(error_of("root ::= \"a\"\nroot ::= \"b\""), Catch::Contains("grammar:2:1") && Catch::Contains("defined twice"));
  CHECK_THAT(error_of("root ::= \"\\q\""), Catch::Contains("unknown escape"));
  CHECK_THAT(error_of("root ::= [z-a]"), Catch::Contains("out of order"));
}

TEST_CASE("gbnf: gbnf_literal round-trips through the parser", "[grammar]") {
  for (const std::string& s : std::vector<std::string>{"plain", "quo\"te", "back\\slash", "new\nline\ttab", std::string("nul\x01", 4), "\xC3\xA9t\xC3\xA9"}) {
    CHECK(full_match("root ::= " + gbnf_literal(s), s));
  }
}
