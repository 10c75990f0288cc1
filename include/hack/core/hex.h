/// @file hex.h
/// @brief Bytes as lower-case hex and back (block keys, UCX worker addresses).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hack/core/error.h"

namespace hack {

/// Lower-case hex of `bytes`, two digits per byte.
inline std::string hex_encode(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(bytes.size() * 2, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

/// The bytes of `hex` (digits of either case, an even number of them); throws hack::Error
/// starting with `what` for an odd length or a character that is no hex digit.
inline std::vector<uint8_t> hex_decode(std::string_view hex, std::string_view what) {
  auto digit = [&](char c) -> unsigned {
    if (c >= '0' && c <= '9') return static_cast<unsigned>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<unsigned>(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return static_cast<unsigned>(c - 'A' + 10);
    fail("{}: '{}' is not a hex digit", what, c);
  };
  if (hex.size() % 2 != 0) fail("{}: {} hex digits (an even number expected)", what, hex.size());
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(digit(hex[2 * i]) << 4 | digit(hex[2 * i + 1]));
  return out;
}

}  // namespace hack
