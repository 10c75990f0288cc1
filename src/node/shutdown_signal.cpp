#include "hack/node/shutdown_signal.h"

#include <pthread.h>

#include "hack/core/error.h"

namespace hack::server {

ShutdownSignal::ShutdownSignal() {
  std::signal(SIGPIPE, SIG_IGN);
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  HACK_CHECK(pthread_sigmask(SIG_BLOCK, &set_, nullptr) == 0, "cannot block SIGINT/SIGTERM");
}

int ShutdownSignal::wait() const {
  int sig = 0;
  while (sigwait(&set_, &sig) != 0) {
  }
  return sig;
}

}  // namespace hack::server
