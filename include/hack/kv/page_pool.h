/// @file page_pool.h
/// @brief Fixed-size page allocator with reference counts (shared prefixes), and the byte
/// budget a KV cache admits sequences against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "hack/core/huge_pages.h"

namespace hack {

/// A page: its bytes (64-byte aligned, stable for the pool's lifetime) and its id.
struct PageRef {
  std::byte* data = nullptr;
  uint32_t id = 0;
  explicit operator bool() const { return data != nullptr; }
};

/// Hands out pages of one size from slabs that are never moved or unmapped while the pool
/// lives, so a PageRef stays valid until released. Thread-safe.
///
/// Memory policy: slabs grow with the most pages ever in use at once and are kept; a slab
/// none of whose pages is in use can give its memory back (release_free_slabs: the OS drops
/// the physical pages, the addresses stay), so a node's RSS follows its KV in use rather than
/// the high-water mark of its busiest moment (decode nodes trim when idle).
class PagePool {
 public:
  /// pages_per_slab = 0 picks slabs of about 4 MiB. Slabs of 2 MiB or more are mapped on
  /// transparent huge pages (HugePageMapping): attention streams pages in an order unrelated
  /// to their addresses, and on 4 KiB pages nearly every page it reads missed the TLB.
  explicit PagePool(size_t page_bytes, size_t pages_per_slab = 0);
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  /// A page with reference count 1 (contents undefined).
  PageRef allocate();
  /// One more owner.
  void retain(PageRef page);
  /// One owner fewer; the page is free again at 0.
  void release(PageRef page);
  int ref_count(PageRef page) const;

  size_t page_bytes() const { return page_bytes_; }
  size_t pages_in_use() const;
  size_t bytes_in_use() const { return pages_in_use() * page_bytes_; }
  /// Bytes taken from the system (in-use and free pages).
  size_t bytes_reserved() const;
  /// Gives the physical memory of every slab with no page in use back to the system
  /// (madvise MADV_DONTNEED; the slab stays mapped, its pages read as zero once touched again).
  /// Returns the bytes given back by this call (slabs already given back count once).
  size_t release_free_slabs();

 private:
  struct AlignedFree {
    void operator()(std::byte* p) const;
  };
  struct Slab {
    std::unique_ptr<HugePageMapping> mapped;        // slabs of ≥ 2 MiB
    std::unique_ptr<std::byte, AlignedFree> heap;  // smaller ones
    std::byte* data() const { return mapped ? mapped->data() : heap.get(); }
  };
  size_t page_bytes_;
  size_t pages_per_slab_;
  mutable std::mutex mutex_;
  std::vector<Slab> slabs_;
  std::vector<std::byte*> page_data_;  // [id]
  std::vector<int> refs_;              // [id]
  std::vector<uint32_t> free_;         // ids
  std::vector<uint8_t> slab_released_; // [slab]: 1 = memory given back, no page allocated since
  size_t in_use_ = 0;
};

/// Bytes a cache may commit; sequences reserve their worst case when admitted so a
/// running sequence never runs out of pages. capacity 0 = unbounded. Thread-safe.
class MemoryBudget {
 public:
  explicit MemoryBudget(size_t capacity_bytes) : capacity_(capacity_bytes) {}
  /// Reserves `bytes` unless that would pass the capacity.
  bool try_reserve(size_t bytes);
  void release(size_t bytes);
  size_t reserved() const;
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  mutable std::mutex mutex_;
  size_t reserved_ = 0;
};

}  // namespace hack
