// Replaces the global operator new/delete of every Catch2 test binary with counting
// versions, so a test can assert that a path — all its threads — does not allocate. Kept in
// its own file so no caller inlines them.
#include <atomic>
#include <cstdlib>
#include <new>

#include "support/alloc_counter.h"

namespace {
std::atomic<long> g_allocations{0};
}

namespace hack::test {
long process_allocations() { return g_allocations.load(std::memory_order_relaxed); }
}  // namespace hack::test

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
// The nothrow forms too: a sanitizer runtime replaces the ones not defined here with its own,
// whose memory would then reach the free() below (alloc-dealloc mismatch under ASan).
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t& tag) noexcept { return operator new(n, tag); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
