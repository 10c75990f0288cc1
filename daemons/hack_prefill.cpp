// hack-prefill: computes prompts' KV, streams it as HACK pages to decode nodes over UCX
// layer by layer, returns the first token (see hack/prefill/prefill_server.h).
#include <cstdio>

#include "hack/core/logging.h"
#include "hack/prefill/prefill_server.h"
#include "hack/node/shutdown_signal.h"

int main(int argc, char** argv) {
  try {
    hack::server::ShutdownSignal signal;  // before any thread starts
    hack::server::PrefillServerConfig config;
    hack::FlagSet flags("hack-prefill", "Prefill node: prompt in over HTTP, KV out over UCX.", "HACK_PREFILL");
    hack::server::add_prefill_flags(flags, config);
    if (!flags.parse(argc, argv)) return 0;
    hack::setup_logging(config.log_level, config.json_logs);
    hack::server::PrefillServer server(config);
    std::printf("hack-prefill ready: http %d\n", server.port());
    std::fflush(stdout);
    signal.wait();
    server.drain(config.drain_timeout_s);  // SIGTERM: finish what runs, take nothing new
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hack-prefill: error: %s\n", e.what());
    return 1;
  }
}
