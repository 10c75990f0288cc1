/// @file block_key.h
/// @brief Prefix-cache block keys (DESIGN.md §3.3): chained SHA-256 over Π-token blocks, so
/// the key of block i names the whole prefix [0, (i + 1)·Π) and the same prompt gets the same
/// keys on every process.
///
///   H_root = SHA-256("hackserve-kv-chain-v1" ‖ u32 len ‖ fingerprint ‖ u32 len ‖ namespace)
///   H_i    = SHA-256(H_{i−1} ‖ token ids of block i as u32 little-endian)
///
/// The fingerprint (KvFingerprint::text()) names everything that changes a block's bytes:
/// model id and weights digest, KV mode and cache options, the vault codec, Π, bits and bit
/// allocation, an FDC artifact digest. A change to any of them gives other keys, so a block
/// is never restored into a cache it was not made for.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hack {

using BlockKey = std::array<uint8_t, 32>;

/// Lower-case hex of a key (64 characters); parse_block_key reverses it (throws hack::Error).
std::string to_hex(const BlockKey& key);
BlockKey parse_block_key(std::string_view hex);

/// SHA-256 of bytes (OpenSSL libcrypto).
BlockKey sha256(std::span<const uint8_t> bytes);

/// What a block's bytes depend on, as canonical "name=value" lines (sorted by name, so the
/// order fields were added in does not matter).
class KvFingerprint {
 public:
  KvFingerprint& add(std::string_view name, std::string_view value);
  KvFingerprint& add(std::string_view name, int64_t value);
  /// The canonical text hashed into the chain root.
  std::string text() const;
  /// SHA-256 of text(), in hex (for logs and the vault's stats).
  std::string digest() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

/// H_root for (fingerprint, namespace).
BlockKey chain_root(const KvFingerprint& fingerprint, std::string_view name_space);
/// H_i from H_{i−1} and the token ids of block i.
BlockKey chain_next(const BlockKey& previous, std::span<const int> block_tokens);
/// The key of a partial block: `tokens` (fewer than Π) right after the prefix `previous`
/// names (a chain key, or the root). Hashed under its own domain, so it never equals a
/// chain key: SHA-256("hackserve-kv-tail-v1" ‖ H_previous ‖ u32 count ‖ token ids as u32).
BlockKey tail_key(const BlockKey& previous, std::span<const int> tokens);
/// Keys of the full blocks of `tokens`: floor(tokens.size() / block_tokens) keys, key i
/// naming tokens [0, (i + 1)·block_tokens). At most max_blocks (−1: all).
std::vector<BlockKey> chain_keys(const BlockKey& root, std::span<const int> tokens, int block_tokens,
                                 int max_blocks = -1);

}  // namespace hack
