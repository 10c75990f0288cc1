// libFuzzer target: the vault's wire header and call payloads (net/wire.h,
// net/vault_protocol.h) as the vault and its clients decode untrusted bytes.
#include <cstddef>
#include <cstdint>
#include <span>

#include "hack/core/error.h"
#include "hack/net/vault_protocol.h"
#include "hack/net/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  if (in.size() >= hack::net::kWireHeaderBytes) {
    hack::net::WireHeader h;
    (void)hack::net::decode_wire_header(in.first(hack::net::kWireHeaderBytes), h);
  }
  const std::span<const std::byte> payload = in.empty() ? in : in.subspan(1);
  try {
    switch (in.empty() ? 0 : static_cast<int>(in[0]) % 4) {
      case 0: (void)hack::net::decode_vault_store(payload); break;
      case 1: (void)hack::net::decode_vault_keys(payload); break;
      case 2: (void)hack::net::decode_vault_count(payload); break;
      default: {
        const hack::net::VaultPromoteHead head = hack::net::decode_vault_promote_head(payload);
        if (!head.headers.empty()) (void)hack::net::split_vault_promote_layer(head, 0, payload);
      }
    }
  } catch (const hack::Error&) {
  }
  return 0;
}
