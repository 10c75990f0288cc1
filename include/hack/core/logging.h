/// @file logging.h
/// @brief Process-wide spdlog setup: level and plain or JSON-lines output to stderr.
#pragma once

#include <string_view>

namespace hack {

/// level: trace|debug|info|warn|error|off. json: one JSON object per line.
/// Throws hack::Error on an unknown level.
void setup_logging(std::string_view level, bool json = false);

}  // namespace hack
