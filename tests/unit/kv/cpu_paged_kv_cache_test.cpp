// The paged pool and CpuPagedKvCache: paged equals contiguous (fp mode against FpKvCache),
// shared prefixes and reference counts, byte accounting, page transfer and concurrent use.
// The step's attention plan is tested in attention_plan_test.cpp.
#include <catch2/catch.hpp>
#include <sys/mman.h>
#include <unistd.h>


#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "hack/core/error.h"
#include "hack/core/thread_pool.h"
#include "hack/kv/fp_kv_cache.h"
#include "hack/kv/page_pool.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "kv_test_util.h"

using namespace hack;
using hack::test::KvStream;

namespace {

KvCacheOptions fp_options(DType dtype, int block) {
  KvCacheOptions o;
  o.mode = KvMode::fp;
  o.fp_dtype = dtype;
  o.block_tokens = block;
  return o;
}

KvCacheOptions hack_options(int bits, int block, int sinks = 4) {
  KvCacheOptions o;
  o.mode = KvMode::hack;
  o.k_bits = o.v_bits = bits;
  o.block_tokens = block;
  o.sinks = sinks;
  return o;
}

// Feeds the same stream to both caches in chunks; after every chunk compares attention of
// every (layer, head) row: |a − b| ≤ atol + rtol·|b|.
template <class CacheA, class CacheB>
void compare_caches(CacheA& a, CacheB& b, const KvStream& data, int layers, const std::vector<int>& chunks,
                    double atol, double rtol) {
  const int H = data.heads, G = data.group, d = data.dim;
  a.add_sequence(7, data.tokens);
  b.add_sequence(7, data.tokens);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  int pos = 0;
  for (size_t ci = 0; pos < data.tokens; ++ci) {
    const int n = std::min(chunks[ci % chunks.size()], data.tokens - pos);
    const size_t row = static_cast<size_t>(H) * G * d;
    std::vector<float> out_a(n * row), out_b(n * row);
    std::vector<float> sa(a.attend_scratch_floats(n, pos + n)), sb(b.attend_scratch_floats(n, pos + n));
    for (int l = 0; l < layers; ++l) {
      a.append(l, 7, pos, n, data.k_at(pos), data.v_at(pos));
      b.append(l, 7, pos, n, data.k_at(pos), data.v_at(pos));
      for (int h = 0; h < H; ++h) {
        const size_t off = static_cast<size_t>(h) * G * d;
        a.attend(l, 7, h, pos, n, data.q_at(pos) + off, row, out_a.data() + off, row, scale, sa.data());
        b.attend(l, 7, h, pos, n, data.q_at(pos) + off, row, out_b.data() + off, row, scale, sb.data());
      }
      for (size_t i = 0; i < out_a.size(); ++i)
        if (std::fabs(out_a[i] - out_b[i]) > atol + rtol * std::fabs(out_b[i]))
          FAIL("layer " << l << " tokens " << pos << "+" << n << " element " << i << ": " << out_a[i] << " vs "
                        << out_b[i]);
    }
    pos += n;
  }
  REQUIRE(a.length(7, layers - 1) == data.tokens);
}

}  // namespace

TEST_CASE("paged fp32 equals the contiguous fp32 cache", "[kv][paged]") {
  // Same fp32 values, different summation order (canonical 16-lane dots, online softmax
  // across pages): differences are fp32 rounding, ~1e-6 relative; 1e-4 leaves room for
  // scores of magnitude ~30 while any indexing error shows up at O(0.1).
  for (int block : {16, 64})
    for (int group : {1, 4, 8})
      for (int dim : {64, 128}) {
        INFO("block " << block << " group " << group << " dim " << dim);
        const KvStream data(3 * block + 7, 2, group, dim, static_cast<uint32_t>(block + group + dim));
        FpKvCache contiguous(KvShape{2, 2, dim, group});
        auto paged = make_paged_kv_cache(KvShape{2, 2, dim, group}, fp_options(DType::f32, block));
        compare_caches(*paged, contiguous, data, 2, {1, 3, block + 1, 1, 2 * block}, 1e-4, 1e-4);
      }
}

TEST_CASE("paged bf16 equals the contiguous cache on bf16-rounded K/V", "[kv][paged]") {
  const int dim = 64, group = 4, block = 32;
  KvStream data(2 * block + 5, 2, group, dim, 5);
  KvStream rounded = data;
  for (float& x : rounded.k) x = test::bf16_round(x);
  for (float& x : rounded.v) x = test::bf16_round(x);
  FpKvCache contiguous(KvShape{1, 2, dim, group});
  auto paged = make_paged_kv_cache(KvShape{1, 2, dim, group}, fp_options(DType::bf16, block));
  // The paged cache rounds the unrounded stream itself.
  const float scale = 0.125f;
  contiguous.add_sequence(1, data.tokens);
  paged->add_sequence(1, data.tokens);
  contiguous.append(0, 1, 0, data.tokens, rounded.k.data(), rounded.v.data());
  paged->append(0, 1, 0, data.tokens, data.k.data(), data.v.data());
  const size_t row = 2 * group * dim;
  std::vector<float> a(data.tokens * row), b(data.tokens * row), scratch(paged->attend_scratch_floats(data.tokens, data.tokens) +
                                                                          contiguous.attend_scratch_floats(data.tokens, data.tokens));
  for (int h = 0; h < 2; ++h) {
    const size_t off = static_cast<size_t>(h) * group * dim;
    paged->attend(0, 1, h, 0, data.tokens, data.q.data() + off, row, a.data() + off, row, scale, scratch.data());
    contiguous.attend(0, 1, h, 0, data.tokens, data.q.data() + off, row, b.data() + off, row, scale, scratch.data());
  }
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(std::fabs(a[i] - b[i]) <= 1e-4 + 1e-4 * std::fabs(b[i]));
}

TEST_CASE("hack mode with every block exact equals bf16 attention", "[kv][paged]") {
  // A single append of the whole stream leaves every block pending (exact): a prefill
  // chunk attends to itself in bf16, so it must match the bf16 fp cache.
  const int dim = 64, group = 4, block = 16;
  const KvStream data(5 * block + 3, 2, group, dim, 9);
  auto hack = make_paged_kv_cache(KvShape{1, 2, dim, group}, hack_options(2, block));
  auto bf16 = make_paged_kv_cache(KvShape{1, 2, dim, group}, fp_options(DType::bf16, block));
  compare_caches(*hack, *bf16, data, 1, {data.tokens}, 1e-5, 1e-5);
}

TEST_CASE("a prefill attends to the whole prompt exactly in any number of chunks", "[kv][paged]") {
  // Between begin_prefill and end_prefill nothing is quantized, so a prompt prefilled in
  // chunks sees exactly what the bf16 cache sees; end_prefill then quantizes every block,
  // and the pages are byte for byte those of a token-by-token run.
  const int dim = 64, group = 3, block = 16, H = 2;
  const KvStream data(4 + 6 * block + 5, H, group, dim, 12);
  auto hack = make_paged_kv_cache(KvShape{1, H, dim, group}, hack_options(2, block));
  auto bf16 = make_paged_kv_cache(KvShape{1, H, dim, group}, fp_options(DType::bf16, block));
  REQUIRE_THROWS_AS(hack->begin_prefill(99), Error);  // unknown sequence
  hack->add_sequence(7, data.tokens);
  hack->begin_prefill(7);
  hack->remove_sequence(7);
  auto prefill_hack = [&](CpuPagedKvCache& c) {
    c.add_sequence(7, data.tokens);
    c.begin_prefill(7);
  };
  prefill_hack(*hack);
  bf16->add_sequence(7, data.tokens);
  const float scale = 0.125f;
  const size_t row = static_cast<size_t>(H) * group * dim;
  int pos = 0;
  for (const int n : {5, 17, 40, data.tokens - 62}) {
    std::vector<float> out_a(n * row), out_b(n * row);
    std::vector<float> sa(hack->attend_scratch_floats(n, pos + n)), sb(bf16->attend_scratch_floats(n, pos + n));
    hack->append(0, 7, pos, n, data.k_at(pos), data.v_at(pos));
    bf16->append(0, 7, pos, n, data.k_at(pos), data.v_at(pos));
    REQUIRE(hack->hack_page_count(7, 0) == 0);
    for (int h = 0; h < H; ++h) {
      hack->attend(0, 7, h, pos, n, data.q_at(pos) + h * group * dim, row, out_a.data() + h * group * dim, row, scale,
                   sa.data());
      bf16->attend(0, 7, h, pos, n, data.q_at(pos) + h * group * dim, row, out_b.data() + h * group * dim, row, scale,
                   sb.data());
    }
    for (size_t i = 0; i < out_a.size(); ++i) REQUIRE(std::fabs(out_a[i] - out_b[i]) <= 1e-5 + 1e-5 * std::fabs(out_b[i]));
    pos += n;
  }
  hack->end_prefill(7);
  CpuPagedKvCache& paged = *hack;
  REQUIRE(paged.hack_page_count(7, 0) == 6);
  REQUIRE(paged.pending_block_count(7, 0) == 0);
  auto stepwise = make_paged_kv_cache(KvShape{1, H, dim, group}, hack_options(2, block));
  stepwise->add_sequence(0, data.tokens + 1);
  for (int t = 0; t < data.tokens; ++t) stepwise->append(0, 0, t, 1, data.k_at(t), data.v_at(t));
  stepwise->close_pending_blocks(0);
  for (int i = 0; i < 6; ++i) {
    const auto a = paged.hack_page(7, 0, i), b = stepwise->hack_page(0, 0, i);
    REQUIRE(std::memcmp(a.data(), b.data(), a.size()) == 0);
  }

  SECTION("exact_prefill off: chunks see the earlier chunks quantized (the ablation's old path)") {
    KvCacheOptions o = hack_options(2, block);
    o.exact_prefill = false;
    auto old = make_paged_kv_cache(KvShape{1, H, dim, group}, o);
    old->add_sequence(7, data.tokens);
    old->begin_prefill(7);
    old->append(0, 7, 0, 40, data.k_at(0), data.v_at(0));
    old->append(0, 7, 40, 5, data.k_at(40), data.v_at(40));
    REQUIRE(old->hack_page_count(7, 0) == 2);
  }
}

TEST_CASE("the recent window keeps the newest tokens exact", "[kv][paged]") {
  const int dim = 64, group = 2, block = 16, H = 2, S = 4;
  const KvStream data(S + 8 * block + 3, H, group, dim, 13);
  for (const int recent : {0, 1, 15, 16, 17, 40}) {
    KvCacheOptions o = hack_options(2, block, S);
    o.recent_tokens = recent;
    auto cache = make_paged_kv_cache(KvShape{1, H, dim, group}, o);
    cache->add_sequence(0, data.tokens);
    for (int t = 0; t < data.tokens; ++t) {
      cache->append(0, 0, t, 1, data.k_at(t), data.v_at(t));
      // Before storing token t, blocks ending at or before t − recent were quantized.
      const int expect = std::max(0, t - recent - S) / block;
      INFO("recent " << recent << " token " << t);
      REQUIRE(cache->hack_page_count(0, 0) == expect);
      // Every token of the window is still readable exactly.
      if (t >= recent && t - recent >= S + expect * block) {
        std::vector<float> k(static_cast<size_t>(H) * dim), v(k.size());
        REQUIRE_NOTHROW(cache->read_exact_tokens(0, 0, t - recent, 1, k.data(), v.data()));
      }
    }
    // The reservation covers the window's bf16 blocks.
    KvCacheOptions none = hack_options(2, block, S);
    if (recent > 0) REQUIRE(cache->sequence_bytes(1000) > make_paged_kv_cache(KvShape{1, H, dim, group}, none)->sequence_bytes(1000));
  }
}

TEST_CASE("page pool reference counts and reuse", "[kv][paged]") {
  PagePool pool(100, 3);
  REQUIRE(pool.page_bytes() == 128);
  const PageRef a = pool.allocate(), b = pool.allocate();
  REQUIRE(reinterpret_cast<uintptr_t>(a.data) % 64 == 0);
  REQUIRE(pool.pages_in_use() == 2);
  pool.retain(a);
  REQUIRE(pool.ref_count(a) == 2);
  pool.release(a);
  REQUIRE(pool.pages_in_use() == 2);
  pool.release(a);
  REQUIRE(pool.pages_in_use() == 1);
  REQUIRE_THROWS_AS(pool.release(a), Error);
  const PageRef c = pool.allocate();
  REQUIRE(c.id == a.id);  // freed pages are reused before new slabs
  std::vector<PageRef> many;
  for (int i = 0; i < 10; ++i) many.push_back(pool.allocate());
  REQUIRE(pool.pages_in_use() == 12);
  REQUIRE(pool.bytes_reserved() == 12 * 128);
  for (PageRef p : many) pool.release(p);
  pool.release(b);
  pool.release(c);
  REQUIRE(pool.pages_in_use() == 0);
}

TEST_CASE("page ids: new ids count up, freed ones come back last-freed first, a bounded space refuses", "[kv][paged]") {
  PageIds ids(3);
  REQUIRE(ids.allocate() == 0);
  REQUIRE(ids.allocate() == 1);
  ids.retain(1);
  REQUIRE_FALSE(ids.release(1));
  REQUIRE(ids.release(1));
  REQUIRE_THROWS_AS(ids.release(1), Error);
  REQUIRE(ids.allocate() == 1);
  REQUIRE(ids.allocate() == 2);
  REQUIRE(ids.available() == 0);
  REQUIRE_THROWS_AS(ids.allocate(), Error);  // every id is held
  REQUIRE(ids.release(0));
  REQUIRE(ids.release(2));
  REQUIRE(ids.allocate() == 2);
  REQUIRE(ids.ref_count(0) == 0);
  REQUIRE(ids.in_use() == 2);
}

TEST_CASE("page pool maps ids another owner hands out, and keeps slabs whose ids are held", "[kv][paged]") {
  PageIds ids;
  PagePool pool(4096, 4, &ids);
  std::vector<uint32_t> held;
  for (int i = 0; i < 8; ++i) held.push_back(ids.allocate());
  for (uint32_t id : held) std::memset(pool.map(id), static_cast<int>(id), 4096);
  REQUIRE(pool.bytes_reserved() == 8 * 4096);
  REQUIRE(pool.pages_in_use() == 8);
  REQUIRE(pool.data(5) == pool.data(4) + 4096);  // a slab's pages are contiguous, in id order
  for (uint32_t id = 4; id < 8; ++id) ids.release(id);
  REQUIRE(pool.release_free_slabs() >= 3 * 4096);  // slab 1 is free
  REQUIRE(std::to_integer<int>(pool.data(3)[0]) == 3);  // slab 0 kept
  REQUIRE(pool.release_free_slabs() == 0);
  const uint32_t again = ids.allocate();  // the last freed
  REQUIRE(again == 7);
  std::memset(pool.map(again), 9, 4096);
  REQUIRE(std::to_integer<int>(pool.data(7)[4095]) == 9);
}

// Pages of [data, data + bytes) the OS holds in memory, counting whole OS pages inside the range.
size_t resident_os_pages(const std::byte* data, size_t bytes) {
  const size_t os_page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const auto from = (reinterpret_cast<uintptr_t>(data) + os_page - 1) / os_page * os_page;
  const auto to = (reinterpret_cast<uintptr_t>(data) + bytes) / os_page * os_page;
  if (to <= from) return 0;
  std::vector<unsigned char> in_core((to - from) / os_page);
  REQUIRE(::mincore(reinterpret_cast<void*>(from), to - from, in_core.data()) == 0);
  size_t n = 0;
  for (unsigned char c : in_core) n += c & 1;
  return n;
}

TEST_CASE("page pool gives the memory of free slabs back and keeps their pages usable", "[kv][paged]") {
  // 16 pages of 4 KiB per slab, two slabs; one page of the first stays in use.
  const size_t page = 4096, per_slab = 16;
  PagePool pool(page, per_slab);
  std::vector<PageRef> pages;
  for (size_t i = 0; i < 2 * per_slab; ++i) {
    pages.push_back(pool.allocate());
    std::memset(pages.back().data, 0xab, page);
  }
  REQUIRE(pool.bytes_reserved() == 2 * per_slab * page);
  const std::byte* slab0 = pages[0].data;  // pages of a slab are contiguous, in id order
  const std::byte* slab1 = pages[per_slab].data;
  REQUIRE(resident_os_pages(slab1, per_slab * page) >= per_slab - 1);
  REQUIRE(pool.release_free_slabs() == 0);  // every slab has pages in use
  for (size_t i = 1; i < pages.size(); ++i) pool.release(pages[i]);
  const size_t released = pool.release_free_slabs();
  CHECK(released >= (per_slab - 1) * page);  // slab 1's interior OS pages; slab 0 holds a page
  CHECK(released <= per_slab * page);
  CHECK(resident_os_pages(slab1, per_slab * page) == 0);
  CHECK(resident_os_pages(slab0, per_slab * page) >= per_slab - 1);  // untouched: a page is in use
  CHECK(std::to_integer<int>(pages[0].data[page - 1]) == 0xab);
  CHECK(pool.release_free_slabs() == 0);  // given back once
  pool.release(pages[0]);
  CHECK(pool.release_free_slabs() >= (per_slab - 1) * page);
  CHECK(pool.bytes_reserved() == 2 * per_slab * page);  // the addresses stay the pool's
  // Every page is handed out again and holds what is written to it.
  std::vector<PageRef> again;
  for (size_t i = 0; i < 2 * per_slab; ++i) {
    again.push_back(pool.allocate());
    std::memset(again.back().data, static_cast<int>(i), page);
  }
  for (size_t i = 0; i < again.size(); ++i) {
    CHECK(std::to_integer<size_t>(again[i].data[0]) == i);
    CHECK(std::to_integer<size_t>(again[i].data[page - 1]) == i);
  }
  CHECK(pool.release_free_slabs() == 0);  // both slabs in use again
  for (PageRef p : again) pool.release(p);
}

TEST_CASE("forked sequences share full pages", "[kv][paged]") {
  for (KvMode mode : {KvMode::hack, KvMode::fp}) {
    const int dim = 64, group = 2, block = 16;
    const KvStream data(4 + 4 * block + 5, 2, group, dim, 21);
    KvCacheOptions o = mode == KvMode::hack ? hack_options(2, block) : fp_options(DType::bf16, block);
    auto cache = make_paged_kv_cache(KvShape{2, 2, dim, group}, o);
    cache->add_sequence(1, 200);
    for (int t = 0; t < data.tokens; ++t)
      for (int l = 0; l < 2; ++l) cache->append(l, 1, t, 1, data.k_at(t), data.v_at(t));
    const KvCacheStats before = cache->stats();
    const int shared_tokens = mode == KvMode::hack ? data.tokens : 2 * block + 3;
    cache->fork_sequence(1, 2, shared_tokens, 200);
    REQUIRE(cache->length(2, 1) == shared_tokens);
    const int full = mode == KvMode::hack ? 4 : 2;
    for (int i = 0; i < full; ++i) REQUIRE(cache->page_ref_count(2, 0, i) == 2);
    // Only the partly filled block (and nothing else) was copied.
    const size_t copied = cache->stats().bytes_used - before.bytes_used;
    const size_t exact_page = 2 * 2 * static_cast<size_t>(block) * dim * 2 * 2;  // two layers
    REQUIRE(copied == exact_page);
    // Both continue with different tokens; the fork attends like the original did.
    const float scale = 0.125f;
    const size_t row = 2 * group * dim;
    std::vector<float> a(row), b(row), scratch(cache->attend_scratch_floats(1, 200));
    const int t = shared_tokens;
    for (int l = 0; l < 2; ++l) {
      cache->append(l, 2, t, 1, data.k_at(t - 1), data.v_at(t - 1));
      if (mode == KvMode::fp) cache->remove_sequence(99);  // no-op
    }
    auto reference = make_paged_kv_cache(KvShape{2, 2, dim, group}, o);
    reference->add_sequence(3, 200);
    for (int u = 0; u < shared_tokens; ++u)
      for (int l = 0; l < 2; ++l) reference->append(l, 3, u, 1, data.k_at(u), data.v_at(u));
    for (int l = 0; l < 2; ++l) reference->append(l, 3, t, 1, data.k_at(t - 1), data.v_at(t - 1));
    // The new token's query is the stream's last one, as its K/V are (under hack, t is the
    // stream's length: q_at(t) would read past it).
    for (int h = 0; h < 2; ++h) {
      const size_t off = static_cast<size_t>(h) * group * dim;
      cache->attend(1, 2, h, t, 1, data.q_at(t - 1) + off, row, a.data() + off, row, scale, scratch.data());
      reference->attend(1, 3, h, t, 1, data.q_at(t - 1) + off, row, b.data() + off, row, scale, scratch.data());
    }
    REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    cache->remove_sequence(1);
    for (int i = 0; i < full; ++i) REQUIRE(cache->page_ref_count(2, 0, i) == 1);
    cache->remove_sequence(2);
    REQUIRE(cache->stats().bytes_used == 0);
  }
}

TEST_CASE("fork refuses to cut into a quantized block", "[kv][paged]") {
  const KvStream data(4 + 3 * 16, 1, 1, 16, 2);
  auto cache = make_paged_kv_cache(KvShape{1, 1, 16, 1}, hack_options(2, 16));
  cache->add_sequence(1, 100);
  for (int t = 0; t < data.tokens; ++t) cache->append(0, 1, t, 1, data.k_at(t), data.v_at(t));
  REQUIRE_THROWS_AS(cache->fork_sequence(1, 2, 4 + 16 + 3, 100), Error);
  REQUIRE_FALSE(cache->has_sequence(2));
  REQUIRE_NOTHROW(cache->fork_sequence(1, 2, 4 + 32, 100));
}

TEST_CASE("byte budget admits sequences by their worst case", "[kv][paged]") {
  KvCacheOptions o = hack_options(2, 64);
  const KvShape shape{4, 8, 128, 4};
  o.capacity_bytes = 0;
  auto probe = make_paged_kv_cache(shape, o);
  probe->add_sequence(0, 1000);
  // 1000 tokens: 15 HACK pages + open + sink page per layer.
  const HackPageLayout& layout = probe->hack_layout();
  const size_t per_layer = 15 * layout.page_bytes() + 2 * 8 * 64 * 128 * 2 + 2 * 8 * 4 * 128 * 2;
  o.capacity_bytes = 2 * 4 * per_layer + 100;
  auto cache = make_paged_kv_cache(shape, o);
  cache->add_sequence(1, 1000);
  cache->add_sequence(2, 1000);
  REQUIRE_THROWS_WITH(cache->add_sequence(3, 1000), Catch::Contains("KV bytes"));
  cache->remove_sequence(1);
  REQUIRE_NOTHROW(cache->add_sequence(3, 1000));
  REQUIRE(cache->stats().bytes_capacity == o.capacity_bytes);
  REQUIRE(cache->stats().bytes_used == 0);  // nothing stored yet
  REQUIRE(cache->stats().sequences == 2);
}

TEST_CASE("reservations grow within the budget and are returned on removal", "[kv][paged]") {
  KvCacheOptions o = hack_options(2, 64);
  const KvShape shape{4, 8, 128, 4};
  o.capacity_bytes = 0;
  auto probe = make_paged_kv_cache(shape, o);
  const size_t small = probe->sequence_bytes(100), large = probe->sequence_bytes(1000);
  REQUIRE(large > small);
  o.capacity_bytes = large + small;
  auto cache = make_paged_kv_cache(shape, o);
  cache->add_sequence(1, 100);
  cache->add_sequence(2, 100);
  REQUIRE(cache->stats().bytes_reserved == 2 * small);
  REQUIRE(cache->try_extend_sequence(1, 1000));  // small + (large - small) + small fits exactly
  REQUIRE(cache->stats().bytes_reserved == large + small);
  REQUIRE(cache->max_tokens(1) == 1000);
  REQUIRE_FALSE(cache->try_extend_sequence(2, 1000));  // nothing changes on refusal
  REQUIRE(cache->max_tokens(2) == 100);
  REQUIRE(cache->stats().bytes_reserved == large + small);
  REQUIRE(cache->try_extend_sequence(2, 50));  // never shrinks
  REQUIRE(cache->max_tokens(2) == 100);
  std::vector<float> k(static_cast<size_t>(200) * 8 * 128, 0.5f);
  for (int l = 0; l < shape.num_layers; ++l) cache->append(l, 1, 0, 200, k.data(), k.data());  // past the old 100
  cache->remove_sequence(1);
  cache->remove_sequence(2);
  REQUIRE(cache->stats().bytes_reserved == 0);
  REQUIRE(cache->stats().bytes_used == 0);
}

TEST_CASE("kv bytes per token", "[kv][paged]") {
  const KvShape llama8b{32, 8, 128, 4};
  const double bf16 = kv_bytes_per_token(llama8b, fp_options(DType::bf16, 64));
  REQUIRE(bf16 == 32.0 * 4096);
  REQUIRE(kv_bytes_per_token(llama8b, fp_options(DType::f32, 64)) == 2 * bf16);
  const double h2 = kv_bytes_per_token(llama8b, hack_options(2, 64));
  WARN("bytes/token vs bf16 (Llama-3-8B shape): 2-bit Π=64 " << h2 / bf16);
  REQUIRE(h2 / bf16 <= 0.17);
  for (int bits : {2, 4, 8})
    for (int block : {32, 64, 128}) {
      const double r = kv_bytes_per_token(llama8b, hack_options(bits, block)) / bf16;
      WARN("  " << bits << "-bit Π=" << block << ": " << r * 100 << " % of bf16");
      REQUIRE(r < bits / 16.0 + 0.1);
    }
}

TEST_CASE("HACK pages travel as bytes and are validated on arrival", "[kv][paged]") {
  const int dim = 64, group = 2, block = 16;
  const KvStream data(4 + 3 * block + 5, 2, group, dim, 33);
  const KvCacheOptions o = hack_options(4, block);
  auto sender = make_paged_kv_cache(KvShape{2, 2, dim, group}, o);
  auto receiver = make_paged_kv_cache(KvShape{2, 2, dim, group}, o);
  sender->add_sequence(1, 100);
  for (int l = 0; l < 2; ++l) sender->append(l, 1, 0, data.tokens, data.k_at(0), data.v_at(0));
  REQUIRE(sender->hack_page_count(1, 0) == 0);  // one prefill append: its blocks are still pending
  sender->close_pending_blocks(1);
  REQUIRE(sender->hack_page_count(1, 0) == 3);
  REQUIRE(sender->hack_page_count(1, 1) == 3);
  receiver->add_sequence(5, 100);
  for (int l = 0; l < 2; ++l) {
    receiver->append(l, 5, 0, 4, data.k_at(0), data.v_at(0));  // sinks
    const auto page0 = sender->hack_page(1, l, 0);
    std::vector<std::byte> bad(page0.begin(), page0.end());
    REQUIRE_THROWS_AS(receiver->append_hack_page(l, 5, bad.data(), bad.size() - 1), Error);  // size
    REQUIRE_THROWS_AS(receiver->append_hack_page(1 - l, 5, bad.data(), bad.size()), Error);   // layer
    const auto page1 = sender->hack_page(1, l, 1);
    REQUIRE_THROWS_AS(receiver->append_hack_page(l, 5, page1.data(), page1.size()), Error);   // position
    for (int i = 0; i < 3; ++i) {
      const auto p = sender->hack_page(1, l, i);
      receiver->append_hack_page(l, 5, p.data(), p.size());
    }
    const int first_open = 4 + 3 * block;
    receiver->append(l, 5, first_open, data.tokens - first_open, data.k_at(first_open), data.v_at(first_open));
  }
  const size_t row = 2 * group * dim;
  std::vector<float> a(row), b(row), scratch(sender->attend_scratch_floats(1, 100));
  const int pos = data.tokens - 1;
  for (int h = 0; h < 2; ++h) {
    const size_t off = static_cast<size_t>(h) * group * dim;
    sender->attend(1, 1, h, pos, 1, data.q_at(pos) + off, row, a.data() + off, row, 0.1f, scratch.data());
    receiver->attend(1, 5, h, pos, 1, data.q_at(pos) + off, row, b.data() + off, row, 0.1f, scratch.data());
  }
  REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST_CASE("closing with known pages copies them, checked first, instead of quantizing", "[kv][paged]") {
  const int dim = 64, group = 2, block = 16;
  const KvStream data(4 + 3 * block + 5, 2, group, dim, 34);
  const KvStream other(4 + 3 * block + 5, 2, group, dim, 35);  // other tokens: other pages
  const KvCacheOptions o = hack_options(4, block);
  const KvShape shape{2, 2, dim, group};
  auto source = make_paged_kv_cache(shape, o);  // the pages a known-page close copies
  auto plain = make_paged_kv_cache(shape, o);
  auto cache = make_paged_kv_cache(shape, o);
  source->add_sequence(1, 100);
  plain->add_sequence(1, 100);
  cache->add_sequence(1, 100);
  for (int l = 0; l < 2; ++l) {
    source->append(l, 1, 0, other.tokens, other.k_at(0), other.v_at(0));
    plain->append(l, 1, 0, data.tokens, data.k_at(0), data.v_at(0));
    cache->append(l, 1, 0, data.tokens, data.k_at(0), data.v_at(0));
  }
  source->close_pending_blocks(1);
  plain->close_pending_blocks(1);
  // Block 1 of each layer is known (from the other tokens, so the copy is visible); 0 and 2 are quantized.
  const KnownPages known = [&](int layer, int b) -> const std::byte* {
    return b == 1 ? source->hack_page(1, layer, 1).data() : nullptr;
  };
  // A page of another layer or position is refused before anything changes.
  const KnownPages wrong_layer = [&](int layer, int b) -> const std::byte* {
    return b == 1 ? source->hack_page(1, 1 - layer, 1).data() : nullptr;
  };
  const KnownPages wrong_block = [&](int layer, int b) -> const std::byte* {
    return b == 1 ? source->hack_page(1, layer, 2).data() : nullptr;
  };
  REQUIRE_THROWS_AS(cache->close_pending_blocks(1, 0, wrong_layer), Error);
  REQUIRE_THROWS_AS(cache->close_pending_blocks(1, 0, wrong_block), Error);
  REQUIRE(cache->hack_page_count(1, 0) == 0);
  REQUIRE(cache->pending_block_count(1, 0) == 3);
  for (int l = 0; l < 2; ++l) {
    cache->close_pending_blocks(1, l, known);
    REQUIRE(cache->hack_page_count(1, l) == 3);
    for (int b = 0; b < 3; ++b) {
      INFO("layer " << l << " block " << b);
      const auto got = cache->hack_page(1, l, b);
      const auto want = (b == 1 ? *source : *plain).hack_page(1, l, b);
      REQUIRE(std::equal(got.begin(), got.end(), want.begin(), want.end()));
    }
    const auto quantized = plain->hack_page(1, l, 1), copied = cache->hack_page(1, l, 1);
    CHECK_FALSE(std::equal(copied.begin(), copied.end(), quantized.begin(), quantized.end()));
  }
}

TEST_CASE("concurrent appends and attends of different sequences", "[kv][paged]") {
  const int dim = 64, group = 2, block = 16, H = 2, n_seq = 6, L = 4 + 5 * block + 3;
  const KvShape shape{2, H, dim, group};
  auto serial = make_paged_kv_cache(shape, hack_options(2, block));
  auto parallel = make_paged_kv_cache(shape, hack_options(2, block));
  std::vector<KvStream> streams;
  for (int s = 0; s < n_seq; ++s) {
    streams.emplace_back(L, H, group, dim, static_cast<uint32_t>(70 + s));
    serial->add_sequence(s, L);
    parallel->add_sequence(s, L);
  }
  const size_t row = static_cast<size_t>(H) * group * dim;
  auto run = [&](CpuPagedKvCache& cache, int s, std::vector<float>& out) {
    std::vector<float> scratch(cache.attend_scratch_floats(1, L));
    for (int t = 0; t < L; ++t)
      for (int l = 0; l < 2; ++l) {
        cache.append(l, s, t, 1, streams[static_cast<size_t>(s)].k_at(t), streams[static_cast<size_t>(s)].v_at(t));
        for (int h = 0; h < H; ++h) {
          const size_t off = static_cast<size_t>(h) * group * dim;
          cache.attend(l, s, h, t, 1, streams[static_cast<size_t>(s)].q_at(t) + off, row,
                       out.data() + static_cast<size_t>(t) * row + off, row, 0.125f, scratch.data());
        }
      }
  };
  std::vector<std::vector<float>> expect(n_seq, std::vector<float>(L * row)), got(n_seq, std::vector<float>(L * row));
  for (int s = 0; s < n_seq; ++s) run(*serial, s, expect[static_cast<size_t>(s)]);
  std::vector<std::thread> threads;
  for (int s = 0; s < n_seq; ++s) threads.emplace_back([&, s] { run(*parallel, s, got[static_cast<size_t>(s)]); });
  for (auto& t : threads) t.join();
  for (int s = 0; s < n_seq; ++s) REQUIRE(got[static_cast<size_t>(s)] == expect[static_cast<size_t>(s)]);
}

TEST_CASE("misuse is reported", "[kv][paged]") {
  auto cache = make_paged_kv_cache(KvShape{1, 1, 16, 1}, hack_options(2, 16));
  const KvStream data(40, 1, 1, 16, 1);
  cache->add_sequence(1, 20);
  REQUIRE_THROWS_AS(cache->add_sequence(1, 20), Error);
  REQUIRE_THROWS_AS(cache->append(0, 1, 3, 1, data.k_at(0), data.v_at(0)), Error);
  REQUIRE_THROWS_AS(cache->append(0, 1, 0, 21, data.k_at(0), data.v_at(0)), Error);
  REQUIRE_THROWS_AS(cache->append(0, 2, 0, 1, data.k_at(0), data.v_at(0)), Error);
  cache->append(0, 1, 0, 5, data.k_at(0), data.v_at(0));
  std::vector<float> out(16), scratch(cache->attend_scratch_floats(1, 20));
  REQUIRE_THROWS_AS(cache->attend(0, 1, 0, 5, 1, data.q_at(5), 16, out.data(), 16, 1.0f, scratch.data()), Error);
  REQUIRE_THROWS_AS(make_paged_kv_cache(KvShape{1, 1, 24, 1}, hack_options(2, 16)), Error);  // head_dim % 16
  REQUIRE_THROWS_AS(make_paged_kv_cache(KvShape{1, 1, 16, 1}, hack_options(3, 16)), Error);
  REQUIRE_THROWS_AS(make_paged_kv_cache(KvShape{1, 1, 16, 1}, hack_options(2, 24)), Error);
  REQUIRE(parse_kv_mode("hack") == KvMode::hack);
  REQUIRE(parse_rounding("stochastic") == Rounding::stochastic);
  REQUIRE_THROWS_AS(parse_kv_mode("int4"), Error);
  REQUIRE(cache->name() == "hack-2bit");
  REQUIRE(describe(hack_options(4, 32)) == "hack k4v4 block=32 sinks=4 nearest");
  REQUIRE(describe(fp_options(DType::f32, 64)) == "fp f32 block=64");
}
