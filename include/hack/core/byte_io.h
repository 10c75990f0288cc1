/// @file byte_io.h
/// @brief Little-endian fixed-width fields in byte buffers, for the versioned formats (wire
/// headers, HACK pages' neighbours: exact-token messages, KV blocks). The formats are
/// little-endian and so is every supported host (x86-64), so a field is one memcpy; callers
/// check bounds before they read.
#pragma once

#include <cstddef>
#include <cstring>

namespace hack {

/// Writes `value` at out + at and advances at.
template <class T>
void put_le(std::byte* out, size_t& at, T value) {
  std::memcpy(out + at, &value, sizeof(T));
  at += sizeof(T);
}

/// Reads a T at in + at and advances at.
template <class T>
T get_le(const std::byte* in, size_t& at) {
  T value;
  std::memcpy(&value, in + at, sizeof(T));
  at += sizeof(T);
  return value;
}

}  // namespace hack
