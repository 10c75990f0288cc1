#include "hack/node/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <vector>

namespace hack::server {

namespace {

// Bucket bounds in seconds, those of vLLM's metrics (so dashboards carry over), with finer
// low buckets for inter-token latency, which is a few ms on a fast decode node.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                         0.3,   0.4,    0.5,   0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kRequestBuckets = {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,   15.0,   20.0,
                                             30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const std::vector<double> kQueueBuckets = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,  0.25,  0.5,   1.0,   2.5,
                                           5.0,   10.0,  20.0, 40.0,  80.0, 160.0, 320.0, 640.0, 1280.0};

prometheus::Histogram& histogram(prometheus::Registry& r, const char* name, const char* help,
                                 const std::vector<double>& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, buckets);
}

const std::vector<double> kRestoreBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                             0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0};

prometheus::Counter& counter(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

}  // namespace

struct Metrics::Impl {
  prometheus::Registry registry;

  prometheus::Histogram& ttft = histogram(registry, "hack:time_to_first_token_seconds",
                                          "Time from request arrival to its first token, in seconds.", kTtftBuckets);
  prometheus::Histogram& itl = histogram(registry, "hack:inter_token_latency_seconds",
                                         "Time between consecutive tokens of a request, in seconds.", kItlBuckets);
  prometheus::Histogram& e2e = histogram(registry, "hack:e2e_request_latency_seconds",
                                         "Time from request arrival to its last token, in seconds.", kRequestBuckets);
  prometheus::Histogram& queue = histogram(registry, "hack:request_queue_time_seconds",
                                           "Time a request waited before it was scheduled, in seconds.", kQueueBuckets);

  prometheus::Gauge& running = prometheus::BuildGauge()
                                   .Name("hack:num_requests_running")
                                   .Help("Requests being prefilled or decoded.")
                                   .Register(registry)
                                   .Add({});
  prometheus::Gauge& waiting = prometheus::BuildGauge()
                                   .Name("hack:num_requests_waiting")
                                   .Help("Requests waiting to be scheduled.")
                                   .Register(registry)
                                   .Add({});
  prometheus::Family<prometheus::Gauge>& kv_usage = prometheus::BuildGauge()
                                                        .Name("hack:kv_cache_usage_ratio")
                                                        .Help("Fraction of the KV page pool in use, per node (0..1).")
                                                        .Register(registry);

  prometheus::Counter& prompt_tokens = prometheus::BuildCounter()
                                           .Name("hack:prompt_tokens_total")
                                           .Help("Prompt tokens processed.")
                                           .Register(registry)
                                           .Add({});
  prometheus::Counter& generation_tokens = prometheus::BuildCounter()
                                               .Name("hack:generation_tokens_total")
                                               .Help("Tokens generated.")
                                               .Register(registry)
                                               .Add({});
  prometheus::Family<prometheus::Counter>& kv_bytes = prometheus::BuildCounter()
                                                          .Name("hack:kv_bytes_transferred_total")
                                                          .Help("KV cache bytes sent between nodes, per node.")
                                                          .Register(registry);
  prometheus::Counter& vault_hits = prometheus::BuildCounter()
                                        .Name("hack:vault_hits_total")
                                        .Help("KV blocks restored from the vault instead of recomputed.")
                                        .Register(registry)
                                        .Add({});
  prometheus::Counter& vault_misses = counter(registry, "hack:vault_misses_total",
                                             "KV blocks asked of the vault that it did not hold.");
  prometheus::Counter& vault_stored = counter(registry, "hack:vault_bytes_stored_total", "Block bytes stored in the vault.");
  prometheus::Counter& vault_served = counter(registry, "hack:vault_bytes_served_total", "Block bytes the vault served.");
  prometheus::Counter& vault_evictions = counter(registry, "hack:vault_evictions_total",
                                                 "Blocks evicted from the vault for its byte budget.");
  prometheus::Histogram& vault_restore = histogram(registry, "hack:vault_restore_seconds",
                                                   "Time of one BatchPromote, from the call to its last layer, in seconds.",
                                                   kRestoreBuckets);
  prometheus::Family<prometheus::Histogram>& prefill_stage =
      prometheus::BuildHistogram()
          .Name("hack:prefill_stage_seconds")
          .Help("Time of one stage of a prefill job (setup, restore_lookup, restore_decode, restore_import, compute, "
                "export (quantize, send: parts of it), capture, sample, store, drain), in seconds.")
          .Register(registry);
  prometheus::Gauge& vault_blocks = prometheus::BuildGauge().Name("hack:vault_blocks").Help("Blocks held by the vault.").Register(registry).Add({});
  prometheus::Gauge& vault_bytes = prometheus::BuildGauge().Name("hack:vault_bytes").Help("Bytes charged to the vault's budget.").Register(registry).Add({});
  prometheus::Family<prometheus::Counter>& prefix_hits = prometheus::BuildCounter()
                                                             .Name("hack:prefix_cache_hits_total")
                                                             .Help("Prompt blocks restored instead of computed, by tier (local, vault).")
                                                             .Register(registry);
  prometheus::Counter& prefix_misses = counter(registry, "hack:prefix_cache_misses_total",
                                               "Full prompt blocks computed because no cache held them.");
  prometheus::Family<prometheus::Counter>& errors = prometheus::BuildCounter()
                                                        .Name("hack:request_errors_total")
                                                        .Help("Requests that ended in an error, by error type.")
                                                        .Register(registry);
  prometheus::Family<prometheus::Counter>& successes = prometheus::BuildCounter()
                                                           .Name("hack:request_success_total")
                                                           .Help("Requests that finished, by finish reason.")
                                                           .Register(registry);
  prometheus::Family<prometheus::Counter>& retries = prometheus::BuildCounter()
                                                         .Name("hack:request_retries_total")
                                                         .Help("Attempts that failed before any token and were retried, by cause.")
                                                         .Register(registry);
  prometheus::Family<prometheus::Counter>& migrations = prometheus::BuildCounter()
                                                            .Name("hack:request_migrations_total")
                                                            .Help("Streams continued on another node pair after tokens, by cause.")
                                                            .Register(registry);
  prometheus::Family<prometheus::Counter>& kv_rejected = prometheus::BuildCounter()
                                                             .Name("hack:kv_messages_rejected_total")
                                                             .Help("Data-plane messages refused, by reason.")
                                                             .Register(registry);
  prometheus::Family<prometheus::Counter>& vault_rejected = prometheus::BuildCounter()
                                                                .Name("hack:vault_messages_rejected_total")
                                                                .Help("Vault calls refused for their MAC, by reason.")
                                                                .Register(registry);
  prometheus::Family<prometheus::Counter>& kv_send_retries = prometheus::BuildCounter()
                                                                 .Name("hack:kv_send_retries_total")
                                                                 .Help("Prefill jobs sent again on a fresh endpoint to "
                                                                       "their decode node after a broken one.")
                                                                 .Register(registry);
  prometheus::Family<prometheus::Counter>& prefill_batched = prometheus::BuildCounter()
                                                                 .Name("hack:prefill_batched_jobs_total")
                                                                 .Help("Prompts a prefill node computed in a batched "
                                                                       "step beside others (--prefill-batch-jobs).")
                                                                 .Register(registry);
  prometheus::Family<prometheus::Counter>& kv_connects =
      prometheus::BuildCounter()
          .Name("hack:kv_connects_total")
          .Help("KV endpoints a prefill node opened to decode nodes, by how: address (UCX worker address, a node "
                "on this host: shared memory where enabled) or listener (host:port).")
          .Register(registry);
};

Metrics::Metrics() : impl_(std::make_unique<Impl>()) {}
Metrics::~Metrics() = default;

void Metrics::observe_time_to_first_token_s(double s) { impl_->ttft.Observe(s); }
void Metrics::observe_inter_token_latency_s(double s) { impl_->itl.Observe(s); }
void Metrics::observe_e2e_request_latency_s(double s) { impl_->e2e.Observe(s); }
void Metrics::observe_request_queue_time_s(double s) { impl_->queue.Observe(s); }

void Metrics::set_num_requests_running(double n) { impl_->running.Set(n); }
void Metrics::set_num_requests_waiting(double n) { impl_->waiting.Set(n); }
// Family::Add returns the existing series for labels it has seen (under the family's lock).
void Metrics::set_kv_cache_usage_ratio(std::string_view node, double ratio) {
  impl_->kv_usage.Add({{"node", std::string(node)}}).Set(ratio);
}

void Metrics::add_prompt_tokens(uint64_t n) { impl_->prompt_tokens.Increment(static_cast<double>(n)); }
void Metrics::add_generation_tokens(uint64_t n) { impl_->generation_tokens.Increment(static_cast<double>(n)); }
void Metrics::add_kv_bytes_transferred(std::string_view node, uint64_t bytes) {
  impl_->kv_bytes.Add({{"node", std::string(node)}}).Increment(static_cast<double>(bytes));
}
void Metrics::add_vault_hits(uint64_t blocks) { impl_->vault_hits.Increment(static_cast<double>(blocks)); }
void Metrics::add_vault_misses(uint64_t blocks) { impl_->vault_misses.Increment(static_cast<double>(blocks)); }
void Metrics::add_vault_bytes_stored(uint64_t bytes) { impl_->vault_stored.Increment(static_cast<double>(bytes)); }
void Metrics::add_vault_bytes_served(uint64_t bytes) { impl_->vault_served.Increment(static_cast<double>(bytes)); }
void Metrics::add_vault_evictions(uint64_t blocks) { impl_->vault_evictions.Increment(static_cast<double>(blocks)); }
void Metrics::observe_vault_restore_s(double s) { impl_->vault_restore.Observe(s); }
void Metrics::observe_prefill_stage_s(std::string_view stage, double s) {
  impl_->prefill_stage.Add({{"stage", std::string(stage)}}, kRestoreBuckets).Observe(s);
}
void Metrics::set_vault_usage(double blocks, double bytes) {
  impl_->vault_blocks.Set(blocks);
  impl_->vault_bytes.Set(bytes);
}
void Metrics::add_prefix_cache_hits(std::string_view tier, uint64_t blocks) {
  impl_->prefix_hits.Add({{"tier", std::string(tier)}}).Increment(static_cast<double>(blocks));
}
void Metrics::add_prefix_cache_misses(uint64_t blocks) { impl_->prefix_misses.Increment(static_cast<double>(blocks)); }
void Metrics::count_request_error(std::string_view type) {
  impl_->errors.Add({{"type", std::string(type)}}).Increment();
}
void Metrics::count_request_success(std::string_view finish_reason) {
  impl_->successes.Add({{"finish_reason", std::string(finish_reason)}}).Increment();
}

void Metrics::count_request_retry(std::string_view cause) {
  impl_->retries.Add({{"cause", std::string(cause)}}).Increment();
}
void Metrics::count_request_migration(std::string_view cause) {
  impl_->migrations.Add({{"cause", std::string(cause)}}).Increment();
}
void Metrics::count_kv_message_rejected(std::string_view reason) {
  impl_->kv_rejected.Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::count_vault_message_rejected(std::string_view reason) {
  impl_->vault_rejected.Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::add_kv_send_retries(uint64_t n) {
  if (n > 0) impl_->kv_send_retries.Add({}).Increment(static_cast<double>(n));
}

void Metrics::add_prefill_batched_jobs(uint64_t n) {
  impl_->prefill_batched.Add({}).Increment(static_cast<double>(n));
}

void Metrics::add_kv_connects(std::string_view by, uint64_t n) {
  impl_->kv_connects.Add({{"by", std::string(by)}}).Increment(static_cast<double>(n));
}

std::string Metrics::serialize() const { return prometheus::TextSerializer().Serialize(impl_->registry.Collect()); }

}  // namespace hack::server
