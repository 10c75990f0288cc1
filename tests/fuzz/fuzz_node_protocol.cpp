// libFuzzer target: the node protocol's JSON parsers (node/node_protocol.h), every entry point
// that reads a body from another process: the router's calls to the nodes (generate, prefill,
// cancel), the nodes' answers (events, prefill reply, health, errors) and the first-token
// payload of a KV request_done. The first byte picks the parser, the rest is the body.
//
// Oracle beyond "no crash, no sanitizer report": what a parser accepts must serialize
// (to_json) to a body the same parser accepts again with the same fields, since a router and
// its nodes exchange exactly those bodies.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "hack/core/error.h"
#include "hack/node/node_protocol.h"

namespace {

using namespace hack::server;

void require(bool ok) {
  if (!ok) std::abort();  // a round-trip mismatch: libFuzzer keeps the input
}

void sampling_round_trip(const hack::SamplingParams& a, const hack::SamplingParams& b) {
  require(a.max_tokens == b.max_tokens && a.top_k == b.top_k && a.stop_token_ids == b.stop_token_ids &&
          a.seed == b.seed && a.logprobs == b.logprobs && a.grammar == b.grammar);
}

void parse_one(int which, std::string_view body) {
  switch (which) {
    case 0: {
      const GenerateJob job = parse_generate_job(body);
      const GenerateJob again = parse_generate_job(to_json(job));
      require(again.request_id == job.request_id && again.prompt == job.prompt && again.generated == job.generated);
      sampling_round_trip(job.params, again.params);
      break;
    }
    case 1: {
      const PrefillCall call = parse_prefill_call(body);
      const PrefillCall again = parse_prefill_call(to_json(call));
      require(again.request_id == call.request_id && again.prompt == call.prompt &&
              again.decode_ucx == call.decode_ucx);
      sampling_round_trip(call.params, again.params);
      break;
    }
    case 2: {
      const FirstToken first = parse_first_token(body);
      const FirstToken again = parse_first_token(to_json(first));
      require(again.sample.token == first.sample.token && again.seed == first.seed);
      break;
    }
    case 3: {
      const PrefillReply reply = parse_prefill_reply(body);
      const PrefillReply again = parse_prefill_reply(to_json(reply));
      require(again.first.sample.token == reply.first.sample.token &&
              again.prompt_logprobs.size() == reply.prompt_logprobs.size());
      break;
    }
    case 4: {
      const NodeEvent event = parse_node_event(body);
      const NodeEvent again = parse_node_event(to_json(event));
      require(again.kind == event.kind);
      break;
    }
    case 5: {
      const NodeHealth health = parse_node_health(body);
      const NodeHealth again = parse_node_health(to_json(health));
      require(again.role == health.role && again.draining == health.draining && again.ready == health.ready &&
              again.queue_tokens == health.queue_tokens);
      break;
    }
    case 6: {
      const uint64_t id = parse_cancel_body(body);
      require(parse_cancel_body(cancel_body(id)) == id);
      break;
    }
    case 7: (void)parse_sampling(body); break;
    default: (void)parse_node_error(body); break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    parse_one(data[0] % 9, body);
  } catch (const hack::Error&) {
  }
  return 0;
}
