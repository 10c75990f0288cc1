// libFuzzer target: arbitrary bytes as a chat template, parsed and rendered against fixed
// conversations. Parse and render may fail with hack::Error (that is the contract for bad
// templates); anything else - a crash, a sanitizer report, another exception type, a hang -
// is a bug. Limits are tight so every input finishes quickly.
//
//   ./build-fuzz/tests/fuzz/fuzz_chat_template -max_total_time=600 -timeout=10 \
//       -dict=tests/fixtures/chat/jinja.dict corpus/ tests/fixtures/chat/templates/
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "hack/tokenizer/chat_template.h"

namespace {

const nlohmann::ordered_json& conversation() {
  static const auto messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris? é🚀 {{ x }}"},
    {"role": "assistant", "content": "<think>\ncheck\n</think>\n\nOne moment.", "reasoning_content": "check",
     "tool_calls": [{"id": "call12345", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2.5, null]}}}]},
    {"role": "tool", "tool_call_id": "call12345", "content": "22C"},
    {"role": "assistant", "content": null},
    {"role": "user", "content": [{"type": "text", "text": "thanks"}]}
  ])");
  return messages;
}

const nlohmann::ordered_json& tools() {
  static const auto t = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
  ])");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  hack::ChatTemplate tmpl;
  try {
    tmpl = hack::ChatTemplate::parse(source, "fuzz");
  } catch (const hack::Error&) {
    return 0;
  }
  hack::ChatRenderOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.now_unix_s = 1721989800;
  options.limits.max_output_bytes = 1 << 20;
  options.limits.max_list_items = 100'000;
  options.limits.max_steps = 200'000;
  options.limits.max_call_depth = 100;
  for (int variant = 0; variant < 2; ++variant) {
    options.add_generation_prompt = variant == 0;
    options.tools = variant == 0 ? tools() : nlohmann::ordered_json();
    options.extra_kwargs = variant == 0 ? nlohmann::ordered_json{{"enable_thinking", false}} : nlohmann::ordered_json();
    try {
      const std::string out = tmpl.render(conversation(), options);
      if (out.size() > options.limits.max_output_bytes) __builtin_trap();
    } catch (const hack::Error&) {
    }
  }
  return 0;
}
