// The KV stream codec on synthetic K/V: a layer exported while it is being filled (chunk
// by chunk, as prefill does) and imported in order into a second cache reproduces the
// state a single cache reaches (same page bytes, same exact tokens, same attention bits);
// bad messages are rejected with the cache left as it was. The model-level test (prefill
// on one cache, decode on another, against one Engine) is tests/unit/backend/kv_stream_engine_test.cpp.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "hack/core/error.h"
#include "hack/kv/kv_stream.h"
#include "kv_test_util.h"

using namespace hack;
using hack::test::KvStream;

namespace {

constexpr int kLayers = 2, kHeads = 2, kGroup = 2, kDim = 32, kBlock = 16;

KvCacheOptions make_options(KvMode mode, int bits, DType fp_dtype, int sinks = 4) {
  KvCacheOptions o;
  o.mode = mode;
  o.k_bits = o.v_bits = bits;
  o.block_tokens = kBlock;
  o.sinks = sinks;
  o.fp_dtype = fp_dtype;
  return o;
}

struct Message {
  int layer;
  KvMessageKind kind;
  std::vector<std::byte> bytes;
};

// Appends `data` to `cache` in chunks; after each layer of each chunk exports it (when
// `messages` is given), like the prefill callback does.
void fill(CpuPagedKvCache& cache, int seq, const KvStream& data, int chunk, std::vector<Message>* messages,
          KvExportCursor* cursor) {
  for (int pos = 0; pos < data.tokens;) {
    const int n = std::min(chunk, data.tokens - pos);
    const bool last = pos + n == data.tokens;
    for (int l = 0; l < kLayers; ++l) {
      cache.append(l, seq, pos, n, data.k_at(pos), data.v_at(pos));
      if (messages != nullptr)
        export_layer(cache, seq, l, last, *cursor, [&](KvMessageKind kind, std::span<const std::byte> payload) {
          messages->push_back({l, kind, {payload.begin(), payload.end()}});
        });
    }
    pos += n;
  }
}

// Exact tokens of a layer that are not quantized, as raw bytes (K then V).
std::vector<std::byte> exact_bytes(const CpuPagedKvCache& cache, int seq, int layer, int first, int n) {
  const size_t bytes = static_cast<size_t>(n) * kHeads * kDim * dtype_size(cache.exact_dtype());
  std::vector<std::byte> out(2 * bytes);
  cache.copy_exact_tokens(seq, layer, first, n, out.data(), out.data() + bytes);
  return out;
}

// Same layer state in both caches: lengths, page bytes, exact tokens, pending blocks only
// inside the recent window (none without one).
void require_same_state(const CpuPagedKvCache& a, int seq_a, const CpuPagedKvCache& b, int seq_b) {
  const KvCacheOptions& o = a.options();
  for (int l = 0; l < kLayers; ++l) {
    INFO("layer " << l);
    const int length = a.length(seq_a, l);
    REQUIRE(b.length(seq_b, l) == length);
    const int window_blocks = (o.recent_tokens + o.block_tokens - 1) / o.block_tokens;
    REQUIRE(a.pending_block_count(seq_a, l) == b.pending_block_count(seq_b, l));
    REQUIRE(a.pending_block_count(seq_a, l) <= window_blocks);
    int exact_from = 0;
    if (o.mode == KvMode::hack) {
      const int pages = a.hack_page_count(seq_a, l);
      REQUIRE(b.hack_page_count(seq_b, l) == pages);
      for (int i = 0; i < pages; ++i) {
        const auto pa = a.hack_page(seq_a, l, i), pb = b.hack_page(seq_b, l, i);
        REQUIRE(pa.size() == pb.size());
        REQUIRE(std::memcmp(pa.data(), pb.data(), pa.size()) == 0);
      }
      const int sinks = std::min(length, o.sinks);
      if (sinks > 0) REQUIRE(exact_bytes(a, seq_a, l, 0, sinks) == exact_bytes(b, seq_b, l, 0, sinks));
      exact_from = o.sinks + pages * o.block_tokens;
    }
    if (length > exact_from)
      REQUIRE(exact_bytes(a, seq_a, l, exact_from, length - exact_from) ==
              exact_bytes(b, seq_b, l, exact_from, length - exact_from));
  }
}

}  // namespace

TEST_CASE("kv stream: an exported layer imports to the same state", "[kv][stream]") {
  struct Config {
    const char* name;
    KvCacheOptions options;
  };
  const std::vector<Config> configs = {
      {"hack 2-bit", make_options(KvMode::hack, 2, DType::bf16)},
      {"hack 4-bit", make_options(KvMode::hack, 4, DType::bf16)},
      {"hack 8-bit", make_options(KvMode::hack, 8, DType::bf16)},
      {"hack 2-bit no sinks", make_options(KvMode::hack, 2, DType::bf16, 0)},
      {"hack K4/V2 recent 20", [] {
         KvCacheOptions o = make_options(KvMode::hack, 4, DType::bf16);
         o.v_bits = 2;
         o.recent_tokens = 20;
         return o;
       }()},
      {"hack 2-bit recent 16", [] {
         KvCacheOptions o = make_options(KvMode::hack, 2, DType::bf16);
         o.recent_tokens = kBlock;
         return o;
       }()},
      {"fp bf16", make_options(KvMode::fp, 2, DType::bf16)},
      {"fp f32", make_options(KvMode::fp, 2, DType::f32)},
  };
  const KvShape shape{kLayers, kHeads, kDim, kGroup};
  for (const Config& config : configs) {
    for (int length : {1, 3, 4, 5, kBlock - 1, kBlock, 4 + kBlock, 3 * kBlock + 7, 100}) {
      for (int chunk : {7, 24, 1000}) {
        INFO(config.name << ", " << length << " tokens in chunks of " << chunk);
        const KvStream data(length + 1, kHeads, kGroup, kDim, static_cast<uint32_t>(length * 31 + chunk));
        CpuPagedKvCache reference(shape, config.options), prefill(shape, config.options), decode(shape, config.options);
        reference.add_sequence(1, length + 1);
        prefill.add_sequence(2, length + 1);
        decode.add_sequence(3, length + 1);
        KvStream prompt = data;
        prompt.tokens = length;
        fill(reference, 1, prompt, chunk, nullptr, nullptr);
        std::vector<Message> messages;
        KvExportCursor cursor;
        fill(prefill, 2, prompt, chunk, &messages, &cursor);
        REQUIRE(cursor.messages == messages.size());
        // Each layer's messages come in import order: exact sinks, pages, the open block.
        for (const Message& m : messages) import_message(decode, 3, m.layer, m.kind, m.bytes);
        // Closing reference's pending blocks is what its next append would do first.
        reference.close_pending_blocks(1);
        require_same_state(reference, 1, decode, 3);
        require_same_state(reference, 1, prefill, 2);
        if (config.options.mode == KvMode::hack) {
          // An exact prefill (nothing quantized until it ends) with the prompt length known
          // streams the same pages, each as soon as its block fills, to the same state.
          CpuPagedKvCache held(shape, config.options), decode2(shape, config.options);
          held.add_sequence(4, length + 1);
          decode2.add_sequence(5, length + 1);
          held.begin_prefill(4);
          std::vector<Message> streamed;
          KvExportCursor early;
          early.prompt_tokens = length;
          fill(held, 4, prompt, chunk, &streamed, &early);
          held.end_prefill(4);
          for (const Message& m : streamed) import_message(decode2, 5, m.layer, m.kind, m.bytes);
          require_same_state(reference, 1, decode2, 5);
          require_same_state(reference, 1, held, 4);
          for (int l = 0; l < kLayers; ++l) {  // per layer: the same pages in the same order
            std::vector<const Message*> pages_a, pages_b;
            for (const Message& m : messages)
              if (m.kind == KvMessageKind::hack_page && m.layer == l) pages_a.push_back(&m);
            for (const Message& m : streamed)
              if (m.kind == KvMessageKind::hack_page && m.layer == l) pages_b.push_back(&m);
            REQUIRE(pages_a.size() == pages_b.size());
            for (size_t i = 0; i < pages_a.size(); ++i) REQUIRE(pages_a[i]->bytes == pages_b[i]->bytes);
          }
        }
        // A further export of a finished layer is refused.
        REQUIRE_THROWS_AS(export_layer(prefill, 2, 0, true, cursor, [](KvMessageKind, std::span<const std::byte>) {}),
                          Error);

        // One decode token on both: attention bit for bit.
        const size_t row = static_cast<size_t>(kHeads) * kGroup * kDim;
        std::vector<float> out_ref(row), out_dec(row);
        std::vector<float> scratch(reference.attend_scratch_floats(1, length + 1));
        for (int l = 0; l < kLayers; ++l) {
          reference.append(l, 1, length, 1, data.k_at(length), data.v_at(length));
          decode.append(l, 3, length, 1, data.k_at(length), data.v_at(length));
          for (int h = 0; h < kHeads; ++h) {
            const size_t off = static_cast<size_t>(h) * kGroup * kDim;
            reference.attend(l, 1, h, length, 1, data.q_at(length) + off, row, out_ref.data() + off, row, 0.2f,
                             scratch.data());
            decode.attend(l, 3, h, length, 1, data.q_at(length) + off, row, out_dec.data() + off, row, 0.2f,
                          scratch.data());
          }
          REQUIRE(std::memcmp(out_ref.data(), out_dec.data(), row * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("kv stream: message order and sizes", "[kv][stream]") {
  const KvShape shape{kLayers, kHeads, kDim, kGroup};
  // hack: 4 sinks + 3 blocks + 5 open tokens, one chunk: sinks, then (at final) 3 pages, open.
  CpuPagedKvCache cache(shape, make_options(KvMode::hack, 2, DType::bf16));
  const int length = 4 + 3 * kBlock + 5;
  const KvStream data(length, kHeads, kGroup, kDim, 5);
  cache.add_sequence(1, length);
  std::vector<Message> messages;
  KvExportCursor cursor;
  fill(cache, 1, data, 20, &messages, &cursor);
  std::vector<std::pair<int, KvMessageKind>> kinds;
  for (const Message& m : messages) kinds.emplace_back(m.layer, m.kind);
  // Chunks [0,20) [20,40) [40,57): sinks are sent once complete, each block after the
  // append that quantizes it (the next chunk's), and with the final export the blocks
  // closed then and the open block's 5 tokens.
  using K = KvMessageKind;
  const std::vector<std::pair<int, K>> expected = {
      {0, K::exact}, {1, K::exact},                                      // chunk 1: sinks (block 0 pending)
      {0, K::hack_page}, {1, K::hack_page},                              // chunk 2: block 0
      {0, K::hack_page}, {0, K::hack_page}, {0, K::exact},               // final: blocks 1, 2, open
      {1, K::hack_page}, {1, K::hack_page}, {1, K::exact}};
  REQUIRE(kinds == expected);
  const ExactTokensHeader sinks = decode_exact_header(messages[0].bytes);
  CHECK(sinks.first_token == 0);
  CHECK(sinks.n_tokens == 4);
  CHECK(sinks.dtype == DType::bf16);
  CHECK(messages[0].bytes.size() == kExactTokensHeaderBytes + 2 * 4 * kHeads * kDim * 2);
  const ExactTokensHeader open = decode_exact_header(messages[6].bytes);
  CHECK(open.first_token == 4 + 3 * kBlock);
  CHECK(open.n_tokens == 5);
  CHECK(messages[2].bytes.size() == cache.hack_layout().page_bytes());
  size_t bytes = 0;
  for (const Message& m : messages) bytes += m.bytes.size();
  CHECK(cursor.bytes == bytes);

  // fp f32: page-sized exact messages, full pages as they fill, the tail at the end.
  CpuPagedKvCache fp(shape, make_options(KvMode::fp, 2, DType::f32));
  fp.add_sequence(1, 40);
  const KvStream fp_data(40, kHeads, kGroup, kDim, 6);
  std::vector<Message> fp_messages;
  KvExportCursor fp_cursor;
  fill(fp, 1, fp_data, 20, &fp_messages, &fp_cursor);
  std::vector<std::pair<uint64_t, uint32_t>> ranges;
  for (const Message& m : fp_messages) {
    if (m.layer != 0) continue;
    const ExactTokensHeader h = decode_exact_header(m.bytes);
    CHECK(h.dtype == DType::f32);
    ranges.emplace_back(h.first_token, h.n_tokens);
  }
  CHECK(ranges == std::vector<std::pair<uint64_t, uint32_t>>{{0, 16}, {16, 16}, {32, 8}});
}

TEST_CASE("kv stream: bad messages are rejected and leave the cache as it was", "[kv][stream]") {
  const KvShape shape{kLayers, kHeads, kDim, kGroup};
  const KvCacheOptions o = make_options(KvMode::hack, 2, DType::bf16);
  const int length = 4 + 2 * kBlock + 3;
  const KvStream data(length, kHeads, kGroup, kDim, 9);
  CpuPagedKvCache prefill(shape, o), decode(shape, o);
  prefill.add_sequence(1, length);
  std::vector<Message> messages;
  KvExportCursor cursor;
  fill(prefill, 1, data, length, &messages, &cursor);
  // Layer 0: sinks, page 0, page 1, open.
  std::vector<const Message*> layer0;
  for (const Message& m : messages)
    if (m.layer == 0) layer0.push_back(&m);
  REQUIRE(layer0.size() == 4);
  const auto& sinks = layer0[0]->bytes;
  const auto& page0 = layer0[1]->bytes;
  const auto& open = layer0[3]->bytes;

  decode.add_sequence(7, length);
  const KvCacheStats empty = decode.stats();
  auto reject = [&](KvMessageKind kind, std::vector<std::byte> bytes, const char* why, int layer = 0) {
    INFO(why);
    const int before = decode.length(7, layer);
    const size_t used = decode.stats().bytes_used;
    REQUIRE_THROWS_WITH(import_message(decode, 7, layer, kind, bytes), Catch::Contains(why));
    REQUIRE(decode.length(7, layer) == before);
    REQUIRE(decode.stats().bytes_used == used);
  };
  auto patched = [](std::vector<std::byte> bytes, size_t at, auto value) {
    std::memcpy(bytes.data() + at, &value, sizeof value);
    return bytes;
  };
  // Header problems.
  reject(KvMessageKind::exact, std::vector<std::byte>(sinks.begin(), sinks.begin() + 20), "shorter than");
  reject(KvMessageKind::exact, patched(sinks, 0, uint32_t{0x12345678}), "bad magic");
  reject(KvMessageKind::exact, patched(sinks, 4, uint16_t{9}), "version 9");
  reject(KvMessageKind::exact, patched(sinks, 6, uint8_t{5}), "unknown dtype");
  reject(KvMessageKind::exact, patched(sinks, 6, uint8_t{2}), "bytes, but");  // f32 declared: sizes disagree
  reject(KvMessageKind::exact, std::vector<std::byte>(sinks.begin(), sinks.end() - 1), "bytes, but");
  reject(KvMessageKind::exact, patched(sinks, 12, uint32_t{0}), "no tokens");
  // A self-consistent message of another shape or place.
  {
    // 2 tokens of 4 heads × 16 dims = the byte count of 4 tokens of 2 × 32 → only dims differ.
    auto other = patched(patched(sinks, 24, uint16_t{4}), 26, uint16_t{16});
    reject(KvMessageKind::exact, other, "4 KV heads of dim 16");
  }
  reject(KvMessageKind::exact, sinks, "of layer 0 arrived for layer 1", 1);
  reject(KvMessageKind::exact, open, "start at 36");           // the open block before the sinks
  reject(KvMessageKind::hack_page, page0, "holds 0 tokens");   // a page before the sinks
  {
    CpuPagedKvCache fp(shape, make_options(KvMode::fp, 2, DType::f32));
    fp.add_sequence(1, length);
    REQUIRE_THROWS_WITH(import_message(fp, 1, 0, KvMessageKind::exact, sinks), Catch::Contains("bf16 but this cache keeps f32"));
    REQUIRE_THROWS_WITH(import_message(fp, 1, 0, KvMessageKind::hack_page, page0), Catch::Contains("--kv fp"));
  }
  REQUIRE_THROWS_WITH(import_message(decode, 7, 5, KvMessageKind::exact, sinks), Catch::Contains("layer 5 out of range"));
  reject(static_cast<KvMessageKind>(9), sinks, "unknown message kind");

  // The good stream still applies after all that, then a page twice, a short page, tokens
  // that would fill a block and tokens past the capacity are refused.
  import_message(decode, 7, 0, KvMessageKind::exact, sinks);
  reject(KvMessageKind::exact, sinks, "start at 0");
  import_message(decode, 7, 0, KvMessageKind::hack_page, page0);
  reject(KvMessageKind::hack_page, page0, "token 4, expected layer 0 token 20");
  reject(KvMessageKind::hack_page, std::vector<std::byte>(layer0[2]->bytes.begin(), layer0[2]->bytes.end() - 64),
         "HACK page:");
  import_message(decode, 7, 0, KvMessageKind::hack_page, layer0[2]->bytes);
  {
    // A whole block as exact tokens (full blocks must travel as HACK pages): taken from a
    // cache whose third block is still pending, so still exact.
    CpuPagedKvCache big(shape, o);
    big.add_sequence(1, 4 + 3 * kBlock);
    const KvStream d(4 + 3 * kBlock, kHeads, kGroup, kDim, 3);
    big.append(0, 1, 0, 4 + 3 * kBlock, d.k_at(0), d.v_at(0));
    const auto filled = encode_exact_tokens(big, 1, 0, 4 + 2 * kBlock, kBlock);
    CpuPagedKvCache roomy(shape, o);
    roomy.add_sequence(1, 100);
    import_message(roomy, 1, 0, KvMessageKind::exact, sinks);
    import_message(roomy, 1, 0, KvMessageKind::hack_page, page0);
    import_message(roomy, 1, 0, KvMessageKind::hack_page, layer0[2]->bytes);
    REQUIRE_THROWS_WITH(import_message(roomy, 1, 0, KvMessageKind::exact, filled),
                        Catch::Contains("include the block at 36"));
    REQUIRE(roomy.length(1, 0) == 36);
  }
  {
    CpuPagedKvCache small(shape, o);
    small.add_sequence(1, 40);
    const KvStream d(40, kHeads, kGroup, kDim, 4);
    small.append(0, 1, 0, 40, d.k_at(0), d.v_at(0));
    small.close_pending_blocks(1, 0);
    auto too_many = encode_exact_tokens(small, 1, 0, 36, 4);
    CpuPagedKvCache tight(shape, o);
    tight.add_sequence(1, 38);
    import_message(tight, 1, 0, KvMessageKind::exact, sinks);
    import_message(tight, 1, 0, KvMessageKind::hack_page, page0);
    import_message(tight, 1, 0, KvMessageKind::hack_page, layer0[2]->bytes);
    REQUIRE_THROWS_WITH(import_message(tight, 1, 0, KvMessageKind::exact, too_many), Catch::Contains("capacity of 38"));
    REQUIRE(tight.length(1, 0) == 36);
  }
  import_message(decode, 7, 0, KvMessageKind::exact, open);
  REQUIRE(decode.length(7, 0) == length);
  for (int i = 0; i < 2; ++i) {
    const auto a = prefill.hack_page(1, 0, i), b = decode.hack_page(7, 0, i);
    REQUIRE(std::memcmp(a.data(), b.data(), a.size()) == 0);
  }
  REQUIRE(exact_bytes(prefill, 1, 0, 36, 3) == exact_bytes(decode, 7, 0, 36, 3));

  // Freeing the half-imported sequence returns every byte.
  decode.remove_sequence(7);
  CHECK(decode.stats().bytes_used == 0);
  CHECK(decode.stats().sequences == 0);
  CHECK(empty.bytes_used == 0);
}

TEST_CASE("kv stream: exact tokens are read back only where they are exact", "[kv][stream]") {
  const KvShape shape{kLayers, kHeads, kDim, kGroup};
  CpuPagedKvCache cache(shape, make_options(KvMode::hack, 2, DType::bf16));
  const int length = 4 + 2 * kBlock + 5;
  const KvStream data(length, kHeads, kGroup, kDim, 12);
  cache.add_sequence(1, length);
  cache.append(0, 1, 0, length, data.k_at(0), data.v_at(0));
  std::vector<float> k(static_cast<size_t>(length) * kHeads * kDim), v(k.size());
  // Right after the append every token is exact (blocks pending): bf16 of the input.
  cache.read_exact_tokens(1, 0, 0, length, k.data(), v.data());
  for (size_t i = 0; i < k.size(); ++i) {
    REQUIRE(k[i] == test::bf16_round(data.k[i]));
    REQUIRE(v[i] == test::bf16_round(data.v[i]));
  }
  REQUIRE(cache.pending_block_count(1, 0) == 2);
  cache.close_pending_blocks(1, 0);
  REQUIRE(cache.pending_block_count(1, 0) == 0);
  REQUIRE(cache.hack_page_count(1, 0) == 2);
  REQUIRE(cache.hack_page_count(1, 1) == 0);  // the per-layer close touched layer 0 only
  REQUIRE_THROWS_WITH(cache.read_exact_tokens(1, 0, 3, 2, k.data(), v.data()), Catch::Contains("quantized block"));
  REQUIRE_THROWS_WITH(cache.read_exact_tokens(1, 0, length - 1, 2, k.data(), v.data()), Catch::Contains("not stored"));
  cache.read_exact_tokens(1, 0, 4 + 2 * kBlock, 5, k.data(), v.data());
  const size_t off = static_cast<size_t>(4 + 2 * kBlock) * kHeads * kDim;
  for (size_t i = 0; i < 5 * kHeads * kDim; ++i) REQUIRE(k[i] == test::bf16_round(data.k[off + i]));
}
