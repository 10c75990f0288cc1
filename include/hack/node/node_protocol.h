/// @file node_protocol.h
/// @brief The internal control plane between router and nodes (DESIGN.md §4): JSON bodies
/// of the prefill and decode endpoints, parsed into typed structs at this edge.
///
///   decode  POST /internal/generate   GenerateJob → SSE of NodeEvent JSON objects:
///                                     accepted, token*, then finished | error
///           POST /internal/cancel     {"request_id"}
///   prefill POST /internal/prefill    PrefillCall → PrefillReply (after the KV is sent)
///           POST /internal/cancel     {"request_id"}
///   both    GET  /health              NodeHealth;  GET /metrics (Prometheus text)
/// Internal endpoints require `X-Hack-Secret: <secret>` when the node has a secret.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hack/model/sampler.h"
#include "hack/core/error.h"
#include "hack/model/sampler.h"

namespace hack::server {

inline constexpr std::string_view kSecretHeader = "x-hack-secret";

/// What a decode node is asked to generate.
struct GenerateJob {
  uint64_t request_id = 0;
  std::vector<int> prompt;
  SamplingParams params;
  bool remote_kv = true;  ///< KV comes from a prefill node (false: the decode node prefills)
  std::string kv_format;  ///< the prefill node's KV format (runtime kv_format); "" = not checked
  /// A migrated stream: the tokens an earlier node pair already generated. The KV covers
  /// prompt + generated, the sampler records them (penalties, step count) and the next token
  /// is sampled at step generated.size(); params.max_tokens still counts the whole output
  /// and params.seed must be the seed the stream began with. Empty for a new request.
  std::vector<int> generated;
};

/// What a prefill node is asked to compute and where to send the KV.
struct PrefillCall {
  uint64_t request_id = 0;
  std::vector<int> prompt;
  SamplingParams params;
  std::string decode_ucx;     ///< "host:port" of the decode node's UCX listener
  /// The decode node's UCX worker address (hex) and host identity (ucx_host_id()). Prefill
  /// connects by the address instead of decode_ucx when it runs on the same host (so UCX may
  /// carry the KV over shared memory); empty: by decode_ucx.
  std::string decode_ucx_worker;
  std::string decode_host_id;
  bool corrupt_page = false;  ///< test hook (honoured only with --enable-test-hooks)
  std::string kv_format;      ///< the decode node's KV format; "" = not checked
  std::vector<int> generated; ///< as GenerateJob::generated: KV of prompt + generated, sample step generated.size()
};

/// The first token, sampled by the prefill node (also sent to decode with the KV).
struct FirstToken {
  SampleResult sample;
  uint64_t seed = 0;      ///< the sampler's seed (decode continues its stream)
  int prompt_tokens = 0;  ///< the prompt's length (0 = not said)
};

struct PrefillReply {
  FirstToken first;
  uint64_t kv_bytes = 0;   ///< payload bytes sent over UCX
  double prefill_s = 0;    ///< compute time
  double total_s = 0;      ///< queue + compute + transfer
  /// With params.prompt_logprobs >= 0: prompt tokens 1..n-1 (prompt_logprobs() of sampler.h).
  std::vector<SampleResult> prompt_logprobs;
};

enum class NodeEventKind { accepted, token, finished, error };

/// One SSE event of /internal/generate.
struct NodeEvent {
  NodeEventKind kind = NodeEventKind::token;
  SampleResult sample;          ///< token
  int index = 0;                ///< token
  /// Token 0 of a request that asked for prompt logprobs: the prefill reply's, attached by
  /// DisaggregatedCall on the router (never on the decode node's wire).
  std::vector<SampleResult> prompt_logprobs;
  FinishReason finish_reason = FinishReason::length;  ///< finished
  int prompt_tokens = 0;        ///< finished
  int completion_tokens = 0;    ///< finished
  std::string message;          ///< error
  /// accepted: the decode node's UCX listener ("host:port") to stream the request's KV to, so
  /// the router starts prefill with the address of the process that admitted it, not one
  /// from a health poll that may predate a restart. Empty from nodes that do not send it.
  std::string ucx_address;
  std::string ucx_worker;  ///< accepted: the node's UCX worker address (hex), as NodeHealth
  std::string host_id;     ///< accepted: as NodeHealth
};

/// Reported by GET /health of either node.
struct NodeHealth {
  std::string role;           ///< "prefill" | "decode"
  std::string model;          ///< served model name
  std::string ucx_address;    ///< decode: "host:port" of its UCX listener
  std::string ucx_worker;     ///< decode: its UCX worker address (hex), for prefill nodes on its host
  std::string host_id;        ///< decode: ucx_host_id() of its process ("" = not said)
  int64_t queue_tokens = 0;   ///< the routing signal (see each node for its definition)
  int running = 0;
  int waiting = 0;
  double kv_usage = 0;        ///< reserved / capacity
  uint64_t kv_bytes_transferred = 0;
  int64_t kv_sequences = 0;   ///< sequences holding KV now (0 when idle: accounting check)
  uint64_t kv_bytes_used = 0; ///< KV bytes held now
  bool draining = false;      ///< SIGTERM: finishing what it runs, taking nothing new (routers skip it)
  /// decode: its UCX listener has accepted a connection and delivered a message (a self-probe
  /// over the data plane). Until then routers send it nothing. Absent in a body = true.
  bool ready = true;
  std::string kv_format;      ///< what its KV bytes depend on (runtime kv_format): pairs must agree
};

std::string to_json(const SamplingParams& params);
std::string to_json(const GenerateJob& job);
std::string to_json(const PrefillCall& call);
std::string to_json(const FirstToken& first);
std::string to_json(const PrefillReply& reply);
std::string to_json(const NodeEvent& event);
std::string to_json(const NodeHealth& health);
std::string cancel_body(uint64_t request_id);
/// {"error":{"message":...,"type":...}} as the nodes answer failures.
std::string node_error_body(std::string_view message, std::string_view type = "node_error");

/// Parsers throw hack::Error naming the field on malformed input.
SamplingParams parse_sampling(std::string_view json);
GenerateJob parse_generate_job(std::string_view json);
PrefillCall parse_prefill_call(std::string_view json);
FirstToken parse_first_token(std::string_view json);
PrefillReply parse_prefill_reply(std::string_view json);
NodeEvent parse_node_event(std::string_view json);
NodeHealth parse_node_health(std::string_view json);
uint64_t parse_cancel_body(std::string_view json);
/// The message of a node_error_body (or the raw text when it is not one).
std::string parse_node_error(std::string_view body);

/// Whether an internal request may pass: true when `secret` is empty, else when the
/// X-Hack-Secret value equals it (compared in constant time).
bool secret_matches(std::string_view given, std::string_view secret);

}  // namespace hack::server
