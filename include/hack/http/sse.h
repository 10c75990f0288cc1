/// @file sse.h
/// @brief Server-sent events (text/event-stream): an incremental parser that yields each
/// event's data, and the formatter the HTTP server writes events with.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace hack::server {

/// Incremental text/event-stream parser following the WHATWG rules for what we use: lines end
/// in "\r\n", "\n" or "\r" (also split across feeds); "data" fields of one event are joined
/// with '\n'; a blank line dispatches the event; comments (":...") and other fields (event,
/// id, retry) are ignored; an event with no data field is not dispatched; an unfinished event
/// at end of stream is dropped. Bytes may be fed in arbitrary pieces.
class SseParser {
 public:
  /// Parses `bytes` and appends the data of every event they complete to `events`.
  void feed(std::string_view bytes, std::vector<std::string>& events);
  std::vector<std::string> feed(std::string_view bytes) {
    std::vector<std::string> events;
    feed(bytes, events);
    return events;
  }
  /// Bytes held for the unfinished line and event (callers cap this against hostile peers).
  size_t pending_bytes() const { return line_.size() + data_.size(); }

 private:
  void end_line(std::vector<std::string>& events);

  std::string line_;        // current line, without its terminator
  std::string data_;        // data fields of the current event, '\n'-joined
  bool has_data_ = false;   // a data field was seen ("data:" alone gives an empty event)
  bool after_cr_ = false;   // last byte was '\r': a '\n' right after it ends no new line
  bool at_start_ = true;    // a UTF-8 BOM at stream start is skipped
};

/// One event as written on the wire: "event: <event>\n" when `event` is given (a name without
/// CR or LF), "data: <line>\n" for every line of `data` (split on "\r\n", "\n" and "\r"), then
/// a blank line. SseParser gives `data` back with lines '\n'-joined.
std::string sse_format_event(std::string_view data, std::string_view event = {});

}  // namespace hack::server
