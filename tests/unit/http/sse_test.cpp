#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "hack/core/error.h"
#include "hack/http/sse.h"

using namespace hack::server;
using Events = std::vector<std::string>;

TEST_CASE("sse parser: single and multi-line events", "[server][sse]") {
  SseParser p;
  CHECK(p.feed("data: hello\n\n") == Events{"hello"});
  CHECK(p.feed("data: a\ndata: b\ndata:c\n\n") == Events{"a\nb\nc"});
  CHECK(p.feed("data: 1\n\ndata: 2\n\n") == Events{"1", "2"});
}

TEST_CASE("sse parser: field rules", "[server][sse]") {
  SseParser p;
  // Only one leading space is stripped; "data" with no colon is an empty data field.
  CHECK(p.feed("data:  two spaces\n\n") == Events{" two spaces"});
  CHECK(p.feed("data\n\n") == Events{""});
  CHECK(p.feed("data:\n\n") == Events{""});
  CHECK(p.feed("data: x:y: z\n\n") == Events{"x:y: z"});
  // Comments, other fields and unknown fields are ignored; no data means no event.
  CHECK(p.feed(": keep-alive\n\n").empty());
  CHECK(p.feed("event: token\nid: 7\nretry: 100\n\n").empty());
  CHECK(p.feed("event: token\n: note\ndata: v\nfoo: bar\n\n") == Events{"v"});
  // "datax" is another field, not data.
  CHECK(p.feed("datax: no\n\n").empty());
  // Extra blank lines dispatch nothing.
  CHECK(p.feed("\n\n\ndata: z\n\n\n\n") == Events{"z"});
}

TEST_CASE("sse parser: CRLF and CR line ends", "[server][sse]") {
  SseParser a;
  CHECK(a.feed("data: one\r\ndata: two\r\n\r\ndata: three\r\n\r\n") == Events{"one\ntwo", "three"});
  SseParser b;
  CHECK(b.feed("data: one\rdata: two\r\rdata: three\r\r") == Events{"one\ntwo", "three"});
  SseParser c;  // a CR at the end of one feed and its LF at the start of the next are one line end
  CHECK(c.feed("data: x\r").empty());
  CHECK(c.feed("\n").empty());
  CHECK(c.feed("\r").size() == 1);
}

TEST_CASE("sse parser: unfinished event is held, BOM skipped", "[server][sse]") {
  SseParser p;
  CHECK(p.feed("data: par").empty());
  CHECK(p.pending_bytes() > 0);
  CHECK(p.feed("tial\ndata: more").empty());
  CHECK(p.feed("\n\n") == Events{"partial\nmore"});
  CHECK(p.pending_bytes() == 0);

  SseParser q;
  CHECK(q.feed("\xEF\xBB").empty());
  CHECK(q.feed("\xBF" "data: after bom\n\n") == Events{"after bom"});
  SseParser r;  // a BOM only counts at the very start
  CHECK(r.feed("data: a\n\n\xEF\xBB\xBF" "data: b\n\n") == Events{"a"});
}

TEST_CASE("sse format round-trips through the parser", "[server][sse]") {
  CHECK(sse_format_event("x") == "data: x\n\n");
  CHECK(sse_format_event("{}", "response.created") == "event: response.created\ndata: {}\n\n");
  CHECK_THROWS_AS(sse_format_event("x", "a\nb"), hack::Error);
  CHECK(sse_format_event("a\nb") == "data: a\ndata: b\n\n");
  CHECK(sse_format_event("a\r\nb\rc") == "data: a\ndata: b\ndata: c\n\n");
  SseParser p;
  for (std::string s : {"", "plain", "two\nlines", "trailing\n", "\nleading", "{\"json\": [1, 2]}", " spaced "}) {
    CHECK(p.feed(sse_format_event(s)) == Events{s});
  }
}

TEST_CASE("sse parser: random splits give the same events as one feed", "[server][sse]") {
  std::string stream;
  Events expected;
  std::mt19937 gen(20240611);
  const char* line_ends[] = {"\n", "\r\n", "\r"};
  for (int i = 0; i < 200; ++i) {
    std::string eol = line_ends[gen() % 3];
    int lines = 1 + static_cast<int>(gen() % 3);
    std::string data;
    if (gen() % 4 == 0) stream += ": comment " + std::to_string(i) + eol;
    if (gen() % 4 == 0) stream += "event: e" + eol;
    for (int l = 0; l < lines; ++l) {
      std::string line = "ev" + std::to_string(i) + "-" + std::to_string(l) + std::string(gen() % 40, 'x');
      stream += "data: " + line + eol;
      data += (l ? "\n" : "") + line;
    }
    stream += eol;
    expected.push_back(data);
  }
  SseParser whole;
  REQUIRE(whole.feed(stream) == expected);

  for (int trial = 0; trial < 200; ++trial) {
    uint32_t seed = 1000 + static_cast<uint32_t>(trial);
    std::mt19937 rng(seed);
    SseParser p;
    Events got;
    size_t pos = 0;
    while (pos < stream.size()) {
      size_t n = std::min<size_t>(stream.size() - pos, rng() % 17);  // 0-byte feeds included
      p.feed(std::string_view(stream).substr(pos, n), got);
      pos += n;
    }
    INFO("seed " << seed);
    REQUIRE(got == expected);
  }
}
