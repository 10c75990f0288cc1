// Wire header encoding and validation (include/hack/net/wire.h).
#include "hack/net/wire.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
// Inlined, so XXH3 is compiled for this build's ISA (AVX2): ~4x the shared library's speed.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstring>

#include "hack/core/byte_io.h"

namespace hack::net {

namespace {

bool known_type(uint16_t type) { return type >= 1 && type <= 17; }

}  // namespace

const char* wire_type_name(WireType type) {
  switch (type) {
    case WireType::kv_page: return "kv_page";
    case WireType::kv_layer_done: return "kv_layer_done";
    case WireType::request_done: return "request_done";
    case WireType::request_error: return "request_error";
    case WireType::request_cancel: return "request_cancel";
    case WireType::kv_exact: return "kv_exact";
    case WireType::vault_store: return "vault_store";
    case WireType::vault_lookup: return "vault_lookup";
    case WireType::vault_promote: return "vault_promote";
    case WireType::vault_delete: return "vault_delete";
    case WireType::vault_stats: return "vault_stats";
    case WireType::vault_count: return "vault_count";
    case WireType::vault_promote_head: return "vault_promote_head";
    case WireType::vault_promote_layer: return "vault_promote_layer";
    case WireType::vault_error: return "vault_error";
    case WireType::vault_stats_reply: return "vault_stats_reply";
    case WireType::kv_exact_copy: return "kv_exact_copy";
  }
  return "unknown";
}

uint64_t wire_checksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t wire_pages_checksum(std::span<const uint64_t> page_checksums) {
  std::array<std::byte, 8 * kWireMaxPagesPerMessage> le;
  HACK_CHECK(page_checksums.size() <= kWireMaxPagesPerMessage, "wire: {} pages in one message, at most {}",
             page_checksums.size(), kWireMaxPagesPerMessage);
  size_t at = 0;
  for (uint64_t c : page_checksums) put_le(le.data(), at, c);
  return XXH3_64bits(le.data(), at);
}

WireHeader make_wire_header(WireType type, uint64_t request_id, uint32_t layer, uint32_t seq,
                            std::span<const std::byte> payload) {
  if (type == WireType::kv_page) {
    HACK_CHECK(payload.size() <= UINT32_MAX, "wire: a {}-byte page", payload.size());
    const uint64_t sum = wire_checksum(payload);
    return make_pages_header(request_id, layer, seq, {static_cast<uint32_t>(payload.size())}, std::span(&sum, 1));
  }
  WireHeader h;
  h.type = type;
  h.request_id = request_id;
  h.layer = layer;
  h.seq = seq;
  h.payload_bytes = payload.size();
  h.payload_checksum = wire_checksum(payload);
  return h;
}

WireHeader make_pages_header(uint64_t request_id, uint32_t layer, uint32_t seq, std::vector<uint32_t> page_bytes,
                             std::span<const uint64_t> page_checksums) {
  HACK_CHECK(page_checksums.empty() || page_bytes.size() == page_checksums.size(),
             "wire: {} page lengths but {} checksums", page_bytes.size(), page_checksums.size());
  WireHeader h;
  h.type = WireType::kv_page;
  h.request_id = request_id;
  h.layer = layer;
  h.seq = seq;
  for (uint32_t n : page_bytes) h.payload_bytes += n;
  h.unchecked = page_checksums.empty();
  h.payload_checksum = h.unchecked ? 0 : wire_pages_checksum(page_checksums);
  h.page_bytes = std::move(page_bytes);
  return h;
}

std::vector<std::byte> encode_wire_header(const WireHeader& header) {
  std::vector<std::byte> out(wire_header_bytes(header));
  size_t at = 0;
  put_le(out.data(), at, kWireMagic);
  put_le(out.data(), at, kWireVersion);
  put_le(out.data(), at, static_cast<uint16_t>(header.type));
  put_le(out.data(), at, header.request_id);
  put_le(out.data(), at, header.layer);
  put_le(out.data(), at, header.seq);
  put_le(out.data(), at, header.payload_bytes);
  put_le(out.data(), at, header.payload_checksum);
  put_le(out.data(), at, static_cast<uint32_t>(header.page_bytes.size()));
  put_le(out.data(), at, header.unchecked ? kWireFlagUnchecked : uint32_t{0});
  for (uint32_t n : header.page_bytes) put_le(out.data(), at, n);
  return out;
}

std::vector<std::byte> wire_text(std::string_view text) {
  text = text.substr(0, kWireMaxErrorBytes);
  const auto* begin = reinterpret_cast<const std::byte*>(text.data());
  return {begin, begin + text.size()};
}

namespace {

// Magic and version, read before anything else: a peer of another version lays out its
// header (and tag) differently, so nothing after them can be trusted.
Status check_magic_version(std::span<const std::byte> bytes) {
  if (bytes.size() < 8) return Status::error(fmt::format("wire header is {} bytes, expected at least {}", bytes.size(), kWireHeaderBytes));
  size_t at = 0;
  const auto magic = get_le<uint32_t>(bytes.data(), at);
  const auto version = get_le<uint16_t>(bytes.data(), at);
  if (magic != kWireMagic) return Status::error(fmt::format("wire header has bad magic {:#010x}", magic));
  if (version != kWireVersion)
    return Status::error(fmt::format("wire version {} is not supported (this build speaks {}): every node of the cluster "
                                     "must run the same wire version (v4 may send KV pages unchecked over shared memory)",
                                     version, kWireVersion));
  return Status::ok();
}

// Where the fixed part keeps page_count: after magic, version, type, request_id, layer, seq,
// payload_bytes and payload_xxh3 (4 + 2 + 2 + 8 + 4 + 4 + 8 + 8 bytes).
constexpr size_t kPageCountOffset = 40;

// The encoded length the fixed part declares (kWireHeaderBytes + 4 × page_count); 0 when
// the bytes are too short to say.
size_t declared_header_bytes(std::span<const std::byte> bytes) {
  if (bytes.size() < kWireHeaderBytes) return 0;
  size_t at = kPageCountOffset;
  const auto pages = get_le<uint32_t>(bytes.data(), at);
  if (pages > kWireMaxPagesPerMessage) return 0;
  return kWireHeaderBytes + 4 * size_t{pages};
}

}  // namespace

std::optional<uint64_t> wire_header_request(std::span<const std::byte> bytes) {
  if (bytes.size() < kWireHeaderBytes || !check_magic_version(bytes)) return std::nullopt;
  size_t at = 6;
  if (!known_type(get_le<uint16_t>(bytes.data(), at))) return std::nullopt;
  return get_le<uint64_t>(bytes.data(), at);
}

Status decode_wire_header(std::span<const std::byte> bytes, WireHeader& out) {
  if (Status s = check_magic_version(bytes); !s) return s;
  if (bytes.size() < kWireHeaderBytes)
    return Status::error(fmt::format("wire header is {} bytes, expected at least {}", bytes.size(), kWireHeaderBytes));
  size_t at = 6;
  const auto type = get_le<uint16_t>(bytes.data(), at);
  if (!known_type(type)) return Status::error(fmt::format("wire header has unknown message type {}", type));
  WireHeader h;
  h.type = static_cast<WireType>(type);
  h.request_id = get_le<uint64_t>(bytes.data(), at);
  h.layer = get_le<uint32_t>(bytes.data(), at);
  h.seq = get_le<uint32_t>(bytes.data(), at);
  h.payload_bytes = get_le<uint64_t>(bytes.data(), at);
  h.payload_checksum = get_le<uint64_t>(bytes.data(), at);
  const auto page_count = get_le<uint32_t>(bytes.data(), at);
  const auto flags = get_le<uint32_t>(bytes.data(), at);
  const char* name = wire_type_name(h.type);
  if ((flags & ~kWireFlagUnchecked) != 0)
    return Status::error(fmt::format("request {}: {} header has unknown flags {:#x}", h.request_id, name,
                                     flags & ~kWireFlagUnchecked));
  h.unchecked = (flags & kWireFlagUnchecked) != 0;
  if (h.unchecked && h.type != WireType::kv_page)
    return Status::error(fmt::format("request {}: {} header is flagged unchecked (only kv_page may be)", h.request_id, name));
  if (h.unchecked && h.payload_checksum != 0)
    return Status::error(fmt::format("request {}: unchecked kv_page header carries checksum {:#018x} (must be 0)",
                                     h.request_id, h.payload_checksum));
  uint64_t limit = 0;
  switch (h.type) {
    case WireType::kv_page:
    case WireType::kv_exact:
    case WireType::kv_exact_copy:
    case WireType::vault_store:
    case WireType::vault_promote_layer: limit = kWireMaxPayloadBytes; break;
    case WireType::vault_lookup:
    case WireType::vault_promote:
    case WireType::vault_delete: limit = kWireMaxKeysPayloadBytes; break;
    case WireType::vault_promote_head: limit = kWireMaxHeadPayloadBytes; break;
    case WireType::vault_count: limit = 8; break;
    case WireType::vault_stats: limit = 0; break;
    case WireType::vault_error: limit = kWireMaxErrorBytes; break;
    case WireType::vault_stats_reply: limit = kWireMaxDoneBytes; break;
    case WireType::request_error:
    case WireType::request_cancel: limit = kWireMaxErrorBytes; break;
    case WireType::request_done: limit = kWireMaxDoneBytes; break;
    case WireType::kv_layer_done: limit = 0; break;
  }
  if (h.payload_bytes > limit)
    return Status::error(fmt::format("request {}: {} declares a {}-byte payload, limit {}", h.request_id, name,
                                     h.payload_bytes, limit));
  // The page table: present exactly on kv_page, as long as it says, summing to the payload.
  if (h.type != WireType::kv_page) {
    if (page_count != 0)
      return Status::error(fmt::format("request {}: {} header declares {} pages (only kv_page carries pages)",
                                       h.request_id, name, page_count));
  } else if (page_count == 0 || page_count > kWireMaxPagesPerMessage) {
    return Status::error(fmt::format("request {}: kv_page header declares {} pages (1 to {} allowed)", h.request_id,
                                     page_count, kWireMaxPagesPerMessage));
  }
  const size_t expected = kWireHeaderBytes + 4 * size_t{page_count};
  if (bytes.size() != expected)
    return Status::error(fmt::format("request {}: {} header is {} bytes, but its {} pages make it {} (a truncated or "
                                     "overlong page table)", h.request_id, name, bytes.size(), page_count, expected));
  h.page_bytes.resize(page_count);
  uint64_t sum = 0;
  for (uint32_t i = 0; i < page_count; ++i) {
    h.page_bytes[i] = get_le<uint32_t>(bytes.data(), at);
    if (h.page_bytes[i] == 0)
      return Status::error(fmt::format("request {}: kv_page header: page {} of {} is empty", h.request_id, i, page_count));
    sum += h.page_bytes[i];
  }
  if (h.type == WireType::kv_page && sum != h.payload_bytes)
    return Status::error(fmt::format("request {}: kv_page page table sums to {} bytes, but the header declares a "
                                     "{}-byte payload", h.request_id, sum, h.payload_bytes));
  out = std::move(h);
  return Status::ok();
}

Status verify_wire_payload(const WireHeader& header, std::span<const std::byte> payload) {
  if (payload.size() != header.payload_bytes)
    return Status::error(fmt::format("request {}: {} payload is {} bytes, header says {}", header.request_id,
                                     wire_type_name(header.type), payload.size(), header.payload_bytes));
  uint64_t sum = 0;
  if (header.type == WireType::kv_page) {
    std::array<uint64_t, kWireMaxPagesPerMessage> sums;
    HACK_CHECK(header.page_bytes.size() <= sums.size(), "wire: {} pages", header.page_bytes.size());
    size_t offset = 0;
    for (size_t i = 0; i < header.page_bytes.size(); ++i) {
      // decode_wire_header made the table sum to payload_bytes; a hand-built header may not.
      if (header.page_bytes[i] > payload.size() - offset)
        return Status::error(fmt::format("request {}: kv_page page table overruns its {}-byte payload at page {}",
                                         header.request_id, payload.size(), i));
      if (!header.unchecked) sums[i] = wire_checksum(payload.subspan(offset, header.page_bytes[i]));
      offset += header.page_bytes[i];
    }
    if (header.unchecked) return Status::ok();  // lengths only (kWireFlagUnchecked)
    sum = wire_pages_checksum(std::span(sums.data(), header.page_bytes.size()));
  } else {
    sum = wire_checksum(payload);
  }
  if (sum != header.payload_checksum)
    return Status::error(fmt::format("request {}: {} (layer {}{}) payload checksum {:#018x} != header {:#018x}",
                                     header.request_id, wire_type_name(header.type), header.layer,
                                     header.page_bytes.size() > 1 ? fmt::format(", {} pages", header.page_bytes.size())
                                                                  : std::string(),
                                     sum, header.payload_checksum));
  return Status::ok();
}

WireAuth::WireAuth(std::string_view secret, std::string_view label) {
  if (secret.empty()) return;
  HACK_CHECK(!label.empty(), "wire auth: empty key-derivation label");
  unsigned int len = 0;
  HACK_CHECK(HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
                  reinterpret_cast<const unsigned char*>(label.data()), label.size(), key_.data(),
                  &len) != nullptr && len == key_.size(),
             "wire auth: HMAC-SHA256 key derivation failed");
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  HACK_CHECK(mac != nullptr, "wire auth: OpenSSL has no HMAC");
  mac_ = std::shared_ptr<void>(mac, [](void* m) { EVP_MAC_free(static_cast<EVP_MAC*>(m)); });
  enabled_ = true;
}

const char* WireAuth::rejection_reason(const Status& error) {
  const std::string& m = error.message();
  if (m.starts_with("bad MAC")) return "bad_mac";
  if (m.starts_with("an authenticated")) return "unexpected_mac";
  if (m.starts_with("wire version")) return "wire_version";
  return "unauthenticated";
}

std::array<std::byte, kWireTagBytes> WireAuth::tag(std::span<const std::byte> header, std::span<const std::byte> payload,
                                                   WireChannel channel) const {
  return tag(header, std::span(&payload, 1), channel);
}

std::array<std::byte, kWireTagBytes> WireAuth::tag(std::span<const std::byte> header,
                                                   std::span<const std::span<const std::byte>> payload,
                                                   WireChannel channel) const {
  std::array<std::byte, kWireTagBytes> out{};
  HACK_CHECK(enabled_, "wire auth: no secret");
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(static_cast<EVP_MAC*>(mac_.get()));
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
  const auto ch = static_cast<unsigned char>(channel);
  size_t len = 0;
  bool ok = ctx != nullptr && EVP_MAC_init(ctx, key_.data(), key_.size(), params) == 1 &&
            EVP_MAC_update(ctx, &ch, 1) == 1 &&
            EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(header.data()), header.size()) == 1;
  for (const auto& part : payload)
    ok = ok && EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(part.data()), part.size()) == 1;
  ok = ok && EVP_MAC_final(ctx, reinterpret_cast<unsigned char*>(out.data()), &len, out.size()) == 1 && len == out.size();
  EVP_MAC_CTX_free(ctx);
  HACK_CHECK(ok, "wire auth: HMAC-SHA256 failed");
  return out;
}

std::vector<std::byte> WireAuth::seal(std::vector<std::byte> header, std::span<const std::byte> payload,
                                      WireChannel channel) const {
  return seal(std::move(header), std::span(&payload, 1), channel);
}

std::vector<std::byte> WireAuth::seal(std::vector<std::byte> header, std::span<const std::span<const std::byte>> payload,
                                      WireChannel channel) const {
  if (!enabled_) return header;
  HACK_CHECK(header.size() >= kWireHeaderBytes && declared_header_bytes(header) == header.size(),
             "wire auth: sealing a {}-byte header", header.size());
  const auto t = tag(header, payload, channel);
  header.insert(header.end(), t.begin(), t.end());
  return header;
}

Status WireAuth::open(std::span<const std::byte> header, std::span<const std::byte> payload, WireChannel channel,
                      std::span<const std::byte>& plain) const {
  plain = {};
  // Another version's header and tag cannot be told apart: name the version instead.
  if (header.size() >= 8) {
    size_t at = 0;
    if (get_le<uint32_t>(header.data(), at) == kWireMagic) {
      if (Status s = check_magic_version(header); !s) return s;
    }
  }
  const size_t plain_bytes = declared_header_bytes(header);  // 0: too short or garbled to say
  if (!enabled_) {
    if (plain_bytes != 0 && header.size() == plain_bytes + kWireTagBytes)
      return Status::error("an authenticated (sealed) message, but this node has no cluster secret: give every node "
                           "the same --secret-file");
    plain = header;
    return Status::ok();
  }
  if (plain_bytes == 0 || header.size() != plain_bytes + kWireTagBytes)
    return Status::error(fmt::format("unauthenticated message ({}-byte header, no MAC): the sender lacks the cluster "
                                     "secret", header.size()));
  const auto body = header.first(plain_bytes);
  const auto want = tag(body, payload, channel);
  if (CRYPTO_memcmp(want.data(), header.data() + plain_bytes, kWireTagBytes) != 0)
    return Status::error("bad MAC: the message was not sealed with this cluster's secret (or was altered)");
  plain = body;
  return Status::ok();
}

}  // namespace hack::net
