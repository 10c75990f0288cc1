#include "hack/kv/page_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <new>

#include "hack/core/error.h"

namespace hack {

namespace {
constexpr size_t kPageAlign = 64;
constexpr size_t kSlabTargetBytes = size_t{4} << 20;
}  // namespace

void PagePool::AlignedFree::operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{kPageAlign}); }

PagePool::PagePool(size_t page_bytes, size_t pages_per_slab)
    : page_bytes_((page_bytes + kPageAlign - 1) / kPageAlign * kPageAlign),
      pages_per_slab_(pages_per_slab > 0 ? pages_per_slab : std::max<size_t>(1, kSlabTargetBytes / std::max<size_t>(1, page_bytes))) {
  HACK_CHECK(page_bytes > 0, "PagePool: page size must be positive");
}

PageRef PagePool::allocate() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.empty()) {
    const size_t bytes = page_bytes_ * pages_per_slab_;
    Slab slab;
    if (bytes >= HugePageMapping::kHugePage) slab.mapped = std::make_unique<HugePageMapping>(bytes, "KV pages", false);
    else slab.heap.reset(static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{kPageAlign})));
    const uint32_t first = static_cast<uint32_t>(page_data_.size());
    for (size_t i = 0; i < pages_per_slab_; ++i) {
      page_data_.push_back(slab.data() + i * page_bytes_);
      refs_.push_back(0);
    }
    // Hand out the slab's pages in address order.
    for (size_t i = pages_per_slab_; i-- > 0;) free_.push_back(first + static_cast<uint32_t>(i));
    slabs_.push_back(std::move(slab));
    slab_released_.push_back(0);
  }
  const uint32_t id = free_.back();
  free_.pop_back();
  slab_released_[id / pages_per_slab_] = 0;
  refs_[id] = 1;
  ++in_use_;
  return {page_data_[id], id};
}

void PagePool::retain(PageRef page) {
  std::lock_guard<std::mutex> lock(mutex_);
  HACK_CHECK(page.id < refs_.size() && refs_[page.id] > 0, "PagePool: retain of a free page {}", page.id);
  ++refs_[page.id];
}

void PagePool::release(PageRef page) {
  if (!page) return;
  std::lock_guard<std::mutex> lock(mutex_);
  HACK_CHECK(page.id < refs_.size() && refs_[page.id] > 0, "PagePool: release of a free page {}", page.id);
  if (--refs_[page.id] == 0) {
    free_.push_back(page.id);
    --in_use_;
  }
}

int PagePool::ref_count(PageRef page) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return page.id < refs_.size() ? refs_[page.id] : 0;
}

size_t PagePool::pages_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_;
}

size_t PagePool::bytes_reserved() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slabs_.size() * pages_per_slab_ * page_bytes_;
}

size_t PagePool::release_free_slabs() {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t os_page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t slab_bytes = page_bytes_ * pages_per_slab_;
  size_t released = 0;
  for (size_t s = 0; s < slabs_.size(); ++s) {
    if (slab_released_[s]) continue;
    const auto first = refs_.begin() + static_cast<std::ptrdiff_t>(s * pages_per_slab_);
    if (std::any_of(first, first + static_cast<std::ptrdiff_t>(pages_per_slab_), [](int r) { return r > 0; })) continue;
    // Only whole OS pages inside the slab: the allocator's bookkeeping just before it stays.
    const auto begin = reinterpret_cast<uintptr_t>(slabs_[s].data());
    const uintptr_t from = (begin + os_page - 1) / os_page * os_page;
    const uintptr_t to = (begin + slab_bytes) / os_page * os_page;
    if (to > from && ::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED) == 0) released += to - from;
    slab_released_[s] = 1;
  }
  return released;
}

bool MemoryBudget::try_reserve(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capacity_ != 0 && reserved_ + bytes > capacity_) return false;
  reserved_ += bytes;
  return true;
}

void MemoryBudget::release(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_ -= std::min(bytes, reserved_);
}

size_t MemoryBudget::reserved() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_;
}

}  // namespace hack
