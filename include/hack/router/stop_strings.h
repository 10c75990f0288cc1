/// @file stop_strings.h
/// @brief Stop strings over a stream of decoded text: emit only text that cannot turn out to
/// be the start of a stop string, and cut the output where one appears (OpenAI semantics:
/// the stop string itself is not returned).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hack::server {

/// Feed it the text deltas of one choice (from IncrementalDecoder, so every delta is whole
/// UTF-8). Each call returns the text that is safe to send now. A suffix of the text seen so
/// far that is a prefix of some stop string is held back until later text settles it, so a
/// stop string split across tokens is never sent. When a stop string completes, the result
/// holds the text before the match that completed first (the earliest end; at the same end
/// the longer stop), plus the stop string itself with include_stop_in_output (vLLM's
/// include_stop_str_in_output); stopped() turns true and later feeds return nothing. The
/// emitted text is the same however the text is split into deltas. Not thread-safe (one
/// per choice).
class StopStringMatcher {
 public:
  /// Empty stop strings are ignored (the protocol layer rejects them before this).
  explicit StopStringMatcher(std::vector<std::string> stops, bool include_stop_in_output = false);

  struct Step {
    std::string text;  ///< safe to emit
    bool stopped = false;
  };

  /// Adds `delta`; returns what can be emitted and whether a stop string matched.
  Step feed(std::string_view delta);
  /// End of generation (EOS, max_tokens): returns the held-back text. Empty after a stop.
  std::string flush();

  bool stopped() const { return matched_.has_value(); }
  /// Index into the constructor's list of the stop string that matched.
  std::optional<size_t> matched_index() const { return matched_; }
  /// Bytes held back now (a prefix of some stop string).
  size_t held_bytes() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  bool include_stop_in_output_;
  std::string held_;  // the unsent tail; a proper prefix of at least one stop string
  std::optional<size_t> matched_;
};

}  // namespace hack::server
