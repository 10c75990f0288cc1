#include "src/tokenizer/byte_level.h"

#include "src/tokenizer/utf8.h"

namespace hack::tok {

ByteLevelTable::ByteLevelTable() {
  byte_of_.fill(-1);
  int next_extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next_extra++);
    std::string s;
    append_utf8(s, cp);
    len_[b] = static_cast<uint8_t>(s.size());
    for (size_t i = 0; i < s.size(); ++i) utf8_[b][i] = s[i];
    byte_of_[cp] = static_cast<int16_t>(b);
  }
}

const ByteLevelTable& ByteLevelTable::get() {
  static const ByteLevelTable table;
  return table;
}

}  // namespace hack::tok
