// The device-neutral block manager (kv/block_manager.h): admission against the byte budget,
// the recent window and the prefill bracket deciding which blocks close, the plan it builds
// from that state alone — and a bare manager, told only what a storage did, reaching the
// same state and the same plan as the CPU storage that owns one (what a device storage must
// do to run the same plan).
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "hack/core/error.h"
#include "hack/kv/attention_plan.h"
#include "hack/kv/block_manager.h"
#include "hack/backend/cpu_paged_kv_cache.h"

using namespace hack;

namespace {

KvCacheOptions hack_options(int block, int sinks, int recent, size_t capacity = 0) {
  KvCacheOptions o;
  o.mode = KvMode::hack;
  o.block_tokens = block;
  o.sinks = sinks;
  o.recent_tokens = recent;
  o.capacity_bytes = capacity;
  return o;
}

// 100 bytes a token, rounded up to whole blocks of 16.
size_t bytes_of(int max_tokens) { return static_cast<size_t>((max_tokens + 15) / 16) * 1600; }

bool same_plan(const AttentionPlan& a, const AttentionPlan& b) {
  if (a.items.size() != b.items.size() || a.segments.size() != b.segments.size() || a.tasks.size() != b.tasks.size() ||
      a.segment_offsets != b.segment_offsets || a.state_floats != b.state_floats || a.order != b.order)
    return false;
  for (size_t i = 0; i < a.items.size(); ++i) {
    const PlanItem &x = a.items[i], &y = b.items[i];
    if (x.seq_id != y.seq_id || x.start_pos != y.start_pos || x.n_tokens != y.n_tokens || x.row != y.row ||
        x.closed_pages != y.closed_pages)
      return false;
  }
  for (size_t i = 0; i < a.segments.size(); ++i) {
    const PlanSegment &x = a.segments[i], &y = b.segments[i];
    if (x.first_token != y.first_token || x.tokens != y.tokens || x.slot != y.slot || x.index != y.index) return false;
  }
  for (size_t i = 0; i < a.tasks.size(); ++i) {
    const PlanTask &x = a.tasks[i], &y = b.tasks[i];
    if (x.item != y.item || x.head_begin != y.head_begin || x.head_end != y.head_end || x.row_begin != y.row_begin ||
        x.n_rows != y.n_rows || x.seg_begin != y.seg_begin || x.seg_end != y.seg_end || x.state != y.state)
      return false;
  }
  return true;
}

}  // namespace

TEST_CASE("block manager: admission reserves against the budget and gives it back") {
  KvBlockManager m(2, hack_options(16, 4, 0, 3200), bytes_of);
  m.add_sequence(1, 16);
  CHECK(m.reserved_bytes() == 1600);
  REQUIRE_THROWS_AS(m.add_sequence(1, 16), Error);  // exists
  REQUIRE_THROWS_AS(m.add_sequence(2, 0), Error);   // no tokens
  REQUIRE_THROWS_AS(m.add_sequence(2, 40), Error);  // 4800 bytes do not fit
  CHECK_FALSE(m.has_sequence(2));
  CHECK_FALSE(m.try_extend_sequence(1, 48));  // would need 4800
  CHECK(m.max_tokens(1) == 16);
  CHECK(m.try_extend_sequence(1, 32));
  CHECK(m.try_extend_sequence(1, 20));  // never shrinks
  CHECK(m.max_tokens(1) == 32);
  CHECK(m.reserved_bytes() == 3200);
  CHECK(m.remove_sequence(1));
  CHECK_FALSE(m.remove_sequence(1));
  CHECK(m.reserved_bytes() == 0);
  m.add_sequence(2, 32);
  CHECK(m.sequence_count() == 1);
}

TEST_CASE("block manager: appends are checked, blocks close outside the recent window and the prefill") {
  // Π 16, S 4, R 20: block b covers [4 + 16b, 20 + 16b) and may close once 20 + 16b ≤ length − 20.
  KvBlockManager m(1, hack_options(16, 4, 20), bytes_of);
  m.add_sequence(7, 200);
  REQUIRE_THROWS_AS(m.check_append(7, 0, 1, 5), Error);    // not at the end
  REQUIRE_THROWS_AS(m.check_append(7, 0, 0, 201), Error);  // past max_tokens
  REQUIRE_THROWS_AS(m.check_append(7, 1, 0, 1), Error);    // no layer 1
  m.record_append(7, 0, 52);                               // sinks + 3 blocks
  CHECK(m.full_blocks(52) == 3);
  CHECK(m.pending_blocks(7, 0) == 3);
  // Block 0 ends at 20 ≤ 52 − 20 = 32 and may close; block 1 ends at 36 > 32 and stays.
  CHECK(m.closable_blocks(7, 0) == 1);
  m.record_closed(7, 0, 1);
  CHECK(m.pending_blocks(7, 0) == 2);
  REQUIRE_THROWS_AS(m.record_closed(7, 0, 4), Error);  // block 3 is not full
  m.begin_prefill(7);
  CHECK(m.prefilling(7));
  CHECK(m.end_prefill(7));
  CHECK_FALSE(m.end_prefill(7));

  std::vector<PlanSegment> seg;
  m.list_segments(52, 1, seg);
  REQUIRE(seg.size() == 4);
  CHECK((seg[0].slot == SegmentSlot::sinks && seg[0].tokens == 4));
  CHECK((seg[1].slot == SegmentSlot::closed && seg[1].index == 0 && seg[1].first_token == 4));
  CHECK((seg[2].slot == SegmentSlot::pending && seg[2].index == 0 && seg[2].first_token == 20));
  CHECK((seg[3].slot == SegmentSlot::pending && seg[3].index == 1 && seg[3].first_token == 36));
  seg.clear();
  m.list_segments(60, 1, seg);
  CHECK((seg.back().slot == SegmentSlot::open && seg.back().first_token == 52 && seg.back().tokens == 8));
}

TEST_CASE("block manager: fp pages are all closed, the last one partial") {
  KvCacheOptions o;
  o.mode = KvMode::fp;
  o.block_tokens = 16;
  KvBlockManager m(1, o, bytes_of);
  m.add_sequence(3, 100);
  m.record_append(3, 0, 33);
  CHECK(m.closed_blocks(3, 0) == 3);
  CHECK(m.pending_blocks(3, 0) == 0);
  std::vector<PlanSegment> seg;
  m.list_segments(33, 0, seg);
  REQUIRE(seg.size() == 3);
  CHECK((seg[2].slot == SegmentSlot::closed && seg[2].index == 2 && seg[2].tokens == 1));
}

TEST_CASE("block manager: a bare manager told what a storage did plans what the CPU storage plans") {
  const KvShape shape{.num_layers = 2, .num_kv_heads = 2, .head_dim = 32, .group_size = 2};
  for (const int recent : {0, 24}) {
    KvCacheOptions o = hack_options(16, 4, recent);
    CpuPagedKvCache cache(shape, o);
    // A storage that follows the manager's rules: close what closable_blocks allows at every
    // append outside the prefill, and at end_prefill.
    KvBlockManager bare(shape.num_layers, o, [&](int t) { return cache.sequence_bytes(t); });
    std::mt19937 rng(11 + recent);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const size_t token = static_cast<size_t>(shape.num_kv_heads * shape.head_dim);
    auto append_both = [&](int seq, int n) {
      std::vector<float> k(static_cast<size_t>(n) * token), v(k.size());
      for (float& x : k) x = u(rng);
      for (float& x : v) x = u(rng);
      for (int l = 0; l < shape.num_layers; ++l) {
        const int at = bare.length(seq, l);
        cache.append(l, seq, at, n, k.data(), v.data());
        bare.check_append(seq, l, at, n);
        if (n > 0 && !bare.prefilling(seq)) bare.record_closed(seq, l, bare.closable_blocks(seq, l));
        bare.record_append(seq, l, n);
      }
    };
    for (int seq : {1, 2}) {
      cache.add_sequence(seq, 300);
      bare.add_sequence(seq, 300);
      cache.begin_prefill(seq);
      bare.begin_prefill(seq);
      append_both(seq, 37 + 40 * seq);
      cache.end_prefill(seq);
      if (bare.end_prefill(seq))
        for (int l = 0; l < shape.num_layers; ++l) bare.record_closed(seq, l, bare.closable_blocks(seq, l));
    }
    for (int step = 0; step < 40; ++step) {
      std::vector<PlanItem> items{PlanItem{1, bare.length(1, 0), 1, 0}, PlanItem{2, bare.length(2, 0), step % 3 + 1, 1}};
      AttentionPlan from_cache, from_bare;
      cache.plan(items, PlanPolicy{.split_segments = 3}, from_cache);
      bare.plan(shape, items, PlanPolicy{.split_segments = 3}, from_bare);
      REQUIRE(same_plan(from_cache, from_bare));
      append_both(1, 1);
      append_both(2, step % 3 + 1);
      for (int seq : {1, 2})
        for (int l = 0; l < shape.num_layers; ++l) {
          REQUIRE(cache.length(seq, l) == bare.length(seq, l));
          REQUIRE(cache.hack_page_count(seq, l) == bare.closed_blocks(seq, l));
          REQUIRE(cache.hack_pages(seq, l).size() == static_cast<size_t>(bare.closed_blocks(seq, l)));  // the pages themselves
          REQUIRE(cache.hack_pages(seq, l).data() == cache.blocks().pages(seq, l).data());  // the manager's table
          REQUIRE(cache.pending_block_count(seq, l) == bare.pending_blocks(seq, l));
        }
    }
    CHECK(cache.stats().bytes_reserved == bare.reserved_bytes());
  }
}

TEST_CASE("block manager: a fork keeps the closed blocks among its tokens and never cuts a closed one") {
  KvBlockManager m(2, hack_options(16, 4, 0), bytes_of);
  m.add_sequence(1, 100);
  for (int l = 0; l < 2; ++l) {
    m.record_append(1, l, 60);  // sinks + 3 blocks + 8
    m.record_closed(1, l, l == 0 ? 3 : 2);
  }
  m.fork_sequence(1, 2, 36, 80);  // sinks + 2 blocks: both closed in both layers
  CHECK(m.length(2, 0) == 36);
  CHECK(m.closed_blocks(2, 0) == 2);
  CHECK(m.closed_blocks(2, 1) == 2);
  CHECK(m.max_tokens(2) == 80);
  m.fork_sequence(1, 3, 52, 60);  // 3 blocks: closed 3 in layer 0, 2 (one pending) in layer 1
  CHECK(m.closed_blocks(3, 0) == 3);
  CHECK(m.pending_blocks(3, 1) == 1);
  REQUIRE_THROWS_AS(m.fork_sequence(1, 4, 40, 60), Error);  // token 40 lies in closed block 2
  REQUIRE_THROWS_AS(m.fork_sequence(1, 4, 61, 80), Error);  // more than src holds
  REQUIRE_THROWS_AS(m.fork_sequence(1, 4, 30, 20), Error);  // more than dst may hold
  CHECK_FALSE(m.has_sequence(4));
  m.fork_sequence(1, 4, 58, 60);  // in the open block (after every closed one): copied
  CHECK(m.length(4, 1) == 58);
}

TEST_CASE("block manager: the page ids it hands out are shared by forks and freed with their last holder") {
  KvBlockManager m(2, hack_options(16, 4, 0), bytes_of);
  m.own_page_ids({0, 0});  // both layers' pages in one space
  REQUIRE(m.owns_pages());
  m.add_sequence(1, 100);
  REQUIRE_THROWS_AS(m.own_page_ids({0, 0}), Error);  // once, before any sequence
  std::vector<uint32_t> ids;
  for (int l = 0; l < 2; ++l) {
    m.record_append(1, l, 60);  // sinks + 3 blocks + 8
    m.new_pages(l, 3, ids);
    REQUIRE_THROWS_AS(m.record_closed(1, l, 3), Error);  // closed blocks come with their pages
    m.close_blocks(1, l, ids);
    CHECK(m.closed_blocks(1, l) == 3);
  }
  PageIds& space = m.page_ids(0);
  REQUIRE(&space == &m.page_ids(1));
  CHECK(space.in_use() == 6);
  // Layer 0's ids were handed out first; every id is distinct.
  CHECK(std::vector<uint32_t>(m.pages(1, 0).begin(), m.pages(1, 0).end()) == std::vector<uint32_t>{0, 1, 2});
  CHECK(std::vector<uint32_t>(m.pages(1, 1).begin(), m.pages(1, 1).end()) == std::vector<uint32_t>{3, 4, 5});
  // A block that is not full cannot close.
  m.new_pages(0, 1, ids);
  REQUIRE_THROWS_AS(m.close_blocks(1, 0, ids), Error);
  m.free_pages(0, ids);
  CHECK(space.in_use() == 6);

  m.fork_sequence(1, 2, 36, 80);  // sinks + 2 blocks: shares two pages per layer
  CHECK(std::vector<uint32_t>(m.pages(2, 1).begin(), m.pages(2, 1).end()) == std::vector<uint32_t>{3, 4});
  CHECK(m.page_ref_count(2, 0, 0) == 2);
  CHECK(m.page_ref_count(1, 0, 2) == 1);  // block 2 is not dst's
  CHECK(space.in_use() == 6);
  REQUIRE(m.remove_sequence(1));
  CHECK(space.in_use() == 4);  // the pages only sequence 1 held are free, the shared ones stay
  CHECK(m.page_ref_count(2, 0, 1) == 1);
  // Emptying a layer (a rebuild) gives its pages back; other counts are the table's.
  REQUIRE_THROWS_AS(m.set_layer(2, 0, 36, 1), Error);  // two pages held, not one
  m.set_layer(2, 0, 0, 0);
  CHECK(m.pages(2, 0).empty());
  CHECK(space.in_use() == 2);
  REQUIRE(m.remove_sequence(2));
  CHECK(space.in_use() == 0);
  m.new_pages(1, 1, ids);
  CHECK(ids[0] == 4);  // the last freed id first (layer 1 of sequence 2 went last)
  m.free_pages(1, ids);
}

TEST_CASE("block manager: fp pages get ids as they start, and a fork copies the partial one into an id of its own") {
  KvCacheOptions o;
  o.mode = KvMode::fp;
  o.block_tokens = 16;
  KvBlockManager m(1, o, bytes_of);
  m.own_page_ids({0});
  m.add_sequence(3, 100);
  for (int p = 0; p < 3; ++p) m.add_page(3, 0);
  m.record_append(3, 0, 40);
  CHECK(m.closed_blocks(3, 0) == 3);
  m.fork_sequence(3, 4, 40, 64);  // two full pages shared, the third (8 tokens) copied
  const std::span<const uint32_t> a = m.pages(3, 0), b = m.pages(4, 0);
  REQUIRE(b.size() == 3);
  CHECK((b[0] == a[0] && b[1] == a[1] && b[2] != a[2]));
  CHECK(m.page_ref_count(4, 0, 1) == 2);
  CHECK(m.page_ref_count(4, 0, 2) == 1);
  m.fork_sequence(3, 5, 32, 64);  // exactly two pages: nothing to copy
  CHECK(m.pages(5, 0).size() == 2);
  CHECK(m.page_ids(0).in_use() == 4);
  for (int s : {3, 4, 5}) m.remove_sequence(s);
  CHECK(m.page_ids(0).in_use() == 0);
  REQUIRE_THROWS_AS(m.add_page(7, 0), Error);  // unknown sequence
}
