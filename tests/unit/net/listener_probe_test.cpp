// A worker's self-probe of its UCX listener (net/listener_probe.h), which gates a decode
// node's readiness: it passes only when this worker's own listener accepts the connection
// and delivers the message, and fails within its timeout otherwise.
#include <catch2/catch.hpp>

#include <chrono>

#include "hack/net/listener_probe.h"
#include "unit/net/net_test_util.h"

using namespace hack;
using namespace hack::net;

TEST_CASE("listener probe: passes through the worker's own listener, fails without one", "[net][ucx]") {
  UcxWorker worker(test::options_for("tcp"));
  const uint16_t port = worker.listen("127.0.0.1", 0);
  const Status ok = listener_probe(worker, "127.0.0.1", port, test::kWaitS);
  INFO(ok.message());
  CHECK(ok);
  // Repeatable (each probe dials a new endpoint and closes it).
  CHECK(listener_probe(worker, probe_host("0.0.0.0"), port, test::kWaitS));

  // Nothing listens there: the connect fails, reported as such.
  uint16_t dead_port = 0;
  {
    UcxWorker gone(test::options_for("tcp"));
    dead_port = gone.listen("127.0.0.1", 0);
  }
  UcxWorker lone(test::options_for("tcp"));
  const auto t0 = std::chrono::steady_clock::now();
  const Status refused = listener_probe(lone, "127.0.0.1", dead_port, 5.0);
  CHECK_FALSE(refused);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 10.0);

  // Another worker's listener accepts, but the message lands there, not here: not ready.
  const Status elsewhere = listener_probe(lone, "127.0.0.1", port, 1.0);
  CHECK_FALSE(elsewhere);
  CHECK_THAT(elsewhere.message(), Catch::Contains("no probe message within"));
}

TEST_CASE("listener probe: the wildcard bind address is dialled on loopback", "[net]") {
  CHECK(probe_host("0.0.0.0") == "127.0.0.1");
  CHECK(probe_host("") == "127.0.0.1");
  CHECK(probe_host("::") == "::1");
  CHECK(probe_host("10.1.2.3") == "10.1.2.3");
}
