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

WireHeader make_wire_header(WireType type, uint64_t request_id, uint32_t layer, uint32_t seq,
                            std::span<const std::byte> payload) {
  WireHeader h;
  h.type = type;
  h.request_id = request_id;
  h.layer = layer;
  h.seq = seq;
  h.payload_bytes = payload.size();
  h.payload_checksum = wire_checksum(payload);
  return h;
}

void encode_wire_header(const WireHeader& header, std::span<std::byte, kWireHeaderBytes> out) {
  size_t at = 0;
  put_le(out.data(), at, kWireMagic);
  put_le(out.data(), at, kWireVersion);
  put_le(out.data(), at, static_cast<uint16_t>(header.type));
  put_le(out.data(), at, header.request_id);
  put_le(out.data(), at, header.layer);
  put_le(out.data(), at, header.seq);
  put_le(out.data(), at, header.payload_bytes);
  put_le(out.data(), at, header.payload_checksum);
}

std::vector<std::byte> encode_wire_header(const WireHeader& header) {
  std::vector<std::byte> out(kWireHeaderBytes);
  encode_wire_header(header, std::span<std::byte, kWireHeaderBytes>(out.data(), kWireHeaderBytes));
  return out;
}

std::vector<std::byte> wire_text(std::string_view text) {
  text = text.substr(0, kWireMaxErrorBytes);
  const auto* begin = reinterpret_cast<const std::byte*>(text.data());
  return {begin, begin + text.size()};
}

Status decode_wire_header(std::span<const std::byte> bytes, WireHeader& out) {
  if (bytes.size() != kWireHeaderBytes)
    return Status::error(fmt::format("wire header is {} bytes, expected {}", bytes.size(), kWireHeaderBytes));
  size_t at = 0;
  const auto magic = get_le<uint32_t>(bytes.data(), at);
  const auto version = get_le<uint16_t>(bytes.data(), at);
  const auto type = get_le<uint16_t>(bytes.data(), at);
  if (magic != kWireMagic) return Status::error(fmt::format("wire header has bad magic {:#010x}", magic));
  if (version != kWireVersion)
    return Status::error(fmt::format("wire header version {} is not supported (this build speaks {})", version, kWireVersion));
  if (!known_type(type)) return Status::error(fmt::format("wire header has unknown message type {}", type));
  WireHeader h;
  h.type = static_cast<WireType>(type);
  h.request_id = get_le<uint64_t>(bytes.data(), at);
  h.layer = get_le<uint32_t>(bytes.data(), at);
  h.seq = get_le<uint32_t>(bytes.data(), at);
  h.payload_bytes = get_le<uint64_t>(bytes.data(), at);
  h.payload_checksum = get_le<uint64_t>(bytes.data(), at);
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
    return Status::error(fmt::format("request {}: {} declares a {}-byte payload, limit {}", h.request_id,
                                     wire_type_name(h.type), h.payload_bytes, limit));
  out = h;
  return Status::ok();
}

Status verify_wire_payload(const WireHeader& header, std::span<const std::byte> payload) {
  if (payload.size() != header.payload_bytes)
    return Status::error(fmt::format("request {}: {} payload is {} bytes, header says {}", header.request_id,
                                     wire_type_name(header.type), payload.size(), header.payload_bytes));
  const uint64_t sum = wire_checksum(payload);
  if (sum != header.payload_checksum)
    return Status::error(fmt::format("request {}: {} (layer {}) payload checksum {:#018x} != header {:#018x}",
                                     header.request_id, wire_type_name(header.type), header.layer, sum,
                                     header.payload_checksum));
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
  return "unauthenticated";
}

std::array<std::byte, kWireTagBytes> WireAuth::tag(std::span<const std::byte> header, std::span<const std::byte> payload,
                                                   WireChannel channel) const {
  std::array<std::byte, kWireTagBytes> out{};
  HACK_CHECK(enabled_, "wire auth: no secret");
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(static_cast<EVP_MAC*>(mac_.get()));
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
  const auto ch = static_cast<unsigned char>(channel);
  size_t len = 0;
  const bool ok = ctx != nullptr && EVP_MAC_init(ctx, key_.data(), key_.size(), params) == 1 &&
                  EVP_MAC_update(ctx, &ch, 1) == 1 &&
                  EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(header.data()), header.size()) == 1 &&
                  EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(payload.data()), payload.size()) == 1 &&
                  EVP_MAC_final(ctx, reinterpret_cast<unsigned char*>(out.data()), &len, out.size()) == 1 &&
                  len == out.size();
  EVP_MAC_CTX_free(ctx);
  HACK_CHECK(ok, "wire auth: HMAC-SHA256 failed");
  return out;
}

std::vector<std::byte> WireAuth::seal(std::vector<std::byte> header, std::span<const std::byte> payload,
                                      WireChannel channel) const {
  if (!enabled_) return header;
  HACK_CHECK(header.size() == kWireHeaderBytes, "wire auth: sealing a {}-byte header", header.size());
  const auto t = tag(header, payload, channel);
  header.insert(header.end(), t.begin(), t.end());
  return header;
}

Status WireAuth::open(std::span<const std::byte> header, std::span<const std::byte> payload, WireChannel channel,
                      std::span<const std::byte>& plain) const {
  plain = {};
  if (!enabled_) {
    if (header.size() == kWireSealedHeaderBytes)
      return Status::error("an authenticated (sealed) message, but this node has no cluster secret: give every node "
                           "the same --secret-file");
    plain = header;
    return Status::ok();
  }
  if (header.size() != kWireSealedHeaderBytes)
    return Status::error(fmt::format("unauthenticated message ({}-byte header, no MAC): the sender lacks the cluster "
                                     "secret", header.size()));
  const auto body = header.first(kWireHeaderBytes);
  const auto want = tag(body, payload, channel);
  if (CRYPTO_memcmp(want.data(), header.data() + kWireHeaderBytes, kWireTagBytes) != 0)
    return Status::error("bad MAC: the message was not sealed with this cluster's secret (or was altered)");
  plain = body;
  return Status::ok();
}

}  // namespace hack::net
