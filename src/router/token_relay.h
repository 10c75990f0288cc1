// Token relay and stop handling of one choice: its tokens as text (incremental detokenizing,
// stop strings, tool-call parsing) and the SSE chunks of a streamed choice.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "hack/router/openai_protocol.h"
#include "hack/router/stop_strings.h"
#include "hack/router/tool_calls.h"
#include "hack/http/http_server.h"
#include "hack/tokenizer/tokenizer.h"

namespace hack::server::router {

// The chunks of one choice of a streamed response; does nothing for a whole response.
class ChoiceStream {
 public:
  ChoiceStream(Responder* res, const ResponseMeta& meta, int index, bool chat)
      : res_(res), meta_(meta), index_(index), chat_(chat) {}

  bool streaming() const { return res_ != nullptr; }

  // The opening chunks: chat's role, completions' echoed prompt.
  void open(const std::string& echo) {
    if (!res_) return;
    if (chat_) res_->send_event(chat_role_chunk(meta_, index_));
    if (!echo.empty()) send(echo, std::nullopt, std::nullopt);
    offset_ = count_code_points(echo);  // as completion_response's text_offset_base
  }

  // Text goes in one chunk and tool-call pieces in the next (a delta holds one or the
  // other, as OpenAI sends them); logprobs and the finish reason ride on the last.
  // The echoed prompt's logprobs, after its text: offsets from 0, as the whole response's,
  // counted over the tokens' text (a BOS token's text is not in the echoed prompt).
  void send_prompt_logprobs(std::vector<PositionLogprobs> lps) {
    if (!res_) return;
    offset_ = 0;
    for (const PositionLogprobs& l : lps) offset_ += count_code_points(l.token);
    ChoiceDelta d{index_, "", std::move(lps), std::nullopt, 0};
    res_->send_event(completion_chunk(meta_, d));
  }

  void send(std::string text, std::optional<std::vector<PositionLogprobs>> lps, std::optional<FinishReason> finish,
            std::vector<ToolCallDelta> calls = {}) {
    if (!res_) return;
    if (!calls.empty()) {
      if (!text.empty()) send(std::move(text), std::nullopt, std::nullopt);
      text.clear();
    }
    if (text.empty() && calls.empty() && (!lps || lps->empty()) && !finish) return;
    ChoiceDelta d{index_, std::move(text), std::move(lps), finish, offset_, std::move(calls)};
    if (d.logprobs) {
      for (const PositionLogprobs& l : *d.logprobs) offset_ += count_code_points(l.token);
    }
    res_->send_event(chat_ ? chat_chunk(meta_, d) : completion_chunk(meta_, d));
  }

 private:
  Responder* res_;
  const ResponseMeta& meta_;
  int index_;
  bool chat_;
  // Completions logprobs: text_offset of the next token, counted over the tokens' own text
  // as the non-stream response counts it — not over the text sent so far, which lags
  // behind while a stop string's prefix is held back.
  size_t offset_ = 0;
};

// One attempt's tokens as text: detokenized incrementally, with the stop strings applied
// (text that may begin a stop string is held back until that is decided), then split into
// content and tool calls (ToolCallParser; all content when the request parses none).
class ChoiceText {
 public:
  ChoiceText(const Tokenizer& tokenizer, const CompletionRequest& r)
      : detok_(tokenizer, r.skip_special_tokens), stops_(r.stop, r.include_stop_str_in_output), tools_(r.tool_parser) {}

  // What settled with `token`.
  ToolParseStep feed(int token) {
    const StopStringMatcher::Step step = stops_.feed(detok_.step(token));
    if (step.stopped) stopped_ = true;
    ToolParseStep out = tools_.feed(step.text);
    if (stopped_) append(out, tools_.finish());
    return out;
  }

  // The rest once generation has ended.
  ToolParseStep finish() {
    if (stopped_) return {};
    const StopStringMatcher::Step step = stops_.feed(detok_.finish());
    stopped_ = step.stopped;
    ToolParseStep out = tools_.feed(stopped_ ? step.text : step.text + stops_.flush());
    append(out, tools_.finish());
    return out;
  }

  // A stop string matched: the choice ends there.
  bool stopped() const { return stopped_; }
  const std::vector<ToolCall>& tool_calls() const { return tools_.calls(); }

 private:
  static void append(ToolParseStep& to, ToolParseStep from) {
    to.content += from.content;
    for (ToolCallDelta& d : from.calls) {
      if (!to.calls.empty() && to.calls.back().index == d.index && !d.id) {
        to.calls.back().arguments += d.arguments;
      } else {
        to.calls.push_back(std::move(d));
      }
    }
  }

  IncrementalDecoder detok_;
  StopStringMatcher stops_;
  ToolCallParser tools_;
  bool stopped_ = false;
};

// A sampled token with its top logprobs, as the OpenAI responses list them.
PositionLogprobs logprob_entry(const Tokenizer& tokenizer, const SampleResult& s);

}  // namespace hack::server::router
