// hack-router: the public OpenAI-compatible API over pools of prefill and decode nodes
// (see hack/router/router_server.h).
#include <cstdio>

#include "hack/core/logging.h"
#include "hack/router/router_server.h"
#include "hack/node/shutdown_signal.h"

int main(int argc, char** argv) {
  try {
    hack::server::ShutdownSignal signal;  // before any thread starts
    hack::server::RouterConfig config;
    hack::FlagSet flags("hack-router", "OpenAI-compatible API; routes each request to the prefill and decode node with the shortest queue.", "HACK_ROUTER");
    hack::server::add_router_flags(flags, config);
    if (!flags.parse(argc, argv)) return 0;
    hack::setup_logging(config.log_level, config.json_logs);
    hack::server::RouterServer server(config);
    std::printf("hack-router ready: http %d\n", server.port());
    std::fflush(stdout);
    signal.wait();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hack-router: error: %s\n", e.what());
    return 1;
  }
}
