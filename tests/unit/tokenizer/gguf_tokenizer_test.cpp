// Tokenizer::load of a GGUF file (src/tokenizer/gguf_tokenizer.cpp): a tiny byte-level BPE
// written by the test's own GGUF writer; what llama.cpp's metadata says (token types, bos and
// add_bos, the pre-tokenizer, the chat template) comes out as the Hugging Face pipeline would
// have it, and what we cannot run is refused by name. The real vocabularies are checked
// against transformers' goldens in tests/e2e/smollm2_gguf_test.cpp.
#include <catch2/catch.hpp>

#include <filesystem>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "hack/core/error.h"
#include "hack/core/read_file.h"
#include "hack/tokenizer/chat_template.h"
#include "hack/tokenizer/tokenizer.h"
#include "support/gguf_writer.h"
#include "support/test_support.h"

using namespace hack;
using Catch::Contains;
using test::GgufWriter;

namespace {

// a b c ab Ġ (byte-level space) 1 2 <|s|> (control) <tool> (user-defined)
GgufWriter tiny_vocab(const std::string& model = "gpt2", const std::string& pre = "smollm") {
  GgufWriter w;
  w.kv_string("general.architecture", "llama");
  w.kv_string("tokenizer.ggml.model", model);
  w.kv_string("tokenizer.ggml.pre", pre);
  w.kv_strings("tokenizer.ggml.tokens", {"a", "b", "c", "ab", "\xc4\xa0", "1", "2", "<|s|>", "<tool>", "12", "\xc4\xa0" "a"});
  w.kv_array("tokenizer.ggml.token_type", GgufWriter::i32, std::vector<int32_t>{1, 1, 1, 1, 1, 1, 1, 3, 4, 1, 1});
  w.kv_strings("tokenizer.ggml.merges", {"a b", "1 2", "\xc4\xa0 a"});
  w.kv_scalar("tokenizer.ggml.bos_token_id", GgufWriter::u32, uint32_t{7});
  w.kv_scalar("tokenizer.ggml.eos_token_id", GgufWriter::u32, uint32_t{7});
  w.kv_scalar("tokenizer.ggml.add_bos_token", GgufWriter::boolean, uint8_t{1});
  w.kv_string("tokenizer.chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}");
  return w;
}

struct TempFile {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("hack_gguf_tok_" + std::to_string(::getpid()) + ".gguf");
  ~TempFile() { std::filesystem::remove(path); }
};

}  // namespace

TEST_CASE("gguf tokenizer: vocabulary, merges, token types, bos and the chat template", "[tokenizer][gguf]") {
  TempFile f;
  tiny_vocab().write(f.path);
  const Tokenizer tok = Tokenizer::load(f.path);
  CHECK(tok.vocab_size() == 11);
  CHECK(tok.bos_token() == "<|s|>");
  CHECK(tok.add_bos_token());
  CHECK(tok.encode("ab c", false) == std::vector<int>{3, 4, 2});
  CHECK(tok.encode("ab a", true) == std::vector<int>{7, 3, 10});
  // smollm: every digit its own pre-token, so "12" is never merged.
  CHECK(tok.encode("12", false) == std::vector<int>{5, 6});
  CHECK(tok.encode("a<tool>b", false) == std::vector<int>{0, 8, 1});
  CHECK(tok.is_special(7));
  CHECK_FALSE(tok.is_special(8));
  CHECK(tok.decode(std::vector<int>{7, 3, 4, 2}, true) == "ab c");
  CHECK(find_chat_template(f.path, false) == "{% for m in messages %}{{ m['content'] }}{% endfor %}");

  // gpt2's pre-tokenizer keeps digits together, so the merge applies.
  tiny_vocab("gpt2", "gpt2").write(f.path);
  CHECK(Tokenizer::load(f.path).encode("12", false) == std::vector<int>{9});
}

TEST_CASE("gguf tokenizer: unsupported models and malformed vocabularies are refused by name", "[tokenizer][gguf]") {
  TempFile f;
  auto error_of = [&](const GgufWriter& w) -> std::string {
    w.write(f.path);
    try {
      Tokenizer::load(f.path);
    } catch (const Error& e) {
      return e.what();
    }
    return "(loaded)";
  };
  CHECK_THAT(error_of(tiny_vocab("llama")), Contains("tokenizer model 'llama' (tokenizer.ggml.model) is not supported"));
  CHECK_THAT(error_of(tiny_vocab("gpt2", "deepseek-llm")),
             Contains("pre-tokenizer 'deepseek-llm' (tokenizer.ggml.pre) is not supported"));
  GgufWriter m = tiny_vocab();
  m.kv_strings("tokenizer.ggml.merges", {"ab"});
  CHECK_THAT(error_of(m), Contains("appears twice"));  // the writer's second merges key
  GgufWriter d;
  d.kv_string("tokenizer.ggml.model", "gpt2");
  d.kv_string("tokenizer.ggml.pre", "gpt2");
  d.kv_strings("tokenizer.ggml.tokens", {"a", "b", "a"});
  d.kv_strings("tokenizer.ggml.merges", {"a b"});
  CHECK_THAT(error_of(d), Contains("token 'a' appears twice (ids 0 and 2)"));
  GgufWriter bad;
  bad.kv_string("tokenizer.ggml.model", "gpt2");
  bad.kv_string("tokenizer.ggml.pre", "gpt2");
  bad.kv_strings("tokenizer.ggml.tokens", {"a", "b"});
  bad.kv_strings("tokenizer.ggml.merges", {"a  b"});
  CHECK_THAT(error_of(bad), Contains("merge 'a  b' is not two tokens separated by one space"));
  GgufWriter types;
  types.kv_string("tokenizer.ggml.model", "gpt2");
  types.kv_string("tokenizer.ggml.pre", "gpt2");
  types.kv_strings("tokenizer.ggml.tokens", {"a", "b"});
  types.kv_array("tokenizer.ggml.token_type", GgufWriter::i32, std::vector<int32_t>{1});
  types.kv_strings("tokenizer.ggml.merges", {"a b"});
  CHECK_THAT(error_of(types), Contains("tokenizer.ggml.token_type has 1 entries for 2 tokens"));
}

// A GGUF laid out as llama.cpp's convert_hf_to_gguf.py writes a Qwen tokenizer (tokens by id,
// merges as "a b", added special tokens CONTROL and the others USER_DEFINED, pre "qwen2"),
// made here from Qwen3's tokenizer.json (whose normalizer and pre-tokenizer are Qwen2's), must
// encode the 10,000 strings of the qwen3 goldens as HF tokenizers did (an independent
// implementation, scripts/make_tokenizer_goldens.py): the qwen2 pre-tokenizer mapping checked on
// a real 151k vocabulary.
TEST_CASE("gguf tokenizer: a Qwen vocabulary with pre qwen2 encodes as HF tokenizers", "[tokenizer][gguf][golden]") {
  const std::filesystem::path dir = test::shared_fixtures_dir() / "tokenizers" / "qwen3";
  const nlohmann::json tok = nlohmann::json::parse(read_file(dir / "tokenizer.json", "fixture"));
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  auto put = [&](size_t id, const std::string& text, int32_t type) {
    if (tokens.size() <= id) {
      for (size_t i = tokens.size(); i <= id; ++i) tokens.push_back("[PAD" + std::to_string(i) + "]");
      types.resize(tokens.size(), 4);  // llama.cpp pads missing ids with USER_DEFINED [PADn]
    }
    tokens[id] = text;
    types[id] = type;
  };
  for (const auto& [text, id] : tok["model"]["vocab"].items()) put(id.get<size_t>(), text, 1);
  for (const auto& a : tok["added_tokens"]) put(a["id"].get<size_t>(), a["content"], a["special"].get<bool>() ? 3 : 4);
  std::vector<std::string> merges;
  for (const auto& m : tok["model"]["merges"])
    merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  GgufWriter w;
  w.kv_string("general.architecture", "qwen2");
  w.kv_string("tokenizer.ggml.model", "gpt2");
  w.kv_string("tokenizer.ggml.pre", "qwen2");
  w.kv_strings("tokenizer.ggml.tokens", tokens);
  w.kv_array("tokenizer.ggml.token_type", GgufWriter::i32, types);
  w.kv_strings("tokenizer.ggml.merges", merges);
  w.kv_scalar("tokenizer.ggml.eos_token_id", GgufWriter::u32, uint32_t{151645});
  w.kv_scalar("tokenizer.ggml.add_bos_token", GgufWriter::boolean, uint8_t{0});
  TempFile f;
  w.write(f.path);
  const Tokenizer t = Tokenizer::load(f.path);
  CHECK(t.eos_token() == "<|im_end|>");
  CHECK_FALSE(t.add_bos_token());

  const nlohmann::json golden =
      nlohmann::json::parse(read_file(test::fixtures_dir() / "tokenizers" / "goldens" / "qwen3.json", "fixture"));
  size_t checked = 0, wrong = 0;
  for (const auto& c : golden["encode"]) {
    const std::string text = c["text"];
    const std::vector<int> want = c["ids"].get<std::vector<int>>();
    const std::vector<int> got = t.encode(text, true);  // add_bos false, no eos: the same ids
    if (got != want && ++wrong <= 3) UNSCOPED_INFO("text " << nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    ++checked;
  }
  CHECK(checked == 10000);
  CHECK(wrong == 0);
}
