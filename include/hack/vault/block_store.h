/// @file block_store.h
/// @brief The vault's block store (DESIGN.md §3.3): immutable KV blocks under chained prefix
/// keys (kv/block_key.h), per namespace, in memory under a byte budget, optionally persisted
/// to append-only segment files. No networking here: the vault server (vault_server.h) and
/// a prefill node's local prefix cache both use it.
///
/// Invariants:
///   - Prefix-closed: a block is visible only when its parent is visible (or it is the first
///     block of its chain). A block whose parent has not arrived yet is staged, invisible,
///     and dropped after orphan_timeout_s (an abandoned store leaves nothing).
///   - Complete: a block becomes visible whole (its checksum verified first) or not at all.
///   - Eviction takes chain tails first: only leaves (blocks with no visible child) are
///     evicted, least recently used first, so what remains stays prefix-closed.
///   - Every read (promote) re-verifies the block's checksum; a block that fails is removed
///     with all its descendants and the read stops there (a chain with a hole is useless).
///   - Namespaces are isolated: a (namespace, key) pair names a block, so the same key in two
///     namespaces is two blocks, and no call ever returns a block of another namespace.
///
/// Thread-safe (one mutex; put() and promote() hash values outside it); blocks are
/// shared_ptr<const>, so a reader keeps a promoted block alive while it is sent even if the
/// store evicts it meanwhile (memory_pinned_bytes counts those). With data_dir set, a call
/// that writes records (put, promote finding corruption, remove) throws hack::Error naming
/// the file when a write fails; the block concerned is then left as it was (not stored, or
/// not removed).
///
/// Segment files (data_dir set): <data_dir>/segment-<16 lower-case hex digits>.hkv, numbered
/// from 1, append-only; <data_dir>/LOCK is flock'ed so one store at a time uses the directory.
/// A segment is a bare sequence of records (no file header). Record layout (version 1),
/// little-endian, 104 + namespace bytes + value bytes in all:
///   offset  0  u32 magic 0x52564B48 (the bytes "HKVR")
///           4  u16 version (1)
///           6  u8  kind (1 block, 2 tombstone)
///           7  u8  flags (bit 0: first block of its chain; other bits 0)
///           8  u8  codec (Block::codec)
///           9  u8  reserved[3] (0)
///          12  u16 namespace bytes (1..65535)
///          14  u16 reserved (0)
///          16  u64 value bytes (tombstone: 0)
///          24  u64 checksum (Block::checksum, xxh64 seed 0 of the value; tombstone: 0)
///          32  key[32]
///          64  parent[32] (tombstone: 0)
///          96  u32 header crc32 (zlib crc32 of bytes [0, 96))
///         100  namespace (UTF-8 bytes, no terminator)
///              value
///              u32 record crc32 (zlib crc32 of everything before it, header crc included)
/// A block record is written when a block becomes visible (a staged block when it is
/// published, so a parent's record precedes its children's); a tombstone (key, namespace)
/// when a block is evicted, removed or found corrupt; one tombstone for a removed subtree,
/// as replaying it removes the subtree. At start every segment is scanned in number order:
/// blocks go through put()'s rules (staging included, no timeout; blocks still staged at the
/// end were orphaned and are dropped), tombstones remove. A record whose header is sound but
/// whose record CRC (or checksum) fails is skipped and counted; after a damaged header the
/// scan resumes at the next sound header; a record cut off by the file's end (or a damaged
/// header with no sound one after it) is torn: dropped, and the file truncated to the last
/// whole record. The budget is enforced during the scan; blocks it evicted or refused, and
/// dropped orphans, get tombstones afterwards, so the next start sees the same blocks. When
/// dead bytes (everything but the records of visible blocks) exceed both
/// compact_ratio · live bytes and segment_bytes, the visible blocks are rewritten (parents
/// first) into a segment numbered after every existing one, which is synced before the old
/// segments are deleted (a crash in between replays to the same blocks). Compaction runs
/// inside the call that tipped the balance, under the store's lock. Values stay in memory
/// too: the store serves from memory; the files are for restarts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hack/core/error.h"
#include "hack/kv/block_key.h"

namespace hack::vault {

/// One stored block. Immutable once put.
struct Block {
  std::string name_space;
  BlockKey key{};
  BlockKey parent{};         ///< the previous block's key (the chain root for the first block)
  bool first = false;        ///< the chain's first block: its parent is the root, never stored
  uint8_t codec = 0;         ///< opaque to the store (kv/kv_block.h BlockCodec)
  uint64_t checksum = 0;     ///< xxh64 (seed 0) of value, computed by the writer
  std::vector<std::byte> value;
};
using BlockPtr = std::shared_ptr<const Block>;

/// xxh64 (seed 0) of a block's value, the checksum a writer puts in Block::checksum.
uint64_t block_checksum(std::span<const std::byte> value);

struct BlockStoreOptions {
  size_t max_bytes = size_t{1} << 30;   ///< budget over every namespace (values + kBlockOverheadBytes each)
  /// Optional per-namespace budgets (a namespace not listed is bounded by max_bytes only).
  std::map<std::string, size_t> namespace_quota_bytes;
  double orphan_timeout_s = 10.0;       ///< staged blocks whose parent never came are dropped after this
  size_t max_orphan_bytes = size_t{64} << 20;  ///< staged bytes beyond this drop the oldest staged
  size_t max_block_bytes = size_t{256} << 20;  ///< a bigger value is rejected
  std::string data_dir;                 ///< empty: memory only
  size_t segment_bytes = size_t{64} << 20;     ///< a segment file is closed past this size
  double compact_ratio = 1.0;           ///< compact when dead bytes > compact_ratio · live bytes (and > segment_bytes)
  bool fsync = false;                   ///< fdatasync after every record (slow; default: the OS decides)
};

/// Bytes charged per block on top of its value (index entry, key, bookkeeping).
inline constexpr size_t kBlockOverheadBytes = 256;

enum class PutResult {
  stored,          ///< visible now (and any staged descendants that were waiting for it)
  duplicate,       ///< the key is already visible in the namespace (kept; the new copy is dropped)
  staged,          ///< invisible until its parent arrives
  bad_checksum,    ///< value does not match checksum: dropped
  too_large,       ///< value exceeds max_block_bytes, the budget or the namespace's quota (or
                   ///< with its ancestors, which are never evicted for it; or, waiting for its
                   ///< parent, max_orphan_bytes): dropped
  invalid,         ///< empty namespace, key == parent, ...: dropped
};
const char* put_result_name(PutResult result);

struct RecoveryStats {
  uint64_t segments = 0;
  uint64_t records = 0;          ///< whole records read
  uint64_t blocks_restored = 0;  ///< visible after recovery
  uint64_t torn_records = 0;     ///< dropped at a segment's end (file truncated)
  uint64_t corrupt_records = 0;  ///< CRC or checksum mismatch, or a damaged header: skipped
  uint64_t orphans_dropped = 0;  ///< blocks whose parent was not recovered
};

struct BlockStoreStats {
  uint64_t blocks = 0;            ///< visible blocks
  uint64_t bytes = 0;             ///< charged bytes of visible blocks
  uint64_t staged_blocks = 0;
  uint64_t staged_bytes = 0;
  uint64_t memory_pinned_bytes = 0;  ///< evicted/removed blocks still held by readers
  uint64_t puts = 0, stored = 0, duplicates = 0, rejected = 0;
  uint64_t lookups = 0;
  uint64_t hit_blocks = 0;        ///< blocks found by lookup/promote
  uint64_t miss_blocks = 0;       ///< blocks asked for after the first missing one (lookup/promote)
  uint64_t evictions = 0;         ///< blocks evicted for the budget
  uint64_t evicted_bytes = 0;
  uint64_t orphans_expired = 0;   ///< staged blocks dropped (timeout, staging budget, or no room
                                  ///< when their parent came)
  uint64_t corrupt_blocks = 0;    ///< blocks removed because a checksum failed on read (the
                                  ///< failing block and its descendants)
  uint64_t deletes = 0;           ///< blocks removed by remove()
  std::map<std::string, uint64_t> namespace_bytes;
  RecoveryStats recovery;         ///< from the last start (zero without data_dir)
  uint64_t segment_files = 0;
  uint64_t disk_bytes = 0;        ///< bytes of all segment files
  uint64_t compactions = 0;
};

class BlockStore {
 public:
  /// Opens the store; with data_dir, creates it if needed and recovers its segments.
  /// Throws hack::Error for bad options or an unusable data_dir.
  explicit BlockStore(BlockStoreOptions options);
  ~BlockStore();
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  /// Adds a block (see PutResult). Evicts LRU leaves to make room (never the new block's
  /// own ancestors). Persists it when data_dir is set.
  PutResult put(Block block);
  /// How many of keys[0..] are visible, from the start, in the namespace (keys[i]'s parent
  /// is keys[i − 1]); touches them (LRU).
  size_t lookup(const std::string& name_space, std::span<const BlockKey> keys);
  /// The visible blocks of keys[0..n) for the longest such n (at most max_blocks), each
  /// checksum-verified (a failing block is removed with its descendants and ends the
  /// result); touches them.
  std::vector<BlockPtr> promote(const std::string& name_space, std::span<const BlockKey> keys,
                                size_t max_blocks = SIZE_MAX);
  /// Removes a block and every descendant. Returns how many blocks were removed.
  size_t remove(const std::string& name_space, const BlockKey& key);
  /// Drops staged blocks older than orphan_timeout_s (put() also calls it).
  void expire_orphans();
  BlockStoreStats stats() const;
  const BlockStoreOptions& options() const { return options_; }

  /// Test hook: flips one byte of a visible block's stored value (in memory; a persisted
  /// copy is untouched), so the next read finds the checksum wrong.
  bool corrupt_for_test(const std::string& name_space, const BlockKey& key);
  /// Test hook: every visible key, per namespace.
  std::map<std::string, std::vector<BlockKey>> keys_for_test() const;

 private:
  struct Impl;
  BlockStoreOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hack::vault
