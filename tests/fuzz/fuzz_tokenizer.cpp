// libFuzzer target for hack::Tokenizer. The first input byte picks a tokenizer (every one
// the goldens in tests/fixtures/tokenizers/goldens describe: the fixtures and their patched
// variants, which use Metaspace, Digits, Split behaviours, lstrip / rstrip / single_word
// added tokens, ...) and a mode; the rest is text to encode (any bytes: invalid UTF-8 is
// repaired), or, in id mode, a stream of 16-bit token ids. Checks: ids are in range, decode yields valid UTF-8,
// incremental decode == full decode (both skip modes), and round trips where the
// tokenizer is lossless (kjv-bpe: byte-level without normalizer; mistral: text without
// U+2581, which its decoder turns into a space, and without added tokens, after which its
// normalizer prepends a space).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "hack/tokenizer/tokenizer.h"
#include "src/tokenizer/utf8.h"
#include "unit/tokenizer/golden_support.h"

namespace {

struct Fixture {
  std::string name;
  hack::Tokenizer tokenizer;
};

std::vector<Fixture>* load_fixtures() {
  auto* fixtures = new std::vector<Fixture>();
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(hack::test::golden_dir())) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    if (path.extension() != ".json") continue;
    const nlohmann::json golden = nlohmann::json::parse(hack::read_file(path, "fixture"));
    fixtures->push_back({path.stem().string(), hack::test::load_golden_tokenizer(golden)});
  }
  if (fixtures->empty()) {
    std::fprintf(stderr, "fuzz_tokenizer: no goldens in %s\n", hack::test::golden_dir().c_str());
    std::abort();
  }
  return fixtures;
}

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_tokenizer: %s\n", what);
    std::abort();
  }
}

bool valid_utf8(std::string_view s) { return hack::tok::valid_utf8_prefix(s) == s.size(); }

std::string incremental(const hack::Tokenizer& t, const std::vector<int>& ids, bool skip) {
  hack::IncrementalDecoder d(t, skip);
  std::string out;
  for (int id : ids) {
    const std::string piece = d.step(id);
    require(valid_utf8(piece), "incremental piece is not valid UTF-8");
    out += piece;
  }
  return out + d.finish();
}

void check_decode(const hack::Tokenizer& t, const std::vector<int>& ids) {
  for (bool skip : {false, true}) {
    const std::string full = t.decode(ids, skip);
    require(valid_utf8(full), "decode is not valid UTF-8");
    require(incremental(t, ids, skip) == full, "incremental decode != decode");
  }
}

const std::vector<Fixture>* fixtures = nullptr;

}  // namespace

// Loading the tokenizers (12 MB of golden JSON, under ASan) takes seconds: do it before
// the fuzzing loop, whose per-input -timeout would otherwise count it.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fixtures = load_fixtures();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  const Fixture& fixture = (*fixtures)[(selector & 0x7F) % fixtures->size()];
  const hack::Tokenizer& t = fixture.tokenizer;
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);

  if (selector & 0x80) {
    // Id mode: arbitrary id streams, weighted to the low ids (bytes, byte-level
    // characters) and the added tokens at the top, plus ids with no token at all.
    std::vector<int> ids;
    for (size_t i = 0; i + 1 < input.size(); i += 2) {
      const int raw = static_cast<uint8_t>(input[i]) | (static_cast<uint8_t>(input[i + 1]) << 8);
      const int kind = raw & 3, value = raw >> 2;
      ids.push_back(kind == 0 ? value % 512 : kind == 1 ? t.vocab_size() - 1 - value % 64 : kind == 2 ? value : -value);
    }
    check_decode(t, ids);
    return 0;
  }

  const std::vector<int> ids = t.encode(input, false);
  const std::vector<int> with_special = t.encode(input, true);
  require(with_special.size() >= ids.size(), "special tokens removed ids");
  for (int id : with_special) require(id >= 0 && id < t.vocab_size(), "id out of range");
  check_decode(t, with_special);
  const std::string decoded = t.decode(ids, false);
  if (valid_utf8(input)) {
    if (fixture.name == "kjv-bpe") require(decoded == input, "kjv-bpe round trip");
    const bool has_added = std::any_of(ids.begin(), ids.end(), [&](int id) { return t.is_special(id); });
    if (fixture.name == "mistral" && !has_added && input.find("\xE2\x96\x81") == std::string_view::npos) {
      require(decoded == input, "mistral round trip");
    }
  }
  return 0;
}
