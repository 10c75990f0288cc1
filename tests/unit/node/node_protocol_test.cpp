// The router↔node JSON bodies: every struct survives a round trip, malformed bodies are
// refused with the field named, and the shared-secret check.
#include <catch2/catch.hpp>

#include "hack/node/node_protocol.h"

namespace hack::server {
namespace {

SamplingParams full_params() {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.seed = 0xfedcba9876543210ull;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = -0.25f;
  p.repetition_penalty = 1.1f;
  p.max_tokens = 77;
  p.min_tokens = 3;
  p.stop_token_ids = {5, 9};
  p.logit_bias = {{3, -100.0f}, {17, 2.5f}};
  p.grammar = "root ::= \"{\" [a-z]* \"}\"\n";
  p.ignore_eos = true;
  p.logprobs = 2;
  return p;
}

void check_same(const SamplingParams& a, const SamplingParams& b) {
  CHECK(a.temperature == b.temperature);
  CHECK(a.top_k == b.top_k);
  CHECK(a.top_p == b.top_p);
  CHECK(a.min_p == b.min_p);
  CHECK(a.seed == b.seed);
  CHECK(a.presence_penalty == b.presence_penalty);
  CHECK(a.frequency_penalty == b.frequency_penalty);
  CHECK(a.repetition_penalty == b.repetition_penalty);
  CHECK(a.max_tokens == b.max_tokens);
  CHECK(a.min_tokens == b.min_tokens);
  CHECK(a.stop_token_ids == b.stop_token_ids);
  CHECK(a.logit_bias == b.logit_bias);
  CHECK(a.grammar == b.grammar);
  CHECK(a.ignore_eos == b.ignore_eos);
  CHECK(a.logprobs == b.logprobs);
}

TEST_CASE("node protocol bodies round-trip", "[server][node_protocol]") {
  const SamplingParams p = full_params();
  check_same(parse_sampling(to_json(p)), p);
  SamplingParams unseeded;
  CHECK_FALSE(parse_sampling(to_json(unseeded)).seed.has_value());

  const GenerateJob job{123456789012345ull, {1, 2, 3}, p, false};
  const GenerateJob j2 = parse_generate_job(to_json(job));
  CHECK(j2.request_id == job.request_id);
  CHECK(j2.prompt == job.prompt);
  CHECK(j2.remote_kv == false);
  check_same(j2.params, p);

  const PrefillCall call{.request_id = 42, .prompt = {7, 8}, .params = p, .decode_ucx = "10.0.0.2:8310",
                         .corrupt_page = true};
  const PrefillCall c2 = parse_prefill_call(to_json(call));
  CHECK(c2.request_id == 42);
  CHECK(c2.prompt == call.prompt);
  CHECK(c2.decode_ucx == "10.0.0.2:8310");
  CHECK(c2.decode_ucx_worker.empty());
  CHECK(c2.decode_host_id.empty());
  CHECK(c2.corrupt_page);
  // A decode node on the prefill node's host is also named by its worker address.
  PrefillCall same_host = call;
  same_host.decode_ucx_worker = "00ff1a";
  same_host.decode_host_id = "boot|ipc:[1]|pid:[2]";
  const PrefillCall c3 = parse_prefill_call(to_json(same_host));
  CHECK(c3.decode_ucx_worker == "00ff1a");
  CHECK(c3.decode_host_id == "boot|ipc:[1]|pid:[2]");
  CHECK_THROWS_WITH(parse_prefill_call(R"({"request_id": 1, "prompt": [1], "sampling": {}, "decode_ucx": "h:1",
                                          "decode_ucx_worker": "xyz"})"),
                    Catch::Contains("decode_ucx_worker"));
  CHECK_THROWS_WITH(parse_prefill_call(R"({"request_id": 1, "prompt": [1], "sampling": {}, "decode_ucx": "h:1",
                                          "decode_ucx_worker": "abc"})"),
                    Catch::Contains("even number"));
  CHECK(c2.generated.empty());
  CHECK(j2.generated.empty());

  // A migrated stream carries the tokens generated so far on both calls.
  GenerateJob moved = job;
  moved.generated = {9, 10, 11};
  CHECK(parse_generate_job(to_json(moved)).generated == moved.generated);
  PrefillCall moved_call = call;
  moved_call.generated = {4, 5};
  CHECK(parse_prefill_call(to_json(moved_call)).generated == moved_call.generated);
  CHECK_THROWS_WITH(parse_generate_job(R"({"request_id":1,"prompt":[1],"sampling":{},"generated":"x"})"),
                    Catch::Contains("generated"));

  SampleResult s{17, -0.5f, {{17, -0.5f}, {3, -1.25f}}};
  const FirstToken first{s, 99};
  const FirstToken f2 = parse_first_token(to_json(first));
  CHECK(f2.sample.token == 17);
  CHECK(f2.sample.logprob == -0.5f);
  REQUIRE(f2.sample.top_logprobs.size() == 2);
  CHECK(f2.sample.top_logprobs[1].token == 3);
  CHECK(f2.sample.top_logprobs[1].logprob == -1.25f);
  CHECK(f2.seed == 99);

  const PrefillReply reply{first, 4096, 0.25, 0.5};
  const PrefillReply r2 = parse_prefill_reply(to_json(reply));
  CHECK(r2.first.sample.token == 17);
  CHECK(r2.kv_bytes == 4096);
  CHECK(r2.total_s == 0.5);
  CHECK(r2.prompt_logprobs.empty());
  CHECK(to_json(reply).find("prompt_logprobs") == std::string::npos);  // absent unless asked for

  PrefillReply with_prompt = reply;
  with_prompt.prompt_logprobs = {SampleResult{5, -2.5f, {{7, -0.5f}}}, SampleResult{6, -0.125f, {}}};
  const PrefillReply r3 = parse_prefill_reply(to_json(with_prompt));
  REQUIRE(r3.prompt_logprobs.size() == 2);
  CHECK(r3.prompt_logprobs[0].token == 5);
  CHECK(r3.prompt_logprobs[0].logprob == -2.5f);
  CHECK(r3.prompt_logprobs[0].top_logprobs[0].token == 7);
  CHECK(r3.prompt_logprobs[1].logprob == -0.125f);
  CHECK_THROWS_AS(parse_prefill_reply(R"({"token": 1, "seed": 2, "prompt_logprobs": {}})"), hack::Error);
  CHECK_THROWS_AS(parse_prefill_reply(R"({"token": 1, "seed": 2, "prompt_logprobs": [3]})"), hack::Error);
  CHECK_THROWS_AS(parse_prefill_reply(R"({"token": 1, "seed": 2, "prompt_logprobs": [{"logprob": 0}]})"), hack::Error);

  SamplingParams asks;
  asks.prompt_logprobs = 3;
  CHECK(parse_sampling(to_json(asks)).prompt_logprobs == 3);
  CHECK(parse_sampling(to_json(SamplingParams{})).prompt_logprobs == -1);
  CHECK_THROWS_AS(parse_sampling(R"({"prompt_logprobs": -2})"), hack::Error);

  for (const NodeEvent& e :
       {NodeEvent{.kind = NodeEventKind::accepted}, NodeEvent{.kind = NodeEventKind::accepted, .ucx_address = "10.0.0.7:13337"},
        NodeEvent{.kind = NodeEventKind::accepted, .ucx_address = "10.0.0.7:13337", .ucx_worker = "beef", .host_id = "b|i|p"},
        NodeEvent{.kind = NodeEventKind::token, .sample = s, .index = 4},
        NodeEvent{.kind = NodeEventKind::finished, .finish_reason = FinishReason::stop, .prompt_tokens = 5,
                  .completion_tokens = 6},
        NodeEvent{.kind = NodeEventKind::error, .message = "boom \"quoted\""}}) {
    const NodeEvent back = parse_node_event(to_json(e));
    CHECK(back.kind == e.kind);
    CHECK(back.sample.token == e.sample.token);
    CHECK(back.index == e.index);
    CHECK(back.finish_reason == e.finish_reason);
    CHECK(back.prompt_tokens == e.prompt_tokens);
    CHECK(back.completion_tokens == e.completion_tokens);
    CHECK(back.message == e.message);
    CHECK(back.ucx_address == e.ucx_address);
    CHECK(back.ucx_worker == e.ucx_worker);
    CHECK(back.host_id == e.host_id);
  }
  CHECK_THROWS_WITH(parse_node_event(R"({"type": "accepted", "ucx_worker": "0g"})"), Catch::Contains("hex digit"));

  NodeHealth h{.role = "decode", .model = "hack-tiny", .ucx_address = "127.0.0.1:9", .ucx_worker = "0a0b",
               .host_id = "b|i|p", .queue_tokens = 100, .running = 2, .waiting = 3, .kv_usage = 0.5,
               .kv_bytes_transferred = 1234, .kv_sequences = 1, .kv_bytes_used = 4096};
  const NodeHealth h2 = parse_node_health(to_json(h));
  CHECK(h2.role == "decode");
  CHECK(h2.ucx_address == "127.0.0.1:9");
  CHECK(h2.ucx_worker == "0a0b");
  CHECK(h2.host_id == "b|i|p");
  CHECK(h2.queue_tokens == 100);
  CHECK(h2.waiting == 3);
  CHECK(h2.kv_bytes_transferred == 1234);
  CHECK(h2.kv_sequences == 1);
  CHECK(h2.kv_bytes_used == 4096);

  CHECK(parse_cancel_body(cancel_body(77)) == 77);
  CHECK(parse_node_error(node_error_body("it broke")) == "it broke");
  CHECK(parse_node_error("plain text") == "plain text");
}

TEST_CASE("malformed node bodies are refused naming the problem", "[server][node_protocol]") {
  CHECK_THROWS_WITH(parse_generate_job("{"), Catch::Contains("not valid JSON"));
  CHECK_THROWS_WITH(parse_generate_job("[1]"), Catch::Contains("JSON object"));
  CHECK_THROWS_WITH(parse_generate_job(R"({"prompt":[1],"sampling":{}})"), Catch::Contains("'request_id'"));
  CHECK_THROWS_WITH(parse_generate_job(R"({"request_id":1,"prompt":"abc","sampling":{}})"),
                    Catch::Contains("'prompt'"));
  CHECK_THROWS_WITH(parse_generate_job(R"({"request_id":1,"prompt":[1]})"), Catch::Contains("'sampling'"));
  CHECK_THROWS_WITH(parse_generate_job(R"({"request_id":1,"prompt":[1],"sampling":{"max_tokens":"x"}})"),
                    Catch::Contains("'max_tokens'"));
  CHECK_THROWS_WITH(parse_prefill_call(R"({"request_id":1,"prompt":[1],"sampling":{}})"),
                    Catch::Contains("'decode_ucx'"));
  CHECK_THROWS_WITH(parse_node_event(R"({"type":"mystery"})"), Catch::Contains("unknown type"));
  CHECK_THROWS_WITH(parse_node_event(R"({"type":"accepted","ucx_address":"no-port"})"), Catch::Contains("ucx_address"));
  CHECK_THROWS_WITH(parse_node_event(R"({"type":"finished","finish_reason":"tired","prompt_tokens":1,
                                       "completion_tokens":1})"),
                    Catch::Contains("finish_reason"));
  CHECK_THROWS_WITH(parse_first_token(R"({"token":1,"top_logprobs":[[1]],"seed":1})"),
                    Catch::Contains("top_logprobs"));
  CHECK_THROWS_WITH(parse_cancel_body("{}"), Catch::Contains("'request_id'"));
}

// Found by tests/fuzz/fuzz_node_protocol.cpp: numbers out of a field's range were cast
// regardless (undefined behaviour for a float, a silent wrap for a large integer).
TEST_CASE("numbers outside a field's range are refused, integral floats in range accepted", "[server][node_protocol]") {
  auto sampling = [](const std::string& fields) { return parse_sampling("{" + fields + "}"); };
  CHECK_THROWS_WITH(sampling(R"("max_tokens":1e300)"), Catch::Contains("'max_tokens'"));
  CHECK_THROWS_WITH(sampling(R"("max_tokens":4294967296)"), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(sampling(R"("max_tokens":2.5)"), Catch::Contains("integer"));
  CHECK_THROWS_WITH(sampling(R"("seed":-1)"), Catch::Contains("negative"));
  CHECK_THROWS_WITH(sampling(R"("seed":1.8446744073709552e19)"), Catch::Contains("'seed'"));
  CHECK_THROWS_WITH(sampling(R"("temperature":1e300)"), Catch::Contains("'temperature'"));
  CHECK_THROWS_WITH(sampling(R"("stop_token_ids":[1, 1e12])"), Catch::Contains("'stop_token_ids'"));
  CHECK_THROWS_WITH(sampling(R"("logit_bias":[[3, 1e300]])"), Catch::Contains("logit_bias"));
  CHECK_THROWS_WITH(sampling(R"("ignore_eos":1)"), Catch::Contains("'ignore_eos'"));
  CHECK_THROWS_WITH(parse_first_token(R"({"token":1,"top_logprobs":[[99999999999,0]],"seed":1})"),
                    Catch::Contains("top_logprobs"));
  CHECK_THROWS_WITH(parse_generate_job(R"({"request_id":1,"prompt":[1,-3e9],"sampling":{}})"), Catch::Contains("'prompt'"));
  // What other producers send for integers (32.0) is still an integer; the full u64 range stays.
  CHECK(sampling(R"("max_tokens":32.0)").max_tokens == 32);
  CHECK(sampling(R"("seed":18446744073709551615)").seed == std::optional<uint64_t>(UINT64_MAX));
  CHECK(sampling(R"("logit_bias":[[3,-1.5]])").logit_bias == std::vector<std::pair<int, float>>{{3, -1.5f}});
  CHECK(parse_cancel_body(R"({"request_id":18446744073709551615})") == UINT64_MAX);
}

TEST_CASE("internal endpoints compare the shared secret exactly", "[server][node_protocol]") {
  CHECK(secret_matches("", ""));
  CHECK(secret_matches("anything", ""));  // no secret configured: open
  CHECK(secret_matches("s3cret", "s3cret"));
  CHECK_FALSE(secret_matches("", "s3cret"));
  CHECK_FALSE(secret_matches("s3cre", "s3cret"));
  CHECK_FALSE(secret_matches("s3cret!", "s3cret"));
  CHECK_FALSE(secret_matches("s3creT", "s3cret"));
}

}  // namespace
}  // namespace hack::server
