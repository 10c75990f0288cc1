#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "hack/router/stop_strings.h"

using namespace hack::server;

namespace {

struct Run {
  std::string emitted;  // concatenation of everything returned, flush included
  bool stopped = false;
  std::optional<size_t> index;
  size_t stop_delta = 0;  // which feed reported the stop
};

Run run(const std::vector<std::string>& stops, const std::vector<std::string>& deltas, bool include = false) {
  StopStringMatcher m(stops, include);
  Run r;
  for (size_t i = 0; i < deltas.size(); ++i) {
    auto step = m.feed(deltas[i]);
    r.emitted += step.text;
    if (step.stopped) {
      r.stopped = true;
      r.stop_delta = i;
      break;
    }
  }
  r.emitted += m.flush();
  r.index = m.matched_index();
  return r;
}

// Reference: grow the text one byte at a time and cut at the earliest-starting match in the
// first prefix that contains any stop.
std::string reference_cut(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    const std::string prefix = text.substr(0, end);
    size_t best = std::string::npos;
    for (const auto& s : stops) best = std::min(best, prefix.find(s));
    if (best != std::string::npos) return text.substr(0, best);
  }
  return text;
}

}  // namespace

TEST_CASE("stop strings: a stop split across deltas is never emitted") {
  StopStringMatcher m({"</end>"});
  auto a = m.feed("Hello <");
  CHECK(a.text == "Hello ");
  CHECK_FALSE(a.stopped);
  CHECK(m.held_bytes() == 1);
  auto b = m.feed("/e");
  CHECK(b.text.empty());
  CHECK(m.held_bytes() == 3);
  auto c = m.feed("nd");
  CHECK(c.text.empty());
  auto d = m.feed(">tail");
  CHECK(d.text.empty());
  CHECK(d.stopped);
  CHECK(m.stopped());
  CHECK(m.matched_index() == 0u);
  CHECK(m.feed("more").text.empty());
  CHECK(m.flush().empty());
}

TEST_CASE("stop strings: a false start is released when it stops matching") {
  StopStringMatcher m({"STOP"});
  CHECK(m.feed("a ST").text == "a ");
  auto s = m.feed("ART");
  CHECK(s.text == "START");
  CHECK_FALSE(s.stopped);
  CHECK(m.feed("S").text.empty());
  CHECK(m.flush() == "S");  // end of generation: held text goes out
}

TEST_CASE("stop strings: one character per delta") {
  const std::string text = "The answer is 42.\n\nQuestion: next";
  std::vector<std::string> deltas;
  for (char c : text) deltas.emplace_back(1, c);
  const Run r = run({"\n\nQuestion:"}, deltas);
  CHECK(r.stopped);
  CHECK(r.emitted == "The answer is 42.");
  CHECK(r.stop_delta == text.find(":"));  // stops on the delta completing the match
}

TEST_CASE("stop strings: stop at the very beginning") {
  const Run r = run({"###"}, {"###", "text"});
  CHECK(r.stopped);
  CHECK(r.emitted.empty());
  CHECK(r.stop_delta == 0);
  CHECK(run({"ab"}, {"a", "b", "c"}).emitted.empty());
}

TEST_CASE("stop strings: the earliest of several stops wins, whatever their order") {
  const Run r = run({"world", "lo"}, {"hello world"});
  CHECK(r.emitted == "hel");
  CHECK(r.index == 1u);
  const Run r2 = run({"lo", "world"}, {"hello world"});
  CHECK(r2.emitted == "hel");
  CHECK(r2.index == 0u);
  // The first to complete wins: "ab" ends before "abc" (the text is the same either way).
  const Run r3 = run({"abc", "ab"}, {"xxabcd"});
  CHECK(r3.emitted == "xx");
  CHECK(r3.index == 1u);
  // Same end: the longer one, which starts earlier.
  const Run r4 = run({"bc", "abc"}, {"xabc"});
  CHECK(r4.emitted == "x");
  CHECK(r4.index == 1u);
}

TEST_CASE("stop strings: overlapping stops and self-overlap") {
  // "aab": after "aa" the held text must keep both a's ("aab" may start at either).
  CHECK(run({"aab"}, {"a", "a", "a", "b"}).emitted == "a");
  // One stop's prefix is another's suffix: a shorter one completes first in time.
  const Run r = run({"abcd", "bc"}, {"a", "b", "c", "d"});
  CHECK(r.emitted == "a");
  CHECK(r.index == 1u);
  // ... also when both arrive in one delta.
  const Run whole = run({"abcd", "bc"}, {"abcd"});
  CHECK(whole.emitted == "a");
  CHECK(whole.index == 1u);
  // "xyz" is held after "xy", then "xyxyz" - the match starts in the second pair.
  CHECK(run({"xyz"}, {"xy", "xy", "z!"}).emitted == "xy");
}

TEST_CASE("stop strings: unicode stops and text") {
  const Run r = run({"。終"}, {"こんにちは", "。", "終わり"});
  CHECK(r.stopped);
  CHECK(r.emitted == "こんにちは");
  // A held prefix is whole code points: "é" shares its lead byte with "è" but is released intact.
  StopStringMatcher m({"èx"});
  CHECK(m.feed("aé").text == "aé");
  CHECK(m.feed("è").text.empty());
  CHECK(m.feed("y😀").text == "èy😀");
}

TEST_CASE("stop strings: include_stop_in_output and no stops") {
  CHECK(run({"END"}, {"abc E", "ND more"}, true).emitted == "abc END");
  const Run none = run({}, {"a", "b"});
  CHECK_FALSE(none.stopped);
  CHECK(none.emitted == "ab");
  StopStringMatcher m({});
  CHECK(m.feed("abc").text == "abc");  // nothing held without stops
  CHECK(m.held_bytes() == 0);
}

TEST_CASE("stop strings: random texts and splits agree with a byte-by-byte search") {
  const uint64_t seed = 20240611;
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  const std::string alphabet = "abc";
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const int len = static_cast<int>(rng() % 24);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops;
    const int n_stops = 1 + static_cast<int>(rng() % 3);
    for (int s = 0; s < n_stops; ++s) {
      std::string stop;
      const int slen = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < slen; ++i) stop += alphabet[rng() % alphabet.size()];
      stops.push_back(stop);
    }
    std::vector<std::string> deltas;
    for (size_t pos = 0; pos < text.size();) {
      const size_t n = std::min<size_t>(text.size() - pos, rng() % 4);
      deltas.push_back(text.substr(pos, n));  // empty deltas included
      pos += n;
    }
    const Run r = run(stops, deltas);
    INFO("text '" << text << "' stops " << stops.size());
    const std::string ref = reference_cut(text, stops);
    bool ref_stopped = false;
    for (const auto& s : stops) ref_stopped = ref_stopped || text.find(s) != std::string::npos;
    CHECK(r.stopped == ref_stopped);
    // Emitted text is a prefix of the text and never contains a stop string.
    REQUIRE(text.compare(0, r.emitted.size(), r.emitted) == 0);
    for (const auto& s : stops) CHECK(r.emitted.find(s) == std::string::npos);
    if (!r.stopped) CHECK(r.emitted == text);
    // The cut does not depend on the split: it is the per-byte one.
    if (r.stopped) CHECK(r.emitted == ref);
  }
}
