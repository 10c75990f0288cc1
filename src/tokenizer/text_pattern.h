// A Split / Replace pattern: a literal string or a regex, matched like HF tokenizers does.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "src/tokenizer/json_util.h"
#include "src/tokenizer/regex.h"

namespace hack::tok {

class TextPattern {
 public:
  explicit TextPattern(const PatternSpec& spec) : literal_(spec.is_regex ? "" : spec.text) {
    if (spec.is_regex) regex_ = std::make_unique<Regex>(spec.text);
  }

  /// Calls fn(start, end) for each non-overlapping match, left to right.
  template <class F>
  void for_each_match(std::string_view text, RegexScratch& scratch, F&& fn) const {
    if (regex_) {
      regex_->for_each_match(text, scratch, fn);
      return;
    }
    if (literal_.empty()) return;
    size_t pos = 0;
    while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
      fn(pos, pos + literal_.size());
      pos += literal_.size();
    }
  }

  /// Appends `text` to `out` with every match replaced by `content`.
  void replace_all(std::string_view text, std::string_view content, RegexScratch& scratch, std::string& out) const {
    size_t prev = 0;
    for_each_match(text, scratch, [&](size_t s, size_t e) {
      out.append(text.substr(prev, s - prev));
      out.append(content);
      prev = e;
    });
    out.append(text.substr(prev));
  }

  bool could_match(std::string_view text) const {
    return regex_ || (!literal_.empty() && text.find(literal_) != std::string_view::npos);
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

}  // namespace hack::tok
