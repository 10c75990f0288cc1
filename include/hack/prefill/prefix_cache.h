/// @file prefix_cache.h
/// @brief A prefill node's prefix cache (DESIGN.md §1, §3.3): full Π-token blocks of
/// prompts it has prefilled, kept in a local LRU (a vault::BlockStore in memory) and written
/// to hack-vault, so a prompt that repeats a cached prefix restores it instead of computing
/// it. Blocks are kv/kv_block.h values under chained keys (kv/block_key.h) whose root covers
/// everything that changes a block's bytes (prefix_fingerprint).
///
/// Policy:
///   - lookup: the longest local prefix first; then, if at least vault_min_blocks more blocks
///     could come from the vault (the cost gate: a short remainder is cheaper to compute
///     than a round trip), one BatchPromote of the rest of the chain;
///   - restore: layer by layer into the prefill cache inside the prefill bracket (so the
///     rest of the prompt attends to the restored prefix exactly as to a computed one); a
///     vault layer is applied as soon as it arrives. Any vault failure (down, slow past
///     vault_timeout_s for the whole restore, a bad block) drops what came from the vault and keeps the local
///     prefix: the request is never failed by the vault;
///   - store: every new full block of a prompt goes to the local cache and (write-through,
///     fire-and-forget) to the vault, so other prefill nodes and a restarted node find it at
///     once; blocks restored from the vault are promoted into the local cache. The local LRU
///     evicts chain tails first; evicted blocks are already in the vault;
///   - local extras (never sent to the vault): a block's closed HACK pages, so a hit sends
///     them as they are (keep_pages), and a prompt's partial last block, so a prompt that
///     continues it computes only what is new (keep_tail).
/// At least the prompt's last token is always computed (its logits give the first token), and
/// with whole_chunks the prefill worker restores whole prefill chunks only (lcm(Π, --prefill-chunk) tokens): the
/// rest of the prompt is then computed in the same chunks as without a cache, so a restored
/// prompt's KV and first token are bit-identical to a computed one's (a GEMM of another shape
/// rounds differently). At Π 64 and chunks of 512 this gives up at most 448 tokens of reuse.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hack/kv/block_key.h"
#include "hack/kv/kv_block.h"
#include "hack/kv/paged_kv.h"
#include "hack/model/weights.h"
#include "hack/net/ucx_worker.h"
#include "hack/net/vault_client.h"
#include "hack/runtime/prefix_fingerprint.h"
#include "hack/vault/block_store.h"

namespace hack::server {

struct PrefixCacheOptions {
  BlockCodec codec = BlockCodec::int8_head;
  std::string name_space = "default";
  size_t local_bytes = size_t{256} << 20;          ///< local LRU budget; 0 = no local cache
  std::optional<net::VaultClientOptions> vault;    ///< none: no vault
  int vault_min_blocks = 2;                        ///< cost gate (see the file comment)
  double vault_timeout_s = 2.0;                    ///< a whole restore from the vault (lookup to last layer)
  /// Restore whole prefill chunks only (see the file comment): bit-identical to no cache.
  /// false (the default): any whole block — more reuse (an 8K-token SmolLM2 prompt restores
  /// all 125 blocks instead of 120, TTFT 0.9 s instead of 3.0 s), and the rest of the prompt
  /// may round differently in its last bits.
  bool whole_chunks = false;
  /// HACK mode, local cache: keep each block's closed HACK pages beside its codec value (a
  /// second local value under the same key, in the namespace name_space + "/pages"), so a
  /// hit sends the decode node the pages the prompt that computed them produced instead of
  /// quantizing the restored tokens again (RESULTS "A prefix hit, stage by stage"). The
  /// pages cost about 0.55× the int8-head value's bytes (K4/V4) of the local budget; vault blocks
  /// carry no pages (a block from the vault is quantized again, as before).
  bool keep_pages = true;
  /// Local cache: also keep a prompt's tail — the tokens after its restorable full blocks,
  /// all but its last ([rΠ, n − 1), r = restorable_blocks(n)) — under a key of the whole
  /// prefix (kv/block_key.h tail_key; namespace name_space + "/tail"), so the same prompt
  /// again restores everything but its last token and computes that one alone, and a prompt
  /// that extends it (the next turn of a conversation) computes only what is new (SGLang's
  /// radix cache reuses to the token; a block cache alone recomputes up to Π − 1 tokens). A
  /// prompt that shares a prefix and then differs inside the tail restores whole blocks as
  /// before (a tail is found under its exact tokens only). Not with whole_chunks
  /// (a tail is no whole chunk); not sent to the vault (its blocks are Π tokens). A tail is
  /// kept in the exact codec whatever `codec` is: the tokens right before the one computed
  /// weigh most in its attention, and a lossy tail flipped the greedy first token of a
  /// repeated 3K-token prompt in 1 of 2 runs (int8-head) where an exact one keeps it (RESULTS).
  bool keep_tail = true;
};

struct PrefixRestoreResult {
  int tokens = 0;          ///< tokens restored (a multiple of Π)
  int local_blocks = 0;
  int vault_blocks = 0;
  double restore_s = 0;    ///< lookup + promote + applying the blocks
  double lookup_s = 0;     ///< local lookup and promote, the vault's head (its block list)
  double decode_s = 0;     ///< checksums and codec → f32 of every restored block layer
  double import_s = 0;     ///< f32 → the prefill cache's pages (HACK: quantized again)
  double vault_wait_s = 0; ///< waiting for the vault's layers to arrive
  int page_blocks = 0;     ///< blocks whose closed pages came from the local cache (keep_pages)
  int tail_tokens = 0;     ///< of `tokens`, those of the prompt's tail (keep_tail)
  std::string vault_error; ///< why vault blocks were not used ("" when they were or none were asked)
};

/// One prompt's state in a PrefixCache between its restore and finish_capture: the pages its
/// restore found and the blocks, pages and tail captured so far. Owned by the caller (one per
/// prompt in flight); opaque to it.
struct PrefixJob {
  // capture in progress: [first, end) of keys, slices per block per layer
  std::vector<BlockKey> keys;
  int first = 0;
  int end = 0;
  std::vector<std::vector<std::vector<std::byte>>> slices;
  // keep_pages: the restored pages ([block] → value, [layer][block] → page); captured pages
  // from page_first, [page][layer] → bytes.
  std::vector<vault::BlockPtr> restored_pages;
  std::vector<std::vector<const std::byte*>> known;
  int page_first = 0;
  int page_offset = 0;  // the key of page b is keys[b + page_offset] (see page_key_offset in the .cpp)
  std::vector<std::vector<std::vector<std::byte>>> pages;
  // keep_tail: tokens [tail_first, +tail_tokens) under tail_key, whose prefix is tail_parent;
  // slices per layer.
  int tail_first = 0;
  int tail_tokens = 0;
  BlockKey tail_key{};
  BlockKey tail_parent{};
  std::vector<std::vector<std::byte>> tail_slices;
};

/// Used by one thread (the prefill worker's engine thread).
class PrefixCache {
 public:
  /// `ucx` (for the vault client) must outlive the cache when options.vault is set.
  PrefixCache(const KvFingerprint& fingerprint, const KvShape& shape, int block_tokens, DType exact_dtype,
              PrefixCacheOptions options, net::UcxWorker* ucx);
  ~PrefixCache();

  /// Keys of every full block of `prompt` (what is stored once it is prefilled).
  std::vector<BlockKey> keys(std::span<const int> prompt) const;
  /// How many of them a prefill may restore: the last token is always computed (its logits
  /// give the first generated token).
  int restorable_blocks(size_t prompt_tokens) const;
  /// Restores the longest cached prefix of `keys` into `seq_id` of `cache` (empty, its prefill
  /// bracket open), and notes in `job` the closed pages it found (keep_pages; known_pages).
  /// Throws hack::Error only for a local problem (the cache refusing a block).
  PrefixRestoreResult restore(PagedKv& cache, int seq_id, std::span<const BlockKey> keys, PrefixJob& job);

  /// After restore() (`result`; `keys` the blocks it was asked for): restores, right after the
  /// restored blocks, the longest tail the local cache keeps that `prompt` continues
  /// (keep_tail): the same prompt's own, or an earlier prompt's that this one extends (a
  /// conversation's next turn), never past the prompt's last token. Adds its tokens to
  /// `result` (tokens, tail_tokens, the times). Returns the tokens restored.
  int restore_tail(PagedKv& cache, int seq_id, std::span<const int> prompt, std::span<const BlockKey> keys,
                   PrefixRestoreResult& result);

  /// Capture of a prompt's new blocks while it is prefilled: begin, then capture_layer in
  /// each layer's callback of the last chunk (tokens exact then), then finish. `prompt`
  /// given: its tail is captured too (keep_tail; pass it only when the tail was not restored).
  /// Each prompt has its own PrefixJob, so prompts prefilled in one batched step capture
  /// side by side.
  void begin_capture(PrefixJob& job, std::span<const BlockKey> all_keys, int first_new_block, int full_blocks,
                     std::span<const int> prompt = {});
  void capture_layer(PrefixJob& job, const PagedKv& cache, int seq_id, int layer);
  /// Stores the captured blocks locally and in the vault, and clears `job`. Returns how many.
  int finish_capture(PrefixJob& job);

  /// The closed pages the job's restore found (keep_pages), valid while `job` lives and until
  /// finish_capture: for PagedKv::close_pending_blocks and KvExportCursor::known_pages. Empty
  /// (no function) when it found none.
  static KnownPages known_pages(const PrefixJob& job);
  /// With keep_pages: after a layer's blocks were closed at the prompt's end (HACK mode),
  /// captures the pages of the new blocks (see the .cpp for which) for finish_capture.
  void capture_pages(PrefixJob& job, const PagedKv& cache, int seq_id, int layer);

  const PrefixCacheOptions& options() const { return options_; }
  const BlockKey& root() const { return root_; }

 private:
  void restore_local_layer(PagedKv& cache, int seq_id, int layer, std::span<const vault::BlockPtr> blocks,
                           std::span<const KvBlockHeader> headers);
  void store_block(const BlockKey& key, const BlockKey& parent, bool first, std::vector<std::byte> value);
  // Into the local LRU under `name_space` (its checksum computed here); a value of this
  // cache's codec, or a block's pages (pages_space_).
  void put_local(const std::string& name_space, const BlockKey& key, const BlockKey& parent, bool first,
                 std::vector<std::byte> value);

  KvShape shape_;
  int block_tokens_;
  DType dtype_;
  PrefixCacheOptions options_;
  BlockKey root_{};
  std::unique_ptr<vault::BlockStore> local_;
  std::unique_ptr<net::VaultClient> vault_;
  std::vector<float> scratch_;
  KvRestoreTimes restore_times_;  // of the restore in progress
  // keep_pages: the pages namespace.
  std::string pages_space_;
  void find_pages(PrefixJob& job, const PagedKv& cache, std::span<const BlockKey> keys, int restored_blocks);
  // keep_tail: the tail namespace.
  bool tails() const { return options_.keep_tail && local_ && !options_.whole_chunks; }
  std::string tail_space_;
};

}  // namespace hack::server
