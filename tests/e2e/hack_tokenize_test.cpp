// hack-tokenize as a user runs it: the real binary on the real Qwen3 and Mistral tokenizer
// files, checked against ids from an independent implementation (expected.json) and against
// the library it fronts.
#include <catch2/catch.hpp>


#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hack/core/read_file.h"
#include "hack/tokenizer/tokenizer.h"
#include "support/run_process.h"
#include "support/test_support.h"

using namespace hack;

using test::TempFile;

namespace {

test::ProcessResult run_tokenize(const std::string& args) {
  return test::run_process((test::binary_dir() / "bin" / "hack-tokenize").string() + " " + args);
}

std::string tokenizer_dir(const char* name) {
  return test::shell_quote((test::shared_fixtures_dir() / "tokenizers" / name).string());
}


}  // namespace

TEST_CASE("hack-tokenize encodes exactly like expected.json and decodes back", "[e2e][hack-tokenize]") {
  for (const char* name : {"qwen3", "mistral"}) {
    const auto expected = nlohmann::json::parse(
        read_file(test::shared_fixtures_dir() / "tokenizers" / name / "expected.json", "expected ids"));
    const Tokenizer tokenizer = Tokenizer::load(test::shared_fixtures_dir() / "tokenizers" / name);
    int checked = 0;
    for (const auto& c : expected["cases"]) {
      const std::string text = c["text"].get<std::string>();
      if (text.empty() || text.find('\0') != std::string::npos) continue;  // not passable as an argument
      INFO(name << ": " << text);
      const TempFile input("input.txt", text);
      const auto r = run_tokenize("--tokenizer " + tokenizer_dir(name) + " --text-file " + input.arg() + " --json");
      INFO(r.err);
      REQUIRE(r.exit_code == 0);
      REQUIRE(nlohmann::json::parse(r.out) == c["ids"]);
      // --decode prints what the library decodes (checked against HF by the unit goldens),
      // plus a newline.
      const std::vector<int> ids = c["ids"].get<std::vector<int>>();
      const auto d = run_tokenize("--tokenizer " + tokenizer_dir(name) + " --decode --text " +
                                  test::shell_quote(c["ids"].dump()));
      REQUIRE(d.exit_code == 0);
      REQUIRE(d.out == tokenizer.decode(ids, false) + "\n");
      ++checked;
    }
    REQUIRE(checked >= 20);
  }
}

TEST_CASE("hack-tokenize renders a chat with the model's template", "[e2e][hack-tokenize]") {
  const TempFile chat("chat.json", R"([{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "Hi 👋"}])");
  const auto r = run_tokenize("--tokenizer " + tokenizer_dir("qwen3") + " --chat-file " + chat.arg() +
                              " --add-generation-prompt --json");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto out = nlohmann::json::parse(r.out);
  REQUIRE(out["text"] == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 👋<|im_end|>\n"
                         "<|im_start|>assistant\n");
  REQUIRE(out["ids"].front() == 151644);  // <|im_start|> is split out as a special token

  // --chat-template overrides the model's template.
  const TempFile tmpl("t.jinja", "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}");
  const auto o = run_tokenize("--tokenizer " + tokenizer_dir("qwen3") + " --chat-file " + chat.arg() +
                              " --chat-template " + tmpl.arg());
  REQUIRE(o.exit_code == 0);
  REQUIRE(o.out == "[system]Be brief.[user]Hi 👋");
}

TEST_CASE("hack-tokenize reports bad input clearly", "[e2e][hack-tokenize]") {
  auto r = run_tokenize("--tokenizer /nonexistent/tok --text hi");
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find("/nonexistent/tok") != std::string::npos);

  const TempFile bad("bad.json", "[{\"role\": \"user\", ");
  r = run_tokenize("--tokenizer " + tokenizer_dir("qwen3") + " --chat-file " + bad.arg());
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find("malformed JSON") != std::string::npos);

  const TempFile broken("broken.jinja", "{% for m in messages %}{{ m.content }");
  const TempFile chat("chat2.json", R"([{"role": "user", "content": "x"}])");
  r = run_tokenize("--tokenizer " + tokenizer_dir("qwen3") + " --chat-file " + chat.arg() + " --chat-template " +
                   broken.arg());
  REQUIRE(r.exit_code == 1);
  REQUIRE(!r.err.empty());

  r = run_tokenize("--tokenizer " + tokenizer_dir("qwen3") + " --decode --text '1, 2, x'");
  REQUIRE(r.exit_code != 0);

  r = run_tokenize("--no-such-flag");
  REQUIRE(r.exit_code == 2);
}
