/// @file thread_pool.h
/// @brief A fixed pool of worker threads for data-parallel kernels. The calling thread
/// takes part as worker 0, so a pool of n threads starts n - 1 OS threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <type_traits>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace hack {

/// A non-owning reference to a callable (like C++26 std::function_ref): what the pool's
/// calls take, so handing work to the pool never allocates (a std::function built from a
/// lambda with more than two captured pointers would). The callable must outlive the call.
template <class Signature>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::decay_t<F>, FunctionRef> && std::is_invocable_r_v<R, const F&, Args...>)
  FunctionRef(const F& f)  // NOLINT(google-explicit-constructor): passed like a lambda
      : object_(&f), call_([](const void* o, Args... args) -> R { return (*static_cast<const F*>(o))(args...); }) {}
  R operator()(Args... args) const { return call_(object_, args...); }

 private:
  const void* object_;
  R (*call_)(const void*, Args...);
};

class ThreadPool {
 public:
  /// n_threads <= 0 picks std::thread::hardware_concurrency().
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  /// Runs fn(thread_index, n_threads) once on every worker and waits for all. An exception
  /// fn throws on any thread is rethrown here once every thread is done (the first one caught
  /// when several throw). Not reentrant: fn must not call run() on the same pool.
  void run(FunctionRef<void(int thread_index, int n_threads)> fn);

  /// Splits [0, n) into contiguous ranges, one per worker, and calls fn(begin, end).
  void parallel_for(size_t n, FunctionRef<void(size_t begin, size_t end)> fn);

  /// Hands out [0, n) in chunks of `grain` on demand (for uneven work).
  void parallel_for_dynamic(size_t n, size_t grain, FunctionRef<void(size_t begin, size_t end)> fn);
  /// Tells idle workers to sleep now instead of spinning for the next job: the caller is
  /// about to hand the cores to other threads (OpenBLAS's, for an sgemm). The next run()
  /// wakes them as usual.
  void park();

 private:
  void worker_loop(int index);

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const FunctionRef<void(int, int)>* job_ = nullptr;
  std::exception_ptr error_;  // the job's first exception (mutex_)
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> parked_{false};  // park(): idle workers sleep instead of spinning
  std::atomic<int> pending_{0};
  bool stopping_ = false;
};

/// [begin, end) of part `index` of `parts` equal splits of [0, n).
inline void split_range(size_t n, int index, int parts, size_t* begin, size_t* end) {
  const size_t per = n / static_cast<size_t>(parts);
  const size_t extra = n % static_cast<size_t>(parts);
  const size_t i = static_cast<size_t>(index);
  *begin = i * per + (i < extra ? i : extra);
  *end = *begin + per + (i < extra ? 1 : 0);
}

}  // namespace hack
