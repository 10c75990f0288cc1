#include "hack/grammar/token_vocabulary.h"

#include <algorithm>
#include <array>
#include <numeric>

#include "hack/core/error.h"
#include "hack/tokenizer/tokenizer.h"

namespace hack::grammar {

namespace {

// GPT-2's bytes_to_unicode inverted: code point -> byte, -1 outside its 256-character alphabet.
std::array<int16_t, 324> gpt2_byte_of_code_point() {
  std::array<int16_t, 324> byte_of{};
  byte_of.fill(-1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    byte_of[static_cast<size_t>(printable ? b : 256 + extra++)] = static_cast<int16_t>(b);
  }
  return byte_of;
}

}  // namespace

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {
  std::vector<int> order;
  for (int id = 0; id < size(); ++id) {
    if (!bytes_[static_cast<size_t>(id)].empty()) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)] || (bytes_[static_cast<size_t>(a)] == bytes_[static_cast<size_t>(b)] && a < b);
  });
  trie_.push_back(TrieNode{});
  std::vector<uint32_t> path{0};  // path[d]: the node at depth d of the current token
  std::string_view prev;
  for (int id : order) {
    const std::string_view s = bytes_[static_cast<size_t>(id)];
    HACK_CHECK(s.size() < 65535, "token {} is {} bytes long", id, s.size());
    max_token_bytes_ = std::max(max_token_bytes_, static_cast<int>(s.size()));
    size_t common = 0;
    while (common < s.size() && common < prev.size() && s[common] == prev[common]) ++common;
    while (path.size() > common + 1) {
      trie_[path.back()].subtree_end = static_cast<uint32_t>(trie_.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      TrieNode n;
      n.byte = static_cast<uint8_t>(s[d]);
      n.depth = static_cast<uint16_t>(d + 1);
      n.tokens_begin = n.tokens_end = static_cast<uint32_t>(trie_tokens_.size());
      path.push_back(static_cast<uint32_t>(trie_.size()));
      trie_.push_back(n);
    }
    // Tokens are appended in trie preorder, so each node's tokens are contiguous.
    TrieNode& last = trie_[path.back()];
    if (last.tokens_begin == last.tokens_end) last.tokens_begin = static_cast<uint32_t>(trie_tokens_.size());
    trie_tokens_.push_back(id);
    last.tokens_end = static_cast<uint32_t>(trie_tokens_.size());
    prev = s;
  }
  while (!path.empty()) {
    trie_[path.back()].subtree_end = static_cast<uint32_t>(trie_.size());
    path.pop_back();
  }
}

TokenVocabulary TokenVocabulary::from_tokenizer(const Tokenizer& tokenizer) {
  static const std::array<int16_t, 324> byte_of = gpt2_byte_of_code_point();
  const int n = tokenizer.vocab_size();
  std::vector<std::string> bytes(static_cast<size_t>(n));
  for (int id = 0; id < n; ++id) {
    if (tokenizer.is_special(id)) continue;
    const std::optional<std::string> piece = tokenizer.id_to_token(id);
    if (!piece) continue;
    // Byte-level: every character of the piece is one byte of the GPT-2 alphabet.
    std::string out;
    bool mapped = true;
    for (size_t i = 0; i < piece->size() && mapped;) {
      const auto c = static_cast<unsigned char>((*piece)[i]);
      const int len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      uint32_t cp = len == 1 ? c : c & (0x7F >> len);
      for (int k = 1; k < len && i + static_cast<size_t>(k) < piece->size(); ++k) {
        cp = (cp << 6) | (static_cast<unsigned char>((*piece)[i + static_cast<size_t>(k)]) & 0x3F);
      }
      i += static_cast<size_t>(len);
      if (cp < byte_of.size() && byte_of[cp] >= 0) {
        out.push_back(static_cast<char>(byte_of[cp]));
      } else {
        mapped = false;
      }
    }
    bytes[static_cast<size_t>(id)] = mapped ? std::move(out) : tokenizer.decode(std::span<const int>(&id, 1), false);
  }
  return TokenVocabulary(std::move(bytes));
}

}  // namespace hack::grammar
