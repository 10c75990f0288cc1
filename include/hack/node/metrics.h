/// @file metrics.h
/// @brief The Prometheus metrics of the router and the nodes (names as in DESIGN.md §5,
/// following vLLM's with the `hack:` prefix), and their text exposition for GET /metrics.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace hack::server {

/// One registry with every hackserve metric. Thread-safe: record from any thread, serialize
/// from the HTTP thread. Label values (node names, error types, finish reasons) should come
/// from a small fixed set; each distinct value is a time series.
class Metrics {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Histograms, seconds.
  void observe_time_to_first_token_s(double s);   ///< hack:time_to_first_token_seconds
  void observe_inter_token_latency_s(double s);   ///< hack:inter_token_latency_seconds
  void observe_e2e_request_latency_s(double s);   ///< hack:e2e_request_latency_seconds
  void observe_request_queue_time_s(double s);    ///< hack:request_queue_time_seconds

  // Gauges.
  void set_num_requests_running(double n);  ///< hack:num_requests_running
  void set_num_requests_waiting(double n);  ///< hack:num_requests_waiting
  void set_kv_cache_usage_ratio(std::string_view node, double ratio);  ///< hack:kv_cache_usage_ratio{node}

  // Counters.
  void add_prompt_tokens(uint64_t n);      ///< hack:prompt_tokens_total
  void add_generation_tokens(uint64_t n);  ///< hack:generation_tokens_total
  void add_kv_bytes_transferred(std::string_view node, uint64_t bytes);  ///< hack:kv_bytes_transferred_total{node}
  void add_vault_hits(uint64_t blocks);    ///< hack:vault_hits_total (blocks restored from / served by the vault)
  void add_vault_misses(uint64_t blocks);  ///< hack:vault_misses_total (blocks asked for and not held)
  void add_vault_bytes_stored(uint64_t bytes);  ///< hack:vault_bytes_stored_total
  void add_vault_bytes_served(uint64_t bytes);  ///< hack:vault_bytes_served_total
  void add_vault_evictions(uint64_t blocks);    ///< hack:vault_evictions_total
  void observe_vault_restore_s(double s);       ///< hack:vault_restore_seconds (vault: promote call → last layer sent;
                                                ///< prefill: lookup → every restored block applied to its cache)
  void set_vault_usage(double blocks, double bytes);  ///< hack:vault_blocks, hack:vault_bytes
  /// hack:prefill_stage_seconds{stage}: one stage of a prefill job (PrefillTimings, the
  /// prefix restore's lookup, decode and import), so a slow TTFT can be taken apart.
  void observe_prefill_stage_s(std::string_view stage, double s);
  /// hack:prefix_cache_hits_total{tier} (tier "local" or "vault"), in blocks.
  void add_prefix_cache_hits(std::string_view tier, uint64_t blocks);
  void add_prefix_cache_misses(uint64_t blocks);  ///< hack:prefix_cache_misses_total (full blocks computed)
  void count_request_error(std::string_view type);             ///< hack:request_errors_total{type}
  void count_request_success(std::string_view finish_reason);  ///< hack:request_success_total{finish_reason}
  /// hack:request_retries_total{cause}: an attempt that failed before any token, retried elsewhere.
  void count_request_retry(std::string_view cause);
  /// hack:request_migrations_total{cause}: a stream continued on another node pair after tokens
  /// (cause: node_lost | stream_broken | stalled).
  void count_request_migration(std::string_view cause);
  /// hack:kv_messages_rejected_total{reason}: data-plane messages refused (bad or missing MAC, replay).
  void count_kv_message_rejected(std::string_view reason);
  /// hack:vault_messages_rejected_total{reason}: vault calls refused for their MAC (a client
  /// without the cluster secret, or with another one).
  void count_vault_message_rejected(std::string_view reason);
  /// hack:kv_send_retries_total: prefill jobs sent again on a fresh endpoint after a broken one.
  void add_kv_send_retries(uint64_t n);
  /// hack:prefill_batched_jobs_total: prompts computed in a batched prefill step beside others.
  void add_prefill_batched_jobs(uint64_t n);
  /// hack:kv_connects_total{by}: KV endpoints a prefill node opened, by "address" or "listener".
  void add_kv_connects(std::string_view by, uint64_t n);

  /// Everything in the Prometheus text exposition format (version 0.0.4).
  std::string serialize() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hack::server
