/// @file vault_protocol.h
/// @brief The payloads of the vault's data-plane calls (DESIGN.md §3.3, §4). Each message is
/// a wire.h header (type vault_*, request_id = the client's call id) plus one of these
/// payloads, little-endian. Decoders validate everything and throw hack::Error naming the
/// problem; they never read outside the payload (tests/fuzz/fuzz_vault_protocol.cpp).
///
/// Client → vault, AM id kVaultRequestAmId:
///   vault_store    u16 namespace bytes | u8 flags (bit 0: first block of its chain) | u8 codec |
///                  u32 0 | key[32] | parent[32] | u64 value xxh64 | namespace | value
///                  (value: a kv/kv_block.h block; no reply — fire-and-forget)
///   vault_lookup,  u16 namespace bytes | u16 0 | u32 keys | u32 max_blocks | u32 0 | namespace |
///   vault_promote, keys[keys][32]
///   vault_delete   (delete: exactly one key)
///   vault_stats    empty
/// Vault → client, AM id kVaultReplyAmId:
///   vault_count          u64: blocks found (lookup) or removed (delete)
///   vault_promote_head   u32 blocks | u32 layers | per block: u64 value xxh64 | u32 header bytes |
///                        u32 0 | the block's kv_block header and layer table
///   vault_promote_layer  (header.layer = l) the layer-l slices of every promoted block, in
///                        block order, back to back; one message per layer, layers may arrive
///                        in any order (rendezvous), the head too
///   vault_error          a UTF-8 message
///   vault_stats_reply    JSON
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hack/kv/block_key.h"
#include "hack/kv/kv_block.h"

namespace hack::net {

inline constexpr uint16_t kVaultRequestAmId = 20;
inline constexpr uint16_t kVaultReplyAmId = 21;
inline constexpr size_t kVaultMaxNamespaceBytes = 255;
inline constexpr size_t kVaultMaxKeys = 16384;

struct VaultStoreMessage {
  std::string name_space;
  bool first = false;
  uint8_t codec = 0;
  BlockKey key{};
  BlockKey parent{};
  uint64_t checksum = 0;
  std::span<const std::byte> value;  ///< into the decoded payload (or the caller's buffer)
};

struct VaultKeysMessage {
  std::string name_space;
  uint32_t max_blocks = 0;  ///< promote: at most this many blocks (0 = as many as match)
  std::vector<BlockKey> keys;
};

struct VaultPromoteHead {
  std::vector<uint64_t> checksums;     ///< per block: xxh64 of its whole value
  std::vector<KvBlockHeader> headers;  ///< per block, decoded and validated
  int layers = 0;
};

/// Namespaces: 1..255 bytes of [A-Za-z0-9._-] (they appear in metrics and file names).
void check_vault_namespace(std::string_view name_space);

std::vector<std::byte> encode_vault_store(const VaultStoreMessage& m);
VaultStoreMessage decode_vault_store(std::span<const std::byte> payload);

std::vector<std::byte> encode_vault_keys(const VaultKeysMessage& m);
VaultKeysMessage decode_vault_keys(std::span<const std::byte> payload);

std::vector<std::byte> encode_vault_count(uint64_t count);
uint64_t decode_vault_count(std::span<const std::byte> payload);

/// `header_bytes[i]`: block i's kv_block header and table (its value's first bytes).
std::vector<std::byte> encode_vault_promote_head(int layers, std::span<const uint64_t> checksums,
                                                 std::span<const std::span<const std::byte>> header_bytes);
/// Checks every block header (kv/kv_block.h) and that all have `layers` layers.
VaultPromoteHead decode_vault_promote_head(std::span<const std::byte> payload);
/// Splits a vault_promote_layer payload into its blocks' slices (sizes from the head's
/// tables), checking each slice's checksum. Throws hack::Error naming the block.
std::vector<std::span<const std::byte>> split_vault_promote_layer(const VaultPromoteHead& head, int layer,
                                                                  std::span<const std::byte> payload);

/// Bytes of a kv_block value's header and layer table (what the head carries of it).
size_t kv_block_prefix_bytes(const KvBlockHeader& header);

}  // namespace hack::net
