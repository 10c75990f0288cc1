// The trie-walked token mask equals checking every token one by one (a small random
// vocabulary and SmolLM2's), replaying tokens equals accepting them one at a time, and the
// sampler with a grammar constraint only ever produces grammar sentences.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "hack/core/error.h"
#include "hack/grammar/grammar_constraint.h"
#include "hack/grammar/json_schema.h"
#include "hack/grammar/matcher.h"
#include "hack/tokenizer/tokenizer.h"
#include "support/test_support.h"

using namespace hack::grammar;
using Json = nlohmann::ordered_json;

namespace {

const char* kNestedSchema = R"({"type":"object","properties":{
  "id":{"type":"integer"},"name":{"type":"string","maxLength":20},
  "kind":{"enum":["cat","dog"]},"weight":{"type":"number"},
  "owner":{"type":"object","properties":{"first":{"type":"string"},"emails":{"type":"array","items":{"type":"string","format":"email"},"maxItems":2}},"required":["first"]}},
  "required":["id","name","kind","owner"]})";

std::shared_ptr<GrammarStateTable> table_for(const std::string& gbnf, std::shared_ptr<const TokenVocabulary> vocab) {
  return std::make_shared<GrammarStateTable>(std::make_shared<const CompiledGrammar>(compile_gbnf(gbnf)), std::move(vocab));
}

// Every token checked one by one on a copy of the matcher.
std::vector<uint8_t> brute_force_mask(const GrammarMatcher& m, const TokenVocabulary& vocab) {
  std::vector<uint8_t> allowed(static_cast<size_t>(vocab.size()), 0);
  for (int t = 0; t < vocab.size(); ++t) {
    GrammarMatcher copy = m;
    allowed[static_cast<size_t>(t)] = copy.accept_token(t);
  }
  return allowed;
}

std::shared_ptr<const TokenVocabulary> smollm2_vocab() {
  static std::shared_ptr<const TokenVocabulary> vocab = [] {
    const auto dir = hack::test::source_dir() / "models" / "smollm2-135m-instruct";
    if (!std::filesystem::exists(dir / "tokenizer.json")) return std::shared_ptr<const TokenVocabulary>();
    return std::make_shared<const TokenVocabulary>(TokenVocabulary::from_tokenizer(hack::Tokenizer::load(dir)));
  }();
  return vocab;
}

}  // namespace

TEST_CASE("matcher: trie mask equals brute force on a random vocabulary", "[grammar]") {
  const uint64_t seed = 7;
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  static const std::vector<std::string> pieces = {"{", "}", "\"", ":", ",", " ", "a", "b", "1", "0", "-", ".",
                                                  "[", "]", "t", "rue", "null", "\\", "\xC3\xA9", "\xC3", "\xA9", "\n"};
  std::vector<std::string> bytes(600);
  for (size_t i = 1; i < bytes.size(); ++i) {  // token 0 has no bytes (a special token)
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n; ++k) bytes[i] += pieces[rng() % pieces.size()];
  }
  auto vocab = std::make_shared<const TokenVocabulary>(bytes);
  for (const std::string& gbnf : std::vector<std::string>{json_object_gbnf(), json_schema_to_gbnf(Json::parse(kNestedSchema))}) {
    const auto table = table_for(gbnf, vocab);
    for (int walk = 0; walk < 20; ++walk) {
      GrammarMatcher m(table);
      for (int step = 0; step < 40; ++step) {
        std::vector<uint8_t> mask;
        m.fill_allowed_mask(mask);
        REQUIRE(mask == brute_force_mask(m, *vocab));
        std::vector<int> allowed;
        for (int t = 0; t < vocab->size(); ++t) {
          if (mask[static_cast<size_t>(t)]) allowed.push_back(t);
        }
        if (allowed.empty()) break;
        REQUIRE(m.accept_token(allowed[rng() % allowed.size()]));
      }
    }
  }
}

TEST_CASE("matcher: trie mask equals brute force on SmolLM2's vocabulary", "[grammar][smollm2]") {
  const auto vocab = smollm2_vocab();
  if (!vocab) {
    WARN("models/smollm2-135m-instruct is absent: skipped");
    return;
  }
  const hack::Tokenizer tok = hack::Tokenizer::load(hack::test::source_dir() / "models" / "smollm2-135m-instruct");
  CHECK(vocab->bytes(tok.eos_id()).empty());  // special tokens are never allowed
  CHECK(vocab->bytes(tok.encode(" hello", false).at(0)) == " hello");
  const std::string text = R"({"id": 12, "name": "Rex \u00e9", "kind": "dog", "owner": {"first": "Ann", "emails": ["a@b.co"]}})";
  const std::vector<int> ids = tok.encode(text, false);
  const auto table = table_for(json_schema_to_gbnf(Json::parse(kNestedSchema)), vocab);
  GrammarMatcher m(table);
  for (size_t i = 0; i <= ids.size(); ++i) {
    if (i % 7 == 0 || i == ids.size()) {
      std::vector<uint8_t> mask;
      m.fill_allowed_mask(mask);
      INFO("after " << i << " tokens");
      REQUIRE(mask == brute_force_mask(m, *vocab));
    }
    if (i < ids.size()) REQUIRE(m.accept_token(ids[i]));
  }
  CHECK(m.is_terminated());
}

TEST_CASE("matcher: replay equals incremental acceptance", "[grammar]") {
  std::vector<std::string> bytes = {"", "{", "}", "\"a\"", ":", "1", "2", ",", " ", "\"", "b", "[", "]"};
  auto vocab = std::make_shared<const TokenVocabulary>(bytes);
  const auto table = table_for(json_object_gbnf(), vocab);
  const std::vector<int> tokens = {1, 3, 4, 8, 11, 5, 7, 6, 12, 7, 9, 10, 9, 4, 5};  // {"a": [1,2],"b":1
  GrammarMatcher incremental(table);
  for (size_t n = 0; n <= tokens.size(); ++n) {
    GrammarMatcher replayed(table_for(json_object_gbnf(), vocab));  // a fresh table, as on another node
    replayed.replay(std::span<const int>(tokens).first(n));
    std::vector<uint8_t> a, b;
    incremental.fill_allowed_mask(a);
    replayed.fill_allowed_mask(b);
    CHECK(a == b);
    CHECK(incremental.can_end() == replayed.can_end());
    if (n < tokens.size()) REQUIRE(incremental.accept_token(tokens[n]));
  }
  GrammarMatcher bad(table);
  CHECK_THROWS_WITH(bad.replay(std::vector<int>{1, 2, 2}), Catch::Contains("token 2 (#2)"));
}

TEST_CASE("sampler with a grammar: only grammar sentences, EOS only where it can end", "[grammar]") {
  const auto vocab = smollm2_vocab();
  if (!vocab) {
    WARN("models/smollm2-135m-instruct is absent: skipped");
    return;
  }
  const hack::Tokenizer tok = hack::Tokenizer::load(hack::test::source_dir() / "models" / "smollm2-135m-instruct");
  GrammarConstraintFactory factory(vocab);
  const std::vector<int> eos = {tok.eos_id()};
  const int v = vocab->size();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    INFO("seed " << seed);
    hack::SamplingParams p;
    p.temperature = 1.0f;
    p.seed = seed;
    p.max_tokens = 400;
    p.grammar = seed % 2 ? json_schema_to_gbnf(Json::parse(kNestedSchema)) : choice_to_gbnf({"alpha", "beta gamma"});
    hack::Sampler sampler(p, v, &factory, eos);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::normal_distribution<float> noise(0.0f, 3.0f);
    std::vector<float> logits(static_cast<size_t>(v));
    std::vector<int> out;
    bool ended = false;
    for (int i = 0; i < p.max_tokens; ++i) {
      for (float& l : logits) l = noise(rng);
      logits[static_cast<size_t>(tok.eos_id())] = -5.0f;  // EOS unlikely unless it is the only choice
      const hack::SampleResult s = sampler.sample(logits);
      if (s.token == tok.eos_id()) {
        ended = true;
        break;
      }
      out.push_back(s.token);
    }
    const std::string text = tok.decode(out, false);
    INFO(text);
    if (seed % 2) {
      if (ended) {
        const Json j = Json::parse(text);  // parses, has the required fields
        CHECK(j.contains("owner"));
        CHECK((j["kind"] == "cat" || j["kind"] == "dog"));
      }
    } else {
      REQUIRE(ended);
      CHECK((text == "alpha" || text == "beta gamma"));
    }
  }
  // No factory: a grammar is refused, not ignored.
  hack::SamplingParams p;
  p.grammar = "root ::= \"a\"";
  CHECK_THROWS_WITH(hack::Sampler(p, v), Catch::Contains("cannot apply a grammar"));
}
