// libFuzzer target: what a data-plane receiver does with untrusted bytes (net/wire.h,
// kv/hack_page.h, kv/kv_stream.h): open the AM header (MAC check with a fixed secret, or the
// plain header without one), decode and validate the wire header, check the payload against
// it, and decode the payload as the KV receiver would (HACK page layout and validation,
// exact-tokens header and its conversion to f32), for every page of a multi-page kv_page message.
//
// Input: byte 0 = mode (bit 0: authenticated), bytes 1-2 = the AM header's length (u16 LE, cut
// to what follows), then the AM header (wire v4: fixed part, page table, tag), then the
// payload. Oracle: a header that decodes must re-encode to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "hack/core/error.h"
#include "hack/kv/hack_page.h"
#include "hack/kv/kv_stream.h"
#include "hack/net/wire.h"

namespace {

using namespace hack::net;

void decode_payload(const WireHeader& header, std::span<const std::byte> payload) {
  try {
    if (header.type == WireType::kv_page) {
      size_t offset = 0;
      for (uint32_t bytes : header.page_bytes) {  // as KvReceiver splits the message
        const auto page = payload.subspan(offset, bytes);
        offset += bytes;
        try {
          const hack::HackPageLayout layout = hack::HackPageLayout::from_page(page.data(), page.size());
          layout.validate(page.data(), page.size());
          (void)hack::HackPageLayout::page_layer(page.data());
          (void)hack::HackPageLayout::page_first_token(page.data());
        } catch (const hack::Error&) {
        }
      }
    } else if (header.type == WireType::kv_exact || header.type == WireType::kv_exact_copy) {
      const hack::ExactTokensHeader exact = hack::decode_exact_header(payload);
      std::vector<float> k, v;
      hack::exact_tokens_f32(exact, payload, k, v);
    }
  } catch (const hack::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const WireAuth sealed_auth("fuzz-cluster-secret");
  static const WireAuth plain_auth;
  if (size < 3) return 0;
  const auto mode = data[0];
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data) + 3, size - 3);
  const WireAuth& auth = (mode & 1) ? sealed_auth : plain_auth;
  const size_t header_len = std::min(static_cast<size_t>(data[1] | data[2] << 8), in.size());
  const auto am_header = in.first(header_len);
  const auto payload = in.subspan(header_len);

  std::span<const std::byte> plain;
  if (!auth.open(am_header, payload, WireChannel::data, plain)) {
    // Also the path of a forged message whose header is fine: decode the header anyway, as a
    // fuzz of decode_wire_header alone.
    WireHeader h;
    (void)decode_wire_header(am_header, h);
    (void)wire_header_request(am_header);
    return 0;
  }
  WireHeader header;
  if (!decode_wire_header(plain, header)) return 0;
  const std::vector<std::byte> again = encode_wire_header(header);
  if (again.size() != plain.size() || std::memcmp(again.data(), plain.data(), again.size()) != 0) std::abort();
  if (!verify_wire_payload(header, payload)) return 0;
  decode_payload(header, payload);
  return 0;
}
