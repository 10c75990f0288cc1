// Prefill on one cache, decode on another (the disaggregated path without the network)
// against one Engine on one cache (hack-run): the prefill exports every layer from the
// layer callback as soon as it is done (kv/kv_stream.h), the decode cache imports the
// messages in order, and 20 greedy decode steps must give the same tokens and bit-identical
// logits, with identical page bytes — for hack 2/4/8-bit (nearest and stochastic rounding)
// and fp bf16/f32, over prompt lengths around the sink and block boundaries.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "hack/backend/backend.h"
#include "hack/backend/engine.h"
#include "hack/core/error.h"
#include "hack/core/thread_pool.h"
#include "hack/kv/kv_stream.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "hack/model/config.h"
#include "hack/model/weights.h"
#include "support/synthetic_model.h"

using namespace hack;

namespace {

constexpr int kBlock = 32, kSinks = 4, kChunk = 80, kDecodeSteps = 20;

int argmax(const std::vector<float>& logits, size_t vocab) {
  return static_cast<int>(std::max_element(logits.begin(), logits.begin() + static_cast<std::ptrdiff_t>(vocab)) -
                          logits.begin());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every layer of two sequences holds the same bytes: pages, pending blocks, exact tokens.
void require_same_kv(const CpuPagedKvCache& a, const CpuPagedKvCache& b, int seq) {
  const KvShape& s = a.shape();
  const KvCacheOptions& o = a.options();
  for (int l = 0; l < s.num_layers; ++l) {
    INFO("layer " << l);
    const int length = a.length(seq, l);
    REQUIRE(b.length(seq, l) == length);
    REQUIRE(a.pending_block_count(seq, l) == b.pending_block_count(seq, l));
    int exact_from = 0;
    if (o.mode == KvMode::hack) {
      const int pages = a.hack_page_count(seq, l);
      REQUIRE(b.hack_page_count(seq, l) == pages);
      for (int i = 0; i < pages; ++i) {
        const auto pa = a.hack_page(seq, l, i), pb = b.hack_page(seq, l, i);
        REQUIRE(std::memcmp(pa.data(), pb.data(), pa.size()) == 0);
      }
      exact_from = o.sinks + pages * o.block_tokens;
      const int sinks = std::min(length, o.sinks);
      std::vector<float> ka(static_cast<size_t>(sinks) * s.num_kv_heads * s.head_dim), va(ka.size()), kb(ka.size()),
          vb(ka.size());
      if (sinks > 0) {
        a.read_exact_tokens(seq, l, 0, sinks, ka.data(), va.data());
        b.read_exact_tokens(seq, l, 0, sinks, kb.data(), vb.data());
        REQUIRE((same_bits(ka, kb) && same_bits(va, vb)));
      }
    }
    const int n = length - exact_from;
    if (n > 0) {
      std::vector<float> ka(static_cast<size_t>(n) * s.num_kv_heads * s.head_dim), va(ka.size()), kb(ka.size()),
          vb(ka.size());
      a.read_exact_tokens(seq, l, exact_from, n, ka.data(), va.data());
      b.read_exact_tokens(seq, l, exact_from, n, kb.data(), vb.data());
      REQUIRE((same_bits(ka, kb) && same_bits(va, vb)));
    }
  }
}

}  // namespace

TEST_CASE("prefill on one cache + decode on another equals one engine, bit for bit", "[backend][kv][stream]") {
  const ModelConfig cfg = test::small_synthetic_config();
  const Model model = Model::synthetic(cfg, 2024);
  ThreadPool pool(2);
  const KvShape shape = kv_shape(cfg);
  const size_t vocab = static_cast<size_t>(cfg.vocab_size);

  struct Config {
    const char* name;
    KvMode mode;
    int bits;
    DType fp_dtype;
    Rounding rounding;
    int v_bits = 0;  // 0 = bits
    int recent = 0;  // bf16 recent window
  };
  const std::vector<Config> configs = {
      {"hack 2-bit", KvMode::hack, 2, DType::bf16, Rounding::nearest},
      {"hack 4-bit", KvMode::hack, 4, DType::bf16, Rounding::nearest},
      {"hack 8-bit", KvMode::hack, 8, DType::bf16, Rounding::nearest},
      {"hack 2-bit stochastic", KvMode::hack, 2, DType::bf16, Rounding::stochastic},
      {"hack K4/V2 recent 40", KvMode::hack, 4, DType::bf16, Rounding::nearest, 2, 40},
      {"fp bf16", KvMode::fp, 2, DType::bf16, Rounding::nearest},
      {"fp f32", KvMode::fp, 2, DType::f32, Rounding::nearest},
  };
  const std::vector<int> lengths = {1,      kSinks - 1, kSinks, kSinks + 1, kBlock - 1, kBlock, kSinks + kBlock,
                                    3 * kBlock + 7, 1000, 2000};
  for (const Config& config : configs) {
    KvCacheOptions o;
    o.mode = config.mode;
    o.k_bits = config.bits;
    o.v_bits = config.v_bits > 0 ? config.v_bits : config.bits;
    o.recent_tokens = config.recent;
    o.block_tokens = kBlock;
    o.sinks = kSinks;
    o.fp_dtype = config.fp_dtype;
    o.rounding = config.rounding;
    o.seed = 77;
    for (int length : lengths) {
      INFO(config.name << ", prompt of " << length << " tokens (chunks of " << kChunk << ")");
      const std::vector<int> prompt = test::random_prompt(length, cfg.vocab_size, static_cast<uint32_t>(length));
      const int max_tokens = length + kDecodeSteps;

      // hack-run: one engine, one cache.
      CpuPagedKvCache ref_kv(shape, o);
      const std::unique_ptr<Backend> ref_backend = make_cpu_backend(model, pool, ref_kv);
      Engine ref(*ref_backend, EngineOptions{kChunk});
      ref.add_sequence(1, max_tokens);
      std::vector<float> ref_logits;
      ref.prefill(1, prompt, ref_logits);
      std::vector<std::vector<float>> ref_steps;
      std::vector<int> ref_tokens = {argmax(ref_logits, vocab)};
      for (int i = 0; i < kDecodeSteps; ++i) {
        const int id = 1, token = ref_tokens.back();
        ref.decode(std::span<const int>(&id, 1), std::span<const int>(&token, 1), ref_logits);
        ref_steps.push_back(ref_logits);
        ref_tokens.push_back(argmax(ref_logits, vocab));
      }

      // Prefill node: export each layer as it finishes; decode node imports as it arrives.
      CpuPagedKvCache prefill_kv(shape, o), decode_kv(shape, o);
      const std::unique_ptr<Backend> prefill_backend = make_cpu_backend(model, pool, prefill_kv);
      Engine prefill(*prefill_backend, EngineOptions{kChunk});
      prefill.add_sequence(1, length);
      decode_kv.add_sequence(1, max_tokens);
      KvExportCursor cursor;
      int final_layers = 0, messages = 0;
      std::vector<float> first_logits;
      prefill.prefill(1, prompt, first_logits, false, [&](int layer, bool last_chunk) {
        final_layers += last_chunk ? 1 : 0;
        export_layer(prefill_kv, 1, layer, last_chunk, cursor, [&](KvMessageKind kind, std::span<const std::byte> m) {
          ++messages;
          import_message(decode_kv, 1, layer, kind, m);
        });
      });
      REQUIRE(final_layers == cfg.num_layers);
      REQUIRE(messages == static_cast<int>(cursor.messages));
      const std::unique_ptr<Backend> decode_backend = make_cpu_backend(model, pool, decode_kv);
      Engine decode(*decode_backend, EngineOptions{kChunk});
      decode.adopt_sequence(1);
      REQUIRE(decode.position(1) == length);

      // Decode node: continues from the first token sampled on the prefill node.
      std::vector<int> tokens = {argmax(first_logits, vocab)};
      REQUIRE(tokens[0] == ref_tokens[0]);
      std::vector<float> logits;
      for (int i = 0; i < kDecodeSteps; ++i) {
        INFO("decode step " << i);
        const int id = 1, token = tokens.back();
        decode.decode(std::span<const int>(&id, 1), std::span<const int>(&token, 1), logits);
        REQUIRE(same_bits(logits, ref_steps[static_cast<size_t>(i)]));
        tokens.push_back(argmax(logits, vocab));
      }
      REQUIRE(tokens == ref_tokens);
      require_same_kv(ref_kv, decode_kv, 1);

      prefill.remove_sequence(1);
      decode.remove_sequence(1);
      REQUIRE(prefill_kv.stats().bytes_used == 0);
      REQUIRE(decode_kv.stats().bytes_used == 0);
    }
  }
}

TEST_CASE("engine: the layer callback runs once per layer per chunk, after the layer's KV is stored",
          "[backend][engine]") {
  const ModelConfig cfg = test::small_synthetic_config();
  const Model model = Model::synthetic(cfg, 7);
  ThreadPool pool(1);
  KvCacheOptions o;
  o.mode = KvMode::fp;
  CpuPagedKvCache kv(kv_shape(cfg), o);
  const std::unique_ptr<Backend> engine_backend = make_cpu_backend(model, pool, kv);
  Engine engine(*engine_backend, EngineOptions{40});
  engine.add_sequence(3, 100);
  const std::vector<int> prompt = test::random_prompt(100, cfg.vocab_size, 3);
  std::vector<std::pair<int, bool>> calls;
  std::vector<float> logits, plain;
  engine.prefill(3, prompt, logits, false, [&](int layer, bool last) {
    calls.emplace_back(layer, last);
    // This layer holds the chunk, the next one not yet.
    const int chunk = static_cast<int>(calls.size() - 1) / cfg.num_layers;
    CHECK(kv.length(3, layer) == std::min(100, 40 * (chunk + 1)));
    if (layer + 1 < cfg.num_layers) CHECK(kv.length(3, layer + 1) == 40 * chunk);
  });
  std::vector<std::pair<int, bool>> expected;
  for (int chunk = 0; chunk < 3; ++chunk)
    for (int l = 0; l < cfg.num_layers; ++l) expected.emplace_back(l, chunk == 2);
  CHECK(calls == expected);
  // The callback changes nothing: same logits as without it.
  CpuPagedKvCache kv2(kv.shape(), o);
  const std::unique_ptr<Backend> engine2_backend = make_cpu_backend(model, pool, kv2);
  Engine engine2(*engine2_backend, EngineOptions{40});
  engine2.add_sequence(3, 100);
  engine2.prefill(3, prompt, plain);
  CHECK(same_bits(logits, plain));
  // An exception from the callback aborts the prefill and propagates.
  engine2.remove_sequence(3);
  engine2.add_sequence(4, 100);
  REQUIRE_THROWS_WITH(engine2.prefill(4, prompt, plain, false,
                                      [](int layer, bool) {
                                        if (layer == 1) hack::fail("stop at layer {}", layer);
                                      }),
                      Catch::Contains("stop at layer 1"));
  CHECK(kv2.length(4, 0) == 40);
  CHECK(kv2.length(4, 2) == 0);
}
