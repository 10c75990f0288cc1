#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "hack/core/error.h"
#include "hack/core/quant_blocks.h"
#include "hack/core/gguf_file.h"
#include "support/gguf_writer.h"

using namespace hack;
using Catch::Contains;
using test::GgufWriter;

namespace {

GgufFile parse_bytes(const std::vector<unsigned char>& bytes) {
  auto keep = std::make_shared<std::vector<unsigned char>>(bytes);
  return GgufFile::parse(std::span<const unsigned char>(keep->data(), keep->size()), keep, "test.gguf");
}

// A small valid file: a few metadata values, an f32 [2, 4] tensor and a q8_0 [1, 32] one.
GgufWriter small_file() {
  GgufWriter w;
  w.kv_string("general.architecture", "llama");
  w.kv_scalar("llama.block_count", GgufWriter::u32, uint32_t{2});
  w.kv_scalar("flag", GgufWriter::boolean, uint8_t{1});
  w.kv_strings("tokens", {"a", "b", "ab"});
  std::vector<float> f(8);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) - 2.5f;
  w.tensor({"w.f32", {4, 2}, 0, GgufWriter::bytes_of(f)});
  std::vector<unsigned char> q8(34);
  const uint16_t half_two = 0x4000;  // 2.0
  std::memcpy(q8.data(), &half_two, 2);
  for (int j = 0; j < 32; ++j) q8[static_cast<size_t>(2 + j)] = static_cast<unsigned char>(static_cast<int8_t>(j - 16));
  w.tensor({"w.q8", {32, 1}, 8, q8});
  return w;
}

}  // namespace

TEST_CASE("gguf: the fixture written by gguf-py reads back, every value type and nested arrays",
          "[core][gguf]") {
  const GgufFile g = GgufFile::open(std::filesystem::path(HACK_SOURCE_DIR) / "tests/fixtures/gguf/blocks.gguf");
  CHECK(g.version() == 3);
  CHECK(g.alignment() == 64);
  CHECK(g.at("general.architecture").as_string("arch") == "hack-fixture");
  CHECK(g.at("hack.u8").as_int("") == 200);
  CHECK(g.at("hack.i8").as_int("") == -100);
  CHECK(g.at("hack.u16").as_int("") == 60000);
  CHECK(g.at("hack.i16").as_int("") == -30000);
  CHECK(g.at("hack.u32").as_uint("") == 4000000000u);
  CHECK(g.at("hack.i32").as_int("") == -2000000000);
  CHECK(g.at("hack.u64").as_uint("") == (uint64_t{1} << 63) + 5);
  CHECK_THROWS_WITH(g.at("hack.u64").as_int("hack.u64"), Contains("does not fit"));
  CHECK(g.at("hack.i64").as_int("") == -(int64_t{1} << 62));
  CHECK(g.at("hack.f32").as_float("") == 0.15625);
  CHECK(g.at("hack.f64").as_float("") == -1e300);
  CHECK(g.at("hack.bool").as_bool(""));
  CHECK(g.at("hack.str").as_string("") == "h\xc3\xa9llo, gguf");
  CHECK(g.at("hack.array.u8").as_ints("") == std::vector<int64_t>{1, 255});
  CHECK(g.at("hack.array.i8").as_ints("") == std::vector<int64_t>{-1, 127});
  CHECK(g.at("hack.array.i16").as_ints("") == std::vector<int64_t>{-2, 3});
  CHECK(g.at("hack.array.u64").items.at(0).as_uint("") == ~uint64_t{0});
  CHECK(g.at("hack.array.f32").items.at(1).as_float("") == -2.0);
  CHECK(g.at("hack.array.bool").items.at(1).as_bool("") == false);
  CHECK(g.at("hack.array.str").as_strings("") == std::vector<std::string>{"a", "", "\xc4\xa0Hello"});
  const GgufValue& nested = g.at("hack.nested");
  REQUIRE(nested.elem_type == GgufType::array);
  REQUIRE(nested.items.size() == 2);
  CHECK(nested.items[0].as_ints("") == std::vector<int64_t>{1, 2});
  CHECK(nested.items[1].as_ints("") == std::vector<int64_t>{3});
  CHECK_THROWS_WITH(g.at("hack.str").as_int("hack.str"), Contains("hack.str: expected an integer, got string"));
  CHECK_THROWS_WITH(g.at("missing.key"), Contains("metadata key missing.key is missing"));
  CHECK(g.tensors().size() == 16);
}

// Golden values from an independent implementation: gguf-py's quants.dequantize of the same
// random blocks (scripts/make_gguf_fixtures.py), extreme f16 scales included. Both compute each
// value as a product of the same fp32 factors; the order of those products may differ, so a
// value may differ by a few ulps: |a − b| ≤ 4·2^-24·|b| (+ 0 for zeros).
TEST_CASE("gguf: dequantize_row of every block type equals gguf-py's", "[core][gguf][quant]") {
  const GgufFile g = GgufFile::open(std::filesystem::path(HACK_SOURCE_DIR) / "tests/fixtures/gguf/blocks.gguf");
  for (const char* name : {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}) {
    INFO(name);
    const Tensor q = g.tensor(name);
    const Tensor e = g.tensor(std::string(name) + ".expected");
    REQUIRE(q.dim(0) == 3);
    REQUIRE(q.dim(1) == 512);
    CHECK(q.dtype() == parse_dtype(name));
    REQUIRE(e.dtype() == DType::f32);
    std::vector<float> got(512);
    for (int64_t r = 0; r < 3; ++r) {
      dequantize_row(q.dtype(), q.slice_rows(r, 1).raw(), got.data(), got.size());
      const float* want = e.data<float>() + r * 512;
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("row " << r << " element " << i);
        REQUIRE(std::abs(got[i] - want[i]) <= 4.0f * 5.96e-8f * std::abs(want[i]));
      }
    }
  }
}

TEST_CASE("gguf: a file from the test's own writer, v2 and v3", "[core][gguf]") {
  for (uint32_t version : {2u, 3u}) {
    GgufWriter w = small_file();
    w.version = version;
    const GgufFile g = parse_bytes(w.bytes());
    CHECK(g.version() == version);
    CHECK(g.alignment() == 32);
    CHECK(g.at("llama.block_count").as_int("") == 2);
    CHECK(g.at("flag").as_bool(""));
    CHECK(g.at("tokens").as_strings("") == std::vector<std::string>{"a", "b", "ab"});
    const Tensor f = g.tensor("w.f32");
    REQUIRE(f.dtype() == DType::f32);
    REQUIRE(f.dim(0) == 2);
    REQUIRE(f.dim(1) == 4);
    CHECK(f.data<float>()[7] == 4.5f);
    const Tensor q = g.tensor("w.q8");
    REQUIRE(q.dtype() == DType::q8_0);
    CHECK(q.bytes() == 34);
    float v[32];
    dequantize_row(DType::q8_0, q.raw(), v, 32);
    CHECK(v[0] == -32.0f);
    CHECK(v[31] == 30.0f);
    CHECK_THROWS_WITH(g.tensor("nope"), Contains("tensor nope is missing"));
  }
}

TEST_CASE("gguf: every truncation of a good file is an error, never a crash", "[core][gguf]") {
  const std::vector<unsigned char> good = small_file().bytes();
  parse_bytes(good);  // the whole file parses
  for (size_t n = 0; n < good.size(); ++n) {
    INFO("first " << n << " bytes");
    const std::vector<unsigned char> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    CHECK_THROWS_AS(parse_bytes(cut), Error);
  }
}

TEST_CASE("gguf: malformed headers and indexes are refused with a message", "[core][gguf]") {
  auto error_of = [](const std::vector<unsigned char>& bytes) -> std::string {
    try {
      parse_bytes(bytes);
    } catch (const Error& e) {
      return e.what();
    }
    return "(parsed)";
  };
  std::vector<unsigned char> b = small_file().bytes();
  auto patch_u32 = [](std::vector<unsigned char> v, size_t at, uint32_t x) {
    std::memcpy(v.data() + at, &x, 4);
    return v;
  };
  CHECK_THAT(error_of(patch_u32(b, 0, 0x46554748)), Contains("not a GGUF file"));
  CHECK_THAT(error_of(patch_u32(b, 4, 1)), Contains("version 1 is not supported"));
  CHECK_THAT(error_of(patch_u32(b, 4, 4)), Contains("version 4 is not supported"));
  CHECK_THAT(error_of(patch_u32(b, 4, 0x03000000)), Contains("big-endian"));
  {  // n_kv far beyond the file
    std::vector<unsigned char> v = b;
    const uint64_t n = uint64_t{1} << 60;
    std::memcpy(v.data() + 16, &n, 8);
    CHECK_THAT(error_of(v), Contains("metadata entries cannot fit"));
  }
  {  // n_tensors far beyond the file
    std::vector<unsigned char> v = b;
    const uint64_t n = uint64_t{1} << 40;
    std::memcpy(v.data() + 8, &n, 8);
    CHECK_THAT(error_of(v), Contains("tensor entries cannot fit"));
  }
  {  // a bad value type, a bad array element type, an array count past the end, a long string
    GgufWriter w;
    w.kv("k", 13, {0, 0, 0, 0});
    CHECK_THAT(error_of(w.bytes()), Contains("metadata k (at offset 24): value type 13 is not a GGUF type"));
    GgufWriter a;
    std::vector<unsigned char> v;
    GgufWriter::put(v, uint32_t{99});
    GgufWriter::put(v, uint64_t{1});
    a.kv("arr", GgufWriter::array, v);
    CHECK_THAT(error_of(a.bytes()), Contains("array element type 99"));
    GgufWriter c;
    v.clear();
    GgufWriter::put(v, uint32_t{GgufWriter::u32});
    GgufWriter::put(v, uint64_t{1} << 62);
    c.kv("arr", GgufWriter::array, v);
    CHECK_THAT(error_of(c.bytes()), Contains("promises 4611686018427387904 u32 elements"));
    GgufWriter s;
    v.clear();
    GgufWriter::put(v, ~uint64_t{0});
    s.kv("str", GgufWriter::string, v);
    CHECK_THAT(error_of(s.bytes()), Contains("truncated GGUF: str needs 18446744073709551615 bytes"));
  }
  {  // nested arrays past the depth limit; a bool that is not 0/1; a key twice
    std::vector<unsigned char> v;
    for (int d = 0; d < 9; ++d) {
      GgufWriter::put(v, uint32_t{GgufWriter::array});
      GgufWriter::put(v, uint64_t{1});
    }
    GgufWriter::put(v, uint32_t{GgufWriter::u8});
    GgufWriter::put(v, uint64_t{0});
    GgufWriter w;
    std::vector<unsigned char> outer;
    outer.insert(outer.end(), v.begin(), v.end());
    w.kv("deep", GgufWriter::array, outer);
    CHECK_THAT(error_of(w.bytes()), Contains("nested deeper than 8"));
    GgufWriter bw;
    bw.kv_scalar("b", GgufWriter::boolean, uint8_t{2});
    CHECK_THAT(error_of(bw.bytes()), Contains("bool byte 2"));
    GgufWriter dw;
    dw.kv_scalar("x", GgufWriter::u8, uint8_t{1});
    dw.kv_scalar("x", GgufWriter::u8, uint8_t{2});
    CHECK_THAT(error_of(dw.bytes()), Contains("metadata key x appears twice"));
  }
  {  // alignment: not a power of two, the wrong type; a tensor offset off the alignment
    GgufWriter w = small_file();
    w.kv_scalar("general.alignment", GgufWriter::u32, uint32_t{24});
    CHECK_THAT(error_of(w.bytes()), Contains("general.alignment 24 is not a power of two"));
    GgufWriter t = small_file();
    t.kv_scalar("general.alignment", GgufWriter::u64, uint64_t{32});
    CHECK_THAT(error_of(t.bytes()), Contains("general.alignment must be a u32"));
    CHECK_THAT(error_of(small_file().bytes({0, 40})), Contains("tensor w.q8: data offset 40 is not a multiple"));
    std::vector<unsigned char> cut = small_file().bytes();
    cut.pop_back();  // the q8 tensor's last byte
    CHECK_THAT(error_of(cut), Contains("truncated GGUF: tensor w.q8 needs bytes [32, 66) of the data section, which has 65"));
  }
  {  // dims: none, five, a partial block, an element count that overflows; a tensor twice
    auto one = [](std::vector<uint64_t> ne, uint32_t type) {
      GgufWriter w;
      w.tensor({"t", std::move(ne), type, std::vector<unsigned char>(64)});
      return w.bytes();
    };
    CHECK_THAT(error_of(one({}, 0)), Contains("tensor t: 0 dims"));
    CHECK_THAT(error_of(one({1, 1, 1, 1, 1}, 0)), Contains("tensor t: 5 dims"));
    CHECK_THAT(error_of(one({48, 1}, 12)), Contains("rows of 48 elements are not whole Q4_K blocks of 256"));
    CHECK_THAT(error_of(one({uint64_t{1} << 40, uint64_t{1} << 40}, 0)), Contains("element count overflows"));
    CHECK_THAT(error_of(one({uint64_t{1} << 62, 1}, 0)), Contains("byte size overflows"));
    GgufWriter w;
    w.tensor({"t", {4}, 0, std::vector<unsigned char>(16)});
    w.tensor({"t", {4}, 0, std::vector<unsigned char>(16)});
    CHECK_THAT(error_of(w.bytes()), Contains("tensor t appears twice"));
  }
}

TEST_CASE("gguf: tensor types we do not compute on are refused by name", "[core][gguf]") {
  GgufWriter w;
  w.tensor({"iq", {256, 1}, 16, std::vector<unsigned char>(66)});  // IQ2_XXS
  w.tensor({"q2", {256, 1}, 10, std::vector<unsigned char>(84)});  // Q2_K
  w.tensor({"odd", {32, 1}, 200, std::vector<unsigned char>(32)});
  const GgufFile g = parse_bytes(w.bytes());
  CHECK_THROWS_WITH(g.tensor("iq"), Contains("tensor iq: type IQ2_XXS is not supported"));
  CHECK_THROWS_WITH(g.tensor("q2"), Contains("tensor q2: type Q2_K is not supported"));
  CHECK_THROWS_WITH(g.tensor("odd"), Contains("tensor odd: ggml type 200 is not supported"));
}

// Random byte mutations of a good file: each parses or throws hack::Error (ASan/UBSan builds
// check the reads). The seed is printed on failure.
TEST_CASE("gguf: 20,000 mutated files parse or fail cleanly", "[core][gguf]") {
  const std::vector<unsigned char> good = small_file().bytes();
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (int k = 0; k < 20000; ++k) {
    std::vector<unsigned char> v = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) v[rng() % v.size()] = static_cast<unsigned char>(rng());
    try {
      const GgufFile g = parse_bytes(v);
      for (const GgufTensorInfo& t : g.tensors()) {
        try {
          const Tensor x = g.tensor(t);
          std::vector<float> row(static_cast<size_t>(x.dim(x.ndim() - 1)));
          if (row.size() <= 4096) convert_to_f32(x.dtype(), x.raw(), row.data(), row.size());
        } catch (const Error&) {
        }
      }
    } catch (const Error&) {
    }
  }
}

// Found by fuzz_gguf (tests/fixtures/fuzz/gguf/zero_length_row.gguf): a row of 0 elements.
TEST_CASE("gguf: a tensor with a zero dim parses, and converting its empty rows touches nothing", "[core][gguf]") {
  GgufWriter w;
  w.tensor({"empty", {0, 3}, 0, {}});
  const GgufFile g = parse_bytes(w.bytes());
  const Tensor t = g.tensor("empty");
  CHECK(t.numel() == 0);
  CHECK(t.bytes() == 0);
  std::vector<float> none;
  convert_to_f32(t.dtype(), t.raw(), none.data(), 0);
}
