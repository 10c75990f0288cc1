#include "hack/core/huge_pages.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "hack/core/error.h"

namespace hack {

HugePageMapping::HugePageMapping(size_t bytes, const char* what, bool populate)
    : bytes_((bytes + kHugePage - 1) / kHugePage * kHugePage) {
  // Over-map by one huge page so the start can be aligned; the slack is unmapped again.
  const size_t mapped = bytes_ + kHugePage;
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  HACK_CHECK(p != MAP_FAILED, "cannot map {} bytes for {}: {}", mapped, what, std::strerror(errno));
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) ::munmap(p, aligned - start);
  if (const size_t tail = start + mapped - (aligned + bytes_); tail > 0)
    ::munmap(reinterpret_cast<void*>(aligned + bytes_), tail);
  data_ = reinterpret_cast<std::byte*>(aligned);
  // Advice only: where THP is off the memory still works, on small pages.
  (void)::madvise(data_, bytes_, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE
  // On the dev VM first-touch faults of 270 MB of weights took 1.5 s, populating first 50 ms.
  if (populate) (void)::madvise(data_, bytes_, MADV_POPULATE_WRITE);
#else
  (void)populate;
#endif
}

HugePageMapping::~HugePageMapping() { ::munmap(data_, bytes_); }

}  // namespace hack
