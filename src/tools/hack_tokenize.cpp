// hack-tokenize: encode text to ids, decode ids to text, or render a chat with a model's
// tokenizer (tokenizer.json + tokenizer_config.json), exactly as HF tokenizers would.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "hack/core/error.h"
#include "hack/core/read_file.h"
#include "hack/core/flags.h"
#include "hack/tokenizer/chat_template.h"
#include "hack/tokenizer/tokenizer.h"

namespace {

constexpr int kUsageError = 2;

struct TokenizeConfig {
  std::string tokenizer;
  std::string text;
  std::string text_file;
  std::string chat_file;
  std::string chat_template;
  bool json = false;
  bool add_special_tokens = false;
  bool decode = false;
  bool skip_special_tokens = false;
  bool add_generation_prompt = false;
  bool batch = false;
};

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Ids as a JSON array or separated by whitespace / commas; bad ids are a usage error (exit 2).
std::vector<int> parse_ids(const std::string& text) {
  try {
    return hack::parse_id_list(text, "decode");
  } catch (const hack::Error& e) {
    throw UsageError(e.what());
  }
}

void print_ids(const std::vector<int>& ids, bool as_json) {
  std::string out;
  if (as_json) {
    out = nlohmann::json(ids).dump();
  } else {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out += ' ';
      out += std::to_string(ids[i]);
    }
  }
  out += '\n';
  std::fwrite(out.data(), 1, out.size(), stdout);
}

int run(int argc, char** argv) {
  TokenizeConfig c;
  hack::FlagSet flags("hack-tokenize",
                      "Encodes text to token ids (default), decodes ids to text (--decode), or renders a chat "
                      "(--chat-file) with a Hugging Face tokenizer directory or a GGUF file.\n"
                      "Exit status: 0 ok, 1 error, 2 bad usage.",
                      "HACK_TOKENIZE");
  flags.add_string("tokenizer", &c.tokenizer,
                   "directory with tokenizer.json and tokenizer_config.json, or a GGUF file (its tokenizer.ggml.* "
                   "metadata and chat template) (required)");
  flags.add_string("text", &c.text, "input: text to encode, or ids to decode with --decode");
  flags.add_string("text-file", &c.text_file, "input read from this file instead of --text");
  flags.add_bool("json", &c.json, "print ids as a JSON array instead of space-separated");
  flags.add_bool("add-special-tokens", &c.add_special_tokens,
                 "apply the post-processor when encoding (BOS / EOS as tokenizer_config.json says)");
  flags.add_bool("decode", &c.decode,
                 "decode ids (JSON array or whitespace / comma separated; from --text, --text-file or stdin)");
  flags.add_bool("skip-special-tokens", &c.skip_special_tokens, "with --decode: drop special tokens");
  flags.add_bool("batch", &c.batch,
                 "input (--text, --text-file or stdin) is a JSON array of strings to encode; print a JSON array "
                 "of id arrays");
  flags.add_string("chat-file", &c.chat_file,
                   "render this chat (a JSON list of messages, or {\"messages\": [...], \"tools\": [...]}) with "
                   "the model's chat template; with --json print {\"text\", \"ids\"}");
  flags.add_bool("add-generation-prompt", &c.add_generation_prompt,
                 "with --chat-file: end with the assistant turn's opening");
  flags.add_string("chat-template", &c.chat_template, "with --chat-file: Jinja file overriding the model's template");
  try {
    if (!flags.parse(argc, argv)) return 0;
  } catch (const hack::Error& e) {
    throw UsageError(e.what());
  }
  if (c.tokenizer.empty()) throw UsageError("--tokenizer DIR is required");
  if (!c.text.empty() && !c.text_file.empty()) throw UsageError("give at most one of --text and --text-file");
  if (c.decode && !c.chat_file.empty()) throw UsageError("--decode and --chat-file exclude each other");
  if (!c.chat_file.empty() && (!c.text.empty() || !c.text_file.empty())) {
    throw UsageError("--chat-file takes no --text / --text-file");
  }
  const bool has_input = !c.text.empty() || !c.text_file.empty() || flags.was_set("text");
  if (c.batch && (c.decode || !c.chat_file.empty())) throw UsageError("--batch encodes: no --decode / --chat-file");
  if (!c.decode && !c.batch && c.chat_file.empty() && !has_input) {
    throw UsageError("give --text, --text-file or --chat-file");
  }
  if (c.skip_special_tokens && !c.decode) throw UsageError("--skip-special-tokens needs --decode");

  const hack::Tokenizer tokenizer = hack::Tokenizer::load(c.tokenizer);
  const std::string input = !c.text_file.empty() ? hack::read_file(c.text_file, "text file") : c.text;
  auto input_or_stdin = [&] {
    return has_input ? input
                     : std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  };

  if (c.batch) {
    nlohmann::json texts;
    try {
      texts = nlohmann::json::parse(input_or_stdin());
    } catch (const nlohmann::json::exception& e) {
      throw UsageError(std::string("--batch: malformed JSON: ") + e.what());
    }
    if (!texts.is_array()) throw UsageError("--batch: expected a JSON array of strings");
    nlohmann::json out = nlohmann::json::array();
    for (const auto& t : texts) {
      if (!t.is_string()) throw UsageError("--batch: expected a JSON array of strings");
      out.push_back(tokenizer.encode(t.get_ref<const std::string&>(), c.add_special_tokens));
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  if (c.decode) {
    const std::string source = input_or_stdin();
    const std::string text = tokenizer.decode(parse_ids(source), c.skip_special_tokens);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }
  if (!c.chat_file.empty()) {
    // The file holds a list of messages, or {"messages": [...], "tools": [...]}.
    nlohmann::ordered_json chat;
    try {
      chat = nlohmann::ordered_json::parse(hack::read_file(c.chat_file, "chat file"));
    } catch (const nlohmann::json::exception& e) {
      hack::fail("{}: malformed JSON: {}", c.chat_file, e.what());
    }
    nlohmann::ordered_json messages = chat;
    hack::ChatRenderOptions options;
    if (chat.is_object()) {
      HACK_CHECK(chat.contains("messages"), "{}: expected a list of messages or {{\"messages\": [...]}}", c.chat_file);
      messages = chat["messages"];
      if (chat.contains("tools")) options.tools = chat["tools"];
    }
    const bool has_tools = options.tools.is_array() && !options.tools.empty();
    std::string source;
    if (!c.chat_template.empty()) {
      source = hack::read_file(c.chat_template, "chat template");
    } else {
      const auto found = hack::find_chat_template(c.tokenizer, has_tools);
      HACK_CHECK(found.has_value(), "{} has no chat template: pass --chat-template FILE", c.tokenizer);
      source = *found;
    }
    options.add_generation_prompt = c.add_generation_prompt;
    if (!tokenizer.bos_token().empty()) options.bos_token = tokenizer.bos_token();
    if (!tokenizer.eos_token().empty()) options.eos_token = tokenizer.eos_token();
    const hack::ChatTemplate tmpl =
        hack::ChatTemplate::parse(source, c.chat_template.empty() ? c.tokenizer : c.chat_template);
    const std::string text = tmpl.render(messages, options);
    if (c.json) {
      const nlohmann::json out = {{"text", text}, {"ids", tokenizer.encode(text, c.add_special_tokens)}};
      std::printf("%s\n", out.dump().c_str());
    } else {
      std::fwrite(text.data(), 1, text.size(), stdout);
    }
    return 0;
  }
  print_ids(tokenizer.encode(input, c.add_special_tokens), c.json);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    const std::string message = e.what();
    std::fprintf(stderr, "hack-tokenize: %s%s\n", message.c_str(),
                 message.find("--help") == std::string::npos ? " (see --help)" : "");
    return kUsageError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hack-tokenize: error: %s\n", e.what());
    return 1;
  }
}
