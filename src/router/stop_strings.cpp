#include "hack/router/stop_strings.h"

#include <algorithm>
#include <utility>

namespace hack::server {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop_in_output)
    : stops_(std::move(stops)), include_stop_in_output_(include_stop_in_output) {}

StopStringMatcher::Step StopStringMatcher::feed(std::string_view delta) {
  Step step;
  if (matched_) return step;
  std::string text = std::move(held_);
  held_.clear();
  text.append(delta);

  // The match that completes first (earliest end; at one end the longer stop, which starts
  // earlier): what a check after every byte would find, so the cut does not depend on how the
  // text is split into deltas. Held text held no complete match, and a match that began
  // before it would have been held, so searching `text` finds every match ending in `delta`.
  size_t best_pos = std::string::npos;
  size_t best_end = std::string::npos;
  size_t best = 0;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const std::string& s = stops_[i];
    if (s.empty()) continue;
    const size_t pos = text.find(s);
    if (pos == std::string::npos) continue;
    const size_t end = pos + s.size();
    if (end < best_end || (end == best_end && pos < best_pos)) {
      best_pos = pos;
      best_end = end;
      best = i;
    }
  }
  if (best_pos != std::string::npos) {
    matched_ = best;
    text.resize(best_pos + (include_stop_in_output_ ? stops_[best].size() : 0));
    step.text = std::move(text);
    step.stopped = true;
    return step;
  }

  // Hold the longest suffix of `text` that is a proper prefix of some stop string. Stop
  // strings are valid UTF-8 and begin with a lead byte, so the cut is on a code point boundary.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - (s.empty() ? 0 : 1), text.size());
    for (size_t len = max_len; len > hold; --len) {
      if (std::string_view(text).substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  held_ = text.substr(text.size() - hold);
  text.resize(text.size() - hold);
  step.text = std::move(text);
  return step;
}

std::string StopStringMatcher::flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace hack::server
