#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <spdlog/spdlog.h>

int main(int argc, char* argv[]) {
  // spdlog builds its registry (default logger, sink, pattern formatter) on its first use.
  // Done here, before any test starts a thread, so no two threads race into it: libspdlog is
  // not instrumented, and TSan saw a UCX progress thread's first log line build the formatter
  // while another thread wrote through it (CI, tsan stage, unit_prefill).
  spdlog::default_logger_raw();
  return Catch::Session().run(argc, argv);
}
