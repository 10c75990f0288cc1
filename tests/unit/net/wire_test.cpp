// Wire header: round trip, every validation failure as a Status, and random bytes that
// never crash the decoder.
#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include "hack/net/wire.h"
#include "net_test_util.h"
#include <filesystem>

using namespace hack;
using namespace hack::net;

namespace {

std::vector<std::byte> encoded(const WireHeader& h) { return encode_wire_header(h); }

}  // namespace

TEST_CASE("wire header round trips and verifies its payload", "[net][wire]") {
  const auto payload = test::random_bytes(1000, 7);
  const WireHeader h = make_wire_header(WireType::kv_page, 0x1122334455667788ull, 31, 12345, payload);
  const auto bytes = encoded(h);
  // Fixed little-endian layout: magic "HKWR" first.
  CHECK(std::memcmp(bytes.data(), "HKWR", 4) == 0);

  WireHeader out;
  REQUIRE(decode_wire_header(bytes, out).is_ok());
  CHECK(out.type == WireType::kv_page);
  CHECK(out.request_id == 0x1122334455667788ull);
  CHECK(out.layer == 31);
  CHECK(out.seq == 12345);
  CHECK(out.payload_bytes == 1000);
  CHECK(verify_wire_payload(out, payload).is_ok());
}

TEST_CASE("wire header rejects bad magic, version, type, size and length", "[net][wire]") {
  const auto payload = test::random_bytes(64, 8);
  const auto good = encoded(make_wire_header(WireType::kv_layer_done, 5, 2, 3, {}));
  WireHeader out;
  out.request_id = 99;

  auto bad = good;
  bad[0] ^= std::byte{1};
  Status s = decode_wire_header(bad, out);
  CHECK_FALSE(s.is_ok());
  CHECK_THAT(s.message(), Catch::Contains("magic"));
  CHECK(out.request_id == 99);  // untouched on failure

  bad = good;
  bad[4] = std::byte{1};  // version 1: a peer from before the XXH3 checksum
  s = decode_wire_header(bad, out);
  CHECK_THAT(s.message(), Catch::Contains("version 1"));

  bad = good;
  bad[6] = std::byte{77};  // type 77
  CHECK_THAT(decode_wire_header(bad, out).message(), Catch::Contains("unknown message type 77"));

  CHECK_THAT(decode_wire_header(std::span(good).first(39), out).message(), Catch::Contains("39 bytes"));

  // kv_layer_done carries no payload; one that declares one is refused.
  const auto with_payload = encoded(make_wire_header(WireType::kv_layer_done, 5, 2, 3, payload));
  CHECK_THAT(decode_wire_header(with_payload, out).message(), Catch::Contains("limit 0"));
  // A page larger than the wire limit.
  WireHeader huge = make_wire_header(WireType::kv_page, 6, 0, 0, {});
  huge.payload_bytes = kWireMaxPayloadBytes + 1;
  CHECK_FALSE(decode_wire_header(encoded(huge), out).is_ok());
  // request_done carries a small document (up to 64 KiB), kv_exact a KV payload.
  WireHeader done = make_wire_header(WireType::request_done, 7, 0, 9, payload);
  CHECK(decode_wire_header(encoded(done), out).is_ok());
  CHECK(out.type == WireType::request_done);
  CHECK(out.payload_bytes == payload.size());
  done.payload_bytes = kWireMaxDoneBytes + 1;
  CHECK_THAT(decode_wire_header(encoded(done), out).message(), Catch::Contains("limit 65536"));
  const WireHeader exact = make_wire_header(WireType::kv_exact, 8, 3, 1, payload);
  REQUIRE(decode_wire_header(encoded(exact), out).is_ok());
  CHECK(out.type == WireType::kv_exact);
  CHECK(std::string(wire_type_name(WireType::kv_exact)) == "kv_exact");
  bad = encoded(exact);
  bad[6] = std::byte{18};  // one past the last type
  CHECK_THAT(decode_wire_header(bad, out).message(), Catch::Contains("unknown message type 18"));
  CHECK(std::string(wire_type_name(WireType::vault_promote_layer)) == "vault_promote_layer");
  CHECK(std::string(wire_type_name(WireType::kv_exact_copy)) == "kv_exact_copy");
}

TEST_CASE("wire payload check catches a flipped byte and a wrong length", "[net][wire]") {
  auto payload = test::random_bytes(4096, 9);
  const WireHeader h = make_wire_header(WireType::kv_page, 1, 0, 0, payload);
  payload[100] ^= std::byte{0x10};
  Status s = verify_wire_payload(h, payload);
  CHECK_FALSE(s.is_ok());
  CHECK_THAT(s.message(), Catch::Contains("checksum"));
  CHECK_THAT(s.message(), Catch::Contains("request 1"));
  s = verify_wire_payload(h, std::span(payload).first(4095));
  CHECK_THAT(s.message(), Catch::Contains("4095 bytes"));
}

TEST_CASE("wire decoder survives random and mutated headers", "[net][wire]") {
  const uint64_t seed = 20261121;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const auto good = encoded(make_wire_header(WireType::kv_page, 42, 3, 4, test::random_bytes(100, 1)));
  int accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    std::vector<std::byte> bytes;
    if (i % 2 == 0) {
      bytes = test::random_bytes(rng() % 80, rng());  // any length, any content
    } else {
      bytes.assign(good.begin(), good.end());         // a valid header with a few bits flipped
      const int flips = 1 + static_cast<int>(rng() % 3);
      for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] ^= static_cast<std::byte>(1u << (rng() % 8));
    }
    WireHeader out;
    if (decode_wire_header(bytes, out).is_ok()) {
      ++accepted;
      // Whatever decodes is within the limits, and a payload check then fails cleanly.
      CHECK(out.payload_bytes <= kWireMaxPayloadBytes);
      if (out.payload_bytes != 0) CHECK_FALSE(verify_wire_payload(out, std::span<const std::byte>()).is_ok());
    }
  }
  // Flips in request id / layer / seq / checksum leave a decodable header.
  CHECK(accepted > 0);
}

TEST_CASE("wire auth: a sealed message opens only with its secret, channel, header and payload", "[net][wire][auth]") {
  const WireAuth auth("s3cret"), other("s3cret!"), off;
  const std::vector<std::byte> payload = {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}};
  const auto header = encode_wire_header(make_wire_header(WireType::kv_page, 42, 3, 7, payload));
  const auto sealed = auth.seal(header, payload, WireChannel::data);
  REQUIRE(header.size() == kWireHeaderBytes + 4);  // one page: a one-entry page table
  REQUIRE(sealed.size() == header.size() + kWireTagBytes);
  std::span<const std::byte> plain;
  REQUIRE(auth.open(sealed, payload, WireChannel::data, plain).is_ok());
  CHECK(std::vector<std::byte>(plain.begin(), plain.end()) == header);

  // Another secret, the other channel (a reflected message), no tag at all.
  CHECK_FALSE(other.open(sealed, payload, WireChannel::data, plain).is_ok());
  CHECK(plain.empty());
  CHECK_FALSE(auth.open(sealed, payload, WireChannel::reply, plain).is_ok());
  const Status unsealed = auth.open(header, payload, WireChannel::data, plain);
  CHECK_FALSE(unsealed.is_ok());
  CHECK(unsealed.message().find("unauthenticated") != std::string::npos);
  // A node without a secret takes plain headers and refuses sealed ones.
  CHECK(off.open(header, payload, WireChannel::data, plain).is_ok());
  CHECK_FALSE(off.open(sealed, payload, WireChannel::data, plain).is_ok());
  CHECK(off.seal(header, payload, WireChannel::data) == header);

  // Every single-bit change of header, tag or payload is caught: by the MAC, except in the
  // version (named as such) and the page count (which moves where the tag starts).
  for (size_t i = 0; i < sealed.size() * 8; ++i) {
    auto bad = sealed;
    bad[i / 8] ^= static_cast<std::byte>(1u << (i % 8));
    INFO("header bit " << i);
    const Status s = auth.open(bad, payload, WireChannel::data, plain);
    CHECK_FALSE(s.is_ok());
    const size_t byte = i / 8;
    const char* expected = byte == 4 || byte == 5     ? "wire version"
                           : byte >= 40 && byte < 44 ? "unauthenticated"
                                                     : "bad MAC";
    CHECK(s.message().find(expected) != std::string::npos);
  }
  for (size_t i = 0; i < payload.size() * 8; ++i) {
    auto bad = payload;
    bad[i / 8] ^= static_cast<std::byte>(1u << (i % 8));
    INFO("payload bit " << i);
    CHECK_FALSE(auth.open(sealed, bad, WireChannel::data, plain).is_ok());
  }
}

TEST_CASE("wire auth: the tag is HMAC-SHA256 as Python's hmac module computes it", "[net][wire][auth]") {
  // Golden value from an independent implementation:
  //   k = hmac.new(b"Jefe", b"hackserve wire auth v1", sha256).digest()
  //   hmac.new(k, b"\x01" + b"abc" + b"def", sha256).hexdigest()
  const WireAuth auth("Jefe");
  const auto bytes = [](std::string_view s) {
    std::vector<std::byte> out;
    for (char c : s) out.push_back(static_cast<std::byte>(c));
    return out;
  };
  const auto tag = auth.tag(bytes("abc"), bytes("def"), WireChannel::data);
  std::string hex;
  for (std::byte b : tag) hex += fmt::format("{:02x}", static_cast<unsigned>(b));
  CHECK(hex == "f8b1b516e4a0841126c37eda4950321bd0bf07d1a1b7ace5a5dc795c17ba649d");
  CHECK(auth.tag(bytes("abc"), bytes("def"), WireChannel::reply) != tag);
}

TEST_CASE("the wire fuzz seeds speak this wire version: header, checksum and seal all check", "[net][wire]") {
  // tests/fixtures/fuzz/wire: byte 0 the fuzz mode (bit 0 sealed), a u16 LE AM header length,
  // then the AM header and payload (tests/fuzz/fuzz_wire.cpp). A seed from an older version
  // would stop at the version check and fuzz nothing behind it. bad_*: deliberately malformed.
  const WireAuth auth("fuzz-cluster-secret");
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(HACK_SOURCE_DIR) / "tests" / "fixtures" / "fuzz" / "wire")) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<char> raw{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    REQUIRE(!raw.empty());
    const auto mode = static_cast<uint8_t>(raw[0]);
    if (entry.path().filename().string().starts_with("bad_")) continue;
    INFO(entry.path().filename().string());
    REQUIRE(raw.size() >= 3);
    const size_t header_len = static_cast<uint8_t>(raw[1]) | size_t{static_cast<uint8_t>(raw[2])} << 8;
    const auto bytes = std::span(reinterpret_cast<const std::byte*>(raw.data()) + 3, raw.size() - 3);
    REQUIRE(bytes.size() >= header_len);
    std::span<const std::byte> plain;
    REQUIRE(((mode & 1) ? auth : WireAuth()).open(bytes.first(header_len), bytes.subspan(header_len), WireChannel::data, plain).is_ok());
    WireHeader header;
    REQUIRE(decode_wire_header(plain, header).is_ok());
    CHECK(verify_wire_payload(header, bytes.subspan(header_len)).is_ok());
    ++checked;
  }
  CHECK(checked >= 10);
}

TEST_CASE("wire v4: a multi-page kv_page header round trips and its checksum covers every page", "[net][wire][pages]") {
  const std::vector<std::vector<std::byte>> pages = {test::random_bytes(1, 1), test::random_bytes(4097, 2),
                                                     test::random_bytes(65536, 3)};
  std::vector<std::byte> payload;
  std::vector<uint32_t> lengths;
  std::vector<uint64_t> sums;
  for (const auto& p : pages) {
    payload.insert(payload.end(), p.begin(), p.end());
    lengths.push_back(static_cast<uint32_t>(p.size()));
    sums.push_back(wire_checksum(p));
  }
  const WireHeader h = make_pages_header(9, 4, 17, lengths, sums);
  CHECK(h.payload_bytes == payload.size());
  const auto bytes = encoded(h);
  CHECK(bytes.size() == kWireHeaderBytes + 4 * pages.size());
  WireHeader out;
  REQUIRE(decode_wire_header(bytes, out).is_ok());
  CHECK(out.page_bytes == lengths);
  CHECK(out.layer == 4);
  CHECK(out.seq == 17);
  CHECK(encoded(out) == bytes);
  CHECK(verify_wire_payload(out, payload).is_ok());
  CHECK(wire_header_request(bytes) == std::optional<uint64_t>(9));
  // A flipped byte in any page, or two pages swapped, fails the check.
  for (size_t at : {size_t{0}, size_t{1}, size_t{3000}, payload.size() - 1}) {
    auto bad = payload;
    bad[at] ^= std::byte{0x01};
    INFO("byte " << at);
    CHECK_THAT(verify_wire_payload(out, bad).message(), Catch::Contains("3 pages"));
  }
  WireHeader swapped = make_pages_header(9, 4, 17, {lengths[1], lengths[0], lengths[2]}, std::vector<uint64_t>{sums[1], sums[0], sums[2]});
  CHECK_FALSE(verify_wire_payload(swapped, payload).is_ok());
}

TEST_CASE("wire v4: an unchecked kv_page carries lengths only and the flag is refused on other types",
          "[net][wire][pages]") {
  const auto payload = test::random_bytes(300, 6);
  const WireHeader h = make_pages_header(21, 2, 5, {100, 200}, {});
  CHECK(h.unchecked);
  CHECK(h.payload_checksum == 0);
  const auto bytes = encoded(h);
  CHECK(bytes[44] == std::byte{1});  // flags: kWireFlagUnchecked
  WireHeader out;
  REQUIRE(decode_wire_header(bytes, out).is_ok());
  CHECK(out.unchecked);
  CHECK(encoded(out) == bytes);
  // Any bytes of the declared lengths pass; a wrong length does not.
  auto flipped = payload;
  flipped[150] ^= std::byte{0xFF};
  CHECK(verify_wire_payload(out, flipped).is_ok());
  CHECK_THAT(verify_wire_payload(out, std::span(payload).first(299)).message(), Catch::Contains("header says 300"));
  // A checked header of the same pages is not unchecked, and verifies its bytes.
  const std::vector<uint64_t> sums = {wire_checksum(std::span(payload).first(100)),
                                      wire_checksum(std::span(payload).subspan(100))};
  const WireHeader checked = make_pages_header(21, 2, 5, {100, 200}, sums);
  CHECK_FALSE(checked.unchecked);
  CHECK(encoded(checked)[44] == std::byte{0});
  CHECK_FALSE(verify_wire_payload(checked, flipped).is_ok());
  // Only kv_page may be unchecked.
  auto done = encoded(make_wire_header(WireType::request_done, 21, 0, 0, {}));
  done[44] = std::byte{1};
  CHECK_THAT(decode_wire_header(done, out).message(), Catch::Contains("only kv_page may be"));
}

TEST_CASE("wire v4: page tables that are cut short, overlong, lying or misplaced are refused", "[net][wire][pages]") {
  const std::vector<uint64_t> sums = {1, 2};
  const auto good = encoded(make_pages_header(12, 0, 0, {100, 200}, sums));
  WireHeader out;
  REQUIRE(decode_wire_header(good, out).is_ok());
  // Cut short / overlong: the length does not match the declared page count.
  CHECK_THAT(decode_wire_header(std::span(good).first(good.size() - 4), out).message(),
             Catch::Contains("truncated or overlong page table"));
  auto longer = good;
  longer.resize(good.size() + 4);
  CHECK_THAT(decode_wire_header(longer, out).message(), Catch::Contains("truncated or overlong page table"));
  // Lengths that do not sum to the payload.
  auto lying = good;
  lying[kWireHeaderBytes] = std::byte{101};
  CHECK_THAT(decode_wire_header(lying, out).message(), Catch::Contains("sums to 301 bytes"));
  // An empty page, zero pages, too many pages.
  CHECK_THAT(decode_wire_header(encoded(make_pages_header(12, 0, 0, {0, 300}, sums)), out).message(),
             Catch::Contains("page 0 of 2 is empty"));
  auto none = good;
  none[40] = std::byte{0};
  none.resize(kWireHeaderBytes);
  CHECK_THAT(decode_wire_header(none, out).message(), Catch::Contains("declares 0 pages"));
  auto many = good;
  many[41] = std::byte{1};  // 258 pages
  CHECK_THAT(decode_wire_header(many, out).message(), Catch::Contains("1 to 256 allowed"));
  // A table on a type that carries none; flags that are unknown, or unchecked with a checksum.
  auto layer_done = encoded(make_wire_header(WireType::kv_layer_done, 12, 0, 0, {}));
  layer_done[40] = std::byte{1};
  layer_done.resize(layer_done.size() + 4);
  CHECK_THAT(decode_wire_header(layer_done, out).message(), Catch::Contains("only kv_page carries pages"));
  auto unknown_flags = good;
  unknown_flags[44] = std::byte{2};
  CHECK_THAT(decode_wire_header(unknown_flags, out).message(), Catch::Contains("unknown flags 0x2"));
  auto unchecked_with_sum = good;
  unchecked_with_sum[44] = std::byte{1};
  CHECK_THAT(decode_wire_header(unchecked_with_sum, out).message(), Catch::Contains("must be 0"));
  // Each names its request, so a receiver can fail it (wire_header_request).
  CHECK(wire_header_request(lying) == std::optional<uint64_t>(12));
  CHECK(wire_header_request(std::span(good).first(40)) == std::nullopt);
  // Too many pages for one message is a sender bug, caught before anything is encoded.
  CHECK_THROWS_AS(wire_pages_checksum(std::vector<uint64_t>(kWireMaxPagesPerMessage + 1)), Error);
}

TEST_CASE("wire v4: a header of another version is named as such, with auth on or off", "[net][wire][pages]") {
  const auto payload = test::random_bytes(100, 4);
  // A v2 header: 40 bytes, version 2 (v2 had no page table), sealed or not.
  auto v2 = encoded(make_wire_header(WireType::kv_page, 3, 0, 0, payload));
  v2[4] = std::byte{2};
  v2.resize(40);
  WireHeader out;
  CHECK_THAT(decode_wire_header(v2, out).message(), Catch::Contains("wire version 2 is not supported (this build speaks 4)"));
  CHECK(wire_header_request(v2) == std::nullopt);
  // A v3 header (same layout, no flags): refused by its version, before anything else is read.
  auto v3 = encoded(make_wire_header(WireType::kv_page, 3, 0, 0, payload));
  v3[4] = std::byte{3};
  CHECK_THAT(decode_wire_header(v3, out).message(), Catch::Contains("wire version 3 is not supported (this build speaks 4)"));
  std::span<const std::byte> plain;
  const WireAuth on("s"), off;
  auto v2_sealed = v2;
  v2_sealed.resize(72);
  for (const WireAuth* auth : {&on, &off}) {
    const Status s = auth->open(v2_sealed, payload, WireChannel::data, plain);
    CHECK_THAT(s.message(), Catch::Contains("wire version 2"));
    CHECK(std::string(WireAuth::rejection_reason(s)) == "wire_version");
  }
}

TEST_CASE("wire auth: a tag over a payload in several spans equals the tag over it in one", "[net][wire][auth]") {
  const WireAuth auth("spans");
  const auto header = encoded(make_pages_header(1, 0, 0, {3, 5}, std::vector<uint64_t>{0, 0}));
  const auto payload = test::random_bytes(8, 5);
  const std::span<const std::byte> whole(payload);
  const std::vector<std::span<const std::byte>> parts = {whole.first(3), whole.subspan(3)};
  CHECK(auth.tag(header, whole, WireChannel::data) == auth.tag(header, parts, WireChannel::data));
  std::span<const std::byte> plain;
  CHECK(auth.open(auth.seal(header, parts, WireChannel::data), payload, WireChannel::data, plain).is_ok());
}
