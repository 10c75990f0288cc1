/// @file page_pool.h
/// @brief Page ids with reference counts (shared prefixes), host memory for pages addressed by
/// those ids, and the byte budget a KV cache admits sequences against.
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

/// Ids of one kind of page with their reference counts: who holds a page, and when it is
/// free again. No memory: a storage maps ids to its own pages (PagePool on the host, a device
/// pool on a GPU), so the bookkeeping is the same on every device (DESIGN.md §2). A freed id
/// is handed out again before a new one (last freed first); new ids count up from 0.
/// Thread-safe.
class PageIds {
 public:
  /// capacity 0: ids without bound (a pool that grows); otherwise ids [0, capacity) (a
  /// pre-allocated pool).
  explicit PageIds(uint32_t capacity = 0) : capacity_(capacity) {}
  /// An id with reference count 1. Throws hack::Error when every id of a bounded space is held.
  uint32_t allocate();
  /// One more owner of a held id.
  void retain(uint32_t id);
  /// One owner fewer; returns true when the id is free now. Throws hack::Error for a free id.
  bool release(uint32_t id);
  /// 0 for a free or never allocated id.
  int ref_count(uint32_t id) const;
  /// True when no id in [first, first + count) is held.
  bool none_held(uint32_t first, uint32_t count) const;
  size_t in_use() const;
  /// Ids allocate() can still hand out (a bounded space).
  size_t available() const { return capacity_ - in_use(); }

 private:
  uint32_t capacity_;
  mutable std::mutex mutex_;
  std::vector<int> refs_;       // [id]
  std::vector<uint32_t> free_;  // ids (a stack)
  size_t in_use_ = 0;
};

/// Host memory for pages of one size, addressed by the ids of a PageIds (its own, or one a
/// KvBlockManager keeps): slabs that are never moved or unmapped while the pool lives, so a
/// page's address stays valid while its id is held. Thread-safe.
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
  /// `ids` = nullptr: the pool keeps its own ids; otherwise it maps those (which must outlive it).
  explicit PagePool(size_t page_bytes, size_t pages_per_slab = 0, PageIds* ids = nullptr);
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  /// A page with reference count 1 (contents undefined).
  PageRef allocate();
  /// One more owner.
  void retain(PageRef page);
  /// One owner fewer; the page is free again at 0.
  void release(PageRef page);
  int ref_count(PageRef page) const;
  /// The memory of a held id (allocated from ids()): makes its slab on first use.
  std::byte* map(uint32_t id);
  /// The address of an id map() has made room for; no lock (slab addresses never change).
  std::byte* data(uint32_t id) const {
    return slab_base_[id / pages_per_slab_] + static_cast<size_t>(id % pages_per_slab_) * page_bytes_;
  }
  const PageIds& ids() const { return *ids_; }

  size_t page_bytes() const { return page_bytes_; }
  size_t pages_in_use() const { return ids_->in_use(); }
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
  std::unique_ptr<PageIds> own_ids_;
  PageIds* ids_;
  mutable std::mutex mutex_;
  std::vector<Slab> slabs_;
  // [slab] → its first page; reserved once (kMaxSlabs) so that data() may read it while
  // map() appends, without a lock.
  std::vector<std::byte*> slab_base_;
  std::vector<uint8_t> slab_released_; // [slab]: 1 = memory given back, no page mapped since
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
