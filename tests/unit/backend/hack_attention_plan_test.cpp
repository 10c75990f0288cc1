// Host planning of HACK device work: the flat page geometry agrees with HackPageLayout,
// and the split-K plan fills the device without empty ranges.
#include "hack/backend/hack_attention_plan.h"

#include <catch2/catch.hpp>
#include <cstring>

#include "hack/core/error.h"

using namespace hack;

namespace {

HackPageLayout layout_of(int bits, int block, int heads, int dim) {
  HackPageParams p;
  p.k_bits = p.v_bits = bits;
  p.block_tokens = block;
  p.heads.assign(static_cast<size_t>(heads), HackHeadDims{dim, dim});
  return HackPageLayout(p);
}

}  // namespace

TEST_CASE("page geometry mirrors the layout", "[kv][hack_plan]") {
  for (int bits : {2, 4, 8})
    for (int dim : {64, 128}) {
      const HackPageLayout l = layout_of(bits, 64, 8, dim);
      const HackPageGeometry g = page_geometry(l);
      INFO("bits " << bits << " dim " << dim);
      CHECK(g.page_bytes == l.page_bytes());
      CHECK(g.header_bytes == l.header_bytes());
      CHECK(g.k_sum_bytes == l.k_sum_bytes());
      CHECK(g.v_sum_bytes == l.v_sum_bytes());
      for (int h = 0; h < 8; ++h) {
        const HackHeadLayout& hl = l.head(h);
        const size_t base = g.head0 + static_cast<size_t>(h) * g.head_bytes;
        CHECK(base == hl.offset);
        CHECK(base + g.k_codes == hl.k_codes);
        CHECK(base + g.v_codes == hl.v_codes);
        CHECK(base + g.k_min == hl.k_min);
        CHECK(base + g.k_scale == hl.k_scale);
        CHECK(base + g.k_sums == hl.k_sums);
        CHECK(base + g.v_min == hl.v_min);
        CHECK(base + g.v_scale == hl.v_scale);
        CHECK(base + g.v_sums == hl.v_sums);
        CHECK(g.fields_end <= g.head_bytes);
      }
      const std::vector<uint8_t> header = page_header_template(l, 3);
      REQUIRE(header.size() == l.header_bytes());
      uint32_t layer = 0;
      std::memcpy(&layer, header.data() + g.layer_offset, 4);
      CHECK(layer == 3);
      uint64_t first = 1;
      std::memcpy(&first, header.data() + g.first_token_offset, 8);
      CHECK(first == 0);
    }
}

TEST_CASE("page geometry rejects per-head dims", "[kv][hack_plan]") {
  HackPageParams p;
  p.heads = {{64, 64}, {48, 80}};
  REQUIRE_THROWS_AS(page_geometry(HackPageLayout(p)), Error);
}

TEST_CASE("decode plan splits small batches and leaves large ones whole", "[kv][hack_plan]") {
  HackDecodePlanInput in;
  in.sm_count = 132;
  in.warps_per_sm = 2;  // the sections' arithmetic below; the defaults have their own section
  in.min_pages_per_split = 1;
  in.max_splits = 64;

  SECTION("large batch fills the device without splitting") {
    in.batch = 64;
    in.kv_heads = 8;
    in.max_pages = 100;
    const HackDecodePlan p = plan_hack_decode(in);
    CHECK(p.splits == 1);
    CHECK(p.pages_per_split == 100);
  }
  SECTION("one sequence, long context: up to max_splits ranges") {
    in.batch = 1;
    in.kv_heads = 8;
    in.max_pages = 1000;
    const HackDecodePlan p = plan_hack_decode(in);
    CHECK(p.splits == 33);  // ceil(264 / 8)
    CHECK(p.pages_per_split == 31);
    in.kv_heads = 1;
    const HackDecodePlan q = plan_hack_decode(in);
    CHECK(q.splits == 63);  // capped at 64, then 16 pages per range need only 63 ranges
    CHECK(q.pages_per_split == 16);
  }
  SECTION("short context: never more ranges than pages") {
    in.batch = 1;
    in.kv_heads = 2;
    in.max_pages = 3;
    const HackDecodePlan p = plan_hack_decode(in);
    CHECK(p.splits == 3);
    CHECK(p.pages_per_split == 1);
    in.max_pages = 0;  // only sinks and the open block
    const HackDecodePlan q = plan_hack_decode(in);
    CHECK(q.splits == 1);
    CHECK(q.pages_per_split == 1);
  }
  SECTION("every range is non-empty and the ranges cover all pages") {
    for (int sms : {1, 7, 108, 132})
      for (int batch : {1, 2, 5, 33})
        for (int heads : {1, 4, 8})
          for (int pages : {0, 1, 2, 9, 10, 63, 64, 65, 1000}) {
            in.sm_count = sms;
            in.batch = batch;
            in.kv_heads = heads;
            in.max_pages = pages;
            const HackDecodePlan p = plan_hack_decode(in);
            INFO("sms " << sms << " batch " << batch << " heads " << heads << " pages " << pages);
            REQUIRE(p.splits >= 1);
            REQUIRE(p.splits <= in.max_splits);
            REQUIRE(p.pages_per_split >= 1);
            REQUIRE(p.splits * p.pages_per_split >= pages);
            if (pages > 0) REQUIRE((p.splits - 1) * p.pages_per_split < pages);
          }
  }
  SECTION("defaults: a warp per split, at least min_pages_per_split pages each") {
    HackDecodePlanInput d;
    d.sm_count = 132;
    d.batch = 1;
    d.kv_heads = 8;
    d.max_pages = 511;  // 32K tokens at Π = 64
    const HackDecodePlan p = plan_hack_decode(d);
    CHECK(p.pages_per_split == 2);  // 8448 slots / 8 heads = 1056 splits, capped at 256
    CHECK(p.splits == 256);
    d.max_pages = 7;
    const HackDecodePlan q = plan_hack_decode(d);
    CHECK(q.pages_per_split == 2);  // never a split of one page while pairs remain
    CHECK(q.splits == 4);
    d.batch = 2048;  // 16384 units fill 8448 slots: no split
    d.max_pages = 100;
    const HackDecodePlan r = plan_hack_decode(d);
    CHECK(r.splits == 1);
    CHECK(r.pages_per_split == 100);
  }
  SECTION("bad input") {
    in.batch = 0;
    REQUIRE_THROWS_AS(plan_hack_decode(in), Error);
    in.batch = 1;
    in.min_pages_per_split = 0;
    REQUIRE_THROWS_AS(plan_hack_decode(in), Error);
  }
}
