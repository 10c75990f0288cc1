#include "src/tokenizer/added_vocabulary.h"

#include <utf8proc.h>

#include <algorithm>

#include "src/tokenizer/normalizer.h"
#include "src/tokenizer/utf8.h"

namespace hack::tok {

// ---- TokenTrie ---------------------------------------------------------------

TokenTrie::TokenTrie() {
  nodes_.emplace_back();
  root_.fill(-1);
}

int TokenTrie::child(int node, unsigned char c) const {
  if (node == 0) return root_[c];
  const auto& ch = nodes_[node].children;
  const auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, -1));
  return it != ch.end() && it->first == c ? it->second : -1;
}

void TokenTrie::add(std::string_view pattern, int value) {
  if (pattern.empty()) return;
  int node = 0;
  for (unsigned char c : pattern) {
    int next = child(node, c);
    if (next < 0) {
      next = static_cast<int>(nodes_.size());
      nodes_.emplace_back();
      if (node == 0) {
        root_[c] = next;
      } else {
        auto& ch = nodes_[node].children;
        ch.insert(std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, -1)), {c, next});
      }
    }
    node = next;
  }
  if (nodes_[node].value < 0) nodes_[node].value = value;
}

int TokenTrie::longest_at(std::string_view text, size_t pos, size_t* len) const {
  int node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    node = child(node, static_cast<unsigned char>(text[i]));
    if (node < 0) break;
    if (nodes_[node].value >= 0) {
      best = nodes_[node].value;
      *len = i + 1 - pos;
    }
  }
  return best;
}

// ---- AddedVocabulary ---------------------------------------------------------

namespace {

// Rust regex `\w`: Alphabetic, marks, decimal numbers, connector punctuation, joiners.
bool is_word_char(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// Start of the whitespace run that ends `s` (s.size() when there is none).
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    int len = 0;
    if (!is_unicode_whitespace(last_code_point(s.substr(0, end), &len))) break;
    end -= static_cast<size_t>(len);
  }
  return end;
}

// Length of the whitespace run that starts `s`.
size_t leading_space_length(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!is_unicode_whitespace(next_code_point(s, next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens, const std::vector<std::string>& normalized_contents)
    : tokens_(std::move(tokens)) {
  // HF orders the patterns: special tokens first, then the others, each in file order.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < tokens_.size(); ++i) {
      const AddedToken& t = tokens_[i];
      if (t.special != (pass == 0) || t.content.empty()) continue;
      if (t.normalized) {
        normalized_trie_.add(normalized_contents[i], static_cast<int>(i));
      } else {
        raw_trie_.add(t.content, static_cast<int>(i));
      }
    }
  }
}

void AddedVocabulary::split(std::string_view text, bool normalized_set, std::vector<AddedSplit>& out) const {
  out.clear();
  const TokenTrie& trie = normalized_set ? normalized_trie_ : raw_trie_;
  if (trie.empty()) {
    out.push_back({0, text.size(), -1});
    return;
  }
  size_t start_offset = 0;
  size_t pos = 0;
  const size_t n = text.size();
  while (pos < n) {
    if (!trie.can_start(static_cast<unsigned char>(text[pos]))) {
      ++pos;
      continue;
    }
    size_t len = 0;
    const int index = trie.longest_at(text, pos, &len);
    if (index < 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + len;
    pos = stop;  // the automaton resumes after the match, whether it is kept or not
    const AddedToken& token = tokens_[index];
    if (token.single_word) {
      const bool start_space = start == 0 || !is_word_char(last_code_point(text.substr(0, start)));
      size_t p = stop;
      const bool stop_space = stop == n || !is_word_char(next_code_point(text, p));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
    if (token.rstrip) stop += leading_space_length(text.substr(stop));
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, token.id});
    start_offset = stop;
  }
  if (start_offset < n) out.push_back({start_offset, n, -1});
}

}  // namespace hack::tok
