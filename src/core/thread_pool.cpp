#include "hack/core/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

namespace hack {

namespace {
// Workers spin this long for a new job before sleeping: decode runs a few hundred short
// jobs per token, and a futex wake-up per job costs more than the job. 20000 bare loads
// (~10 µs) was too short: a 2-thread SmolLM2 decode spent ~12 % of its time in the
// scheduler (futex sleeps and wake-ups between regions) and ran slower than 1 thread.
constexpr std::chrono::microseconds kSpinTime{500};
constexpr int kSpinIterations = 20000;  // run()'s wait for the workers (it also ends in a wait)

// After this long a spinning worker yields between checks, so that on an oversubscribed
// machine (CI, many daemons on 2 cores) it hands its core to whoever can run.
constexpr std::chrono::microseconds kBusySpinTime{50};

// Spins (with PAUSE, kind to a sibling hyper-thread) until done() or kSpinTime has passed.
template <class Done>
bool spin_until(const Done& done) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      _mm_pause();
    }
    const auto spent = std::chrono::steady_clock::now() - start;
    if (spent >= kSpinTime) return done();
    if (spent >= kBusySpinTime) std::this_thread::yield();
  }
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  n_threads_ = n_threads > 0 ? n_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run(FunctionRef<void(int, int)> fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    parked_.store(false, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  try {
    fn(0, n_threads_);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::current_exception();
  }
  for (int spin = 0; spin < kSpinIterations && pending_.load(std::memory_order_acquire) != 0; ++spin) {
  }
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  job_ = nullptr;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error = std::exchange(error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const auto next_job = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!spin_until([&] { return next_job() || parked_.load(std::memory_order_relaxed); }) || !next_job()) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, next_job);
    }
    const FunctionRef<void(int, int)>* job;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      seen = generation_.load(std::memory_order_acquire);
      job = job_;
    }
    try {
      (*job)(index, n_threads_);
    } catch (...) {  // handed to run()'s caller
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_.notify_one();
    }
  }
}

void ThreadPool::park() { parked_.store(true, std::memory_order_relaxed); }

void ThreadPool::parallel_for(size_t n, FunctionRef<void(size_t, size_t)> fn) {
  if (n == 0) return;
  const int parts = static_cast<int>(std::min<size_t>(n, static_cast<size_t>(n_threads_)));
  if (parts == 1) {
    fn(0, n);
    return;
  }
  run([&](int index, int) {
    if (index >= parts) return;
    size_t begin, end;
    split_range(n, index, parts, &begin, &end);
    fn(begin, end);
  });
}

void ThreadPool::parallel_for_dynamic(size_t n, size_t grain, FunctionRef<void(size_t, size_t)> fn) {
  if (n == 0) return;
  grain = std::max<size_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  std::atomic<size_t> next{0};
  run([&](int, int) {
    for (;;) {
      const size_t begin = next.fetch_add(grain, std::memory_order_relaxed);
      if (begin >= n) return;
      fn(begin, std::min(n, begin + grain));
    }
  });
}

}  // namespace hack
