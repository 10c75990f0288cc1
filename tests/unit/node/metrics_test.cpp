#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "hack/node/metrics.h"

using namespace hack::server;
using Catch::Contains;

namespace {

// The value of the sample line starting with `series` ("name{labels}" or "name"), or -1.
double sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

}  // namespace

TEST_CASE("metrics: recorded values appear under their names and labels") {
  Metrics m;
  m.observe_time_to_first_token_s(0.03);
  m.observe_time_to_first_token_s(0.3);
  m.observe_inter_token_latency_s(0.004);
  m.observe_e2e_request_latency_s(2.0);
  m.observe_request_queue_time_s(0.002);
  m.set_num_requests_running(3);
  m.set_num_requests_waiting(5);
  m.set_kv_cache_usage_ratio("decode-0", 0.25);
  m.set_kv_cache_usage_ratio("decode-1", 0.75);
  m.add_prompt_tokens(100);
  m.add_prompt_tokens(23);
  m.add_generation_tokens(40);
  m.add_kv_bytes_transferred("decode-0", 4096);
  m.add_kv_bytes_transferred("decode-0", 4096);
  m.add_vault_hits(3);
  m.count_request_error("invalid_request_error");
  m.count_request_error("invalid_request_error");
  m.count_request_error("timeout");
  m.count_request_success("stop");
  m.count_request_success("length");
  m.count_request_success("stop");

  const std::string text = m.serialize();
  INFO(text);
  CHECK_THAT(text, Contains("# TYPE hack:time_to_first_token_seconds histogram"));
  CHECK(sample(text, "hack:time_to_first_token_seconds_count") == 2);
  CHECK(sample(text, "hack:time_to_first_token_seconds_sum") == Approx(0.33));
  CHECK(sample(text, "hack:time_to_first_token_seconds_bucket{le=\"0.04\"}") == 1);
  CHECK(sample(text, "hack:time_to_first_token_seconds_bucket{le=\"0.5\"}") == 2);
  CHECK(sample(text, "hack:time_to_first_token_seconds_bucket{le=\"+Inf\"}") == 2);
  CHECK(sample(text, "hack:inter_token_latency_seconds_bucket{le=\"0.005\"}") == 1);
  CHECK(sample(text, "hack:inter_token_latency_seconds_bucket{le=\"0.0025\"}") == 0);
  CHECK(sample(text, "hack:e2e_request_latency_seconds_count") == 1);
  CHECK(sample(text, "hack:request_queue_time_seconds_count") == 1);
  CHECK_THAT(text, Contains("# TYPE hack:num_requests_running gauge"));
  CHECK(sample(text, "hack:num_requests_running") == 3);
  CHECK(sample(text, "hack:num_requests_waiting") == 5);
  CHECK(sample(text, "hack:kv_cache_usage_ratio{node=\"decode-0\"}") == 0.25);
  CHECK(sample(text, "hack:kv_cache_usage_ratio{node=\"decode-1\"}") == 0.75);
  CHECK_THAT(text, Contains("# TYPE hack:prompt_tokens_total counter"));
  CHECK(sample(text, "hack:prompt_tokens_total") == 123);
  CHECK(sample(text, "hack:generation_tokens_total") == 40);
  CHECK(sample(text, "hack:kv_bytes_transferred_total{node=\"decode-0\"}") == 8192);
  CHECK(sample(text, "hack:vault_hits_total") == 3);
  CHECK(sample(text, "hack:request_errors_total{type=\"invalid_request_error\"}") == 2);
  CHECK(sample(text, "hack:request_errors_total{type=\"timeout\"}") == 1);
  CHECK(sample(text, "hack:request_success_total{finish_reason=\"stop\"}") == 2);
  CHECK(sample(text, "hack:request_success_total{finish_reason=\"length\"}") == 1);

  m.set_num_requests_running(0);
  CHECK(sample(m.serialize(), "hack:num_requests_running") == 0);
}

TEST_CASE("metrics: a fresh registry reports zeros, and two registries are independent") {
  Metrics a;
  Metrics b;
  a.add_generation_tokens(7);
  CHECK(sample(a.serialize(), "hack:generation_tokens_total") == 7);
  CHECK(sample(b.serialize(), "hack:generation_tokens_total") == 0);
  CHECK(sample(b.serialize(), "hack:e2e_request_latency_seconds_count") == 0);
}
