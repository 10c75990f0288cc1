// hack-vault: a KV block store the prefill and decode nodes restore prefixes from over UCX
// (see hack/vault/vault_server.h).
#include <cstdio>

#include "hack/core/logging.h"
#include "hack/node/shutdown_signal.h"
#include "hack/vault/vault_server.h"

int main(int argc, char** argv) {
  try {
    hack::server::ShutdownSignal signal;  // before any thread starts
    hack::vault::VaultServerConfig config;
    hack::FlagSet flags("hack-vault", "KV block vault: Store / Lookup / BatchPromote over UCX.", "HACK_VAULT");
    hack::vault::add_vault_flags(flags, config);
    if (!flags.parse(argc, argv)) return 0;
    hack::setup_logging(config.log_level, config.json_logs);
    hack::vault::VaultServer server(config);
    std::printf("hack-vault ready: http %d ucx %d\n", server.port(), server.ucx_port());
    std::fflush(stdout);
    signal.wait();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hack-vault: error: %s\n", e.what());
    return 1;
  }
}
