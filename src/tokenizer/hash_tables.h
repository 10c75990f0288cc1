// Open-addressing hash tables for the BPE hot path: token string -> id and packed
// (left id, right id) -> merge. Built once at load, read-only (thread-safe) afterwards.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace hack::tok {

/// 64-bit hash of a byte string (8 bytes per step, then a final avalanche).
inline uint64_t hash_bytes(std::string_view s) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = 0x243F6A8885A308D3ull ^ (s.size() * kMul);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * kMul;
  }
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return h;
}

inline uint64_t hash_u64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

/// string_view -> int; the views must outlive the table (they point into the vocab).
class StringIdMap {
 public:
  void build(const std::vector<std::pair<std::string_view, int>>& entries) {
    size_t cap = 16;
    while (cap < entries.size() * 2) cap <<= 1;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    for (const auto& [key, id] : entries) insert(key, id);
  }

  /// The id of `key`, or -1.
  int find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.hash == h && s.key == key) return s.id;
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    std::string_view key;
    int id = -1;
  };
  void insert(std::string_view key, int id) {
    const uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id < 0 || (s.hash == h && s.key == key)) {
        s = Slot{h, key, id};
        return;
      }
    }
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

/// One BPE merge: its priority (lower merges first) and the id of the merged token.
struct Merge {
  int rank;
  int new_id;
};

/// (left id, right id) -> Merge. A later insert of the same pair replaces the earlier one,
/// like collecting HF's merge list into a HashMap.
class PairMergeMap {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
  }
  void insert(int left, int right, Merge m) {
    const uint64_t key = pack(left, right);
    for (size_t i = hash_u64(key) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.merge.rank < 0 || s.key == key) {
        s.key = key;
        s.merge = m;
        return;
      }
    }
  }
  /// The merge of (left, right), or null.
  const Merge* find(int left, int right) const {
    const uint64_t key = pack(left, right);
    for (size_t i = hash_u64(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.merge.rank < 0) return nullptr;
      if (s.key == key) return &s.merge;
    }
  }

 private:
  static uint64_t pack(int left, int right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  struct Slot {
    uint64_t key = 0;
    Merge merge{-1, -1};
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

}  // namespace hack::tok
