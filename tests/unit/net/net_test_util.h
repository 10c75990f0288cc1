// Helpers for the UCX tests: transport choices, random payloads, and an event collector
// that tests wait on (condition variable with a deadline, never a sleep).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "hack/net/ucx_worker.h"

namespace hack::net::test {

// Generous: a loaded 2-core CI box with two UCX workers and ctest -j2 beside them.
inline constexpr double kWaitS = 60.0;

// UCX_TLS values exercised on loopback. Client-server (sockaddr) connections need the
// tcp transport on the device the connection manager resolved (lo): with shared memory
// only, UCX 1.13 fails the connect with "device lo is not enabled" (Destination is
// unreachable). With tcp beside posix/sysv/cma, UCX 1.13 still puts the AM and rendezvous
// lanes on tcp/lo in this mode (UCX_LOG_LEVEL=debug "lane[..]" lines), so for host:port
// connections the second entry checks that a shared-memory-enabled configuration works, not
// that bytes move through shared memory; connections by worker address do use it (the
// address test checks UcxWorker::transports). HACK_PROBE_TLS=<list> runs the tests with one
// list instead.
inline const std::vector<std::string>& loopback_transports() {
  static const std::vector<std::string> tls = [] {
    if (const char* probe = std::getenv("HACK_PROBE_TLS")) return std::vector<std::string>{probe};
    return std::vector<std::string>{"tcp", "posix,sysv,cma,self,tcp"};
  }();
  return tls;
}

inline UcxOptions options_for(const std::string& tls) {
  UcxOptions options;
  options.config = {{"TLS", tls}};
  return options;
}

inline std::vector<std::byte> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    for (int b = 0; b < 8; ++b) out[i + static_cast<size_t>(b)] = static_cast<std::byte>(v >> (8 * b));
  }
  for (; i < n; ++i) out[i] = static_cast<std::byte>(rng());
  return out;
}

// Records what a KvReceiver / KvSender reports; every method is thread-safe.
struct Events {
  struct Page {
    uint64_t request_id;
    uint32_t layer;
    std::vector<std::byte> bytes;
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Page> pages;
  std::vector<Page> exacts;
  std::map<uint64_t, std::vector<std::byte>> done_payloads;
  std::vector<std::pair<uint64_t, uint32_t>> layers_done;
  std::vector<uint64_t> requests_done;
  std::map<uint64_t, std::string> errors;
  std::vector<std::string> bad_messages;
  // Sequence of (request, event) to check ordering: "page L", "layer L", "done".
  std::map<uint64_t, std::vector<std::string>> log;

  void page(uint64_t id, uint32_t layer, std::span<const std::byte> bytes) {
    std::lock_guard lock(mutex);
    pages.push_back({id, layer, {bytes.begin(), bytes.end()}});
    log[id].push_back("page " + std::to_string(layer));
    changed.notify_all();
  }
  void layer_done(uint64_t id, uint32_t layer) {
    std::lock_guard lock(mutex);
    layers_done.emplace_back(id, layer);
    log[id].push_back("layer " + std::to_string(layer));
    changed.notify_all();
  }
  void exact(uint64_t id, uint32_t layer, std::span<const std::byte> bytes) {
    std::lock_guard lock(mutex);
    exacts.push_back({id, layer, {bytes.begin(), bytes.end()}});
    log[id].push_back("exact " + std::to_string(layer));
    changed.notify_all();
  }
  void done(uint64_t id, std::span<const std::byte> payload = {}) {
    std::lock_guard lock(mutex);
    requests_done.push_back(id);
    done_payloads[id] = std::vector<std::byte>(payload.begin(), payload.end());
    log[id].push_back("done");
    changed.notify_all();
  }
  void error(uint64_t id, const Status& status) {
    std::lock_guard lock(mutex);
    errors.emplace(id, status.message());
    changed.notify_all();
  }
  void bad_message(const Status& status) {
    std::lock_guard lock(mutex);
    bad_messages.push_back(status.message());
    changed.notify_all();
  }
  bool wait(const std::function<bool()>& ready, double seconds = kWaitS) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, std::chrono::duration<double>(seconds), ready);
  }
  bool has_error(uint64_t id) { return errors.contains(id); }
  bool is_done(uint64_t id) {
    for (uint64_t d : requests_done)
      if (d == id) return true;
    return false;
  }
};

}  // namespace hack::net::test
