// Segment files of the vault's block store (layout in include/hack/vault/block_store.h).
#include "segment_log.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <system_error>
#include <vector>

#include "hack/core/error.h"

namespace hack::vault {

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

void FileDescriptor::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

// The fixed part of a record, as decoded from its first kRecordHeaderBytes.
struct RecordHeader {
  RecordKind kind = RecordKind::block;
  uint8_t flags = 0;  // bit 0: first block of its chain
  uint8_t codec = 0;
  uint16_t namespace_bytes = 0;
  uint64_t value_bytes = 0;
  uint64_t checksum = 0;
  BlockKey key{};
  BlockKey parent{};
};

// Byte offsets inside the header (see block_store.h).
constexpr size_t kOffMagic = 0, kOffVersion = 4, kOffKind = 6, kOffFlags = 7, kOffCodec = 8,
                 kOffNamespaceBytes = 12, kOffValueBytes = 16, kOffChecksum = 24, kOffKey = 32,
                 kOffParent = 64, kOffHeaderCrc = 96;
static_assert(kOffHeaderCrc + 4 == kRecordHeaderBytes);
constexpr uint8_t kFlagFirst = 1;

using HeaderBytes = std::array<uint8_t, kRecordHeaderBytes>;

void store_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t load_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t size) {
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), size));
}

HeaderBytes encode_header(const RecordHeader& h) {
  HeaderBytes b{};
  store_le(b.data() + kOffMagic, kRecordMagic, 4);
  store_le(b.data() + kOffVersion, kRecordVersion, 2);
  b[kOffKind] = static_cast<uint8_t>(h.kind);
  b[kOffFlags] = h.flags;
  b[kOffCodec] = h.codec;
  store_le(b.data() + kOffNamespaceBytes, h.namespace_bytes, 2);
  store_le(b.data() + kOffValueBytes, h.value_bytes, 8);
  store_le(b.data() + kOffChecksum, h.checksum, 8);
  std::memcpy(b.data() + kOffKey, h.key.data(), 32);
  std::memcpy(b.data() + kOffParent, h.parent.data(), 32);
  store_le(b.data() + kOffHeaderCrc, crc32_update(0, b.data(), kOffHeaderCrc), 4);
  return b;
}

// The header at `b`, or nothing when it is not one this version wrote (magic, version, kind,
// flags, header CRC, a tombstone without value, a non-empty namespace).
std::optional<RecordHeader> decode_header(const uint8_t* b) {
  if (load_le(b + kOffMagic, 4) != kRecordMagic || load_le(b + kOffVersion, 2) != kRecordVersion) return {};
  if (load_le(b + kOffHeaderCrc, 4) != crc32_update(0, b, kOffHeaderCrc)) return {};
  RecordHeader h;
  const uint8_t kind = b[kOffKind];
  if (kind != static_cast<uint8_t>(RecordKind::block) && kind != static_cast<uint8_t>(RecordKind::tombstone))
    return {};
  h.kind = static_cast<RecordKind>(kind);
  h.flags = b[kOffFlags];
  h.codec = b[kOffCodec];
  h.namespace_bytes = static_cast<uint16_t>(load_le(b + kOffNamespaceBytes, 2));
  h.value_bytes = load_le(b + kOffValueBytes, 8);
  h.checksum = load_le(b + kOffChecksum, 8);
  std::memcpy(h.key.data(), b + kOffKey, 32);
  std::memcpy(h.parent.data(), b + kOffParent, 32);
  if ((h.flags & ~kFlagFirst) != 0 || h.namespace_bytes == 0) return {};
  if (h.kind == RecordKind::tombstone && h.value_bytes != 0) return {};
  return h;
}

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, uint64_t offset, const void* data, size_t size, const std::filesystem::path& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    HACK_CHECK(n > 0, "cannot write {} at offset {}: {}", path.string(), offset, n < 0 ? errno_text() : "no progress");
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

// Reads exactly `size` bytes at `offset`; false when the file ends first.
bool read_exact(int fd, uint64_t offset, void* data, size_t size, const std::filesystem::path& path) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    HACK_CHECK(n >= 0, "cannot read {} at offset {}: {}", path.string(), offset, errno_text());
    if (n == 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

// Writes one record at `offset` of `fd`; returns its size.
uint64_t write_record(int fd, uint64_t offset, RecordKind kind, const Block& block, const std::filesystem::path& path) {
  RecordHeader h;
  h.kind = kind;
  h.namespace_bytes = static_cast<uint16_t>(block.name_space.size());
  h.key = block.key;
  if (kind == RecordKind::block) {
    h.flags = block.first ? kFlagFirst : 0;
    h.codec = block.codec;
    h.value_bytes = block.value.size();
    h.checksum = block.checksum;
    h.parent = block.parent;
  }
  const HeaderBytes header = encode_header(h);
  std::vector<uint8_t> head(header.begin(), header.end());
  head.insert(head.end(), block.name_space.begin(), block.name_space.end());
  uint32_t crc = crc32_update(0, head.data(), head.size());
  const size_t value_bytes = kind == RecordKind::block ? block.value.size() : 0;
  crc = crc32_update(crc, block.value.data(), value_bytes);
  uint8_t trailer[kRecordTrailerBytes];
  store_le(trailer, crc, 4);

  write_all(fd, offset, head.data(), head.size(), path);
  write_all(fd, offset + head.size(), block.value.data(), value_bytes, path);
  write_all(fd, offset + head.size() + value_bytes, trailer, sizeof trailer, path);
  return record_bytes(block.name_space.size(), value_bytes);
}

// "segment-<16 lower-case hex digits>.hkv" -> the number.
std::optional<uint64_t> parse_segment_name(const std::string& name) {
  constexpr std::string_view kPrefix = "segment-", kSuffix = ".hkv";
  if (name.size() != kPrefix.size() + 16 + kSuffix.size() || !name.starts_with(kPrefix) || !name.ends_with(kSuffix))
    return {};
  const char* digits = name.data() + kPrefix.size();
  if (!std::all_of(digits, digits + 16, [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }))
    return {};
  uint64_t number = 0;
  std::from_chars(digits, digits + 16, number, 16);
  return number;
}

// The next offset in [from, size) where a valid header starts (after a damaged one).
std::optional<uint64_t> find_next_header(int fd, uint64_t from, uint64_t size, const std::filesystem::path& path) {
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<uint8_t> window(kChunk + kRecordHeaderBytes);
  for (uint64_t start = from; start + kRecordHeaderBytes <= size; start += kChunk) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(window.size(), size - start));
    if (!read_exact(fd, start, window.data(), n, path)) return {};
    for (size_t i = 0; i < kChunk && i + kRecordHeaderBytes <= n; ++i) {
      if (window[i] == 'H' && load_le(window.data() + i, 4) == kRecordMagic && decode_header(window.data() + i))
        return start + i;
    }
  }
  return {};
}

}  // namespace

SegmentLog::SegmentLog(std::filesystem::path dir, uint64_t segment_bytes, bool sync_every_record)
    : dir_(std::move(dir)), segment_bytes_(segment_bytes), sync_every_record_(sync_every_record) {
  std::error_code error;
  std::filesystem::create_directories(dir_, error);
  HACK_CHECK(!error, "vault data dir {}: cannot create it: {}", dir_.string(), error.message());
  HACK_CHECK(std::filesystem::is_directory(dir_), "vault data dir {} is not a directory", dir_.string());
  const std::filesystem::path lock_path = dir_ / "LOCK";
  lock_fd_ = FileDescriptor(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  HACK_CHECK(lock_fd_.valid(), "cannot open {}: {}", lock_path.string(), errno_text());
  if (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    HACK_CHECK(errno != EWOULDBLOCK, "vault data dir {} is in use by another block store (lock {} held)",
               dir_.string(), lock_path.string());
    fail("cannot lock {}: {}", lock_path.string(), errno_text());
  }
}

std::filesystem::path SegmentLog::segment_path(uint64_t number) const {
  return dir_ / fmt::format("segment-{:016x}.hkv", number);
}

void SegmentLog::sync_dir() const {
  FileDescriptor fd(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  HACK_CHECK(fd.valid(), "cannot open directory {}: {}", dir_.string(), errno_text());
  HACK_CHECK(::fsync(fd.get()) == 0, "cannot sync directory {}: {}", dir_.string(), errno_text());
}

void SegmentLog::replay(const std::function<void(LogRecord&&)>& apply, RecoveryStats& stats) {
  std::error_code error;
  std::vector<uint64_t> numbers;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, error)) {
    if (!entry.is_regular_file()) continue;
    if (const auto number = parse_segment_name(entry.path().filename().string())) numbers.push_back(*number);
  }
  HACK_CHECK(!error, "cannot list vault data dir {}: {}", dir_.string(), error.message());
  std::sort(numbers.begin(), numbers.end());
  for (const uint64_t number : numbers) replay_segment(number, apply, stats);
  stats.segments = numbers.size();
}

void SegmentLog::replay_segment(uint64_t number, const std::function<void(LogRecord&&)>& apply, RecoveryStats& stats) {
  const std::filesystem::path path = segment_path(number);
  FileDescriptor fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  HACK_CHECK(fd.valid(), "cannot open {}: {}", path.string(), errno_text());
  struct stat st {};
  HACK_CHECK(::fstat(fd.get(), &st) == 0, "cannot stat {}: {}", path.string(), errno_text());
  uint64_t size = static_cast<uint64_t>(st.st_size);

  auto truncate_at = [&](uint64_t end) {
    ++stats.torn_records;
    spdlog::warn("vault: {}: torn record at offset {}, cutting the file from {} to {} bytes", path.string(), end, size,
                 end);
    HACK_CHECK(::ftruncate(fd.get(), static_cast<off_t>(end)) == 0, "cannot truncate {} to {} bytes: {}",
               path.string(), end, errno_text());
    HACK_CHECK(::fsync(fd.get()) == 0, "cannot sync {}: {}", path.string(), errno_text());
    size = end;
  };

  HeaderBytes header_bytes;
  uint64_t pos = 0;
  while (pos < size) {
    std::optional<RecordHeader> header;
    if (size - pos >= kRecordHeaderBytes && read_exact(fd.get(), pos, header_bytes.data(), kRecordHeaderBytes, path))
      header = decode_header(header_bytes.data());
    if (!header) {
      // A damaged header: its length cannot be trusted, so resume at the next valid one.
      // With none left, the rest is a torn write.
      if (const auto next = find_next_header(fd.get(), pos + 1, size, path)) {
        ++stats.corrupt_records;
        spdlog::warn("vault: {}: damaged record header at offset {}, skipped to {}", path.string(), pos, *next);
        pos = *next;
        continue;
      }
      truncate_at(pos);
      break;
    }
    const uint64_t bytes = record_bytes(header->namespace_bytes, header->value_bytes);
    if (header->value_bytes > size || bytes > size - pos) {
      truncate_at(pos);
      break;
    }
    LogRecord record;
    record.kind = header->kind;
    record.bytes = bytes;
    Block& block = record.block;
    block.name_space.resize(header->namespace_bytes);
    block.value.resize(header->value_bytes);
    uint8_t trailer[kRecordTrailerBytes];
    uint64_t at = pos + kRecordHeaderBytes;
    bool whole = read_exact(fd.get(), at, block.name_space.data(), block.name_space.size(), path);
    at += block.name_space.size();
    whole = whole && read_exact(fd.get(), at, block.value.data(), block.value.size(), path);
    at += block.value.size();
    whole = whole && read_exact(fd.get(), at, trailer, sizeof trailer, path);
    if (!whole) {  // the file shrank under us
      truncate_at(pos);
      break;
    }
    uint32_t crc = crc32_update(0, header_bytes.data(), header_bytes.size());
    crc = crc32_update(crc, block.name_space.data(), block.name_space.size());
    crc = crc32_update(crc, block.value.data(), block.value.size());
    pos += bytes;
    if (crc != load_le(trailer, 4)) {
      ++stats.corrupt_records;
      spdlog::warn("vault: {}: record at offset {} fails its CRC, skipped", path.string(), pos - bytes);
      continue;
    }
    ++stats.records;
    block.key = header->key;
    if (record.kind == RecordKind::block) {
      block.parent = header->parent;
      block.first = (header->flags & kFlagFirst) != 0;
      block.codec = header->codec;
      block.checksum = header->checksum;
    }
    apply(std::move(record));
  }
  segments_[number] = size;
  disk_bytes_ += size;
}

void SegmentLog::open_active_for_append() {
  if (active_fd_.valid() && segments_.at(active_number_) < segment_bytes_) return;
  if (!active_fd_.valid() && !segments_.empty() && segments_.rbegin()->second < segment_bytes_) {
    active_number_ = segments_.rbegin()->first;
    const std::filesystem::path path = segment_path(active_number_);
    active_fd_ = FileDescriptor(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    HACK_CHECK(active_fd_.valid(), "cannot open {}: {}", path.string(), errno_text());
    return;
  }
  const uint64_t number = segments_.empty() ? 1 : segments_.rbegin()->first + 1;
  const std::filesystem::path path = segment_path(number);
  FileDescriptor fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  HACK_CHECK(fd.valid(), "cannot create {}: {}", path.string(), errno_text());
  active_fd_ = std::move(fd);
  active_number_ = number;
  segments_[number] = 0;
  if (sync_every_record_) sync_dir();
}

uint64_t SegmentLog::append(RecordKind kind, const Block& block) {
  open_active_for_append();
  uint64_t& size = segments_.at(active_number_);
  const std::filesystem::path path = segment_path(active_number_);
  uint64_t bytes = 0;
  try {
    bytes = write_record(active_fd_.get(), size, kind, block, path);
    if (sync_every_record_)
      HACK_CHECK(::fdatasync(active_fd_.get()) == 0, "cannot sync {}: {}", path.string(), errno_text());
  } catch (const Error&) {
    if (::ftruncate(active_fd_.get(), static_cast<off_t>(size)) != 0)
      spdlog::error("vault: cannot cut {} back to {} bytes after a failed write: {}", path.string(), size,
                    errno_text());
    throw;
  }
  size += bytes;
  disk_bytes_ += bytes;
  return bytes;
}

uint64_t SegmentLog::append_block(const Block& block) { return append(RecordKind::block, block); }

uint64_t SegmentLog::append_tombstone(const std::string& name_space, const BlockKey& key) {
  Block block;
  block.name_space = name_space;
  block.key = key;
  return append(RecordKind::tombstone, block);
}

void SegmentLog::compact(std::span<const Block* const> live) {
  const uint64_t number = segments_.empty() ? 1 : segments_.rbegin()->first + 1;
  const std::filesystem::path path = segment_path(number);
  FileDescriptor fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  HACK_CHECK(fd.valid(), "cannot create {}: {}", path.string(), errno_text());
  uint64_t size = 0;
  try {
    for (const Block* block : live) size += write_record(fd.get(), size, RecordKind::block, *block, path);
    HACK_CHECK(::fsync(fd.get()) == 0, "cannot sync {}: {}", path.string(), errno_text());
    sync_dir();
  } catch (const Error&) {
    fd.reset();
    ::unlink(path.c_str());
    throw;
  }
  // The new segment is durable: the old ones are garbage from here on.
  active_fd_.reset();
  std::map<uint64_t, uint64_t> kept;
  for (const auto& [old_number, old_size] : segments_) {
    const std::filesystem::path old_path = segment_path(old_number);
    if (::unlink(old_path.c_str()) != 0 && errno != ENOENT) {
      spdlog::warn("vault: cannot delete compacted segment {}: {}", old_path.string(), errno_text());
      kept[old_number] = old_size;
    }
  }
  sync_dir();
  kept[number] = size;
  segments_ = std::move(kept);
  disk_bytes_ = 0;
  for (const auto& [n, s] : segments_) disk_bytes_ += s;
  active_fd_ = std::move(fd);
  active_number_ = number;
}

}  // namespace hack::vault
