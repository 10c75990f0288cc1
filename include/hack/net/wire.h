/// @file wire.h
/// @brief The versioned header every data-plane message carries (DESIGN.md §4), and its
/// validation. A message is this header (sent as the UCX active-message header) plus a
/// payload (the AM data). Receivers decode the header, then check the payload against the
/// length and checksum it declares; any mismatch is an error for that message (and, when
/// the header itself is sound, for its request) — never a crash.
///
/// Header (version 4), little-endian: a fixed part of kWireHeaderBytes (48), then for kv_page
/// messages a page table:
///   u32 magic "HKWR" | u16 version | u16 type | u64 request_id | u32 layer | u32 seq |
///   u64 payload_bytes | u64 payload_xxh3 | u32 page_count | u32 flags |
///   page_count × u32 page_bytes                 (kv_page only; every other type has none)
/// A kv_page message carries page_count ≥ 1 consecutive pages of one layer, back to back in
/// the payload (the sender coalesces pages into messages of about 1 MiB, which tcp moves ~2×
/// faster per byte than one 256 KiB page each); page_bytes sum to payload_bytes. Its checksum
/// covers every page: payload_xxh3 = XXH3_64 of the pages' own XXH3_64 values (u64 LE, in
/// order), so a sender hashes each page once as it is queued. Other types: XXH3_64 of the
/// payload. With WireAuth the 32-byte tag follows the page table (kWireTagBytes).
///
/// flags: bit 0 (kWireFlagUnchecked), kv_page only: the pages carry no checksum (payload_xxh3
/// is 0) and the receiver checks their lengths alone. A sender uses it where the bytes never
/// leave the host's memory (UCX shared-memory lanes): there a checksum guards against nothing
/// the memory itself does not, and hashing at both ends was a third of a transfer's memory
/// traffic (bench/RESULTS.md). With WireAuth the tag still covers every byte. Other bits are 0.
///
/// History: v1 carried XXH64 of the payload (slower than XXH3, the largest single cost of a
/// transfer); v2 (40 bytes) one page per message; v3 had no flags (the field was reserved, 0).
/// A peer of another version is refused with an error naming both versions: every node of a
/// cluster must run the same wire version.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hack/core/error.h"

namespace hack::net {

inline constexpr uint32_t kWireMagic = 0x52574B48;  // "HKWR"
inline constexpr uint16_t kWireVersion = 4;
/// flags bit 0: a kv_page whose pages carry no checksum (see above).
inline constexpr uint32_t kWireFlagUnchecked = 1;
/// The fixed part of a header; a kv_page header adds 4 bytes per page (wire_header_bytes).
inline constexpr size_t kWireHeaderBytes = 48;
/// Most pages one kv_page message carries (bounds the AM header: 48 + 4 × 256 bytes).
inline constexpr uint32_t kWireMaxPagesPerMessage = 256;
/// Largest payload a receiver accepts (a HACK page is far smaller; this bounds allocation).
inline constexpr uint64_t kWireMaxPayloadBytes = uint64_t{1} << 30;
/// Largest request_error payload (a UTF-8 message).
inline constexpr uint64_t kWireMaxErrorBytes = 4096;
/// Largest request_done payload (a small JSON document: the first token, the seed, ...).
inline constexpr uint64_t kWireMaxDoneBytes = 64 * 1024;
/// Largest vault lookup / promote / delete payload (a namespace and up to 16K keys).
inline constexpr uint64_t kWireMaxKeysPayloadBytes = 16 + 255 + 16384 * 32;
/// Largest vault_promote_head payload (block headers of up to 16K blocks of 1024 layers).
inline constexpr uint64_t kWireMaxHeadPayloadBytes = uint64_t{32} << 20;

enum class WireType : uint16_t {
  kv_page = 1,        ///< payload: page_count HACK pages of `layer` for `request_id`, back to back
  kv_layer_done = 2,  ///< every page of `layer` has been sent; empty payload
  request_done = 3,   ///< every layer has been sent; payload: up to kWireMaxDoneBytes for the receiver
  request_error = 4,  ///< the request failed at the sender or receiver; payload: message
  request_cancel = 5, ///< the sender abandons the request; payload: reason (may be empty)
  kv_exact = 6,       ///< payload: exact (unquantized) tokens of `layer` (kv/kv_stream.h exact message)
  // The vault's protocol (net/vault_protocol.h); request_id is the client's call id.
  vault_store = 7,         ///< client → vault: one block (fire-and-forget)
  vault_lookup = 8,        ///< client → vault: a chain of keys; answered by vault_count
  vault_promote = 9,       ///< client → vault: a chain of keys; answered by vault_promote_head + layers
  vault_delete = 10,       ///< client → vault: one key (and its descendants); answered by vault_count
  vault_stats = 11,        ///< client → vault: empty; answered by vault_stats_reply
  vault_count = 12,        ///< vault → client: u64 (blocks found / removed)
  vault_promote_head = 13, ///< vault → client: how many blocks follow and their headers
  vault_promote_layer = 14,///< vault → client: layer `layer` of every promoted block
  vault_error = 15,        ///< vault → client: the call failed; payload: message
  vault_stats_reply = 16,  ///< vault → client: JSON
  kv_exact_copy = 17,      ///< payload: exact tokens of `layer` kept for the vault, not applied to the cache
};

/// Printable name of a type ("kv_page"), "unknown" for a value outside the enum.
const char* wire_type_name(WireType type);

struct WireHeader {
  WireType type = WireType::kv_page;
  uint64_t request_id = 0;
  uint32_t layer = 0;
  uint32_t seq = 0;               ///< message index within the request, from 0
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;  ///< XXH3-64 of the payload (kv_page: of its pages' XXH3-64s); 0 when unchecked
  bool unchecked = false;         ///< kv_page only: sent without a checksum (kWireFlagUnchecked)
  std::vector<uint32_t> page_bytes;  ///< kv_page: each page's length, in payload order; else empty
};

/// Encoded length of a header: kWireHeaderBytes + 4 bytes per page.
inline size_t wire_header_bytes(const WireHeader& header) { return kWireHeaderBytes + 4 * header.page_bytes.size(); }

/// XXH3_64bits (seed 0) of bytes, the wire checksum.
uint64_t wire_checksum(std::span<const std::byte> bytes);

/// The kv_page checksum: XXH3_64 over the pages' checksums (each wire_checksum of one page),
/// as little-endian u64s in page order.
uint64_t wire_pages_checksum(std::span<const uint64_t> page_checksums);

/// Header for `payload` (length and checksum filled in from it); a kv_page payload is one page.
WireHeader make_wire_header(WireType type, uint64_t request_id, uint32_t layer, uint32_t seq,
                            std::span<const std::byte> payload);

/// kv_page header for pages of the given lengths and checksums (wire_checksum of each page);
/// with no checksums at all, an unchecked one (kWireFlagUnchecked).
WireHeader make_pages_header(uint64_t request_id, uint32_t layer, uint32_t seq, std::vector<uint32_t> page_bytes,
                             std::span<const uint64_t> page_checksums);

/// The header's encoding (wire_header_bytes long; what UcxWorker::send takes).
std::vector<std::byte> encode_wire_header(const WireHeader& header);

/// A UTF-8 message as a payload (request_error, request_cancel, vault_error), cut to
/// kWireMaxErrorBytes.
std::vector<std::byte> wire_text(std::string_view text);

/// Decodes and validates a header: size, magic, version, known type, payload length within
/// the limit of its type, flags (kWireFlagUnchecked only, on a kv_page whose checksum is 0),
/// and a kv_page's page table (1..kWireMaxPagesPerMessage pages, as many entries as it
/// declares, none empty, summing to payload_bytes; no table on any other type). On failure
/// returns an error and leaves `out` untouched.
Status decode_wire_header(std::span<const std::byte> bytes, WireHeader& out);

/// The request id of a header whose fixed part is sound (length, magic, version, known type)
/// even if the rest (page table, payload limit) is not, so a receiver can fail that request
/// rather than drop the message anonymously; nullopt otherwise.
std::optional<uint64_t> wire_header_request(std::span<const std::byte> bytes);

/// Checks a payload against a decoded header: its length, and its checksum unless unchecked.
Status verify_wire_payload(const WireHeader& header, std::span<const std::byte> payload);

/// Data-plane authentication (DESIGN.md §4: reaching the UCX port is not enough to inject
/// KV). With a cluster secret, every KV-transfer message carries after its header (fixed part
/// and page table) a 32-byte tag, HMAC-SHA256(key, channel ‖ header ‖ payload) with key =
/// HMAC-SHA256(secret, "hackserve wire auth v1"), so the AM header is kWireTagBytes longer than
/// wire_header_bytes (kWireSealedHeaderBytes for a header without pages). The tag binds the
/// payload to its type, request id, layer and seq; `channel` (data or reply) stops a message
/// being reflected back to its sender. Replays: request ids are random per attempt and seq
/// must arrive in order, so a replayed message is a duplicate (its request fails, nothing is
/// injected) or a straggler of an ended request (dropped). Without a secret nothing is
/// sealed and a sealed message is refused (the nodes must agree).
///
/// One implementation serves every UCX protocol; each derives its own key from the secret
/// with its own label, so a message sealed for one (KV transfer) is refused by another (the
/// vault) even under the same secret.
inline constexpr size_t kWireTagBytes = 32;
inline constexpr size_t kWireSealedHeaderBytes = kWireHeaderBytes + kWireTagBytes;
/// Key-derivation labels: KV transfer (prefill ↔ decode) and the vault protocol.
inline constexpr std::string_view kWireAuthLabel = "hackserve wire auth v1";
inline constexpr std::string_view kVaultAuthLabel = "hackserve vault auth v1";

/// data: requests and KV (sender → receiver); reply: the answers coming back.
enum class WireChannel : uint8_t { data = 1, reply = 2 };

class WireAuth {
 public:
  /// Off: seal() returns the header as is, open() takes plain headers.
  WireAuth() = default;
  /// On when `secret` is not empty; key = HMAC-SHA256(secret, label).
  explicit WireAuth(std::string_view secret, std::string_view label = kWireAuthLabel);
  /// The metrics label of an open() error: "unauthenticated" (no tag), "bad_mac",
  /// "unexpected_mac" (a tag, but this side has no secret) or "wire_version" (a peer speaking
  /// another wire version, whose header and tag cannot be told apart).
  static const char* rejection_reason(const Status& error);

  bool enabled() const { return enabled_; }
  /// The encoded header with its tag over `payload` appended (when enabled).
  std::vector<std::byte> seal(std::vector<std::byte> header, std::span<const std::byte> payload,
                              WireChannel channel) const;
  /// Same, for a payload sent as several spans (a kv_page message of borrowed pages): the tag
  /// covers them in order, as if they were one buffer.
  std::vector<std::byte> seal(std::vector<std::byte> header, std::span<const std::span<const std::byte>> payload,
                              WireChannel channel) const;
  /// Checks a received AM header's tag over `payload` and returns the plain header in
  /// `plain`; an error names what was wrong (no tag, bad tag, another wire version) and
  /// leaves `plain` empty. The plain header's length comes from its page count.
  Status open(std::span<const std::byte> header, std::span<const std::byte> payload, WireChannel channel,
              std::span<const std::byte>& plain) const;
  /// The tag alone (tests build forged messages with it).
  std::array<std::byte, kWireTagBytes> tag(std::span<const std::byte> header, std::span<const std::byte> payload,
                                           WireChannel channel) const;
  std::array<std::byte, kWireTagBytes> tag(std::span<const std::byte> header,
                                           std::span<const std::span<const std::byte>> payload,
                                           WireChannel channel) const;

 private:
  bool enabled_ = false;
  std::array<unsigned char, 32> key_{};
  std::shared_ptr<void> mac_;  // the fetched OpenSSL EVP_MAC ("HMAC"), shared by copies
};

}  // namespace hack::net
