/// @file clock.h
/// @brief Seconds on the monotonic clock, for deadlines and durations (never wall time).
#pragma once

#include <chrono>

namespace hack {

/// Seconds since an arbitrary fixed point of std::chrono::steady_clock.
inline double monotonic_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace hack
