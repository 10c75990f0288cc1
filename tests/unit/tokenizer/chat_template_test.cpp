// Chat templates against goldens rendered by Python jinja2 configured like transformers
// (scripts/make_chat_goldens.py): every case must match byte for byte, and where jinja2
// failed we must fail too (with the template's own text for raise_exception).
#include <catch2/catch.hpp>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "hack/tokenizer/chat_template.h"
#include "support/test_support.h"

namespace {

using nlohmann::ordered_json;

const ordered_json& goldens() {
  static const ordered_json g = [] {
    std::ifstream in(hack::test::fixtures_dir() / "chat" / "goldens.json");
    REQUIRE(in.good());
    return ordered_json::parse(in);
  }();
  return g;
}

hack::ChatRenderOptions options_from(const ordered_json& o) {
  hack::ChatRenderOptions options;
  options.add_generation_prompt = o.value("add_generation_prompt", false);
  if (o.contains("bos_token") && o["bos_token"].is_string()) options.bos_token = o["bos_token"].get<std::string>();
  if (o.contains("eos_token") && o["eos_token"].is_string()) options.eos_token = o["eos_token"].get<std::string>();
  options.tools = o.value("tools", ordered_json());
  options.documents = o.value("documents", ordered_json());
  options.extra_kwargs = o.value("extra_kwargs", ordered_json::object());
  options.now_unix_s = goldens()["now_unix_s"].get<int64_t>();
  return options;
}

// Checks one golden outcome; `render` produces our output or throws.
template <class Render>
void check_outcome(const ordered_json& golden, const std::string& label, Render render) {
  INFO(label);
  if (golden.contains("expected")) {
    std::string got;
    try {
      got = render();
    } catch (const std::exception& e) {
      FAIL("threw: " << e.what());
    }
    CHECK(got == golden["expected"].get<std::string>());
    return;
  }
  const auto& error = golden["error"];
  if (error.contains("raised")) {
    const std::string raised = error["raised"].get<std::string>();
    try {
      (void)render();
      FAIL("rendered, but jinja2 raised: " << raised);
    } catch (const hack::jinja::TemplateRaised& e) {
      CHECK(e.message() == raised);
      CHECK(std::string(e.what()).find(raised) != std::string::npos);
    }
  } else {
    INFO("jinja2 failed with: " << error["python"].get<std::string>());
    CHECK_THROWS_AS(render(), hack::Error);
  }
}

}  // namespace

TEST_CASE("chat templates render like transformers' jinja2 on every golden case", "[chat_template]") {
  const auto& g = goldens();
  std::map<std::string, hack::ChatTemplate> parsed;
  for (const auto& [name, t] : g["templates"].items()) {
    INFO("template " << name);
    REQUIRE_NOTHROW(parsed.emplace(name, hack::ChatTemplate::parse(t["template"].get<std::string>(), name)));
  }
  std::map<std::string, int> per_template;
  for (const auto& c : g["cases"]) {
    const std::string name = c["template"].get<std::string>();
    const auto& tmpl = parsed.at(name);
    ++per_template[name];
    const auto options = options_from(c["options"]);
    check_outcome(c, name + "/" + c["name"].get<std::string>(), [&] { return tmpl.render(c["messages"], options); });
  }
  for (const char* required : {"qwen3", "llama3.1", "llama3.2", "qwen2.5", "chatml", "mistral-v0.3", "mistral-v0.1"}) {
    INFO(required);
    CHECK(per_template[required] >= 30);
  }
}

TEST_CASE("interpreter snippets render like jinja2", "[chat_template][jinja]") {
  const auto& g = goldens();
  REQUIRE(g["snippets"].size() >= 80);
  for (const auto& s : g["snippets"]) {
    const std::string name = s["name"].get<std::string>();
    check_outcome(s, "snippet " + name + ": " + s["template"].get<std::string>(), [&] {
      const auto t = hack::jinja::Template::parse(s["template"].get<std::string>(), name);
      hack::jinja::Variables vars;
      for (const auto& [key, value] : s["vars"].items()) vars.emplace_back(key, hack::jinja::value_from_json(value));
      hack::jinja::RenderOptions options;
      options.now_unix_s = goldens()["now_unix_s"].get<int64_t>();
      return t.render(vars, options);
    });
  }
}

TEST_CASE("goldens use the real Qwen3 template of the shared fixtures", "[chat_template]") {
  const auto path = hack::test::shared_fixtures_dir() / "tokenizers" / "qwen3" / "tokenizer_config.json";
  if (!std::filesystem::exists(path)) {
    WARN("no " << path << "; skipped");
    return;
  }
  std::ifstream in(path);
  const auto config = nlohmann::json::parse(in);
  const std::string source = hack::chat_template_from_config(config, false);
  CHECK(source == goldens()["templates"]["qwen3"]["template"].get<std::string>());
  CHECK_NOTHROW(hack::ChatTemplate::parse(source, "qwen3"));
}

TEST_CASE("the nlohmann::json overload sorts object keys while ordered_json keeps them", "[chat_template]") {
  const auto t = hack::ChatTemplate::parse("{{ messages[0].tool_calls[0].function.arguments | tojson }}", "args");
  const auto ordered = ordered_json::parse(
      R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"z": 1, "a": 2}}}]}])");
  const hack::ChatRenderOptions options;
  CHECK(t.render(ordered, options) == R"({"z": 1, "a": 2})");
  CHECK(t.render(nlohmann::json(ordered), options) == R"({"a": 2, "z": 1})");
}

TEST_CASE("render() preprocesses messages like transformers", "[chat_template]") {
  const auto t = hack::ChatTemplate::parse(
      "{% for m in messages %}{{ m | tojson }}\n{% endfor %}{{ tools is none }} {{ documents is none }} "
      "{{ bos_token is defined }} {{ eos_token }} {{ add_generation_prompt }} {{ enable_thinking }}",
      "probe");
  const auto messages = ordered_json::parse(R"([
    {"role": "assistant", "content": "a", "reasoning": "r1"},
    {"role": "assistant", "content": "b", "thinking": "t", "reasoning_content": null},
    {"role": "user", "content": "c"}])");
  hack::ChatRenderOptions options;
  options.eos_token = "</s>";
  options.add_generation_prompt = true;
  options.extra_kwargs = {{"enable_thinking", false}};
  CHECK(t.render(messages, options) ==
        "{\"thinking\": \"r1\", \"role\": \"assistant\", \"content\": \"a\", \"reasoning\": \"r1\", "
        "\"reasoning_content\": \"r1\"}\n"
        // "thinking" keeps its first position: {"thinking": r, **message, ...} in Python
        "{\"thinking\": \"t\", \"role\": \"assistant\", \"content\": \"b\", \"reasoning_content\": \"t\"}\n"
        "{\"role\": \"user\", \"content\": \"c\"}\n"
        "True True False </s> True False");

  CHECK_THROWS_WITH(t.render(ordered_json::object(), options), Catch::Contains("messages must be a JSON list"));
  CHECK_THROWS_WITH(t.render(ordered_json::parse("[1]"), options), Catch::Contains("must be objects"));
  options.extra_kwargs = {{"messages", 1}};
  CHECK_THROWS_WITH(t.render(messages, options), Catch::Contains("'messages' cannot be passed"));
}

TEST_CASE("chat_template_from_config picks the template like transformers", "[chat_template]") {
  CHECK(hack::chat_template_from_config(nlohmann::json{{"chat_template", "T"}}, false) == "T");
  const nlohmann::json several = {
      {"chat_template",
       {{{"name", "default"}, {"template", "D"}}, {{"name", "tool_use"}, {"template", "U"}}, {{"name", "rag"}, {"template", "R"}}}}};
  CHECK(hack::chat_template_from_config(several, false) == "D");
  CHECK(hack::chat_template_from_config(several, true) == "U");
  const nlohmann::json no_tool_use = {{"chat_template", {{{"name", "default"}, {"template", "D"}}}}};
  CHECK(hack::chat_template_from_config(no_tool_use, true) == "D");
  const nlohmann::json no_default = {{"chat_template", {{{"name", "tool_use"}, {"template", "U"}}}}};
  CHECK_THROWS_WITH(hack::chat_template_from_config(no_default, false), Catch::Contains("none is named 'default'"));
  CHECK_THROWS_WITH(hack::chat_template_from_config(nlohmann::json::object(), false),
                    Catch::Contains("no chat_template"));
  CHECK_THROWS_AS(hack::chat_template_from_config(nlohmann::json{{"chat_template", 3}}, false), hack::Error);
}

TEST_CASE("find_chat_template looks in chat_template.jinja then chat_template.json then tokenizer_config.json",
          "[chat_template]") {
  const auto dir = std::filesystem::temp_directory_path() / ("hack_chat_template_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto write = [&](const char* name, const std::string& text) { std::ofstream(dir / name) << text; };
  CHECK_FALSE(hack::find_chat_template(dir, false).has_value());
  write("tokenizer_config.json", R"({"chat_template": "from-config"})");
  CHECK(hack::find_chat_template(dir, false) == "from-config");
  write("chat_template.json", R"({"chat_template": "from-json"})");
  CHECK(hack::find_chat_template(dir, false) == "from-json");
  write("chat_template.jinja", "from-jinja{{ x }}");
  CHECK(hack::find_chat_template(dir, false) == "from-jinja{{ x }}");
  std::filesystem::remove_all(dir);
}

TEST_CASE("the kjv-bpe fixture's template renders ChatML with its BOS", "[chat_template]") {
  const auto path = hack::test::fixtures_dir() / "tokenizers" / "kjv-bpe";
  if (!std::filesystem::exists(path / "tokenizer_config.json")) {
    WARN("no kjv-bpe fixture; skipped");
    return;
  }
  const auto source = hack::find_chat_template(path, false);
  REQUIRE(source.has_value());
  const auto t = hack::ChatTemplate::parse(*source, "kjv-bpe");
  hack::ChatRenderOptions options;
  options.bos_token = "<|begin_of_text|>";
  options.add_generation_prompt = true;
  CHECK(t.render(ordered_json::parse(R"([{"role": "user", "content": "In the beginning"}])"), options) ==
        "<|begin_of_text|><|im_start|>user\nIn the beginning<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("one parsed template renders concurrently", "[chat_template]") {
  const auto& g = goldens();
  const auto t = hack::ChatTemplate::parse(g["templates"]["qwen3"]["template"].get<std::string>(), "qwen3");
  const ordered_json* roundtrip = nullptr;
  for (const auto& c : g["cases"]) {
    if (c["template"] == "qwen3" && c["name"] == "multi-step-tools") roundtrip = &c;
  }
  REQUIRE(roundtrip != nullptr);
  const auto options = options_from((*roundtrip)["options"]);
  const std::string expected = (*roundtrip)["expected"].get<std::string>();
  std::vector<std::thread> threads;
  std::atomic<int> matches{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 50; ++k) matches += t.render((*roundtrip)["messages"], options) == expected;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(matches == 200);
}
