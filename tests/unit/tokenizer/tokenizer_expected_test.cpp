// Goldens written by others, independently of scripts/make_tokenizer_goldens.py:
// tests/fixtures/shared/tokenizers/{qwen3,mistral}/expected.json (copies of ../shared) and the kjv-bpe fixture's
// tokenizer_goldens.json (scripts/make_fixtures.py).
#include <catch2/catch.hpp>

#include "unit/tokenizer/golden_support.h"

namespace {

using hack::test::show;
using hack::test::show_ids;

std::vector<int> ids_of(const nlohmann::json& j) { return j.get<std::vector<int>>(); }

}  // namespace

TEST_CASE("shared expected.json: encode matches exactly", "[tokenizer][golden]") {
  for (const char* name : {"qwen3", "mistral"}) {
    DYNAMIC_SECTION(name) {
      const auto dir = hack::test::shared_fixtures_dir() / "tokenizers" / name;
      const hack::Tokenizer tok = hack::Tokenizer::load(dir);
      const nlohmann::json expected = nlohmann::json::parse(hack::read_file(dir / "expected.json", "fixture"));
      REQUIRE(expected["cases"].size() >= 20);
      for (const auto& c : expected["cases"]) {
        const std::string text = c["text"].get<std::string>();
        const std::vector<int> want = ids_of(c["ids"]);
        const std::vector<int> got = tok.encode(text, false);
        INFO(name << " " << show(text) << ": want " << show_ids(want) << " got " << show_ids(got));
        CHECK(got == want);
        // What the incremental decoder streams is what decode returns.
        CHECK(hack::test::incremental_decode(tok, got, false) == tok.decode(got, false));
      }
    }
  }
}

TEST_CASE("kjv-bpe tokenizer_goldens.json: ids, tokens, decode", "[tokenizer][golden]") {
  const auto dir = hack::test::fixtures_dir() / "tokenizers" / "kjv-bpe";
  const hack::Tokenizer tok = hack::Tokenizer::load(dir);
  const nlohmann::json g = nlohmann::json::parse(hack::read_file(dir / "tokenizer_goldens.json", "fixture"));
  CHECK(tok.bos_id() == g["bos_id"].get<int>());
  CHECK(tok.eos_id() == g["eos_id"].get<int>());
  REQUIRE(g["cases"].size() > 0);
  for (const auto& c : g["cases"]) {
    const std::string text = c["text"].get<std::string>();
    INFO(show(text));
    CHECK(tok.encode(text, true) == ids_of(c["ids"]));
    const std::vector<int> plain = tok.encode(text, false);
    CHECK(plain == ids_of(c["ids_no_special"]));
    std::vector<std::string> tokens;
    for (int id : plain) tokens.push_back(tok.id_to_token(id).value_or("<none>"));
    CHECK(tokens == c["tokens_no_special"].get<std::vector<std::string>>());
    const std::vector<int> ids = ids_of(c["ids"]);
    CHECK(tok.decode(ids, false) == c["decoded"].get<std::string>());
    CHECK(tok.decode(ids, true) == c["decoded_skip_special"].get<std::string>());
  }
}
