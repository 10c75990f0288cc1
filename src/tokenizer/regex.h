// PCRE2 (UTF + UCP, JIT) wrapper with the match iteration of the `onig` crate that HF
// tokenizers uses, so Split / Replace patterns from tokenizer.json behave the same.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace hack::tok {

/// Rewrites an Oniguruma pattern (what HF tokenizers compiles) so PCRE2 matches the same:
/// \s, \S, \p{L}, \P{L}, \p{N}, \P{N} become explicit classes with Oniguruma's members.
std::string translate_onig_pattern(std::string_view pattern);

/// Per-thread match state (match data, JIT stack). Create one per encode call or reuse it.
class RegexScratch {
 public:
  RegexScratch();
  ~RegexScratch();
  RegexScratch(const RegexScratch&) = delete;
  RegexScratch& operator=(const RegexScratch&) = delete;

 private:
  friend class Regex;
  pcre2_real_match_data_8* match_data_ = nullptr;
  pcre2_real_match_context_8* context_ = nullptr;
  pcre2_real_jit_stack_8* jit_stack_ = nullptr;
};

class Regex {
 public:
  /// Compiles `pattern` (an Oniguruma-style pattern from tokenizer.json). Throws hack::Error
  /// with PCRE2's message and the offset on a syntax error.
  explicit Regex(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  /// Calls fn(start, end) (byte offsets) for every match of the pattern in valid UTF-8
  /// `text`, left to right, skipping an empty match right where the previous match ended
  /// (onig's FindMatches).
  template <class F>
  void for_each_match(std::string_view text, RegexScratch& scratch, F&& fn) const {
    size_t last_end = 0;
    bool have_last = false;
    size_t last_match_end = 0;
    while (last_end <= text.size()) {
      size_t s = 0, e = 0;
      if (!find(text, last_end, scratch, &s, &e)) return;
      if (s == e && have_last && last_match_end == e) {
        last_end = next_char_end(text, last_end);
        continue;
      }
      last_end = e;
      have_last = true;
      last_match_end = e;
      fn(s, e);
    }
  }

  /// First match at or after `offset`; false when there is none.
  bool find(std::string_view text, size_t offset, RegexScratch& scratch, size_t* start, size_t* end) const;

  const std::string& pattern() const { return pattern_; }

 private:
  static size_t next_char_end(std::string_view text, size_t pos);

  std::string pattern_;
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace hack::tok
