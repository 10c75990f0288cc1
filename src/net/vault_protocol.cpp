// Vault call payloads (include/hack/net/vault_protocol.h).
#include "hack/net/vault_protocol.h"

#include <xxhash.h>

#include <cstring>

#include "hack/core/error.h"

namespace hack::net {

namespace {

// Little-endian writer / bounds-checked reader (the format is little-endian, as is every
// supported host).
class Writer {
 public:
  explicit Writer(size_t reserve) { out_.reserve(reserve); }
  template <class T>
  void put(T value) {
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    out_.insert(out_.end(), p, p + sizeof value);
  }
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const std::byte*>(data);
    out_.insert(out_.end(), p, p + n);
  }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

class Reader {
 public:
  Reader(std::span<const std::byte> in, const char* what) : in_(in), what_(what) {}
  template <class T>
  T get() {
    T value;
    std::memcpy(&value, take(sizeof value).data(), sizeof value);
    return value;
  }
  std::span<const std::byte> take(size_t n) {
    if (n > in_.size() - at_) fail("{}: truncated ({} bytes, needed {} more at offset {})", what_, in_.size(), n, at_);
    auto s = in_.subspan(at_, n);
    at_ += n;
    return s;
  }
  BlockKey key() {
    BlockKey k;
    std::memcpy(k.data(), take(k.size()).data(), k.size());
    return k;
  }
  size_t left() const { return in_.size() - at_; }
  std::span<const std::byte> rest() { return take(left()); }
  void expect_end() const {
    if (at_ != in_.size()) fail("{}: {} unexpected bytes after the message", what_, in_.size() - at_);
  }

 private:
  std::span<const std::byte> in_;
  const char* what_;
  size_t at_ = 0;
};

std::string read_namespace(Reader& r, uint16_t bytes) {
  auto s = r.take(bytes);
  std::string ns(reinterpret_cast<const char*>(s.data()), s.size());
  check_vault_namespace(ns);
  return ns;
}

}  // namespace

void check_vault_namespace(std::string_view ns) {
  HACK_CHECK(!ns.empty() && ns.size() <= kVaultMaxNamespaceBytes, "vault namespace must be 1..{} bytes, got {}",
             kVaultMaxNamespaceBytes, ns.size());
  for (char c : ns) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    HACK_CHECK(ok, "vault namespace '{}' has a character outside [A-Za-z0-9._-]", ns);
  }
}

std::vector<std::byte> encode_vault_store(const VaultStoreMessage& m) {
  check_vault_namespace(m.name_space);
  Writer w(80 + m.name_space.size() + m.value.size());
  w.put(static_cast<uint16_t>(m.name_space.size()));
  w.put(static_cast<uint8_t>(m.first ? 1 : 0));
  w.put(m.codec);
  w.put(uint32_t{0});
  w.bytes(m.key.data(), m.key.size());
  w.bytes(m.parent.data(), m.parent.size());
  w.put(m.checksum);
  w.bytes(m.name_space.data(), m.name_space.size());
  w.bytes(m.value.data(), m.value.size());
  return w.take();
}

VaultStoreMessage decode_vault_store(std::span<const std::byte> payload) {
  Reader r(payload, "vault_store");
  VaultStoreMessage m;
  const auto ns_bytes = r.get<uint16_t>();
  const auto flags = r.get<uint8_t>();
  HACK_CHECK((flags & ~1u) == 0, "vault_store: unknown flags {:#x}", flags);
  m.first = flags & 1;
  m.codec = r.get<uint8_t>();
  HACK_CHECK(r.get<uint32_t>() == 0, "vault_store: reserved field is not zero");
  m.key = r.key();
  m.parent = r.key();
  m.checksum = r.get<uint64_t>();
  m.name_space = read_namespace(r, ns_bytes);
  m.value = r.rest();
  HACK_CHECK(!m.value.empty(), "vault_store: empty value");
  return m;
}

std::vector<std::byte> encode_vault_keys(const VaultKeysMessage& m) {
  check_vault_namespace(m.name_space);
  HACK_CHECK(m.keys.size() <= kVaultMaxKeys, "vault call: {} keys, at most {}", m.keys.size(), kVaultMaxKeys);
  Writer w(16 + m.name_space.size() + 32 * m.keys.size());
  w.put(static_cast<uint16_t>(m.name_space.size()));
  w.put(uint16_t{0});
  w.put(static_cast<uint32_t>(m.keys.size()));
  w.put(m.max_blocks);
  w.put(uint32_t{0});
  w.bytes(m.name_space.data(), m.name_space.size());
  for (const BlockKey& k : m.keys) w.bytes(k.data(), k.size());
  return w.take();
}

VaultKeysMessage decode_vault_keys(std::span<const std::byte> payload) {
  Reader r(payload, "vault keys");
  VaultKeysMessage m;
  const auto ns_bytes = r.get<uint16_t>();
  HACK_CHECK(r.get<uint16_t>() == 0, "vault keys: reserved field is not zero");
  const auto n = r.get<uint32_t>();
  HACK_CHECK(n <= kVaultMaxKeys, "vault keys: {} keys, at most {}", n, kVaultMaxKeys);
  m.max_blocks = r.get<uint32_t>();
  HACK_CHECK(r.get<uint32_t>() == 0, "vault keys: reserved field is not zero");
  m.name_space = read_namespace(r, ns_bytes);
  HACK_CHECK(r.left() == size_t{n} * 32, "vault keys: {} keys need {} bytes, {} left", n, size_t{n} * 32, r.left());
  m.keys.reserve(n);
  for (uint32_t i = 0; i < n; ++i) m.keys.push_back(r.key());
  return m;
}

std::vector<std::byte> encode_vault_count(uint64_t count) {
  Writer w(8);
  w.put(count);
  return w.take();
}

uint64_t decode_vault_count(std::span<const std::byte> payload) {
  Reader r(payload, "vault_count");
  const auto n = r.get<uint64_t>();
  r.expect_end();
  return n;
}

size_t kv_block_prefix_bytes(const KvBlockHeader& header) {
  return kKvBlockHeaderBytes + kKvBlockLayerEntryBytes * header.layers.size();
}

std::vector<std::byte> encode_vault_promote_head(int layers, std::span<const uint64_t> checksums,
                                                 std::span<const std::span<const std::byte>> header_bytes) {
  HACK_CHECK(checksums.size() == header_bytes.size(), "vault_promote_head: {} checksums for {} blocks",
             checksums.size(), header_bytes.size());
  size_t total = 8;
  for (auto h : header_bytes) total += 16 + h.size();
  Writer w(total);
  w.put(static_cast<uint32_t>(checksums.size()));
  w.put(static_cast<uint32_t>(layers));
  for (size_t i = 0; i < checksums.size(); ++i) {
    w.put(checksums[i]);
    w.put(static_cast<uint32_t>(header_bytes[i].size()));
    w.put(uint32_t{0});
    w.bytes(header_bytes[i].data(), header_bytes[i].size());
  }
  return w.take();
}

VaultPromoteHead decode_vault_promote_head(std::span<const std::byte> payload) {
  Reader r(payload, "vault_promote_head");
  VaultPromoteHead head;
  const auto n = r.get<uint32_t>();
  HACK_CHECK(n <= kVaultMaxKeys, "vault_promote_head: {} blocks, at most {}", n, kVaultMaxKeys);
  head.layers = static_cast<int>(r.get<uint32_t>());
  HACK_CHECK(head.layers > 0 && head.layers <= 1024, "vault_promote_head: {} layers", head.layers);
  for (uint32_t i = 0; i < n; ++i) {
    head.checksums.push_back(r.get<uint64_t>());
    const auto bytes = r.get<uint32_t>();
    HACK_CHECK(r.get<uint32_t>() == 0, "vault_promote_head: reserved field of block {} is not zero", i);
    const auto prefix = r.take(bytes);
    // The header alone: decode_kv_block_header checks slices lie inside the value, so hand it
    // a view as long as the table says the value is.
    KvBlockHeader h = decode_kv_block_prefix(prefix);
    HACK_CHECK(h.num_layers == head.layers, "vault_promote_head: block {} has {} layers, the head says {}", i,
               h.num_layers, head.layers);
    HACK_CHECK(kv_block_prefix_bytes(h) == bytes, "vault_promote_head: block {} header is {} bytes, expected {}", i,
               bytes, kv_block_prefix_bytes(h));
    head.headers.push_back(std::move(h));
  }
  r.expect_end();
  return head;
}

std::vector<std::span<const std::byte>> split_vault_promote_layer(const VaultPromoteHead& head, int layer,
                                                                  std::span<const std::byte> payload) {
  HACK_CHECK(layer >= 0 && layer < head.layers, "vault_promote_layer: layer {} outside [0, {})", layer, head.layers);
  Reader r(payload, "vault_promote_layer");
  std::vector<std::span<const std::byte>> slices;
  slices.reserve(head.headers.size());
  for (size_t i = 0; i < head.headers.size(); ++i) {
    const KvBlockLayer& entry = head.headers[i].layers[static_cast<size_t>(layer)];
    auto slice = r.take(entry.bytes);
    HACK_CHECK(XXH64(slice.data(), slice.size(), 0) == entry.checksum,
               "vault_promote_layer: block {} layer {} fails its checksum", i, layer);
    slices.push_back(slice);
  }
  r.expect_end();
  return slices;
}

}  // namespace hack::net
