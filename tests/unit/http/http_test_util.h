// Helpers of the HTTP server and client tests: polling with a deadline, and threads that
// handlers start, joined at scope end.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hack/http/http_client.h"

namespace hack::server::test {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// A GET of `target` on 127.0.0.1:port.
inline HttpClientRequest make_request(int port, std::string target, double timeout_s = 5) {
  HttpClientRequest r;
  r.host = "127.0.0.1";
  r.port = port;
  r.target = std::move(target);
  r.timeout_s = timeout_s;
  return r;
}

/// Polls `cond` every 5 ms for up to timeout_s.
template <class Cond>
bool eventually(Cond cond, double timeout_s = 3) {
  auto t0 = Clock::now();
  while (!cond()) {
    if (seconds_since(t0) > timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

/// Threads started by handlers; joined at scope end (declare before the server, so the
/// server stops first and the threads see their Responders closed).
struct Workers {
  std::mutex mu;
  std::vector<std::thread> threads;
  template <class Fn>
  void start(Fn fn) {
    std::lock_guard lock(mu);
    threads.emplace_back(std::move(fn));
  }
  // Waits for every thread started so far (Catch's assertions are made on the test's thread
  // only: threads record what they saw, the test checks it after this).
  void join() {
    std::lock_guard lock(mu);
    for (auto& t : threads) t.join();
    threads.clear();
  }
  ~Workers() { join(); }
};

}  // namespace hack::server::test
