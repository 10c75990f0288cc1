/// @file huge_pages.h
/// @brief Anonymous memory aligned to 2 MiB and advised for transparent huge pages (RAII).
#pragma once

#include <cstddef>

namespace hack {

/// A private anonymous mapping, 2 MiB aligned, its size rounded up to whole 2 MiB, advised
/// MADV_HUGEPAGE. Where THP is "always" or "madvise" the kernel backs it with 2 MiB pages
/// (compacting if needed, as the advice asks); where THP is "never" it is plain small pages.
/// Large arrays read in long streams (weights, KV page slabs) then cost a TLB entry per
/// 2 MiB instead of per 4 KiB.
class HugePageMapping {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;

  /// Throws hack::Error naming `what` when the mapping fails. populate: fault every page in
  /// now (Linux ≥ 5.14; elsewhere on first touch).
  HugePageMapping(size_t bytes, const char* what, bool populate);
  ~HugePageMapping();
  HugePageMapping(const HugePageMapping&) = delete;
  HugePageMapping& operator=(const HugePageMapping&) = delete;

  std::byte* data() const { return data_; }

 private:
  size_t bytes_;
  std::byte* data_ = nullptr;
};

}  // namespace hack
