// HACK bit allocations: the file round-trips and bad files are refused by name; the
// --hack-allocation flag applies a model directory's file; a cache built from one gives
// each layer its own page layout, and a page of the wrong widths is refused on arrival.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>

#include "hack/core/error.h"
#include "hack/kv/hack_allocation.h"
#include "hack/kv/kv_flags.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "kv_test_util.h"

using namespace hack;
using hack::test::KvStream;

namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() / ("hack_alloc_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

}  // namespace

TEST_CASE("HACK allocation files round-trip and bad ones are refused by name", "[kv][allocation]") {
  const TempDir dir;
  HackAllocation a;
  a.layers = {{4, 2}, {2, 2}, {2, 4}};
  a.recent_tokens = 64;
  a.calibration_json = R"({"score":{"mean_kl":0.01}})";
  const std::string path = (dir.path / "hack_kv.json").string();
  save_hack_allocation(path, a);
  const HackAllocation b = load_hack_allocation(path);
  REQUIRE(b.layers == a.layers);
  REQUIRE(b.recent_tokens == 64);
  REQUIRE(b.calibration_json == a.calibration_json);

  const std::string head = R"({"format": "hackserve.hack-allocation", "version": 1, )";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{not json", "malformed JSON"},
      {R"({"format": "other", "version": 1, "layers": [{"k_bits": 2, "v_bits": 2}]})", "not a HACK allocation"},
      {R"({"format": "hackserve.hack-allocation", "version": 9, "layers": [{"k_bits": 2, "v_bits": 2}]})", "version 9"},
      {head + R"("layers": []})", "non-empty list"},
      {head + R"("layers": [{"k_bits": 3, "v_bits": 2}]})", "bits must be 2, 4 or 8"},
      {head + R"("layers": [{"k_bits": 2}]})", "layers[0] needs integer k_bits and v_bits"},
      {head + R"("num_layers": 2, "layers": [{"k_bits": 2, "v_bits": 2}]})", "num_layers 2 but 1"},
      {head + R"("layers": [{"k_bits": 2, "v_bits": 2}], "recent_tokens": -3})", "recent_tokens"},
  };
  for (const auto& [text, message] : bad) {
    const std::string f = dir.write("bad.json", text);
    INFO(text);
    REQUIRE_THROWS_WITH(load_hack_allocation(f), Catch::Contains(message) && Catch::Contains("bad.json"));
  }
}

TEST_CASE("the auto allocation flag applies the model directory's allocation", "[kv][allocation]") {
  const TempDir model;
  HackAllocation a;
  a.layers = {{4, 2}, {2, 2}};
  a.recent_tokens = 32;
  save_hack_allocation((model.path / kHackAllocationFile).string(), a);
  KvFlags flags;  // defaults: --kv hack, --hack-allocation auto, --hack-recent -1
  KvCacheOptions o = kv_options_from(flags, model.path.string(), 2);
  REQUIRE(o.layer_bits == a.layers);
  REQUIRE(o.recent_tokens == 32);
  flags.hack_recent = 0;  // given explicitly: kept
  REQUIRE(kv_options_from(flags, model.path.string(), 2).recent_tokens == 0);
  REQUIRE_THROWS_WITH(kv_options_from(flags, model.path.string(), 3), Catch::Contains("2 layers, the model 3"));
  flags.hack_allocation = "none";
  REQUIRE(kv_options_from(flags, model.path.string(), 2).layer_bits.empty());
  flags.hack_allocation = "auto";
  flags.kv = "fp";
  REQUIRE(kv_options_from(flags, model.path.string(), 2).layer_bits.empty());
  flags.kv = "hack";
  REQUIRE(kv_options_from(flags, "", 2).layer_bits.empty());  // synthetic: no directory
  flags.hack_allocation = (model.path / "missing.json").string();
  REQUIRE_THROWS_WITH(kv_options_from(flags, "", 2), Catch::Contains("missing.json"));
}

TEST_CASE("a cache under an allocation gives each layer its widths", "[kv][allocation]") {
  const int dim = 64, group = 2, block = 16, H = 2;
  KvCacheOptions o;
  o.block_tokens = block;
  o.layer_bits = {{4, 2}, {2, 2}, {8, 4}};
  const KvShape shape{3, H, dim, group};
  auto cache = make_paged_kv_cache(shape, o);
  REQUIRE(cache->layer_bits(0) == HackLayerBits{4, 2});
  REQUIRE(cache->layer_bits(2) == HackLayerBits{8, 4});
  REQUIRE(cache->hack_layout(0).page_bytes() > cache->hack_layout(1).page_bytes());
  double sum = 0;
  for (int l = 0; l < 3; ++l) sum += cache->hack_layout(l).bytes_per_token();
  REQUIRE(kv_bytes_per_token(shape, o) == Approx(sum));
  REQUIRE(describe(o).find("layers[k4v2 x1, k2v2 x1, k8v4 x1]") != std::string::npos);

  const KvStream data(4 + 2 * block, H, group, dim, 5);
  cache->add_sequence(0, data.tokens + 1);
  for (int l = 0; l < 3; ++l) cache->append(l, 0, 0, data.tokens, data.k_at(0), data.v_at(0));
  cache->close_pending_blocks(0);
  for (int l = 0; l < 3; ++l) {
    REQUIRE(cache->hack_page_count(0, l) == 2);
    REQUIRE(cache->hack_page(0, l, 0).size() == cache->hack_layout(l).page_bytes());
    const HackPageLayout declared = HackPageLayout::from_page(cache->hack_page(0, l, 0).data(), cache->hack_page(0, l, 0).size());
    REQUIRE(declared.k_bits() == cache->layer_bits(l).k_bits);
    REQUIRE(declared.v_bits() == cache->layer_bits(l).v_bits);
  }
  // A receiver with the same allocation takes the pages; one where layer 0 is 2-bit refuses.
  auto same = make_paged_kv_cache(shape, o);
  KvCacheOptions other_o = o;
  other_o.layer_bits[0] = {2, 2};
  auto other = make_paged_kv_cache(shape, other_o);
  same->add_sequence(1, data.tokens + 1);
  other->add_sequence(1, data.tokens + 1);
  for (auto* c : {same.get(), other.get()}) c->append(0, 1, 0, 4, data.k_at(0), data.v_at(0));
  const auto page = cache->hack_page(0, 0, 0);
  REQUIRE_NOTHROW(same->append_hack_page(0, 1, page.data(), page.size()));
  REQUIRE_THROWS_AS(other->append_hack_page(0, 1, page.data(), page.size()), Error);
  // Wrong layer count.
  KvCacheOptions short_o = o;
  short_o.layer_bits.pop_back();
  REQUIRE_THROWS_WITH(make_paged_kv_cache(shape, short_o), Catch::Contains("2 layers given, the model has 3"));
}
