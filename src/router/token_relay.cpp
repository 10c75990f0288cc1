#include "src/router/token_relay.h"

namespace hack::server::router {

PositionLogprobs logprob_entry(const Tokenizer& tokenizer, const SampleResult& s) {
  PositionLogprobs e{tokenizer.decode(std::span<const int>(&s.token, 1), false), s.logprob, {}};
  for (const hack::TokenLogprob& t : s.top_logprobs) {
    e.top.push_back(TopLogprob{tokenizer.decode(std::span<const int>(&t.token, 1), false), t.logprob});
  }
  return e;
}

}  // namespace hack::server::router
