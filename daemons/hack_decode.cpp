// hack-decode: receives KV from prefill nodes over UCX, runs continuous batching and
// streams tokens over its internal HTTP/SSE endpoint (see hack/decode/decode_server.h).
#include <cstdio>

#include "hack/core/logging.h"
#include "hack/decode/decode_server.h"
#include "hack/node/shutdown_signal.h"

int main(int argc, char** argv) {
  try {
    hack::server::ShutdownSignal signal;  // before any thread starts
    hack::server::DecodeServerConfig config;
    hack::FlagSet flags("hack-decode", "Decode node: KV in over UCX, tokens out over HTTP/SSE.", "HACK_DECODE");
    hack::server::add_decode_flags(flags, config);
    if (!flags.parse(argc, argv)) return 0;
    hack::setup_logging(config.log_level, config.json_logs);
    hack::server::DecodeServer server(config);
    std::printf("hack-decode ready: http %d ucx %s\n", server.port(), server.ucx_address().c_str());
    std::fflush(stdout);
    signal.wait();
    server.drain(config.drain_timeout_s);  // SIGTERM: finish what runs, take nothing new
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hack-decode: error: %s\n", e.what());
    return 1;
  }
}
