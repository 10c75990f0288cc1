#include "hack/node/node_protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "hack/core/hex.h"
#include "hack/node/node_address.h"

namespace hack::server {

using nlohmann::json;

namespace {

json parse_object(std::string_view text, std::string_view what) {
  json j = json::parse(text, nullptr, false);
  HACK_CHECK(!j.is_discarded(), "{}: body is not valid JSON", what);
  HACK_CHECK(j.is_object(), "{}: body must be a JSON object", what);
  return j;
}

template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

// A JSON number as T, range-checked: nlohmann's get<int>() of 1e300 or get<uint64_t>() of
// -1.0 is a cast out of range (undefined behaviour), and a token id of 2^40 would wrap.
// An integral T takes an integer, or a float with an integral value in range.
template <class T>
T number_as(const json& v, std::string_view what, const char* name) {
  if constexpr (std::is_same_v<T, bool>) {
    HACK_CHECK(v.is_boolean(), "{}: field '{}' must be true or false", what, name);
    return v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    using Limits = std::numeric_limits<T>;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      HACK_CHECK(u <= static_cast<uint64_t>(Limits::max()), "{}: field '{}' is out of range ({})", what, name, u);
      return static_cast<T>(u);
    }
    if (v.is_number_integer()) {
      const int64_t i = v.get<int64_t>();
      HACK_CHECK(i >= 0 || Limits::is_signed, "{}: field '{}' must not be negative", what, name);
      HACK_CHECK(!Limits::is_signed || (i >= static_cast<int64_t>(Limits::min()) && i <= static_cast<int64_t>(Limits::max())),
                 "{}: field '{}' is out of range ({})", what, name, i);
      return static_cast<T>(i);
    }
    HACK_CHECK(v.is_number_float(), "{}: field '{}' must be a number", what, name);
    const double d = v.get<double>();
    // [min, max + 1): both bounds are exact powers of two as doubles.
    const double lo = static_cast<double>(Limits::min()), hi = 2.0 * (static_cast<double>(Limits::max() / 2 + 1));
    HACK_CHECK(d == std::floor(d) && d >= lo && d < hi, "{}: field '{}' must be an integer in range, got {}", what,
               name, d);
    return static_cast<T>(d);
  } else {
    static_assert(std::is_floating_point_v<T>);
    HACK_CHECK(v.is_number(), "{}: field '{}' must be a number", what, name);
    const double d = v.get<double>();
    HACK_CHECK(std::abs(d) <= static_cast<double>(std::numeric_limits<T>::max()), "{}: field '{}' is out of range ({})",
               what, name, d);
    return static_cast<T>(d);
  }
}

// Typed field access with errors that name the field.
template <class T>
T field(const json& j, std::string_view what, const char* name) {
  auto it = j.find(name);
  HACK_CHECK(it != j.end(), "{}: missing field '{}'", what, name);
  if constexpr (std::is_arithmetic_v<T>) {
    return number_as<T>(*it, what, name);
  } else if constexpr (is_vector<T>::value && std::is_arithmetic_v<typename T::value_type>) {
    HACK_CHECK(it->is_array(), "{}: field '{}' must be an array", what, name);
    T out;
    out.reserve(it->size());
    for (const json& e : *it) out.push_back(number_as<typename T::value_type>(e, what, name));
    return out;
  } else {
    try {
      return it->get<T>();
    } catch (const json::exception&) {
      fail("{}: field '{}' has the wrong type", what, name);
    }
  }
}

template <class T>
T field_or(const json& j, std::string_view what, const char* name, T fallback) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return fallback;
  return field<T>(j, what, name);
}

// A UCX worker address: hex digits, an even number of them ("" when absent).
std::string ucx_worker_field(const json& j, std::string_view what, const char* name) {
  std::string hex = field_or<std::string>(j, what, name, "");
  if (!hex.empty()) (void)hex_decode(hex, fmt::format("{}: field '{}'", what, name));
  return hex;
}

json sample_json(const SampleResult& s) {
  json top = json::array();
  for (const TokenLogprob& t : s.top_logprobs) top.push_back({t.token, t.logprob});
  return {{"token", s.token}, {"logprob", s.logprob}, {"top_logprobs", std::move(top)}};
}

SampleResult parse_sample(const json& j, std::string_view what) {
  SampleResult s;
  s.token = field<int>(j, what, "token");
  s.logprob = field_or<float>(j, what, "logprob", 0.0f);
  if (auto it = j.find("top_logprobs"); it != j.end()) {
    HACK_CHECK(it->is_array(), "{}: field 'top_logprobs' must be an array", what);
    for (const json& e : *it) {
      HACK_CHECK(e.is_array() && e.size() == 2 && e[0].is_number_integer() && e[1].is_number(),
                 "{}: top_logprobs entries must be [token, logprob]", what);
      s.top_logprobs.push_back(TokenLogprob{number_as<int>(e[0], what, "top_logprobs"),
                                            number_as<float>(e[1], what, "top_logprobs")});
    }
  }
  return s;
}

json sampling_json(const SamplingParams& p) {
  json j = {{"temperature", p.temperature},
            {"top_k", p.top_k},
            {"top_p", p.top_p},
            {"min_p", p.min_p},
            {"presence_penalty", p.presence_penalty},
            {"frequency_penalty", p.frequency_penalty},
            {"repetition_penalty", p.repetition_penalty},
            {"max_tokens", p.max_tokens},
            {"min_tokens", p.min_tokens},
            {"stop_token_ids", p.stop_token_ids},
            {"ignore_eos", p.ignore_eos},
            {"logprobs", p.logprobs}};
  if (p.seed) j["seed"] = *p.seed;
  if (!p.logit_bias.empty()) j["logit_bias"] = p.logit_bias;  // [[token, bias], ...]
  if (p.prompt_logprobs >= 0) j["prompt_logprobs"] = p.prompt_logprobs;
  if (!p.grammar.empty()) j["grammar"] = p.grammar;  // GBNF
  return j;
}

SamplingParams sampling_from(const json& j, std::string_view what) {
  HACK_CHECK(j.is_object(), "{}: sampling must be an object", what);
  SamplingParams p;
  p.temperature = field_or<float>(j, what, "temperature", p.temperature);
  p.top_k = field_or<int>(j, what, "top_k", p.top_k);
  p.top_p = field_or<float>(j, what, "top_p", p.top_p);
  p.min_p = field_or<float>(j, what, "min_p", p.min_p);
  p.presence_penalty = field_or<float>(j, what, "presence_penalty", p.presence_penalty);
  p.frequency_penalty = field_or<float>(j, what, "frequency_penalty", p.frequency_penalty);
  p.repetition_penalty = field_or<float>(j, what, "repetition_penalty", p.repetition_penalty);
  p.max_tokens = field_or<int>(j, what, "max_tokens", p.max_tokens);
  p.min_tokens = field_or<int>(j, what, "min_tokens", p.min_tokens);
  p.stop_token_ids = field_or<std::vector<int>>(j, what, "stop_token_ids", {});
  p.ignore_eos = field_or<bool>(j, what, "ignore_eos", false);
  p.logprobs = field_or<int>(j, what, "logprobs", -1);
  if (auto it = j.find("logit_bias"); it != j.end() && !it->is_null()) {
    HACK_CHECK(it->is_array(), "{}: field 'logit_bias' must be an array", what);
    for (const json& e : *it) {
      HACK_CHECK(e.is_array() && e.size() == 2, "{}: logit_bias entries must be [token, bias]", what);
      p.logit_bias.emplace_back(number_as<int>(e[0], what, "logit_bias"), number_as<float>(e[1], what, "logit_bias"));
    }
  }
  p.prompt_logprobs = field_or<int>(j, what, "prompt_logprobs", -1);
  HACK_CHECK(p.prompt_logprobs >= -1, "{}: 'prompt_logprobs' must be -1 or more", what);
  p.grammar = field_or<std::string>(j, what, "grammar", "");
  if (j.contains("seed") && !j["seed"].is_null()) p.seed = field<uint64_t>(j, what, "seed");
  return p;
}

json first_token_json(const FirstToken& first) {
  json j = sample_json(first.sample);
  j["seed"] = first.seed;
  if (first.prompt_tokens > 0) j["prompt_tokens"] = first.prompt_tokens;
  return j;
}

FirstToken first_token_from(const json& j, std::string_view what) {
  FirstToken first{parse_sample(j, what), field<uint64_t>(j, what, "seed")};
  first.prompt_tokens = field_or<int>(j, what, "prompt_tokens", 0);
  HACK_CHECK(first.prompt_tokens >= 0, "{}: 'prompt_tokens' must not be negative", what);
  return first;
}

}  // namespace

bool secret_matches(std::string_view given, std::string_view secret) {
  if (secret.empty()) return true;
  // Every byte of the longer string is visited whatever differs, so timing reveals nothing
  // but the lengths.
  const size_t n = std::max(given.size(), secret.size());
  unsigned diff = given.size() == secret.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char a = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    const unsigned char b = i < secret.size() ? static_cast<unsigned char>(secret[i]) : 0;
    diff |= static_cast<unsigned>(a ^ b);
  }
  return diff == 0;
}

std::string to_json(const SamplingParams& params) { return sampling_json(params).dump(); }

std::string to_json(const GenerateJob& job) {
  json j = {{"request_id", job.request_id},
            {"prompt", job.prompt},
            {"sampling", sampling_json(job.params)},
            {"remote_kv", job.remote_kv}};
  if (!job.kv_format.empty()) j["kv_format"] = job.kv_format;
  if (!job.generated.empty()) j["generated"] = job.generated;
  return j.dump();
}

std::string to_json(const PrefillCall& call) {
  json j = {{"request_id", call.request_id},
            {"prompt", call.prompt},
            {"sampling", sampling_json(call.params)},
            {"decode_ucx", call.decode_ucx}};
  if (!call.decode_ucx_worker.empty()) {
    j["decode_ucx_worker"] = call.decode_ucx_worker;
    j["decode_host_id"] = call.decode_host_id;
  }
  if (call.corrupt_page) j["test_corrupt_page"] = true;
  if (!call.kv_format.empty()) j["kv_format"] = call.kv_format;
  if (!call.generated.empty()) j["generated"] = call.generated;
  return j.dump();
}


std::string to_json(const FirstToken& first) { return first_token_json(first).dump(); }

std::string to_json(const PrefillReply& reply) {
  json j = first_token_json(reply.first);
  j["kv_bytes"] = reply.kv_bytes;
  j["prefill_s"] = reply.prefill_s;
  j["total_s"] = reply.total_s;
  if (!reply.prompt_logprobs.empty()) {
    json lps = json::array();
    for (const SampleResult& s : reply.prompt_logprobs) lps.push_back(sample_json(s));
    j["prompt_logprobs"] = std::move(lps);
  }
  return j.dump();
}

std::string to_json(const NodeEvent& e) {
  switch (e.kind) {
    case NodeEventKind::accepted: {
      json j = {{"type", "accepted"}};
      if (!e.ucx_address.empty()) j["ucx_address"] = e.ucx_address;
      if (!e.ucx_worker.empty()) {
        j["ucx_worker"] = e.ucx_worker;
        j["host_id"] = e.host_id;
      }
      return j.dump();
    }
    case NodeEventKind::token: {
      json j = sample_json(e.sample);
      j["type"] = "token";
      j["index"] = e.index;
      return j.dump();
    }
    case NodeEventKind::finished:
      return json{{"type", "finished"},
                  {"finish_reason", finish_reason_name(e.finish_reason)},
                  {"prompt_tokens", e.prompt_tokens},
                  {"completion_tokens", e.completion_tokens}}
          .dump();
    case NodeEventKind::error: return json{{"type", "error"}, {"message", e.message}}.dump();
  }
  return "{}";
}

std::string to_json(const NodeHealth& h) {
  return json{{"status", h.draining ? "draining" : h.ready ? "ok" : "starting"},
              {"draining", h.draining},
              {"ready", h.ready},
              {"role", h.role},
              {"model", h.model},
              {"ucx_address", h.ucx_address},
              {"ucx_worker", h.ucx_worker},
              {"host_id", h.host_id},
              {"queue_tokens", h.queue_tokens},
              {"running", h.running},
              {"waiting", h.waiting},
              {"kv_usage", h.kv_usage},
              {"kv_bytes_transferred", h.kv_bytes_transferred},
              {"kv_sequences", h.kv_sequences},
              {"kv_bytes_used", h.kv_bytes_used},
              {"kv_format", h.kv_format}}
      .dump();
}

std::string cancel_body(uint64_t request_id) { return json{{"request_id", request_id}}.dump(); }

std::string node_error_body(std::string_view message, std::string_view type) {
  return json{{"error", {{"message", message}, {"type", type}}}}.dump();
}


SamplingParams parse_sampling(std::string_view text) { return sampling_from(parse_object(text, "sampling"), "sampling"); }

GenerateJob parse_generate_job(std::string_view text) {
  constexpr std::string_view what = "generate";
  const json j = parse_object(text, what);
  GenerateJob job;
  job.request_id = field<uint64_t>(j, what, "request_id");
  job.prompt = field<std::vector<int>>(j, what, "prompt");
  HACK_CHECK(j.contains("sampling"), "{}: missing field 'sampling'", what);
  job.params = sampling_from(j["sampling"], what);
  job.remote_kv = field_or<bool>(j, what, "remote_kv", true);
  job.kv_format = field_or<std::string>(j, what, "kv_format", "");
  job.generated = field_or<std::vector<int>>(j, what, "generated", {});
  return job;
}

PrefillCall parse_prefill_call(std::string_view text) {
  constexpr std::string_view what = "prefill";
  const json j = parse_object(text, what);
  PrefillCall call;
  call.request_id = field<uint64_t>(j, what, "request_id");
  call.prompt = field<std::vector<int>>(j, what, "prompt");
  HACK_CHECK(j.contains("sampling"), "{}: missing field 'sampling'", what);
  call.params = sampling_from(j["sampling"], what);
  call.decode_ucx = field<std::string>(j, what, "decode_ucx");
  call.decode_ucx_worker = ucx_worker_field(j, what, "decode_ucx_worker");
  call.decode_host_id = field_or<std::string>(j, what, "decode_host_id", "");
  call.corrupt_page = field_or<bool>(j, what, "test_corrupt_page", false);
  call.kv_format = field_or<std::string>(j, what, "kv_format", "");
  call.generated = field_or<std::vector<int>>(j, what, "generated", {});
  return call;
}

FirstToken parse_first_token(std::string_view text) {
  constexpr std::string_view what = "first token";
  const json j = parse_object(text, what);
  return first_token_from(j, what);
}

PrefillReply parse_prefill_reply(std::string_view text) {
  constexpr std::string_view what = "prefill reply";
  const json j = parse_object(text, what);
  PrefillReply r;
  r.first = first_token_from(j, what);
  r.kv_bytes = field_or<uint64_t>(j, what, "kv_bytes", 0);
  r.prefill_s = field_or<double>(j, what, "prefill_s", 0);
  r.total_s = field_or<double>(j, what, "total_s", 0);
  if (auto it = j.find("prompt_logprobs"); it != j.end() && !it->is_null()) {
    HACK_CHECK(it->is_array(), "{}: field 'prompt_logprobs' must be an array", what);
    for (const json& s : *it) {
      HACK_CHECK(s.is_object(), "{}: prompt_logprobs entries must be objects", what);
      r.prompt_logprobs.push_back(parse_sample(s, what));
    }
  }
  return r;
}

NodeEvent parse_node_event(std::string_view text) {
  constexpr std::string_view what = "node event";
  const json j = parse_object(text, what);
  const std::string type = field<std::string>(j, what, "type");
  NodeEvent e;
  if (type == "accepted") {
    e.kind = NodeEventKind::accepted;
    e.ucx_address = field_or<std::string>(j, what, "ucx_address", "");
    if (!e.ucx_address.empty()) (void)parse_node_address(e.ucx_address, "accepted event's ucx_address");
    e.ucx_worker = ucx_worker_field(j, what, "ucx_worker");
    e.host_id = field_or<std::string>(j, what, "host_id", "");
  } else if (type == "token") {
    e.kind = NodeEventKind::token;
    e.sample = parse_sample(j, what);
    e.index = field<int>(j, what, "index");
  } else if (type == "finished") {
    e.kind = NodeEventKind::finished;
    const std::string reason = field<std::string>(j, what, "finish_reason");
    HACK_CHECK(reason == "stop" || reason == "length", "{}: unknown finish_reason '{}'", what, reason);
    e.finish_reason = reason == "stop" ? FinishReason::stop : FinishReason::length;
    e.prompt_tokens = field<int>(j, what, "prompt_tokens");
    e.completion_tokens = field<int>(j, what, "completion_tokens");
  } else if (type == "error") {
    e.kind = NodeEventKind::error;
    e.message = field<std::string>(j, what, "message");
  } else {
    fail("{}: unknown type '{}'", what, type);
  }
  return e;
}

NodeHealth parse_node_health(std::string_view text) {
  constexpr std::string_view what = "health";
  const json j = parse_object(text, what);
  NodeHealth h;
  h.role = field<std::string>(j, what, "role");
  h.model = field_or<std::string>(j, what, "model", "");
  h.ucx_address = field_or<std::string>(j, what, "ucx_address", "");
  h.ucx_worker = ucx_worker_field(j, what, "ucx_worker");
  h.host_id = field_or<std::string>(j, what, "host_id", "");
  h.queue_tokens = field_or<int64_t>(j, what, "queue_tokens", 0);
  h.running = field_or<int>(j, what, "running", 0);
  h.waiting = field_or<int>(j, what, "waiting", 0);
  h.kv_usage = field_or<double>(j, what, "kv_usage", 0);
  h.kv_bytes_transferred = field_or<uint64_t>(j, what, "kv_bytes_transferred", 0);
  h.kv_sequences = field_or<int64_t>(j, what, "kv_sequences", 0);
  h.kv_bytes_used = field_or<uint64_t>(j, what, "kv_bytes_used", 0);
  h.draining = field_or<bool>(j, what, "draining", false);
  h.ready = field_or<bool>(j, what, "ready", true);
  h.kv_format = field_or<std::string>(j, what, "kv_format", "");
  return h;
}

uint64_t parse_cancel_body(std::string_view text) {
  const json j = parse_object(text, "cancel");
  return field<uint64_t>(j, "cancel", "request_id");
}

std::string parse_node_error(std::string_view body) {
  const json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string()) {
    return j["error"]["message"].get<std::string>();
  }
  return std::string(body);
}

}  // namespace hack::server
