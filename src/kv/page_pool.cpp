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
constexpr size_t kMaxSlabs = size_t{1} << 18;  // 1 TiB of 4 MiB slabs
}  // namespace

void PagePool::AlignedFree::operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{kPageAlign}); }

uint32_t PageIds::allocate() {
  std::lock_guard<std::mutex> lock(mutex_);
  uint32_t id;
  if (free_.empty()) {
    HACK_CHECK(capacity_ == 0 || refs_.size() < capacity_, "page ids: all {} pages are held", capacity_);
    // Room for many ids at once, in both lists, so that steps between growths allocate nothing.
    if (refs_.size() == refs_.capacity()) {
      const size_t room = std::max<size_t>(1024, 2 * refs_.capacity());
      refs_.reserve(room);
      free_.reserve(room);
    }
    id = static_cast<uint32_t>(refs_.size());
    refs_.push_back(0);
  } else {
    id = free_.back();
    free_.pop_back();
  }
  refs_[id] = 1;
  ++in_use_;
  return id;
}

void PageIds::retain(uint32_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  HACK_CHECK(id < refs_.size() && refs_[id] > 0, "page ids: retain of a free page {}", id);
  ++refs_[id];
}

bool PageIds::release(uint32_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  HACK_CHECK(id < refs_.size() && refs_[id] > 0, "page ids: release of a free page {}", id);
  if (--refs_[id] > 0) return false;
  free_.push_back(id);
  --in_use_;
  return true;
}

int PageIds::ref_count(uint32_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return id < refs_.size() ? refs_[id] : 0;
}

bool PageIds::none_held(uint32_t first, uint32_t count) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t id = first; id < std::min<size_t>(refs_.size(), size_t{first} + count); ++id)
    if (refs_[id] > 0) return false;
  return true;
}

size_t PageIds::in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_;
}

PagePool::PagePool(size_t page_bytes, size_t pages_per_slab, PageIds* ids)
    : page_bytes_((page_bytes + kPageAlign - 1) / kPageAlign * kPageAlign),
      pages_per_slab_(pages_per_slab > 0 ? pages_per_slab : std::max<size_t>(1, kSlabTargetBytes / std::max<size_t>(1, page_bytes))),
      own_ids_(ids == nullptr ? std::make_unique<PageIds>() : nullptr),
      ids_(ids == nullptr ? own_ids_.get() : ids) {
  HACK_CHECK(page_bytes > 0, "PagePool: page size must be positive");
  slab_base_.reserve(kMaxSlabs);
}

std::byte* PagePool::map(uint32_t id) {
  const size_t slab = id / pages_per_slab_;
  std::lock_guard<std::mutex> lock(mutex_);
  HACK_CHECK(slab < kMaxSlabs, "PagePool: page {} lies past the pool's {} slabs of {} pages", id, kMaxSlabs,
             pages_per_slab_);
  while (slabs_.size() <= slab) {
    const size_t bytes = page_bytes_ * pages_per_slab_;
    Slab s;
    if (bytes >= HugePageMapping::kHugePage) s.mapped = std::make_unique<HugePageMapping>(bytes, "KV pages", false);
    else s.heap.reset(static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{kPageAlign})));
    slab_base_.push_back(s.data());  // within the reserved capacity: data() readers see no move
    slabs_.push_back(std::move(s));
    slab_released_.push_back(0);
  }
  slab_released_[slab] = 0;
  return data(id);
}

PageRef PagePool::allocate() {
  const uint32_t id = ids_->allocate();
  try {
    return {map(id), id};
  } catch (...) {
    ids_->release(id);
    throw;
  }
}

void PagePool::retain(PageRef page) { ids_->retain(page.id); }

void PagePool::release(PageRef page) {
  if (page) ids_->release(page.id);
}

int PagePool::ref_count(PageRef page) const { return ids_->ref_count(page.id); }

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
    if (!ids_->none_held(static_cast<uint32_t>(s * pages_per_slab_), static_cast<uint32_t>(pages_per_slab_))) continue;
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
