#include <catch2/catch.hpp>

#include <atomic>
#include <numeric>
#include <vector>

#include "hack/core/thread_pool.h"

using namespace hack;

TEST_CASE("parallel_for covers every index exactly once", "[core][thread_pool]") {
  for (int threads : {1, 2, 3, 7}) {
    ThreadPool pool(threads);
    for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{1000}}) {
      std::vector<std::atomic<int>> hits(n);
      for (int rep = 0; rep < 50; ++rep) {
        pool.parallel_for(n, [&](size_t b, size_t e) {
          for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
      }
      for (size_t i = 0; i < n; ++i) REQUIRE(hits[i].load() == 50);
    }
  }
}

TEST_CASE("parallel_for_dynamic sums to the serial result", "[core][thread_pool]") {
  ThreadPool pool(4);
  std::vector<int> v(10007);
  std::iota(v.begin(), v.end(), 0);
  std::atomic<long> sum{0};
  pool.parallel_for_dynamic(v.size(), 64, [&](size_t b, size_t e) {
    long s = 0;
    for (size_t i = b; i < e; ++i) s += v[i];
    sum += s;
  });
  REQUIRE(sum.load() == 10007L * 10006L / 2);
}

TEST_CASE("run gives each worker its own index", "[core][thread_pool]") {
  constexpr int kThreads = 3;
  ThreadPool pool(kThreads);
  // Catch2 v2 assertions are not thread-safe: workers record, the test thread checks.
  std::vector<std::atomic<int>> calls(kThreads), n_seen(kThreads);
  std::atomic<int> out_of_range{0};
  pool.run([&](int i, int n) {
    if (i < 0 || i >= kThreads) {
      ++out_of_range;
      return;
    }
    calls[static_cast<size_t>(i)]++;
    n_seen[static_cast<size_t>(i)] = n;
  });
  REQUIRE(out_of_range.load() == 0);
  for (int i = 0; i < kThreads; ++i) {
    INFO("worker " << i);
    REQUIRE(calls[static_cast<size_t>(i)].load() == 1);
    REQUIRE(n_seen[static_cast<size_t>(i)].load() == kThreads);
  }
}

TEST_CASE("an exception on any thread of run reaches the caller, and the pool keeps working", "[core][thread_pool]") {
  ThreadPool pool(3);
  for (int thrower = 0; thrower < 3; ++thrower) {
    INFO("thread " << thrower << " throws");
    std::atomic<int> ran{0};
    REQUIRE_THROWS_WITH(pool.run([&](int index, int) {
      ran.fetch_add(1);
      if (index == thrower) throw std::runtime_error("boom from a worker");
    }),
                        "boom from a worker");
    REQUIRE(ran.load() == 3);  // every thread ran before the exception was rethrown
  }
  std::atomic<int> ran{0};
  pool.run([&](int, int) { ran.fetch_add(1); });
  REQUIRE(ran.load() == 3);
}
