// IncrementalDecoder: streams exactly decode(all ids), and holds back only what later ids
// could still change (partial UTF-8, open <0xNN> runs).
#include <catch2/catch.hpp>
#include <random>

#include "src/tokenizer/utf8.h"
#include "unit/tokenizer/golden_support.h"

namespace {

hack::Tokenizer load_shared(const char* name) {
  return hack::Tokenizer::load(hack::test::shared_fixtures_dir() / "tokenizers" / name);
}

std::vector<std::string> steps(const hack::Tokenizer& tok, const std::vector<int>& ids, bool skip) {
  hack::IncrementalDecoder d(tok, skip);
  std::vector<std::string> out;
  for (int id : ids) out.push_back(d.step(id));
  out.push_back(d.finish());
  return out;
}

}  // namespace

TEST_CASE("byte-fallback runs are released when a non-byte token closes them", "[tokenizer][incremental]") {
  const hack::Tokenizer tok = load_shared("mistral");
  const int e2 = *tok.token_to_id("<0xE2>"), x82 = *tok.token_to_id("<0x82>"), xac = *tok.token_to_id("<0xAC>");
  const int hello = *tok.token_to_id("▁Hello"), ff = *tok.token_to_id("<0xFF>");
  // "▁Hello" then € as three byte tokens then "▁Hello".
  CHECK(steps(tok, {hello, e2, x82, xac, hello}, false) ==
        std::vector<std::string>{"Hello", "", "", "", "€ Hello", ""});
  // A run that turns out invalid decodes as one U+FFFD per byte, as HF does.
  CHECK(tok.decode(std::vector<int>{hello, e2, x82, xac, ff}, false) == "Hello\uFFFD\uFFFD\uFFFD\uFFFD");
  CHECK(steps(tok, {hello, e2, x82, xac, ff}, false) ==
        std::vector<std::string>{"Hello", "", "", "", "", "\uFFFD\uFFFD\uFFFD\uFFFD"});
}

TEST_CASE("byte-level partial characters are held until complete", "[tokenizer][incremental]") {
  const hack::Tokenizer tok = load_shared("qwen3");
  const std::vector<int> ids = tok.encode("emoji 🤖 ok", false);
  const std::vector<std::string> out = steps(tok, ids, false);
  std::string joined;
  for (const auto& s : out) {
    joined += s;
    // Every piece is valid UTF-8 on its own: no half characters are emitted.
    CHECK(hack::tok::valid_utf8_prefix(s) == s.size());
    CHECK(s.find("\uFFFD") == std::string::npos);
  }
  CHECK(joined == "emoji 🤖 ok");
}

TEST_CASE("skip_special_tokens and the first-token space rule stream like decode", "[tokenizer][incremental]") {
  const hack::Tokenizer tok = load_shared("mistral");
  const std::vector<int> ids = {1, *tok.token_to_id("▁"), *tok.token_to_id("▁Hello"), 2, *tok.token_to_id("▁world")};
  for (bool skip : {false, true}) {
    std::string joined;
    for (const auto& s : steps(tok, ids, skip)) joined += s;
    CHECK(joined == tok.decode(ids, skip));
  }
}

TEST_CASE("random id streams: incremental == full decode", "[tokenizer][incremental]") {
  const uint32_t seed = 1234;
  for (const char* name : {"qwen3", "mistral"}) {
    const hack::Tokenizer tok = load_shared(name);
    std::mt19937 rng(seed);
    // Half of the ids from the low range, where byte tokens / single characters live.
    std::uniform_int_distribution<int> any(0, tok.vocab_size() + 10), low(0, 400);
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<int> ids(static_cast<size_t>(1 + rng() % 30));
      for (int& id : ids) id = rng() % 2 ? any(rng) : low(rng);
      for (bool skip : {false, true}) {
        INFO(name << " seed " << seed << " trial " << trial << " ids " << hack::test::show_ids(ids));
        CHECK(hack::test::incremental_decode(tok, ids, skip) == tok.decode(ids, skip));
      }
    }
  }
}

TEST_CASE("reset and reuse", "[tokenizer][incremental]") {
  const hack::Tokenizer tok = load_shared("qwen3");
  hack::IncrementalDecoder d(tok, false);
  const std::vector<int> ids = tok.encode("héllo wörld", false);
  std::string a, b;
  for (int id : ids) a += d.step(id);
  a += d.finish();
  for (int id : ids) b += d.step(id);
  b += d.finish();
  CHECK(a == "héllo wörld");
  CHECK(b == a);
}
