/// @file router_server.h
/// @brief hack-router as a library object: the public OpenAI-compatible API (DESIGN.md §5)
/// over pools of prefill and decode nodes. Tokenizes and renders chat templates at the
/// edge, picks the prefill and decode node with the shortest queue in tokens (their own
/// reports from health polls, corrected by the router's in-flight accounting), runs the
/// request on the pair (node_client.h), detokenizes, applies stop strings, and answers as
/// JSON or SSE. A request that has produced no token yet is retried once on other nodes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hack/core/flags.h"

namespace hack::server {

struct RouterConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                     ///< 0 = any free port
  std::vector<std::string> prefill;    ///< prefill nodes, host:port (repeatable / comma list)
  std::vector<std::string> decode;     ///< decode nodes, host:port
  std::string model;                   ///< model directory (tokenizer, chat template, config)
  std::string served_name;             ///< model name clients use; default: the directory name
  std::string chat_template;           ///< Jinja file overriding the model's chat template
  std::string tool_parser = "auto";    ///< hermes | llama3_json | mistral | none | auto (from the chat template)
  int max_model_len = 0;               ///< 0 = max_position_embeddings
  std::vector<std::string> api_keys;   ///< accepted Bearer keys (none = no auth)
  std::string api_key_file;            ///< one key per line
  std::string secret;                  ///< the nodes' shared secret
  float health_interval_s = 1.0f;
  float request_timeout_s = 600;       ///< idle limit of each node connection
  int max_migrations = 2;              ///< a stream whose node pair fails after tokens continues on another
                                       ///< pair at most this many times (prompt + tokens so far), then fails
  float stall_timeout_s = 10;          ///< no token for this long and the decode (or, before the first token,
                                       ///< prefill) node is unreachable or busy: the stream is stalled, migrate it
  int64_t max_queue_tokens = 0;        ///< 429 when every prefill node's queue (prompt tokens) passes this (0 = off)
  int64_t max_decode_queue_tokens = 0; ///< 429 when every decode node's queue (tokens to prefill or generate)
                                       ///< passes this (0 = off)
  int64_t prefix_affinity_tokens = 512;  ///< prefill routing: prefer the node sent this prompt's prefix when
                                         ///< its queue is within this many tokens of the shortest (0 = off)
  int prefix_block_tokens = 64;        ///< Π of the nodes' prefix caches (--hack-block)
  int http_threads = 4;                ///< HTTP I/O threads (client connections)
  int io_threads = 4;                  ///< threads running every request's coroutines (node calls, relay)
  int64_t max_body_kb = 8192;
  float header_timeout_s = 10;
  bool json_logs = false;
  std::string log_level = "info";
};

/// Registers every RouterConfig flag (env mirrors HACK_ROUTER_*).
void add_router_flags(FlagSet& flags, RouterConfig& config);

class RouterServer {
 public:
  /// Loads tokenizer and template, binds, starts health polling. Throws hack::Error.
  explicit RouterServer(const RouterConfig& config);
  /// Stops accepting, cancels open requests on their nodes, joins every thread.
  ~RouterServer();
  RouterServer(const RouterServer&) = delete;
  RouterServer& operator=(const RouterServer&) = delete;

  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hack::server
