// Decode and prefill attention over the paged device KV pool against a double-precision
// reference on the same bf16 K/V, sweeping lengths around the page size (1, Π−1, Π, Π+1,
// several pages), GQA group sizes, head dims (incl. 256, which needs opted-in shared
// memory in prefill) and decode split sizes.
//
// Tolerance: |gpu − ref| ≤ 1e-4 + 2^-8·|ref|. The output is a convex combination of V rows
// (|v| ≤ 1): fp32 softmax and accumulation give ~1e-6 absolute; the bf16 output rounding
// is 2^-9 relative. A wrong mask, page lookup or softmax rescale is off by O(0.1).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "gpu/cuda_test_util.h"
#include "hack/backend/cuda_paged_kv_cache.h"
#include "support/test_support.h"

using namespace hack;
using test::bptr;
using test::dptr;

namespace {

struct AttnShape {
  int group_size, head_dim, page_tokens, kv_heads;
};

// K/V of one sequence as the cache's append takes them: [tokens][kv_heads][head_dim],
// bf16-exact so the pool stores exactly these values.
struct SeqKv {
  std::vector<float> k, v;
};

SeqKv random_kv(std::mt19937& rng, int tokens, const AttnShape& s) {
  const size_t n = static_cast<size_t>(tokens) * static_cast<size_t>(s.kv_heads * s.head_dim);
  return {test::random_floats(rng, n, -1, 1, true), test::random_floats(rng, n, -1, 1, true)};
}

// out[d] for one query head attending to keys [0, n_keys).
std::vector<double> reference(const float* q, const SeqKv& kv, int kv_head, int n_keys, const AttnShape& s,
                              float scale) {
  const size_t hd = static_cast<size_t>(s.head_dim), kvd = static_cast<size_t>(s.kv_heads) * hd;
  std::vector<double> scores(static_cast<size_t>(n_keys));
  double mx = -1e300;
  for (int j = 0; j < n_keys; ++j) {
    const float* k = &kv.k[static_cast<size_t>(j) * kvd + static_cast<size_t>(kv_head) * hd];
    double dot = 0;
    for (size_t d = 0; d < hd; ++d) dot += static_cast<double>(q[d]) * k[d];
    scores[static_cast<size_t>(j)] = dot * scale;
    mx = std::max(mx, scores[static_cast<size_t>(j)]);
  }
  double sum = 0;
  for (double& x : scores) sum += (x = std::exp(x - mx));
  std::vector<double> out(hd, 0.0);
  for (int j = 0; j < n_keys; ++j) {
    const float* v = &kv.v[static_cast<size_t>(j) * kvd + static_cast<size_t>(kv_head) * hd];
    for (size_t d = 0; d < hd; ++d) out[d] += scores[static_cast<size_t>(j)] / sum * v[d];
  }
  return out;
}

const AttnShape kShapes[] = {
    {1, 32, 16, 2},   // MHA, smallest head
    {4, 64, 16, 2},   // GQA 4
    {2, 128, 64, 1},  // large pages
    {8, 128, 16, 2},  // Llama-3-8B-like group
    {4, 256, 32, 1},  // head_dim 256 (Gemma-like): prefill needs > 48 KiB shared memory
    {3, 96, 32, 2},   // group 3 (Llama-3.2-3B), 3 channels a lane in the warp decode kernel
    {16, 64, 16, 1},  // the warp decode kernel's largest group
    {20, 64, 16, 1},  // beyond it: the generic decode kernel
    {2, 80, 16, 2},   // head_dim not a multiple of 32: the generic decode kernel
};

}  // namespace

TEST_CASE("cuda decode attention over paged bf16 KV matches the reference", "[gpu][attention]") {
  const uint32_t seed = 4242;
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const AttnShape& s : kShapes) {
    const int P = s.page_tokens;
    INFO("group " << s.group_size << " head_dim " << s.head_dim << " page " << P << " kv_heads " << s.kv_heads);
    const std::vector<int> lengths{1, P - 1, P, P + 1, 3 * P + 5, 7 * P};
    const int n = static_cast<int>(lengths.size());
    const KvShape shape{2, s.kv_heads, s.head_dim, s.group_size};
    CudaKvOptions ko;
    ko.page_tokens = P;
    ko.num_pages = 64;
    CudaPagedKvCache cache(shape, ko);
    // A short decoy sequence first, so no table starts at page 0.
    cache.add_sequence(100, 2 * P);
    const int layer = 1;  // layer 1: the layer offset into the pool is exercised
    const int q_heads = s.kv_heads * s.group_size;
    std::vector<SeqKv> kv;
    std::vector<int> tables, table_offsets;
    for (int i = 0; i < n; ++i) {
      const int len = lengths[static_cast<size_t>(i)];
      cache.add_sequence(i, len + 3);
      kv.push_back(random_kv(rng, len, s));
      // Written by the backend's kv_append kernel (slots from the page table).
      const auto table = cache.page_table(i);
      std::vector<int> slots(static_cast<size_t>(len));
      for (int p = 0; p < len; ++p) slots[static_cast<size_t>(p)] = table[static_cast<size_t>(p / P)] * P + p % P;
      Buffer dk = test::to_device(kv.back().k), dv = test::to_device(kv.back().v), ds = test::to_device(slots);
      cuda::kv_append(cache.layer(layer), dptr<float>(dk), dptr<float>(dv), dptr<int>(ds), len, nullptr);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      cache.commit_append(layer, i, 0, len);
      table_offsets.push_back(static_cast<int>(tables.size()));
      tables.insert(tables.end(), table.begin(), table.end());
    }
    cache.remove_sequence(100);

    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    // Queries scaled up so the softmax is peaked (tests the running-max rescale).
    const auto q = test::random_floats(rng, static_cast<size_t>(n * q_heads * s.head_dim), -4, 4);
    std::vector<int> rows(static_cast<size_t>(n));
    std::iota(rows.begin(), rows.end(), 0);
    std::reverse(rows.begin(), rows.end());  // sequence i's query sits in row n − 1 − i
    Buffer dq = test::to_device(q), drows = test::to_device(rows), dlen = test::to_device(lengths);
    Buffer dtab = test::to_device(tables), doff = test::to_device(table_offsets);
    Buffer dout = Buffer::allocate(MemoryKind::device, q.size() * 2);
    const int max_pages = CudaPagedKvCache::pages_for(*std::max_element(lengths.begin(), lengths.end()), P);
    for (int pages_per_split : {1, 2, 3, 1000}) {
      INFO("pages per split " << pages_per_split);
      cuda::DecodeAttentionArgs a;
      a.kv = cache.layer(layer);
      a.q = dptr<float>(dq);
      a.out = bptr(dout);
      a.q_row_stride = q_heads * s.head_dim;
      a.rows = dptr<int>(drows);
      a.kv_lengths = dptr<int>(dlen);
      a.page_tables = dptr<int>(dtab);
      a.page_table_offsets = dptr<int>(doff);
      a.n_seqs = n;
      a.group_size = s.group_size;
      a.scale = scale;
      a.pages_per_split = std::min(pages_per_split, max_pages);
      a.n_splits = (max_pages + a.pages_per_split - 1) / a.pages_per_split;
      Buffer partial = Buffer::allocate(
          MemoryKind::device,
          static_cast<size_t>(cuda::decode_attention_workspace_floats(n, q_heads, a.n_splits, s.head_dim)) * 4);
      a.partial = dptr<float>(partial);
      cuda::decode_attention(a, nullptr);
      const auto got = test::from_bf16_bits(test::to_host<uint16_t>(dout, q.size()));
      for (int i = 0; i < n; ++i) {
        const size_t row = static_cast<size_t>(rows[static_cast<size_t>(i)]);
        for (int h = 0; h < q_heads; ++h) {
          const size_t off = row * static_cast<size_t>(a.q_row_stride) + static_cast<size_t>(h * s.head_dim);
          const auto ref = reference(&q[off], kv[static_cast<size_t>(i)], h / s.group_size,
                                     lengths[static_cast<size_t>(i)], s, scale);
          for (int d = 0; d < s.head_dim; ++d) {
            INFO("seq " << i << " (length " << lengths[static_cast<size_t>(i)] << ") head " << h << " dim " << d);
            REQUIRE(test::close(got[off + static_cast<size_t>(d)], ref[static_cast<size_t>(d)], 1e-4, 1.0 / 256));
          }
        }
      }
    }
  }
}

TEST_CASE("cuda prefill attention (paged past + the chunk itself, causal) matches the reference",
          "[gpu][attention]") {
  const uint32_t seed = 777;
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const AttnShape& s : kShapes) {
    const int P = s.page_tokens;
    INFO("group " << s.group_size << " head_dim " << s.head_dim << " page " << P << " kv_heads " << s.kv_heads);
    struct Chunk {
      int start, n;
    };
    // (past tokens, chunk tokens): fresh prompts, 1-token chunks, chunks straddling pages.
    const std::vector<Chunk> chunks{{0, 1}, {0, 37}, {P - 1, 2}, {5, P + 1}, {3 * P, 16}, {2, 3 * P + 7}, {1, 1}};
    const int n_chunks = static_cast<int>(chunks.size());
    const KvShape shape{1, s.kv_heads, s.head_dim, s.group_size};
    CudaKvOptions ko;
    ko.page_tokens = P;
    ko.num_pages = 128;
    CudaPagedKvCache cache(shape, ko);
    const int q_heads = s.kv_heads * s.group_size;
    std::vector<SeqKv> kv;
    std::vector<int> tables, table_offsets, first_rows, n_tokens, start_pos;
    int total_rows = 0, max_n = 0;
    for (int c = 0; c < n_chunks; ++c) {
      const Chunk& ch = chunks[static_cast<size_t>(c)];
      const int len = ch.start + ch.n;
      cache.add_sequence(c, len);
      kv.push_back(random_kv(rng, len, s));
      // Written through the host append (the other fill path; decode uses the kernel): past
      // and chunk, as the backend appends the chunk's K/V before attending.
      cache.append(0, c, 0, len, kv.back().k.data(), kv.back().v.data());
      const auto table = cache.page_table(c);
      table_offsets.push_back(static_cast<int>(tables.size()));
      tables.insert(tables.end(), table.begin(), table.end());
      first_rows.push_back(total_rows);
      n_tokens.push_back(ch.n);
      start_pos.push_back(ch.start);
      total_rows += ch.n;
      max_n = std::max(max_n, ch.n);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    const size_t row_len = static_cast<size_t>(q_heads * s.head_dim);
    const auto q = test::random_floats(rng, static_cast<size_t>(total_rows) * row_len, -4, 4);
    Buffer dq = test::to_device(q), dfirst = test::to_device(first_rows), dn = test::to_device(n_tokens);
    Buffer dstart = test::to_device(start_pos), dtab = test::to_device(tables), doff = test::to_device(table_offsets);
    Buffer dout = Buffer::allocate(MemoryKind::device, q.size() * 2);
    cuda::PrefillAttentionArgs a;
    a.kv = cache.layer(0);
    a.q = dptr<float>(dq);
    a.out = bptr(dout);
    a.q_row_stride = static_cast<int>(row_len);
    a.first_rows = dptr<int>(dfirst);
    a.n_tokens = dptr<int>(dn);
    a.start_pos = dptr<int>(dstart);
    a.page_tables = dptr<int>(dtab);
    a.page_table_offsets = dptr<int>(doff);
    a.n_chunks = n_chunks;
    a.max_tokens = max_n;
    a.q_heads = q_heads;
    a.group_size = s.group_size;
    a.scale = scale;
    cuda::prefill_attention(a, nullptr);
    const auto got = test::from_bf16_bits(test::to_host<uint16_t>(dout, q.size()));
    for (int c = 0; c < n_chunks; ++c) {
      const Chunk& ch = chunks[static_cast<size_t>(c)];
      for (int r = 0; r < ch.n; ++r) {
        const size_t row = static_cast<size_t>(first_rows[static_cast<size_t>(c)] + r);
        for (int h = 0; h < q_heads; ++h) {
          const size_t off = row * row_len + static_cast<size_t>(h * s.head_dim);
          const auto ref = reference(&q[off], kv[static_cast<size_t>(c)], h / s.group_size, ch.start + r + 1, s, scale);
          for (int d = 0; d < s.head_dim; ++d) {
            INFO("chunk " << c << " (past " << ch.start << ", " << ch.n << " tokens) row " << r << " head " << h
                          << " dim " << d);
            REQUIRE(test::close(got[off + static_cast<size_t>(d)], ref[static_cast<size_t>(d)], 1e-4, 1.0 / 256));
          }
        }
      }
    }
  }
}

TEST_CASE("device KV cache reserves pages up front and rejects what does not fit", "[gpu][kv]") {
  CudaKvOptions ko;
  ko.page_tokens = 16;
  ko.num_pages = 4;
  CudaPagedKvCache cache(KvShape{2, 2, 32, 2}, ko);
  cache.add_sequence(0, 33);  // 3 pages
  REQUIRE(cache.free_pages() == 1);
  REQUIRE_THROWS_AS(cache.add_sequence(1, 17), hack::Error);  // needs 2
  REQUIRE_THROWS_AS(cache.add_sequence(0, 1), hack::Error);   // id in use
  std::vector<float> k(2 * 32, 0.5f);
  REQUIRE_THROWS_AS(cache.append(0, 0, 1, 1, k.data(), k.data()), hack::Error);  // must start at length 0
  cache.append(0, 0, 0, 1, k.data(), k.data());
  REQUIRE(cache.length(0, 0) == 1);
  REQUIRE(cache.length(0, 1) == 0);
  REQUIRE_THROWS_AS(cache.commit_append(1, 0, 0, 34), hack::Error);  // past the reservation
  cache.remove_sequence(0);
  REQUIRE(cache.free_pages() == 4);
  cache.add_sequence(1, 64);
  REQUIRE(cache.page_table(1).size() == 4);
}
