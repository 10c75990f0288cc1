// Every golden of tests/fixtures/tokenizers/goldens (HF tokenizers' output, see
// scripts/make_tokenizer_goldens.py): encode with and without special tokens, decode with
// and without skip_special_tokens, lossless round trips, and incremental == full decode.
#include <algorithm>
#include <catch2/catch.hpp>

#include "unit/tokenizer/golden_support.h"

namespace {

using hack::test::show;
using hack::test::show_ids;

// Counts mismatches and reports the first few with context, instead of thousands of CHECKs.
struct Mismatches {
  std::string what;
  int count = 0;
  void add(const std::string& detail) {
    if (++count <= 5) UNSCOPED_INFO(what << " mismatch: " << detail);
  }
};

std::vector<std::filesystem::path> golden_files() {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(hack::test::golden_dir())) {
    if (e.path().extension() == ".json") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<int> ids_of(const nlohmann::json& j) { return j.get<std::vector<int>>(); }

}  // namespace

TEST_CASE("golden files exist for the fixture tokenizers", "[tokenizer][golden]") {
  const auto files = golden_files();
  auto has = [&](const std::string& name) {
    return std::any_of(files.begin(), files.end(), [&](const auto& p) { return p.stem() == name; });
  };
  CHECK(has("qwen3"));
  CHECK(has("mistral"));
  CHECK(has("kjv-bpe"));
}

TEST_CASE("encode and decode match HF tokenizers on every golden", "[tokenizer][golden]") {
  for (const auto& path : golden_files()) {
    DYNAMIC_SECTION(path.stem().string()) {
      const nlohmann::json golden = nlohmann::json::parse(hack::read_file(path, "fixture"));
      const hack::Tokenizer tok = hack::test::load_golden_tokenizer(golden);
      const std::vector<int> prefix = ids_of(golden["special_prefix"]);
      const std::vector<int> suffix = ids_of(golden["special_suffix"]);
      const auto& cases = golden["encode"];
      REQUIRE(cases.size() > 0);

      Mismatches encode{"encode"}, encode_special{"encode(add_special_tokens)"}, round_trip{"round trip"},
          incremental{"incremental"};
      size_t lossless = 0;
      std::vector<std::vector<int>> special_ids_of_case;  // HF's ids with special tokens, per case
      for (const auto& c : cases) {
        const std::string text = c["text"].get<std::string>();
        const std::vector<int> want = ids_of(c["ids"]);
        const std::vector<int> got = tok.encode(text, false);
        if (got != want) encode.add(show(text) + ": want " + show_ids(want) + " got " + show_ids(got));

        std::vector<int> want_special;
        if (c.contains("ids_special")) {
          want_special = ids_of(c["ids_special"]);
        } else {
          want_special = prefix;
          want_special.insert(want_special.end(), want.begin(), want.end());
          want_special.insert(want_special.end(), suffix.begin(), suffix.end());
        }
        special_ids_of_case.push_back(want_special);
        const std::vector<int> got_special = tok.encode(text, true);
        if (got_special != want_special) {
          encode_special.add(show(text) + ": want " + show_ids(want_special) + " got " + show_ids(got_special));
        }

        const std::string decoded = tok.decode(got, false);
        if (!c.contains("lossy")) {
          ++lossless;
          if (decoded != text) round_trip.add(show(text) + " decoded as " + show(decoded));
        }
        for (bool skip : {false, true}) {
          const std::string full = tok.decode(got_special, skip);
          const std::string inc = hack::test::incremental_decode(tok, got_special, skip);
          if (inc != full) incremental.add(show_ids(got_special) + ": full " + show(full) + " incremental " + show(inc));
        }
      }

      Mismatches decode{"decode"}, decode_skip{"decode(skip_special_tokens)"}, decode_inc{"incremental decode"};
      for (const auto& d : golden["decode"]) {
        const std::vector<int> ids =
            d.contains("case") ? special_ids_of_case.at(d["case"].get<size_t>()) : ids_of(d["ids"]);
        const std::string want = d["text"].get<std::string>();
        const std::string want_skip = d["text_skip"].get<std::string>();
        const std::string got = tok.decode(ids, false);
        const std::string got_skip = tok.decode(ids, true);
        if (got != want) decode.add(show_ids(ids) + ": want " + show(want) + " got " + show(got));
        if (got_skip != want_skip) decode_skip.add(show_ids(ids) + ": want " + show(want_skip) + " got " + show(got_skip));
        if (hack::test::incremental_decode(tok, ids, false) != want) decode_inc.add(show_ids(ids));
        if (hack::test::incremental_decode(tok, ids, true) != want_skip) decode_inc.add(show_ids(ids) + " (skip)");
      }

      INFO(path.filename().string() << ": " << cases.size() << " encode cases (" << lossless << " lossless), "
                                    << golden["decode"].size() << " decode cases");
      CHECK(encode.count == 0);
      CHECK(encode_special.count == 0);
      CHECK(round_trip.count == 0);
      CHECK(incremental.count == 0);
      CHECK(decode.count == 0);
      CHECK(decode_skip.count == 0);
      CHECK(decode_inc.count == 0);
    }
  }
}
