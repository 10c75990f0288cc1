// A worker's self-probe of its UCX listener (include/hack/net/listener_probe.h).
#include "hack/net/listener_probe.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>

namespace hack::net {

std::string probe_host(const std::string& bind_host) {
  if (bind_host.empty() || bind_host == "0.0.0.0") return "127.0.0.1";
  if (bind_host == "::" || bind_host == "[::]") return "::1";
  return bind_host;
}

Status listener_probe(UcxWorker& worker, const std::string& host, uint16_t port, double timeout_s) {
  struct State {
    std::mutex mutex;
    std::condition_variable arrived;
    bool received = false;
    std::string lost;  // why the probe endpoint failed, if it did
  };
  auto state = std::make_shared<State>();
  const uint64_t nonce = std::random_device{}() * uint64_t{0x9E3779B97F4A7C15} ^ std::random_device{}();
  worker.set_message_handler(kListenerProbeAmId,
                             [state, nonce](EndpointId, std::span<const std::byte> header, std::span<const std::byte>) {
                               uint64_t got = 0;
                               if (header.size() != sizeof got) return;
                               std::memcpy(&got, header.data(), sizeof got);
                               if (got != nonce) return;  // a stale or foreign probe
                               std::lock_guard lock(state->mutex);
                               state->received = true;
                               state->arrived.notify_all();
                             });
  EndpointId endpoint = 0;
  const int token = worker.add_disconnect_handler([state, &endpoint](EndpointId id, const Status& reason) {
    std::lock_guard lock(state->mutex);
    if (id != endpoint) return;
    state->lost = reason.message();
    state->arrived.notify_all();
  });
  Status result = Status::ok();
  try {
    worker.run_on_worker([&] { endpoint = worker.connect(host, port); });  // endpoint set before any callback
    std::vector<std::byte> header(sizeof nonce);
    std::memcpy(header.data(), &nonce, sizeof nonce);
    worker.send(endpoint, kListenerProbeAmId, std::move(header), {}, [state](const Status& s) {
      if (s) return;
      std::lock_guard lock(state->mutex);
      if (state->lost.empty()) state->lost = s.message();
      state->arrived.notify_all();
    });
    std::unique_lock lock(state->mutex);
    state->arrived.wait_for(lock, std::chrono::duration<double>(timeout_s),
                            [&] { return state->received || !state->lost.empty(); });
    if (!state->received)
      result = Status::error(state->lost.empty()
                                 ? fmt::format("UCX listener {}:{}: no probe message within {} s", host, port, timeout_s)
                                 : fmt::format("UCX listener {}:{}: probe failed: {}", host, port, state->lost));
  } catch (const Error& e) {
    result = Status::error(fmt::format("UCX listener {}:{}: {}", host, port, e.what()));
  }
  worker.remove_disconnect_handler(token);
  worker.set_message_handler(kListenerProbeAmId, {});
  if (endpoint != 0) worker.close(endpoint);
  return result;
}

}  // namespace hack::net
