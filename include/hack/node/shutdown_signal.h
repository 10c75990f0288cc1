/// @file shutdown_signal.h
/// @brief How a daemon waits for SIGINT/SIGTERM: block them in every thread (construct this
/// first in main(), before any thread starts) and wait for one with sigwait. SIGPIPE is
/// ignored so a client that vanishes mid-write is an I/O error, not a dead process.
#pragma once

#include <csignal>

namespace hack::server {

class ShutdownSignal {
 public:
  ShutdownSignal();
  /// Blocks until SIGINT or SIGTERM arrives; returns the signal number.
  int wait() const;

 private:
  sigset_t set_{};
};

}  // namespace hack::server
