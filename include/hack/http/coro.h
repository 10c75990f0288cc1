/// @file coro.h
/// @brief Boost.Asio C++20 coroutines for the serving libraries (router → node calls): the
/// one include that makes `asio::awaitable` work with Debian 12's Boost 1.74 on both of our
/// compilers. Include it before any other Boost.Asio header of a translation unit.
///
/// Boost 1.74's awaitable.hpp uses std::exchange without <utility>, and its config only
/// turns coroutines on for clang with libc++; clang with libstdc++ gets them from the
/// BOOST_ASIO_HAS_CO_AWAIT / BOOST_ASIO_HAS_STD_COROUTINE definitions src/CMakeLists.txt
/// passes to clang builds.
#pragma once

#include <coroutine>
#include <utility>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#if !defined(BOOST_ASIO_HAS_CO_AWAIT)
#error "Boost.Asio coroutines are off: build with the definitions src/CMakeLists.txt sets for this compiler"
#endif

namespace hack::server {

namespace asio = boost::asio;
template <class T>
using Task = asio::awaitable<T>;

/// A flag coroutines on one strand wait for: set() wakes every waiter. Not thread-safe:
/// set and wait on the executor (strand) the event was made with.
class CoEvent {
 public:
  explicit CoEvent(const asio::any_io_executor& ex) : timer_(ex, asio::steady_timer::time_point::max()) {}
  bool is_set() const { return set_; }
  void set() {
    set_ = true;
    timer_.cancel();
  }
  /// Until set.
  Task<void> wait() {
    while (!set_) {
      boost::system::error_code ec;
      timer_.expires_at(asio::steady_timer::time_point::max());
      co_await timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
  }
  /// Until set or `deadline`; returns is_set().
  Task<bool> wait_until(asio::steady_timer::time_point deadline) {
    while (!set_ && asio::steady_timer::clock_type::now() < deadline) {
      boost::system::error_code ec;
      timer_.expires_at(deadline);
      co_await timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    co_return set_;
  }

 private:
  asio::steady_timer timer_;
  bool set_ = false;
};

/// Suspends the calling coroutine for `seconds` (no thread sleeps).
inline Task<void> co_sleep(double seconds) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  t.expires_after(std::chrono::duration_cast<asio::steady_timer::duration>(std::chrono::duration<double>(seconds)));
  boost::system::error_code ec;
  co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

}  // namespace hack::server
