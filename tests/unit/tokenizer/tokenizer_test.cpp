// hack::Tokenizer on small hand-written tokenizer.json files: the BPE model's options,
// added-token matching, post-processing, tokenizer_config.json, and load errors.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hack/core/error.h"
#include "hack/tokenizer/tokenizer.h"
#include "support/test_support.h"

namespace {

using nlohmann::json;

// A byte-free BPE over a, b, c: "abc" merges through "bc" (rank 0) then "a"+"bc".
json tiny_tokenizer() {
  return json::parse(R"({
    "version": "1.0",
    "added_tokens": [],
    "normalizer": null,
    "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
    "post_processor": null,
    "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": false, "byte_fallback": false,
              "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "▁": 4, "ab": 5, "bc": 6, "abc": 7, "▁abc": 8,
                        "<0x78>": 9, "<0xC3>": 10, "<0xA9>": 11},
              "merges": ["b c", "a b", "a bc", "▁ abc"]}
  })");
}

hack::Tokenizer make(const json& tok, const json& config = json()) {
  return hack::Tokenizer::from_json(tok.dump(), config.is_null() ? "" : config.dump());
}

std::string load_error(const json& tok, const json& config = json()) {
  try {
    make(tok, config);
  } catch (const hack::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("BPE merges by rank, in both merge encodings", "[tokenizer]") {
  json t = tiny_tokenizer();
  const hack::Tokenizer strings = make(t);
  CHECK(strings.encode("abc", false) == std::vector<int>{8});     // ▁ abc
  CHECK(strings.encode("abc abc", false) == std::vector<int>{8, 8});
  CHECK(strings.encode("ab", false) == std::vector<int>{4, 5});   // ▁ + ab (no "▁ ab" merge)
  t["model"]["merges"] = json::parse(R"([["b", "c"], ["a", "b"], ["a", "bc"], ["▁", "abc"]])");
  const hack::Tokenizer pairs = make(t);
  CHECK(pairs.encode("abc abc", false) == std::vector<int>{8, 8});
  // With "a b" ranked first, "abc" becomes ab + c, which has no merge.
  t["model"]["merges"] = json::parse(R"(["a b", "b c", "a bc", "▁ abc"])");
  CHECK(make(t).encode("abc", false) == std::vector<int>{4, 5, 3});
}

TEST_CASE("BPE unknown characters: unk, fuse_unk, byte_fallback, ignore_merges", "[tokenizer]") {
  json t = tiny_tokenizer();
  CHECK(make(t).encode("axxb", false) == std::vector<int>{4, 1, 0, 0, 2});
  t["model"]["fuse_unk"] = true;
  CHECK(make(t).encode("axxb", false) == std::vector<int>{4, 1, 0, 2});
  t["model"]["byte_fallback"] = true;
  // x has a byte token, é (C3 A9) too; ÿ (C3 BF) has only one of its two: unk.
  CHECK(make(t).encode("axé", false) == std::vector<int>{4, 1, 9, 10, 11});
  CHECK(make(t).encode("aÿ", false) == std::vector<int>{4, 1, 0});
  t["model"]["unk_token"] = nullptr;
  CHECK(make(t).encode("aÿ", false) == std::vector<int>{4, 1});  // no unk token: dropped
  t["model"]["ignore_merges"] = true;
  t["model"]["vocab"]["▁ac"] = 12;
  CHECK(make(t).encode("ac", false) == std::vector<int>{12});
}

TEST_CASE("continuing_subword_prefix and end_of_word_suffix", "[tokenizer]") {
  json t = json::parse(R"({
    "added_tokens": [], "normalizer": null, "post_processor": null, "decoder": {"type": "BPEDecoder", "suffix": "</w>"},
    "pre_tokenizer": {"type": "WhitespaceSplit"},
    "model": {"type": "BPE", "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>",
              "vocab": {"a": 0, "##b": 1, "##c</w>": 2, "ab": 3, "abc</w>": 4, "c</w>": 5},
              "merges": ["a ##b", "ab ##c</w>"]}
  })");
  const hack::Tokenizer tok = make(t);
  CHECK(tok.encode("abc c", false) == std::vector<int>{4, 5});
  CHECK(tok.decode(std::vector<int>{5, 5}, false) == "c c");
}

TEST_CASE("added tokens: leftmost-longest, lstrip / rstrip, normalized, special", "[tokenizer]") {
  json t = tiny_tokenizer();
  t["added_tokens"] = json::parse(R"([
    {"id": 12, "content": "<a>", "special": true, "normalized": false},
    {"id": 13, "content": "<a><b>", "special": true, "normalized": false},
    {"id": 14, "content": "<r>", "special": false, "normalized": false, "rstrip": true, "lstrip": true}
  ])");
  const hack::Tokenizer tok = make(t);
  CHECK(tok.encode("<a><b>", false) == std::vector<int>{13});
  CHECK(tok.encode("<a><a>", false) == std::vector<int>{12, 12});
  CHECK(tok.encode("a  <r>  b", false) == std::vector<int>{4, 1, 14, 4, 2});
  CHECK(tok.is_special(12));
  CHECK_FALSE(tok.is_special(14));
  CHECK(tok.special_ids() == std::vector<int>{12, 13});
  CHECK(tok.decode(std::vector<int>{12, 8, 14}, false) == "<a> abc<r>");
  CHECK(tok.decode(std::vector<int>{12, 8, 14}, true) == "abc<r>");  // Metaspace: first token
  CHECK(tok.vocab_size() == 15);
  CHECK(tok.token_to_id("<a><b>") == 13);
  CHECK(tok.token_to_id("abc") == 7);
  CHECK_FALSE(tok.token_to_id("zzz").has_value());
  CHECK(tok.id_to_token(8) == "▁abc");
  CHECK_FALSE(tok.id_to_token(99).has_value());
  // Ids without a token are skipped by decode, as HF does.
  CHECK(tok.decode(std::vector<int>{99, 8, -1}, false) == "abc");
}

TEST_CASE("tokenizer_config.json: special tokens, add_bos / add_eos, chat templates", "[tokenizer]") {
  json t = tiny_tokenizer();
  t["added_tokens"] = json::parse(R"([
    {"id": 12, "content": "<s>", "special": true, "normalized": false},
    {"id": 13, "content": "</s>", "special": true, "normalized": false}])");
  const json config = json::parse(R"({
    "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "unk_token": null,
    "add_bos_token": true, "add_eos_token": true,
    "chat_template": [{"name": "default", "template": "{{ messages }}"}, {"name": "tool_use", "template": "T"}]})");
  const hack::Tokenizer tok = make(t, config);
  CHECK(tok.bos_token() == "<s>");
  CHECK(tok.eos_token() == "</s>");
  CHECK(tok.unk_token().empty());
  CHECK(tok.bos_id() == 12);
  CHECK(tok.eos_id() == 13);
  CHECK(tok.add_bos_token());
  CHECK(tok.encode("abc", true) == std::vector<int>{12, 8, 13});
  CHECK(tok.encode("abc", false) == std::vector<int>{8});
  REQUIRE(tok.chat_templates().size() == 2);
  CHECK(tok.chat_template() == "{{ messages }}");
  CHECK(tok.chat_template("tool_use") == "T");
  CHECK_FALSE(tok.chat_template("nope").has_value());

  // Without the flags, tokenizer.json's post-processor is used as is.
  t["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
               {"SpecialToken": {"id": "</s>", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [12], "tokens": ["<s>"]},
                       "</s>": {"id": "</s>", "ids": [13], "tokens": ["</s>"]}}})");
  const hack::Tokenizer templated = make(t, json::parse(R"({"bos_token": "<s>", "chat_template": "X"})"));
  CHECK(templated.encode("abc", true) == std::vector<int>{12, 8, 13, 13});
  CHECK(templated.chat_template() == "X");
  CHECK(templated.config_json().find("chat_template") != std::string::npos);
}

TEST_CASE("invalid UTF-8 input is repaired like from_utf8_lossy", "[tokenizer]") {
  const hack::Tokenizer tok = hack::Tokenizer::load(hack::test::shared_fixtures_dir() / "tokenizers" / "qwen3");
  const std::string bad = "a\xE2\x82 b\xFF";
  CHECK(tok.encode(bad, false) == tok.encode("a\xEF\xBF\xBD b\xEF\xBF\xBD", false));
}

TEST_CASE("load errors name the file and the field", "[tokenizer]") {
  using Catch::Matchers::Contains;
  json t = tiny_tokenizer();
  t["model"]["type"] = "WordPiece";
  CHECK_THAT(load_error(t), Contains("model.type") && Contains("WordPiece") && Contains("tokenizer.json"));
  t["model"]["type"] = "Unigram";
  CHECK_THAT(load_error(t), Contains("Unigram"));

  t = tiny_tokenizer();
  t["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Frobnicate"}]})");
  CHECK_THAT(load_error(t), Contains("normalizer.normalizers[1]") && Contains("Frobnicate"));

  t = tiny_tokenizer();
  t["pre_tokenizer"] = json::parse(R"({"type": "BertPreTokenizer"})");
  CHECK_THAT(load_error(t), Contains("pre_tokenizer") && Contains("BertPreTokenizer"));

  t = tiny_tokenizer();
  t["pre_tokenizer"] = json::parse(R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"})");
  CHECK_THAT(load_error(t), Contains("pre_tokenizer.pattern") && Contains("(unclosed"));

  t = tiny_tokenizer();
  t["decoder"] = json::parse(R"({"type": "WordPiece"})");
  CHECK_THAT(load_error(t), Contains("decoder") && Contains("WordPiece"));

  t = tiny_tokenizer();
  t["model"]["merges"].push_back("a zz");
  CHECK_THAT(load_error(t), Contains("merges[4]") && Contains("zz"));

  t = tiny_tokenizer();
  t["model"].erase("vocab");
  CHECK_THAT(load_error(t), Contains("model") && Contains("vocab"));

  CHECK_THROWS_WITH(hack::Tokenizer::from_json("{\"model\": ", ""), Contains("tokenizer.json") && Contains("malformed"));
  CHECK_THROWS_WITH(hack::Tokenizer::from_json(tiny_tokenizer().dump(), "{oops"),
                    Contains("tokenizer_config.json") && Contains("malformed"));
  CHECK_THROWS_WITH(hack::Tokenizer::load("/nonexistent/dir"), Contains("/nonexistent/dir/tokenizer.json"));
}

TEST_CASE("load: special_tokens_map.json fills in, chat_template.jinja wins", "[tokenizer]") {
  const auto dir = std::filesystem::temp_directory_path() / ("hack_tokenizer_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  json t = tiny_tokenizer();
  t["added_tokens"] = json::parse(R"([{"id": 12, "content": "<s>", "special": true, "normalized": false}])");
  auto write = [&](const char* name, const std::string& text) { std::ofstream(dir / name) << text; };
  write("tokenizer.json", t.dump());
  write("tokenizer_config.json", R"({"add_bos_token": true, "chat_template": "from config"})");
  write("special_tokens_map.json", R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>"})");
  write("chat_template.jinja", "from jinja");
  const hack::Tokenizer tok = hack::Tokenizer::load(dir);
  CHECK(tok.bos_token() == "<s>");
  CHECK(tok.bos_id() == 12);
  CHECK(tok.eos_token() == "</s>");
  CHECK(tok.eos_id() == -1);  // not a token of this vocab
  CHECK(tok.encode("abc", true) == std::vector<int>{12, 8});
  CHECK(tok.chat_template() == "from jinja");
  std::filesystem::remove_all(dir);
}
