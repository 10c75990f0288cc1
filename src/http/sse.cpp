#include "hack/http/sse.h"

#include "hack/core/error.h"

namespace hack::server {

void SseParser::feed(std::string_view bytes, std::vector<std::string>& events) {
  if (at_start_ && !bytes.empty()) {
    // The BOM may itself arrive split; hold the first bytes in line_ until it is decided.
    static constexpr std::string_view kBom = "\xEF\xBB\xBF";
    while (!bytes.empty() && line_.size() < kBom.size() && bytes[0] == kBom[line_.size()]) {
      line_.push_back(bytes[0]);
      bytes.remove_prefix(1);
    }
    if (line_.size() == kBom.size()) {
      line_.clear();
      at_start_ = false;
    } else if (!bytes.empty()) {
      at_start_ = false;  // not a BOM: what was held is ordinary line content
    }
  }
  for (char c : bytes) {
    if (c == '\n' && after_cr_) {
      after_cr_ = false;
      continue;
    }
    after_cr_ = (c == '\r');
    if (c == '\n' || c == '\r') {
      end_line(events);
    } else {
      line_.push_back(c);
    }
  }
}

void SseParser::end_line(std::vector<std::string>& events) {
  if (line_.empty()) {  // blank line: dispatch
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line_[0] == ':') {  // comment
    line_.clear();
    return;
  }
  std::string_view line = line_;
  size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon);
  std::string_view value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) data_.push_back('\n');
    data_.append(value);
    has_data_ = true;
  }
  line_.clear();
}

std::string sse_format_event(std::string_view data, std::string_view event) {
  HACK_CHECK(event.find_first_of("\r\n") == std::string_view::npos, "an SSE event name has a CR or LF");
  std::string out;
  out.reserve(data.size() + event.size() + 16);
  if (!event.empty()) {
    out += "event: ";
    out += event;
    out += '\n';
  }
  size_t pos = 0;
  while (true) {
    size_t end = data.find_first_of("\r\n", pos);
    out += "data: ";
    out.append(data.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos));
    out += '\n';
    if (end == std::string_view::npos) break;
    pos = end + ((data[end] == '\r' && end + 1 < data.size() && data[end + 1] == '\n') ? 2 : 1);
  }
  out += '\n';
  return out;
}

}  // namespace hack::server
