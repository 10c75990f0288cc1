// HttpCancel's registry of calls in progress, for the blocking (http_client.cpp) and the
// coroutine (async_http_client.cpp) client calls.
#pragma once

#include <functional>
#include <mutex>

#include "hack/http/http_client.h"

namespace hack::server::detail {

struct CancelAccess {
  /// Registers `abort` for the call's lifetime; false if already cancelled.
  static bool attach(HttpCancel& c, std::function<void()> abort, uint64_t& id) {
    std::lock_guard lock(c.mu_);
    if (c.cancelled_) return false;
    id = c.next_id_++;
    c.aborts_.emplace(id, std::move(abort));
    return true;
  }
  static void detach(HttpCancel& c, uint64_t id) {
    std::lock_guard lock(c.mu_);
    c.aborts_.erase(id);
  }
};

}  // namespace hack::server::detail
