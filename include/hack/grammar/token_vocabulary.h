/// @file token_vocabulary.h
/// @brief Token id → bytes, and a byte trie over the vocabulary for mask computation.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hack {
class Tokenizer;
}

namespace hack::grammar {

/// The vocabulary as byte strings. A token with no bytes (special tokens, empty tokens) is
/// never allowed by a grammar. Immutable once built.
class TokenVocabulary {
 public:
  /// A trie node, in preorder: node 0 is the root (the empty prefix).
  struct TrieNode {
    uint8_t byte = 0;            ///< the byte on the edge from the parent
    uint16_t depth = 0;          ///< bytes from the root
    uint32_t subtree_end = 0;    ///< one past the last node of this subtree (skip target)
    uint32_t tokens_begin = 0;   ///< [tokens_begin, tokens_end) in trie_tokens(): tokens whose bytes end here
    uint32_t tokens_end = 0;
  };

  /// token_bytes[id]: the bytes of token id.
  explicit TokenVocabulary(std::vector<std::string> token_bytes);
  /// From a tokenizer: byte-level BPE tokens map back through the GPT-2 byte table; other
  /// tokens use their decoded text; special tokens get no bytes.
  static TokenVocabulary from_tokenizer(const Tokenizer& tokenizer);

  int size() const { return static_cast<int>(bytes_.size()); }
  std::string_view bytes(int id) const { return bytes_[static_cast<size_t>(id)]; }
  const std::vector<TrieNode>& trie() const { return trie_; }
  const std::vector<int>& trie_tokens() const { return trie_tokens_; }
  int max_token_bytes() const { return max_token_bytes_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<TrieNode> trie_;
  std::vector<int> trie_tokens_;
  int max_token_bytes_ = 0;
};

}  // namespace hack::grammar
