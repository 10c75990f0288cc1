// The vault's call payloads (net/vault_protocol.h): round trips, and every malformed payload
// refused with an error instead of a crash or an out-of-bounds read.
#include <catch2/catch.hpp>

#include <random>

#include "hack/core/error.h"
#include "hack/net/vault_protocol.h"

using namespace hack;
using namespace hack::net;

namespace {

BlockKey key_of(uint8_t seed) {
  BlockKey k;
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(seed * 31 + i);
  return k;
}

}  // namespace

TEST_CASE("vault store and keys messages round-trip", "[vault_protocol]") {
  std::vector<std::byte> value(100);
  for (size_t i = 0; i < value.size(); ++i) value[i] = std::byte(i);
  VaultStoreMessage m{"tenant-a", true, 2, key_of(1), key_of(2), 0x1234567890abcdefull, value};
  const auto bytes = encode_vault_store(m);
  const VaultStoreMessage d = decode_vault_store(bytes);
  CHECK(d.name_space == "tenant-a");
  CHECK(d.first);
  CHECK(d.codec == 2);
  CHECK(d.key == key_of(1));
  CHECK(d.parent == key_of(2));
  CHECK(d.checksum == 0x1234567890abcdefull);
  CHECK(std::equal(d.value.begin(), d.value.end(), value.begin(), value.end()));

  VaultKeysMessage k{"default", 7, {key_of(3), key_of(4), key_of(5)}};
  const VaultKeysMessage kd = decode_vault_keys(encode_vault_keys(k));
  CHECK(kd.name_space == "default");
  CHECK(kd.max_blocks == 7);
  CHECK(kd.keys == k.keys);
  CHECK(decode_vault_count(encode_vault_count(42)) == 42);
}

TEST_CASE("vault namespaces are checked", "[vault_protocol]") {
  CHECK_NOTHROW(check_vault_namespace("a.b_c-D9"));
  CHECK_THROWS_AS(check_vault_namespace(""), Error);
  CHECK_THROWS_AS(check_vault_namespace("a/b"), Error);
  CHECK_THROWS_AS(check_vault_namespace(std::string(256, 'a')), Error);
  std::vector<std::byte> value(4);
  CHECK_THROWS_AS(encode_vault_store({"bad ns", false, 1, {}, {}, 0, value}), Error);
}

TEST_CASE("malformed vault messages are refused", "[vault_protocol]") {
  std::vector<std::byte> value(16);
  const auto store = encode_vault_store({"ns", false, 1, key_of(1), key_of(0), 5, value});
  // Truncated anywhere before the value: an error (the value may not be empty either).
  for (size_t n = 0; n <= 80 + 2; ++n) {
    CHECK_THROWS_AS(decode_vault_store(std::span<const std::byte>(store).first(n)), Error);
  }
  auto bad_flags = store;
  bad_flags[2] = std::byte{0x80};
  CHECK_THROWS_WITH(decode_vault_store(bad_flags), Catch::Contains("flags"));

  const auto keys = encode_vault_keys({"ns", 0, {key_of(1), key_of(2)}});
  auto short_keys = keys;
  short_keys.pop_back();
  CHECK_THROWS_WITH(decode_vault_keys(short_keys), Catch::Contains("keys need"));
  auto too_many = keys;
  too_many[4] = std::byte{0xff};
  too_many[5] = std::byte{0xff};
  CHECK_THROWS_AS(decode_vault_keys(too_many), Error);
  CHECK_THROWS_AS(decode_vault_count(std::vector<std::byte>(7)), Error);
  CHECK_THROWS_AS(decode_vault_count(std::vector<std::byte>(9)), Error);
}

TEST_CASE("random mutations of vault messages never crash the decoders", "[vault_protocol]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<std::byte> value(64);
  const std::vector<std::vector<std::byte>> messages = {
      encode_vault_store({"ns", true, 1, key_of(1), key_of(0), 5, value}),
      encode_vault_keys({"tenant", 3, {key_of(1), key_of(2), key_of(3)}}),
      encode_vault_promote_head(2, {}, {}),
  };
  size_t refused = 0;
  for (int i = 0; i < 30000; ++i) {
    auto m = messages[static_cast<size_t>(i) % messages.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      if (m.empty()) break;
      switch (rng() % 3) {
        case 0: m[rng() % m.size()] = std::byte(rng()); break;
        case 1: m.resize(rng() % (m.size() + 1)); break;
        default: m.insert(m.begin() + static_cast<std::ptrdiff_t>(rng() % (m.size() + 1)), std::byte(rng()));
      }
    }
    try {
      switch (i % 3) {
        case 0: (void)decode_vault_store(m); break;
        case 1: (void)decode_vault_keys(m); break;
        default: (void)decode_vault_promote_head(m);
      }
    } catch (const Error&) {
      ++refused;
    }
  }
  CHECK(refused > 1000);  // most mutations break something and must be reported, not ignored
}
