// Replaces the global operator new/delete of unit_kv with counting versions, so tests can
// assert that a path does not allocate. Kept in its own file so no caller inlines them.
#include <cstdlib>
#include <new>

#include "alloc_counter.h"

namespace {
thread_local long g_allocations = 0;
}

namespace hack::test {
long thread_allocations() { return g_allocations; }
}  // namespace hack::test

void* operator new(std::size_t n) {
  ++g_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
