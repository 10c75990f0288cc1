// The block store's persistence: append-only segment files of self-describing records
// (the layout is documented in include/hack/vault/block_store.h). This file knows bytes,
// files and CRCs; which records are live is the store's business (block_store.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>

#include "hack/vault/block_store.h"

namespace hack::vault {

inline constexpr uint32_t kRecordMagic = 0x52564B48;  // "HKVR" as little-endian bytes
inline constexpr uint16_t kRecordVersion = 1;
inline constexpr size_t kRecordHeaderBytes = 100;     // 96 described bytes + u32 header crc32
inline constexpr size_t kRecordTrailerBytes = 4;      // u32 crc32 of the whole record before it
inline constexpr size_t kMaxNamespaceBytes = 0xFFFF;  // u16 in the header

enum class RecordKind : uint8_t { block = 1, tombstone = 2 };

/// Bytes of one record on disk.
constexpr uint64_t record_bytes(size_t namespace_bytes, size_t value_bytes) {
  return kRecordHeaderBytes + namespace_bytes + value_bytes + kRecordTrailerBytes;
}

/// A file descriptor, closed on destruction.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() { reset(); }
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

/// One whole record read back: a block (every field of Block) or a tombstone (name_space and
/// key only).
struct LogRecord {
  RecordKind kind = RecordKind::block;
  Block block;
  uint64_t bytes = 0;  ///< the record's size on disk
};

/// The segment files of one data directory, which it holds locked (flock) while open.
/// Not thread-safe: the store calls it under its mutex.
class SegmentLog {
 public:
  /// Creates `dir` if needed and locks it; throws hack::Error naming the path.
  SegmentLog(std::filesystem::path dir, uint64_t segment_bytes, bool sync_every_record);

  /// Reads every segment in number order and hands each whole, CRC-clean record to `apply`.
  /// A segment's torn tail is cut off (the file truncated to its last whole record), a
  /// record whose CRC fails is skipped; both are counted in `stats`. Appends go after this.
  void replay(const std::function<void(LogRecord&&)>& apply, RecoveryStats& stats);

  /// Appends a record; returns its size on disk. Rolls to a new segment once the current one
  /// has reached segment_bytes. On a failed write the segment is cut back and hack::Error
  /// thrown, so no partial record stays behind.
  uint64_t append_block(const Block& block);
  uint64_t append_tombstone(const std::string& name_space, const BlockKey& key);

  /// Writes `live` (parents before children) into a fresh segment numbered after every
  /// existing one, syncs it and the directory, then deletes the older segments. A crash
  /// before the deletes leaves old and new segments, which replay to the same blocks.
  void compact(std::span<const Block* const> live);

  uint64_t disk_bytes() const { return disk_bytes_; }
  uint64_t segment_files() const { return segments_.size(); }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path segment_path(uint64_t number) const;
  void replay_segment(uint64_t number, const std::function<void(LogRecord&&)>& apply, RecoveryStats& stats);
  void open_active_for_append();
  uint64_t append(RecordKind kind, const Block& block);
  void sync_dir() const;

  std::filesystem::path dir_;
  uint64_t segment_bytes_;
  bool sync_every_record_;
  FileDescriptor lock_fd_;
  std::map<uint64_t, uint64_t> segments_;  // number -> size in bytes
  uint64_t disk_bytes_ = 0;
  FileDescriptor active_fd_;               // the highest-numbered segment, once appended to
  uint64_t active_number_ = 0;
};

}  // namespace hack::vault
