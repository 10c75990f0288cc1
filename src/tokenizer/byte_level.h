// GPT-2's reversible byte <-> printable-character mapping (bytes_to_unicode), used by the
// ByteLevel pre-tokenizer, normalizer and decoder.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace hack::tok {

class ByteLevelTable {
 public:
  /// The process-wide immutable table (built once, thread-safe).
  static const ByteLevelTable& get();

  /// UTF-8 of the character byte b maps to (1 or 2 bytes).
  std::string_view encode(unsigned char b) const { return {utf8_[b].data(), len_[b]}; }
  /// Appends the mapped characters of every byte of `bytes` to `out`.
  void encode_append(std::string& out, std::string_view bytes) const {
    for (unsigned char b : bytes) out.append(utf8_[b].data(), len_[b]);
  }
  /// The byte a code point stands for, or -1 if it is not in the 256-character alphabet.
  int decode(char32_t cp) const { return cp < kChars ? byte_of_[cp] : -1; }

 private:
  ByteLevelTable();
  static constexpr char32_t kChars = 324;  // the alphabet lies in U+0021..U+0143
  std::array<std::array<char, 2>, 256> utf8_{};
  std::array<uint8_t, 256> len_{};
  std::array<int16_t, kChars> byte_of_{};
};

}  // namespace hack::tok
