// The vault block codec (kv/kv_block.h): header and table round trip and validation (every
// malformed field named, 10,000 mutated values never crash the decoder), exact blocks that
// restore bit for bit (fp f32, fp bf16, hack mode during an exact prefill), int8-head's error
// bound and SNR against an independent per-element bound, and restores that fail leave the
// cache as it was.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "hack/core/error.h"
#include "hack/kv/kv_block.h"
#include "kv_test_util.h"

using namespace hack;
using Catch::Contains;
using hack::test::KvStream;

namespace {

KvCacheOptions cache_options(KvMode mode, DType fp_dtype, int block) {
  KvCacheOptions o;
  o.mode = mode;
  o.fp_dtype = fp_dtype;
  o.block_tokens = block;
  o.sinks = 4;
  return o;
}

// Appends tokens [0, data.tokens) in every layer (layer l gets the stream shifted by l tokens'
// worth of seed, so layers differ).
void fill(CpuPagedKvCache& cache, int seq, const std::vector<KvStream>& layers, int n_tokens) {
  for (size_t l = 0; l < layers.size(); ++l)
    cache.append(static_cast<int>(l), seq, 0, n_tokens, layers[l].k.data(), layers[l].v.data());
}

std::vector<KvStream> layer_streams(int layers, int tokens, int heads, int dim, uint32_t seed) {
  std::vector<KvStream> out;
  for (int l = 0; l < layers; ++l) out.emplace_back(tokens, heads, 1, dim, seed + static_cast<uint32_t>(l) * 7919u);
  return out;
}

// A whole block value of tokens [first, first + tokens) of every layer of `cache`.
std::vector<std::byte> encode_block(const CpuPagedKvCache& cache, int seq, int first, int tokens, BlockCodec codec) {
  std::vector<std::vector<std::byte>> slices(static_cast<size_t>(cache.shape().num_layers));
  for (size_t l = 0; l < slices.size(); ++l)
    encode_kv_block_layer(cache, seq, static_cast<int>(l), first, tokens, codec, slices[l]);
  return assemble_kv_block(codec, cache.exact_dtype(), cache.shape(), first, tokens, slices);
}

std::span<const std::byte> slice_of(const KvBlockHeader& h, std::span<const std::byte> value, int layer) {
  const KvBlockLayer& e = h.layers[static_cast<size_t>(layer)];
  return value.subspan(e.offset, e.bytes);
}

void restore_block(CpuPagedKvCache& cache, int seq, std::span<const std::byte> value) {
  const KvBlockHeader h = decode_kv_block_header(value);
  std::vector<float> scratch;
  for (int l = 0; l < h.num_layers; ++l) restore_kv_block_layer(cache, seq, l, h, slice_of(h, value, l), scratch);
}

// K then V of tokens [first, first + n) as stored (exact_dtype bits).
std::vector<std::byte> exact_bytes(const CpuPagedKvCache& cache, int seq, int layer, int first, int n) {
  const KvShape& s = cache.shape();
  const size_t bytes = static_cast<size_t>(n) * s.num_kv_heads * s.head_dim * dtype_size(cache.exact_dtype());
  std::vector<std::byte> out(2 * bytes);
  cache.copy_exact_tokens(seq, layer, first, n, out.data(), out.data() + bytes);
  return out;
}

// A small valid value: 3 layers × 16 tokens × 2 heads × head_dim 32, for the header tests.
std::vector<std::byte> small_value(BlockCodec codec, DType dtype, int64_t first_token = 0) {
  const KvShape shape{3, 2, 32, 1};
  const int tokens = 16;
  std::vector<std::vector<std::byte>> slices(3);
  for (int l = 0; l < 3; ++l) {
    const KvStream data(tokens, shape.num_kv_heads, 1, shape.head_dim, 100u + static_cast<uint32_t>(l));
    encode_kv_block_layer(data.k.data(), data.v.data(), tokens, shape.num_kv_heads, shape.head_dim, codec, dtype,
                          slices[static_cast<size_t>(l)]);
  }
  return assemble_kv_block(codec, dtype, shape, first_token, tokens, slices);
}

template <class T>
void poke(std::vector<std::byte>& value, size_t at, T x) {
  std::memcpy(value.data() + at, &x, sizeof(T));
}

template <class T>
T peek(const std::vector<std::byte>& value, size_t at) {
  T x;
  std::memcpy(&x, value.data() + at, sizeof(T));
  return x;
}

// Byte offsets in the header and a layer's table entry (kv_block.h).
constexpr size_t kAtVersion = 4, kAtCodec = 6, kAtDtype = 7, kAtLayers = 8, kAtTokens = 12, kAtHeads = 16,
                 kAtDim = 18, kAtReserved = 20, kAtFirst = 24;
size_t entry_at(int layer) { return kKvBlockHeaderBytes + static_cast<size_t>(layer) * kKvBlockLayerEntryBytes; }

}  // namespace

TEST_CASE("kv block: codec names", "[kv][block]") {
  CHECK(parse_block_codec("exact") == BlockCodec::exact);
  CHECK(parse_block_codec("int8-head") == BlockCodec::int8_head);
  CHECK(block_codec_name(BlockCodec::exact) == "exact");
  CHECK(block_codec_name(BlockCodec::int8_head) == "int8-head");
  CHECK_THROWS_WITH(parse_block_codec("int8"), Contains("exact, int8-head"));
}

TEST_CASE("kv block: sizes", "[kv][block]") {
  // Per (token, head, K or V) with head_dim 64: int8-head 4 + 64 = 68 bytes, bf16 128, f32 256.
  CHECK(kv_block_layer_bytes(BlockCodec::int8_head, DType::i8, 1, 1, 64) == 2 * 68);
  CHECK(kv_block_layer_bytes(BlockCodec::exact, DType::bf16, 1, 1, 64) == 2 * 128);
  CHECK(kv_block_layer_bytes(BlockCodec::exact, DType::f32, 1, 1, 64) == 2 * 256);
  CHECK(kv_block_layer_bytes(BlockCodec::int8_head, DType::bf16, 64, 3, 64) == 64 * 3 * 2 * 68);
  CHECK_THROWS_WITH(kv_block_layer_bytes(BlockCodec::exact, DType::i8, 1, 1, 64), Contains("bf16 or f32"));
  // SmolLM2-135M: 30 layers × 3 KV heads × 64, Π = 64.
  const KvShape smol{30, 3, 64, 3};
  CHECK(kv_block_bytes(BlockCodec::int8_head, DType::i8, smol, 64) == 32 + 30 * (24 + 64 * 3 * 2 * 68));
  for (BlockCodec codec : {BlockCodec::exact, BlockCodec::int8_head})
    for (DType dtype : {DType::bf16, DType::f32}) {
      const std::vector<std::byte> value = small_value(codec, dtype);
      CHECK(value.size() == kv_block_bytes(codec, dtype, KvShape{3, 2, 32, 1}, 16));
    }
}

TEST_CASE("kv block: header round trip and checksums", "[kv][block]") {
  for (BlockCodec codec : {BlockCodec::exact, BlockCodec::int8_head})
    for (DType dtype : {DType::bf16, DType::f32}) {
      INFO(block_codec_name(codec) << " " << dtype_name(dtype));
      const std::vector<std::byte> value = small_value(codec, dtype, 192);
      const KvBlockHeader h = decode_kv_block_header(value);
      CHECK(h.codec == codec);
      CHECK(h.dtype == (codec == BlockCodec::exact ? dtype : DType::i8));
      CHECK(h.num_layers == 3);
      CHECK(h.tokens == 16);
      CHECK(h.num_kv_heads == 2);
      CHECK(h.head_dim == 32);
      CHECK(h.first_token == 192);
      REQUIRE(h.layers.size() == 3);
      const size_t layer_bytes = kv_block_layer_bytes(codec, dtype, 16, 2, 32);
      for (int l = 0; l < 3; ++l) {
        CHECK(h.layers[static_cast<size_t>(l)].offset == kKvBlockHeaderBytes + 3 * kKvBlockLayerEntryBytes + l * layer_bytes);
        CHECK(h.layers[static_cast<size_t>(l)].bytes == layer_bytes);
        CHECK(verify_kv_block_layer(h, l, value));
      }
      CHECK_THROWS_WITH(verify_kv_block_layer(h, 3, value), Contains("out of range"));
      // One flipped bit in layer 1's slice: layer 1 fails its checksum, the others still pass.
      std::vector<std::byte> bad = value;
      bad[h.layers[1].offset + 5] ^= std::byte{0x04};
      CHECK(verify_kv_block_layer(h, 0, bad));
      CHECK_FALSE(verify_kv_block_layer(h, 1, bad));
      CHECK(verify_kv_block_layer(h, 2, bad));
      CHECK_FALSE(verify_kv_block_layer(h, 2, std::span(value).first(value.size() - 1)));  // slice cut off
      // Decoding from floats and re-encoding the decoded floats gives the same slice (exact:
      // the dtype's values round-trip; int8-head: x̂ = code·scale re-quantizes to the same codes).
      std::vector<float> k(16 * 2 * 32), v(k.size());
      decode_kv_block_layer(h, slice_of(h, value, 1), k.data(), v.data());
      std::vector<std::byte> again;
      encode_kv_block_layer(k.data(), v.data(), 16, 2, 32, codec, dtype, again);
      const auto original = slice_of(h, value, 1);
      CHECK(std::equal(again.begin(), again.end(), original.begin(), original.end()));
    }
}

TEST_CASE("kv block: malformed values are rejected with the reason", "[kv][block]") {
  const std::vector<std::byte> good = small_value(BlockCodec::exact, DType::bf16);
  REQUIRE_NOTHROW(decode_kv_block_header(good));
  const auto rejects = [&](auto&& mutate, const char* reason) {
    std::vector<std::byte> value = good;
    mutate(value);
    INFO("expected: " << reason);
    CHECK_THROWS_WITH(decode_kv_block_header(value), Contains(reason));
  };
  rejects([](auto& v) { poke<uint32_t>(v, 0, 0x42564B49); }, "bad magic");
  rejects([](auto& v) { poke<uint16_t>(v, kAtVersion, 2); }, "version 2, this build reads 1");
  rejects([](auto& v) { poke<uint8_t>(v, kAtCodec, 3); }, "unknown codec 3");
  rejects([](auto& v) { poke<uint8_t>(v, kAtCodec, 0); }, "unknown codec 0");
  rejects([](auto& v) { poke<uint8_t>(v, kAtDtype, 0); }, "exact codec with dtype code 0");
  rejects([](auto& v) { poke<uint8_t>(v, kAtDtype, 3); }, "exact codec with dtype code 3");
  rejects([](auto& v) { poke<uint8_t>(v, kAtCodec, 2); }, "int8-head codec with dtype code 1");
  rejects([](auto& v) { poke<uint32_t>(v, kAtLayers, 0); }, "empty shape");
  rejects([](auto& v) { poke<uint32_t>(v, kAtTokens, 0); }, "empty shape");
  rejects([](auto& v) { poke<uint16_t>(v, kAtHeads, 0); }, "empty shape");
  rejects([](auto& v) { poke<uint16_t>(v, kAtDim, 0); }, "empty shape");
  rejects([](auto& v) { poke<uint32_t>(v, kAtReserved, 1); }, "reserved");
  rejects([](auto& v) { poke<uint64_t>(v, kAtFirst, uint64_t{1} << 40); }, "beyond the largest position");
  rejects([](auto& v) { poke<uint32_t>(v, kAtLayers, 1000000); }, "cannot hold the table of 1000000 layers");
  rejects([](auto& v) { poke<uint32_t>(v, kAtTokens, 0xffffffffu); }, "beyond the largest position");
  rejects([](auto& v) { poke<uint32_t>(v, kAtTokens, 1u << 30); }, "need more than the value's");
  // Truncated: inside the header, inside the table, inside the last slice.
  rejects([](auto& v) { v.resize(31); }, "31 bytes, shorter than the 32-byte header");
  rejects([](auto& v) { v.resize(kKvBlockHeaderBytes + 30); }, "cannot hold the table of 3 layers");
  rejects([](auto& v) { v.pop_back(); }, "lies outside");
  rejects([](auto& v) { v.push_back(std::byte{0}); }, "1 bytes after the last layer's slice");
  // Table entries.
  rejects([](auto& v) { poke<uint64_t>(v, entry_at(1) + 8, peek<uint64_t>(v, entry_at(1) + 8) - 2); },
          "layer 1 slice has");
  rejects([](auto& v) { poke<uint32_t>(v, kAtTokens, 15); }, "layer 0 slice has");  // dims no longer match sizes
  rejects([](auto& v) { poke<uint64_t>(v, entry_at(2), v.size()); }, "layer 2 slice [");
  rejects([](auto& v) { poke<uint64_t>(v, entry_at(0), ~uint64_t{0} - 10); }, "lies outside");
  rejects(
      [](auto& v) {  // layers 0 and 1 swapped
        const auto a = peek<uint64_t>(v, entry_at(0)), b = peek<uint64_t>(v, entry_at(1));
        poke<uint64_t>(v, entry_at(0), b);
        poke<uint64_t>(v, entry_at(1), a);
      },
      "layer 0 slice starts at");
  rejects([](auto& v) { poke<uint64_t>(v, entry_at(0), peek<uint64_t>(v, entry_at(0)) + 8); },
          "contiguous, in layer order");
  // Checksums are not the header's business: a corrupt slice decodes, and fails verification.
  std::vector<std::byte> corrupt = good;
  corrupt.back() ^= std::byte{1};
  const KvBlockHeader h = decode_kv_block_header(corrupt);
  CHECK_FALSE(verify_kv_block_layer(h, 2, corrupt));
}

TEST_CASE("kv block: the header decoder survives mutated and truncated values", "[kv][block][fuzz]") {
  const uint64_t seed = 20261125;
  INFO("seed " << seed);
  std::printf("kv block fuzz: seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const std::vector<std::vector<std::byte>> goods = {small_value(BlockCodec::exact, DType::bf16, 64),
                                                      small_value(BlockCodec::int8_head, DType::i8, 0)};
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 10000; ++i) {
    const std::vector<std::byte>& good = goods[static_cast<size_t>(i) % goods.size()];
    std::vector<std::byte> value = good;
    const size_t table_end = kKvBlockHeaderBytes + 3 * kKvBlockLayerEntryBytes;
    switch (rng() % 4) {
      case 0:  // a byte of the header or table set to anything
        value[rng() % table_end] = static_cast<std::byte>(rng());
        break;
      case 1:  // a byte anywhere
        value[rng() % value.size()] = static_cast<std::byte>(rng());
        break;
      case 2:  // truncated
        value.resize(rng() % value.size());
        break;
      default:  // a byte of the header or table changed, then truncated
        value[rng() % table_end] = static_cast<std::byte>(rng());
        value.resize(rng() % (value.size() + 1));
        break;
    }
    try {
      const KvBlockHeader h = decode_kv_block_header(value);
      ++accepted;
      // Whatever decodes describes slices inside the value, so verification cannot overrun.
      REQUIRE(h.layers.size() == static_cast<size_t>(h.num_layers));
      for (int l = 0; l < h.num_layers; ++l) {
        const KvBlockLayer& e = h.layers[static_cast<size_t>(l)];
        REQUIRE(e.offset + e.bytes <= value.size());
        (void)verify_kv_block_layer(h, l, value);
      }
    } catch (const Error&) {
      ++rejected;
    }
  }
  std::printf("kv block fuzz: %d of 10000 mutated values decoded, %d rejected\n", accepted, rejected);
  CHECK(accepted > 0);  // mutations of slices and checksums still decode
  CHECK(rejected > 0);
}

TEST_CASE("kv block: exact blocks restore bit for bit", "[kv][block]") {
  struct Config {
    const char* name;
    KvMode mode;
    DType dtype;
  };
  const Config configs[] = {{"fp f32", KvMode::fp, DType::f32},
                            {"fp bf16", KvMode::fp, DType::bf16},
                            {"hack (exact prefill)", KvMode::hack, DType::bf16}};
  struct Dims {
    int heads, dim;
  };
  const Dims dims[] = {{1, 32}, {2, 64}, {3, 128}};
  const int layers = 2;
  for (const Config& c : configs)
    for (const Dims& d : dims)
      for (int block : {16, 64}) {
        INFO(c.name << ", " << d.heads << " heads × " << d.dim << ", Π " << block);
        const KvShape shape{layers, d.heads, d.dim, 1};
        const KvCacheOptions o = cache_options(c.mode, c.dtype, block);
        const int total = 2 * block + 5;  // two full blocks and an open one
        const auto data = layer_streams(layers, total, d.heads, d.dim, static_cast<uint32_t>(block * 131 + d.dim));
        CpuPagedKvCache source(shape, o), restored(shape, o);
        source.add_sequence(1, total);
        restored.add_sequence(9, 2 * block);
        if (c.mode == KvMode::hack) {  // nothing is quantized until end_prefill
          source.begin_prefill(1);
          restored.begin_prefill(9);
        }
        fill(source, 1, data, total);
        const auto block0 = encode_block(source, 1, 0, block, BlockCodec::exact);
        const auto block1 = encode_block(source, 1, block, block, BlockCodec::exact);
        CHECK(block0.size() == kv_block_bytes(BlockCodec::exact, o.mode == KvMode::fp ? c.dtype : DType::bf16, shape,
                                              block));
        // Blocks apply in order only.
        CHECK_THROWS_WITH(restore_block(restored, 9, block1), Contains("starts at token " + std::to_string(block)));
        restore_block(restored, 9, block0);
        restore_block(restored, 9, block1);
        for (int l = 0; l < layers; ++l) {
          REQUIRE(restored.length(9, l) == 2 * block);
          REQUIRE(exact_bytes(restored, 9, l, 0, 2 * block) == exact_bytes(source, 1, l, 0, 2 * block));
        }
        // An exact slice of a bf16 cache is what converting the appended floats gives.
        if (source.exact_dtype() == DType::bf16) {
          std::vector<std::byte> from_cache, from_floats;
          encode_kv_block_layer(source, 1, 1, block, block, BlockCodec::exact, from_cache);
          const size_t off = static_cast<size_t>(block) * d.heads * d.dim;
          encode_kv_block_layer(data[1].k.data() + off, data[1].v.data() + off, block, d.heads, d.dim,
                                BlockCodec::exact, DType::bf16, from_floats);
          CHECK(from_cache == from_floats);
        }
        if (c.mode == KvMode::hack) {
          // Quantization is a pure function of the exact tokens: the same HACK pages.
          source.end_prefill(1);
          restored.end_prefill(9);
          for (int l = 0; l < layers; ++l) {
            REQUIRE(restored.hack_page_count(9, l) == 1);  // [4, 4 + Π); the rest stays exact
            REQUIRE(source.hack_page_count(1, l) >= 1);
            const auto a = source.hack_page(1, l, 0), b = restored.hack_page(9, l, 0);
            REQUIRE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
          }
        }
      }
}

TEST_CASE("kv block: int8-head error bound and SNR", "[kv][block]") {
  // Independent bound: the stored scale s = absmax/127 of each (token, head) row, and every
  // element decodes within s/2 (round to nearest) plus a few fp32 ulps of the value (x/s and
  // code·s each round once).
  for (int dim : {32, 64, 128}) {
    const int tokens = 64, heads = 3;
    const uint32_t seed = 42u + static_cast<uint32_t>(dim);
    INFO("head_dim " << dim << ", seed " << seed);
    KvStream data(tokens, heads, 1, dim, seed);  // K: per-channel offsets and ×4 outlier channels
    const size_t row_floats = static_cast<size_t>(dim);
    // Token 3 head 1: all zeros (scale 0); token 5 head 0: one huge outlier that must not
    // change the neighbouring heads' scales.
    std::fill_n(data.k.begin() + (3 * heads + 1) * dim, dim, 0.0f);
    data.k[(5 * heads + 0) * row_floats + 7] = 1000.0f;
    std::vector<std::byte> slice;
    encode_kv_block_layer(data.k.data(), data.v.data(), tokens, heads, dim, BlockCodec::int8_head, DType::i8, slice);
    REQUIRE(slice.size() == kv_block_layer_bytes(BlockCodec::int8_head, DType::i8, tokens, heads, dim));
    KvBlockHeader h;
    h.codec = BlockCodec::int8_head;
    h.dtype = DType::i8;
    h.num_layers = 1;
    h.tokens = tokens;
    h.num_kv_heads = heads;
    h.head_dim = dim;
    std::vector<float> k(data.k.size()), v(data.v.size());
    decode_kv_block_layer(h, slice, k.data(), v.data());
    const size_t rows = static_cast<size_t>(tokens) * heads;
    for (int part = 0; part < 2; ++part) {
      const std::vector<float>& x = part == 0 ? data.k : data.v;
      const std::vector<float>& y = part == 0 ? k : v;
      const std::byte* scales = slice.data() + part * slice.size() / 2;
      for (size_t r = 0; r < rows; ++r) {
        float absmax = 0.0f;
        for (size_t c = 0; c < row_floats; ++c) absmax = std::max(absmax, std::fabs(x[r * row_floats + c]));
        float scale;
        std::memcpy(&scale, scales + r * sizeof(float), sizeof(float));
        REQUIRE(scale == absmax / 127.0f);
        for (size_t c = 0; c < row_floats; ++c) {
          const float xi = x[r * row_floats + c], yi = y[r * row_floats + c];
          const double tol = 0.5 * scale + 4.0 * std::numeric_limits<float>::epsilon() * std::fabs(xi);
          INFO((part == 0 ? "K" : "V") << " row " << r << " channel " << c << ": " << xi << " → " << yi);
          REQUIRE(std::fabs(static_cast<double>(xi) - yi) <= tol);
        }
      }
    }
    // The zero row decodes to zeros; the outlier's head is coarse, its neighbours are not.
    for (size_t c = 0; c < row_floats; ++c) REQUIRE(k[(3 * heads + 1) * row_floats + c] == 0.0f);
    REQUIRE(k[(5 * heads + 0) * row_floats + 7] == 1000.0f);
    // SNR, without the row of the planted outlier, against the uniform-noise model: rounding
    // to nearest leaves an error uniform in ±s/2, variance s²/12 per element, so
    // SNR ≈ 10·log10(Σx² / Σ_rows dim·s²/12) (slightly pessimistic: a row's absmax element
    // is exact). Truncation instead of rounding would lose ~6 dB against it.
    const auto measure = [&](const std::vector<float>& x, const std::vector<float>& y, const std::byte* scales,
                             double& predicted) {
      std::vector<float> xs, ys;
      double signal = 0.0, noise = 0.0;
      for (size_t r = 0; r < rows; ++r) {
        if (&x == &data.k && r == static_cast<size_t>(5 * heads)) continue;
        const auto at = static_cast<std::ptrdiff_t>(r * row_floats), end = at + static_cast<std::ptrdiff_t>(row_floats);
        xs.insert(xs.end(), x.begin() + at, x.begin() + end);
        ys.insert(ys.end(), y.begin() + at, y.begin() + end);
        float s;
        std::memcpy(&s, scales + r * sizeof(float), sizeof(float));
        noise += static_cast<double>(row_floats) * s * s / 12.0;
        for (size_t c = 0; c < row_floats; ++c) signal += static_cast<double>(x[r * row_floats + c]) * x[r * row_floats + c];
      }
      predicted = 10.0 * std::log10(signal / noise);
      return snr_db(xs, ys);
    };
    double predicted_k = 0.0, predicted_v = 0.0;
    const double snr_k = measure(data.k, k, slice.data(), predicted_k);
    const double snr_v = measure(data.v, v, slice.data() + slice.size() / 2, predicted_v);
    std::printf("kv block int8-head, head_dim %d: SNR K (×4 outlier channels) %.1f dB (uniform-noise model %.1f), "
                "V (Gaussian) %.1f dB (model %.1f)\n", dim, snr_k, predicted_k, snr_v, predicted_v);
    CHECK(snr_k >= predicted_k - 0.5);
    CHECK(snr_v >= predicted_v - 0.5);
    // Gaussian rows: absmax ≈ 2.5σ over 32–128 channels, so ≈ 45 dB. K's ×4 outlier channels
    // (one in 16) raise a row's absmax ~4× at the same power: ≈ 39–42 dB (lower for wider heads,
    // which hold more outliers). Real KV is measured by bench/kv_block_snr (≥ 52 dB target).
    CHECK(snr_v >= 42.0);
    CHECK(snr_k >= 38.0);
  }
}

TEST_CASE("kv block: int8-head restores through a cache", "[kv][block]") {
  // Into an fp f32 cache, the restored tokens are exactly the decoded slice.
  const KvShape shape{2, 3, 64, 3};
  const int block = 64;
  const auto data = layer_streams(2, block, 3, 64, 7);
  CpuPagedKvCache source(shape, cache_options(KvMode::fp, DType::f32, block));
  CpuPagedKvCache restored(shape, cache_options(KvMode::fp, DType::f32, block));
  source.add_sequence(1, block);
  restored.add_sequence(2, block);
  fill(source, 1, data, block);
  const auto value = encode_block(source, 1, 0, block, BlockCodec::int8_head);
  CHECK(value.size() == kv_block_bytes(BlockCodec::int8_head, DType::f32, shape, block));
  restore_block(restored, 2, value);
  const KvBlockHeader h = decode_kv_block_header(value);
  for (int l = 0; l < 2; ++l) {
    std::vector<float> k(block * 3 * 64), v(k.size()), rk(k.size()), rv(k.size());
    decode_kv_block_layer(h, slice_of(h, value, l), k.data(), v.data());
    restored.read_exact_tokens(2, l, 0, block, rk.data(), rv.data());
    CHECK(k == rk);
    CHECK(v == rv);
    CHECK(snr_db(data[static_cast<size_t>(l)].v, rv) > 40.0);
  }
}

TEST_CASE("kv block: a failed restore leaves the cache unchanged", "[kv][block]") {
  const int block = 16, layers = 2;
  const KvShape shape{layers, 2, 32, 1};
  const KvCacheOptions o = cache_options(KvMode::fp, DType::bf16, block);
  const auto data = layer_streams(layers, 3 * block, 2, 32, 11);
  CpuPagedKvCache source(shape, o);
  source.add_sequence(1, 3 * block);
  fill(source, 1, data, 3 * block);
  const auto block0 = encode_block(source, 1, 0, block, BlockCodec::exact);
  const auto block1 = encode_block(source, 1, block, block, BlockCodec::exact);
  const auto int8_block1 = encode_block(source, 1, block, block, BlockCodec::int8_head);

  CpuPagedKvCache target(shape, o);
  target.add_sequence(5, 2 * block);
  restore_block(target, 5, block0);
  const auto before0 = exact_bytes(target, 5, 0, 0, block), before1 = exact_bytes(target, 5, 1, 0, block);
  const auto unchanged = [&] {
    for (int l = 0; l < layers; ++l) REQUIRE(target.length(5, l) == block);
    REQUIRE(exact_bytes(target, 5, 0, 0, block) == before0);
    REQUIRE(exact_bytes(target, 5, 1, 0, block) == before1);
  };
  std::vector<float> scratch;
  const auto restore = [&](CpuPagedKvCache& cache, int seq, int layer, std::span<const std::byte> value) {
    const KvBlockHeader h = decode_kv_block_header(value);
    restore_kv_block_layer(cache, seq, layer, h, slice_of(h, value, layer), scratch);
  };

  // Wrong position: block 0 again at length Π.
  CHECK_THROWS_WITH(restore(target, 5, 0, block0), Contains("starts at token 0 but sequence 5 layer 0 holds 16"));
  unchanged();
  // Corrupt slice: one bit of layer 1's slice (its checksum fails).
  {
    std::vector<std::byte> bad = block1;
    const KvBlockHeader h = decode_kv_block_header(bad);
    bad[h.layers[1].offset + 3] ^= std::byte{0x80};
    CHECK_THROWS_WITH(restore(target, 5, 1, bad), Contains("checksum"));
    unchanged();
    // A slice of the wrong size for its table entry.
    CHECK_THROWS_WITH(restore_kv_block_layer(target, 5, 0, h, slice_of(h, bad, 0).first(h.layers[0].bytes - 2), scratch),
                      Contains("slice has"));
    unchanged();
  }
  // A malformed int8-head slice whose checksum is right (the writer's bug, not the wire's):
  // a NaN scale is refused before anything is stored.
  {
    const KvBlockHeader h = decode_kv_block_header(int8_block1);
    std::vector<std::vector<std::byte>> slices;
    for (int l = 0; l < layers; ++l) {
      const auto s = slice_of(h, int8_block1, l);
      slices.emplace_back(s.begin(), s.end());
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(slices[0].data() + 4 * 5, &nan, 4);
    const auto bad = assemble_kv_block(BlockCodec::int8_head, DType::i8, shape, block, block, slices);
    CHECK_THROWS_WITH(restore(target, 5, 0, bad), Contains("scale"));
    unchanged();
    const float one = 1.0f;
    std::memcpy(slices[0].data() + 4 * 5, &one, 4);  // a finite scale again, and a code of −128
    slices[0][static_cast<size_t>(block) * 2 * 4 + 9] = std::byte{0x80};
    const auto bad2 = assemble_kv_block(BlockCodec::int8_head, DType::i8, shape, block, block, slices);
    CHECK_THROWS_WITH(restore(target, 5, 0, bad2), Contains("-128"));
    unchanged();
  }
  // Wrong dims, layers, dtype.
  {
    CpuPagedKvCache other(KvShape{layers, 1, 32, 1}, o);
    other.add_sequence(5, 2 * block);
    CHECK_THROWS_WITH(restore(other, 5, 0, block0), Contains("2 KV heads of dim 32, the cache 1 of dim 32"));
    CHECK(other.length(5, 0) == 0);
    CpuPagedKvCache dim64(KvShape{layers, 2, 64, 1}, o);
    dim64.add_sequence(5, 2 * block);
    CHECK_THROWS_WITH(restore(dim64, 5, 0, block0), Contains("the cache 2 of dim 64"));
    CpuPagedKvCache deeper(KvShape{layers + 1, 2, 32, 1}, o);
    deeper.add_sequence(5, 2 * block);
    CHECK_THROWS_WITH(restore(deeper, 5, 0, block0), Contains("the block has 2 layers, the cache 3"));
    CpuPagedKvCache f32(shape, cache_options(KvMode::fp, DType::f32, block));
    f32.add_sequence(5, 2 * block);
    CHECK_THROWS_WITH(restore(f32, 5, 0, block0), Contains("exact block of bf16"));
    CHECK(f32.length(5, 0) == 0);
    restore(f32, 5, 0, encode_block(source, 1, 0, block, BlockCodec::int8_head));  // int8-head fits any exact dtype
    CHECK(f32.length(5, 0) == block);
  }
  // Out of range, unknown sequence, over capacity.
  {
    const KvBlockHeader h = decode_kv_block_header(block1);
    CHECK_THROWS_WITH(restore_kv_block_layer(target, 5, 2, h, slice_of(h, block1, 1), scratch), Contains("out of range"));
    CHECK_THROWS_WITH(restore_kv_block_layer(target, 5, -1, h, slice_of(h, block1, 1), scratch), Contains("out of range"));
  }
  CHECK_THROWS_WITH(restore(target, 6, 0, block1), Contains("unknown sequence 6"));
  {
    CpuPagedKvCache small(shape, o);
    small.add_sequence(5, block - 1);
    CHECK_THROWS_WITH(restore(small, 5, 0, block0), Contains("capacity"));
    CHECK(small.length(5, 0) == 0);
  }
  unchanged();
  // And the good block still applies after all that.
  restore_block(target, 5, block1);
  for (int l = 0; l < layers; ++l)
    CHECK(exact_bytes(target, 5, l, 0, 2 * block) == exact_bytes(source, 1, l, 0, 2 * block));
}

TEST_CASE("kv block: encoding needs exactly stored tokens", "[kv][block]") {
  const int block = 16;
  const KvShape shape{1, 2, 32, 1};
  const auto data = layer_streams(1, 3 * block, 2, 32, 3);
  CpuPagedKvCache cache(shape, cache_options(KvMode::hack, DType::bf16, block));
  cache.add_sequence(1, 3 * block);
  cache.append(0, 1, 0, 2 * block, data[0].k.data(), data[0].v.data());
  cache.append(0, 1, 2 * block, 1, data[0].k_at(2 * block), data[0].v_at(2 * block));  // quantizes [4, 20)
  for (BlockCodec codec : {BlockCodec::exact, BlockCodec::int8_head}) {
    std::vector<std::byte> out(3, std::byte{7});
    CHECK_THROWS_WITH(encode_kv_block_layer(cache, 1, 0, 0, block, codec, out), Contains("quantized block"));
    CHECK(out.size() == 3);
    CHECK_THROWS_WITH(encode_kv_block_layer(cache, 1, 0, 2 * block, block, codec, out), Contains("not stored"));
    CHECK(out.size() == 3);
  }
  std::vector<std::byte> out;
  encode_kv_block_layer(cache, 1, 0, 0, 4, BlockCodec::exact, out);  // the sinks are exact
  CHECK(out.size() == kv_block_layer_bytes(BlockCodec::exact, DType::bf16, 4, 2, 32));
  std::vector<float> nan_row(2 * 32, 0.0f);
  nan_row[40] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(encode_kv_block_layer(nan_row.data(), nan_row.data(), 1, 2, 32, BlockCodec::int8_head, DType::i8,
                                          out),
                    Contains("non-finite"));
}

TEST_CASE("kv block: snr_db", "[kv][block]") {
  const std::vector<float> x{1.0f, 1.0f}, y{1.1f, 0.9f};
  CHECK(snr_db(x, x) == std::numeric_limits<double>::infinity());
  CHECK(snr_db(x, y) == Approx(20.0).epsilon(1e-5));  // 10·log10(2 / 0.02)
  CHECK_THROWS_AS(snr_db(x, std::vector<float>{1.0f}), Error);
}

TEST_CASE("kv block: a prefix (header and table only) decodes like the whole value", "[kv_block]") {
  const KvShape shape{4, 2, 32, 1};
  std::vector<std::vector<std::byte>> slices(4);
  std::vector<float> k(16 * 2 * 32, 0.5f), v(k.size(), -0.25f);
  for (auto& s : slices) encode_kv_block_layer(k.data(), v.data(), 16, 2, 32, BlockCodec::int8_head, DType::i8, s);
  const auto value = assemble_kv_block(BlockCodec::int8_head, DType::i8, shape, 64, 16, slices);
  const KvBlockHeader whole = decode_kv_block_header(value);
  const size_t prefix_bytes = kKvBlockHeaderBytes + 4 * kKvBlockLayerEntryBytes;
  const KvBlockHeader prefix = decode_kv_block_prefix(std::span<const std::byte>(value).first(prefix_bytes));
  CHECK(prefix.first_token == 64);
  CHECK(prefix.layers.size() == whole.layers.size());
  for (size_t l = 0; l < 4; ++l) {
    CHECK(prefix.layers[l].offset == whole.layers[l].offset);
    CHECK(prefix.layers[l].checksum == whole.layers[l].checksum);
  }
  // The whole-value decoder refuses the prefix (its slices are missing); the prefix decoder
  // still refuses a cut table.
  CHECK_THROWS_AS(decode_kv_block_header(std::span<const std::byte>(value).first(prefix_bytes)), Error);
  CHECK_THROWS_AS(decode_kv_block_prefix(std::span<const std::byte>(value).first(prefix_bytes - 1)), Error);
}
