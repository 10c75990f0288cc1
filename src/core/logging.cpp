#include "hack/core/logging.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "hack/core/error.h"

namespace hack {

void setup_logging(std::string_view level, bool json) {
  const spdlog::level::level_enum lvl = spdlog::level::from_str(std::string(level));
  HACK_CHECK(lvl != spdlog::level::off || level == "off", "unknown log level '{}' (trace|debug|info|warn|error|off)",
             level);
  auto logger = spdlog::stderr_logger_mt("hack");
  spdlog::set_default_logger(logger);
  spdlog::set_level(lvl);
  if (json) {
    spdlog::set_pattern(R"({"ts":"%Y-%m-%dT%H:%M:%S.%e","level":"%l","msg":"%v"})");
  } else {
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  }
}

}  // namespace hack
