// Counts the heap allocations of every Catch2 test binary, so a test can assert that a path —
// all its threads — does not allocate. Kept in its own file so no caller inlines it.
//
// Normally the global operator new/delete are replaced with counting versions, every form
// (plain, nothrow, aligned; every delete), so all of a binary's allocations pair with the
// frees below: with some forms left to ASan's runtime, its nothrow new met our delete
// (alloc-dealloc mismatch). TSan's runtime defines every operator new/delete itself (strong
// symbols, linked whole), so there the count comes from its allocation hook instead, which
// also sees malloc.
#include <atomic>
#include <cstdlib>
#include <new>

#include "support/alloc_counter.h"

#if defined(__SANITIZE_THREAD__)
#define HACK_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HACK_TSAN 1
#endif
#endif

#if defined(HACK_TSAN)
#include <sanitizer/allocator_interface.h>
#endif

namespace {
std::atomic<long> g_allocations{0};

#if defined(HACK_TSAN)
void on_malloc(const volatile void*, std::size_t) { g_allocations.fetch_add(1, std::memory_order_relaxed); }
void on_free(const volatile void*) {}
const int g_hooks_installed = __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
#else
void* counted_alloc(std::size_t n) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}

void* counted_aligned_alloc(std::size_t n, std::align_val_t al) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  const auto a = static_cast<std::size_t>(al);
  return std::aligned_alloc(a, (n + a - 1) / a * a + (n == 0 ? a : 0));  // size: a multiple of a, not 0
}
#endif
}  // namespace

namespace hack::test {
long process_allocations() { return g_allocations.load(std::memory_order_relaxed); }
}  // namespace hack::test

#if !defined(HACK_TSAN)
void* operator new(std::size_t n) {
  if (void* p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void* operator new(std::size_t n, std::align_val_t al) {
  if (void* p = counted_aligned_alloc(n, al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t al) { return operator new(n, al); }
void* operator new(std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  return counted_aligned_alloc(n, al);
}
void* operator new[](std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  return counted_aligned_alloc(n, al);
}

void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
#endif
