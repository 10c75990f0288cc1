// The decode node's exact KV beside the cache (decode/kv_recorder.h) and the blocks it makes
// of a finished conversation: keys equal to the chain a prefill computes over the same tokens,
// values equal to encoding the same K/V directly.
#include <catch2/catch.hpp>

#include <random>

#include "hack/decode/decode_scheduler.h"
#include "hack/decode/kv_recorder.h"
#include "hack/kv/kv_stream.h"

using namespace hack;
using namespace hack::server;

namespace {

const KvShape kShape{2, 2, 16, 1};
constexpr int kBlock = 16;

std::vector<float> token_kv(int layer, int pos, float which) {
  std::vector<float> x(kShape.num_kv_heads * kShape.head_dim);
  for (size_t i = 0; i < x.size(); ++i) x[i] = which * (layer + 1) + 0.01f * pos + 0.001f * static_cast<float>(i);
  return x;
}

}  // namespace

TEST_CASE("kv recorder keeps appends and exact copies from its first token on", "[kv_recorder]") {
  KvRecorder rec(kShape, 16);
  for (int l = 0; l < kShape.num_layers; ++l) {
    for (int pos = 10; pos < 40; ++pos) {
      const auto k = token_kv(l, pos, 1), v = token_kv(l, pos, -1);
      rec.on_append(l, pos, 1, k.data(), v.data());
    }
  }
  std::vector<float> k(static_cast<size_t>(4 * 32)), v(k.size());
  REQUIRE(rec.read(1, 20, 4, k.data(), v.data()));
  CHECK(k[0] == token_kv(1, 20, 1)[0]);
  CHECK(v[32] == token_kv(1, 21, -1)[0]);
  CHECK_FALSE(rec.read(0, 12, 4, k.data(), v.data()));  // before first_token
  CHECK_FALSE(rec.read(0, 38, 4, k.data(), v.data()));  // past what was recorded
}

TEST_CASE("finished conversations become the blocks a prefill would key and encode", "[kv_recorder]") {
  // Prompt of 20 tokens, 30 generated: KV stored for 49 tokens → blocks 1 and 2 are new
  // (block 0 was stored by the prompt's prefill; block 3 is partial).
  std::vector<int> prompt(20), generated(30);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int>(i + 3);
  for (size_t i = 0; i < generated.size(); ++i) generated[i] = static_cast<int>(100 + i);
  KvRecorder rec(kShape, 16);
  for (int l = 0; l < kShape.num_layers; ++l)
    for (int pos = 16; pos < 49; ++pos) {
      const auto k = token_kv(l, pos, 1), v = token_kv(l, pos, -1);
      rec.on_append(l, pos, 1, k.data(), v.data());
    }
  KvFingerprint f;
  f.add("t", 1);
  const BlockKey root = chain_root(f, "default");
  std::vector<std::tuple<BlockKey, BlockKey, bool, std::vector<std::byte>>> stored;
  const FinishedKv fin{7, prompt, generated, 49, &rec};
  const int n = encode_finished_blocks(fin, root, kBlock, BlockCodec::exact, DType::bf16, kShape,
                                       [&](const BlockKey& key, const BlockKey& parent, bool first,
                                           std::vector<std::byte> value) {
                                         stored.emplace_back(key, parent, first, std::move(value));
                                       });
  REQUIRE(n == 2);
  std::vector<int> all = prompt;
  all.insert(all.end(), generated.begin(), generated.end());
  const auto keys = chain_keys(root, all, kBlock);
  CHECK(std::get<0>(stored[0]) == keys[1]);
  CHECK(std::get<1>(stored[0]) == keys[0]);
  CHECK(std::get<0>(stored[1]) == keys[2]);
  CHECK_FALSE(std::get<2>(stored[0]));
  // Block 2's value equals encoding the same K/V directly.
  std::vector<std::vector<std::byte>> slices(2);
  for (int l = 0; l < 2; ++l) {
    std::vector<float> k, v;
    for (int pos = 32; pos < 48; ++pos) {
      const auto kt = token_kv(l, pos, 1), vt = token_kv(l, pos, -1);
      k.insert(k.end(), kt.begin(), kt.end());
      v.insert(v.end(), vt.begin(), vt.end());
    }
    encode_kv_block_layer(k.data(), v.data(), kBlock, 2, 16, BlockCodec::exact, DType::bf16, slices[static_cast<size_t>(l)]);
  }
  CHECK(std::get<3>(stored[1]) == assemble_kv_block(BlockCodec::exact, DType::bf16, kShape, 32, kBlock, slices));

  // A hole (a token never recorded) ends the run there.
  KvRecorder holey(kShape, 16);
  for (int l = 0; l < 2; ++l)
    for (int pos = 16; pos < 49; ++pos) {
      if (l == 1 && pos == 40) continue;
      const auto k = token_kv(l, pos, 1), v = token_kv(l, pos, -1);
      holey.on_append(l, pos, 1, k.data(), v.data());
    }
  stored.clear();
  CHECK(encode_finished_blocks(FinishedKv{7, prompt, generated, 49, &holey}, root, kBlock, BlockCodec::exact,
                               DType::bf16, kShape,
                               [&](const BlockKey& key, const BlockKey& parent, bool first, std::vector<std::byte> value) {
                                 stored.emplace_back(key, parent, first, std::move(value));
                               }) == 1);
}
