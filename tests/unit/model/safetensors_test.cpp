#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <random>

#include "hack/core/error.h"
#include "hack/model/safetensors.h"
#include "model_test_util.h"

using namespace hack;
using Catch::Contains;
using json = nlohmann::json;

namespace {

// A valid file with f32 "a" [2, 3] and bf16 "b" [4], written by the test's own writer.
void write_two_tensor_file(const std::filesystem::path& path) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {0x3f80, 0xc000, 0x4040, 0x0000};  // bf16: 1, -2, 3, 0
  std::vector<unsigned char> data = test::bytes_of(a);
  const std::vector<unsigned char> bb = test::bytes_of(b);
  data.insert(data.end(), bb.begin(), bb.end());
  const std::string header =
      R"({"__metadata__": {"format": "pt"},
          "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
          "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]}})";
  test::write_raw_safetensors(path, header, data);
}

std::string one_tensor_header(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"weight": {"dtype": ")" + dtype + R"(", "shape": )" + shape + R"(, "data_offsets": )" + offsets + "}}";
}

}  // namespace

TEST_CASE("safetensors: read a file written independently", "[model][safetensors]") {
  test::TempDir dir;
  const auto path = dir / "t.safetensors";
  write_two_tensor_file(path);
  auto f = SafetensorsFile::open(path);
  REQUIRE(f->entries().size() == 2);
  CHECK(f->metadata().at("format") == "pt");
  CHECK(f->contains("a"));
  CHECK_FALSE(f->contains("c"));

  const Tensor a = f->tensor("a");
  CHECK(a.dtype() == DType::f32);
  CHECK(a.ndim() == 2);
  CHECK(a.dim(0) == 2);
  CHECK(a.dim(1) == 3);
  CHECK(a.data<float>()[5] == 6.0f);

  const Tensor b = f->tensor("b");
  CHECK(b.describe() == "[4] bf16");
  CHECK(bf16_to_f32(b.data<uint16_t>()[1]) == -2.0f);
  CHECK(bf16_to_f32(b.data<uint16_t>()[2]) == 3.0f);

  // A view whenever the data is aligned to the element size (the mapping is page-aligned,
  // so that is the file offset's alignment), a copy otherwise.
  CHECK((a.memory_kind() == MemoryKind::borrowed) == (f->find("a")->begin % 4 == 0));
  CHECK((b.memory_kind() == MemoryKind::borrowed) == (f->find("b")->begin % 2 == 0));
  if (a.memory_kind() == MemoryKind::borrowed) CHECK(a.raw() == f->tensor("a").raw());
  REQUIRE_THROWS_WITH(f->tensor("c"), Contains("tensor c not found") && Contains(path.string()));
}

TEST_CASE("safetensors: views outlive the SafetensorsFile (mapping kept alive)", "[model][safetensors]") {
  test::TempDir dir;
  const auto path = dir / "t.safetensors";
  write_two_tensor_file(path);
  Tensor a;
  {
    auto f = SafetensorsFile::open(path);
    a = f->tensor("a");
  }
  CHECK(a.data<float>()[0] == 1.0f);
  CHECK(a.data<float>()[4] == 5.0f);
}

TEST_CASE("safetensors: unaligned data is copied, values intact", "[model][safetensors]") {
  test::TempDir dir;
  const auto path = dir / "u.safetensors";
  std::vector<float> v = {0.5f, -1.25f, 3.0f};
  // Header of 7 bytes + 8-byte length: data at offset 15, not 4-aligned.
  const std::string header = one_tensor_header("F32", "[3]", "[0, 12]");
  std::string padded = header;
  while ((8 + padded.size()) % 4 != 3) padded += ' ';
  test::write_raw_safetensors(path, padded, test::bytes_of(v));
  auto f = SafetensorsFile::open(path);
  const Tensor t = f->tensor("weight");
  CHECK(reinterpret_cast<uintptr_t>(t.raw()) % 4 == 0);
  CHECK(t.data<float>()[1] == -1.25f);
  CHECK(t.data<float>()[2] == 3.0f);
}

TEST_CASE("safetensors: write_safetensors round trip for f32, f16, bf16", "[model][safetensors]") {
  test::TempDir dir;
  Tensor f32 = Tensor::empty(DType::f32, {3, 5});
  Tensor f16 = Tensor::empty(DType::f16, {7});
  Tensor bf16 = Tensor::empty(DType::bf16, {2, 2, 3});
  for (int i = 0; i < 15; ++i) f32.data<float>()[i] = 0.25f * static_cast<float>(i) - 1.0f;
  for (int i = 0; i < 7; ++i) f16.data<uint16_t>()[i] = f32_to_f16(static_cast<float>(i) / 3.0f);
  for (int i = 0; i < 12; ++i) bf16.data<uint16_t>()[i] = f32_to_bf16(-static_cast<float>(i) * 1.5f);
  const auto path = dir / "rt.safetensors";
  write_safetensors(path, {{"x.f32", f32}, {"x.f16", f16}, {"x.bf16", bf16}}, {{"note", "hi"}});

  auto f = SafetensorsFile::open(path);
  CHECK(f->metadata().at("note") == "hi");
  const Tensor r32 = f->tensor("x.f32");
  const Tensor r16 = f->tensor("x.f16");
  const Tensor rb = f->tensor("x.bf16");
  CHECK(r32.describe() == "[3, 5] f32");
  CHECK(r16.describe() == "[7] f16");
  CHECK(rb.describe() == "[2, 2, 3] bf16");
  CHECK(std::memcmp(r32.raw(), f32.raw(), f32.bytes()) == 0);
  CHECK(std::memcmp(r16.raw(), f16.raw(), f16.bytes()) == 0);
  CHECK(std::memcmp(rb.raw(), bf16.raw(), bf16.bytes()) == 0);
  CHECK(r32.memory_kind() == MemoryKind::borrowed);  // our writer aligns the data
  CHECK(f16_to_f32(r16.data<uint16_t>()[3]) == f16_to_f32(f32_to_f16(1.0f)));

  // The header length field is independent of our reader: parse it by hand.
  std::ifstream in(path, std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  const json header = json::parse(text);
  CHECK(header["x.f16"]["dtype"] == "F16");
  CHECK(header["x.bf16"]["shape"] == json({2, 2, 3}));
  CHECK((8 + n) % 8 == 0);
}

TEST_CASE("safetensors: malformed files fail naming the file and tensor", "[model][safetensors]") {
  test::TempDir dir;
  const auto path = dir / "bad.safetensors";
  const std::string file = path.string();

  SECTION("truncated data") {
    write_two_tensor_file(path);
    std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
    REQUIRE_THROWS_WITH(SafetensorsFile::open(path), Contains(file) && Contains("tensor b") && Contains("truncated"));
  }
  SECTION("header length past the end of the file") {
    test::write_raw_safetensors(path, one_tensor_header("F32", "[1]", "[0, 4]"), {0, 0, 0, 0}, 1000);
    REQUIRE_THROWS_WITH(SafetensorsFile::open(path), Contains(file) && Contains("header length 1000"));
  }
  SECTION("absurd header length") {
    test::write_raw_safetensors(path, "", {}, int64_t{1} << 62);
    REQUIRE_THROWS_WITH(SafetensorsFile::open(path), Contains(file) && Contains("header length"));
  }
  SECTION("shorter than the length field") {
    test::write_text(path, "abc");
    REQUIRE_THROWS_WITH(SafetensorsFile::open(path), Contains(file) && Contains("not a safetensors file"));
  }
  SECTION("bad JSON header") {
    test::write_raw_safetensors(path, R"({"weight": {"dtype": "F32", )", {});
    REQUIRE_THROWS_WITH(SafetensorsFile::open(path), Contains(file) && Contains("invalid JSON header"));
    test::write_raw_safetensors(path, R"([1, 2])", {});
    REQUIRE_THROWS_WITH(SafetensorsFile::open(path), Contains(file) && Contains("object"));
  }
  SECTION("unknown dtype") {
    test::write_raw_safetensors(path, one_tensor_header("F8_E4M3", "[4]", "[0, 4]"), {0, 0, 0, 0});
    REQUIRE_THROWS_WITH(SafetensorsFile::open(path),
                        Contains(file) && Contains("tensor weight") && Contains("unsupported dtype F8_E4M3"));
  }
  SECTION("shape and data_offsets disagree") {
    test::write_raw_safetensors(path, one_tensor_header("F32", "[2, 3]", "[0, 20]"), std::vector<unsigned char>(24));
    REQUIRE_THROWS_WITH(SafetensorsFile::open(path),
                        Contains(file) && Contains("tensor weight") && Contains("needs 24 bytes") && Contains("span 20"));
  }
  SECTION("bad offsets and shapes") {
    test::write_raw_safetensors(path, one_tensor_header("F32", "[1]", "[8, 4]"), std::vector<unsigned char>(8));
    REQUIRE_THROWS_WITH(SafetensorsFile::open(path), Contains("tensor weight") && Contains("bad data_offsets"));
    test::write_raw_safetensors(path, one_tensor_header("F32", "[-1]", "[0, 4]"), std::vector<unsigned char>(4));
    REQUIRE_THROWS_WITH(SafetensorsFile::open(path), Contains("tensor weight") && Contains("shape"));
    test::write_raw_safetensors(path, one_tensor_header("F32", "[1]", "[0]"), std::vector<unsigned char>(4));
    REQUIRE_THROWS_WITH(SafetensorsFile::open(path), Contains("tensor weight") && Contains("data_offsets"));
    test::write_raw_safetensors(path, R"({"weight": {"shape": [1], "data_offsets": [0, 4]}})", std::vector<unsigned char>(4));
    REQUIRE_THROWS_WITH(SafetensorsFile::open(path), Contains("tensor weight") && Contains("dtype"));
  }
  SECTION("rank above 4 parses but cannot be viewed") {
    test::write_raw_safetensors(path, one_tensor_header("U8", "[1, 1, 1, 1, 2]", "[0, 2]"), {7, 9});
    auto f = SafetensorsFile::open(path);
    CHECK(f->find("weight")->numel() == 2);
    REQUIRE_THROWS_WITH(f->tensor("weight"), Contains("tensor weight") && Contains("rank 5"));
  }
  SECTION("missing file") {
    REQUIRE_THROWS_WITH(SafetensorsFile::open(dir / "nope.safetensors"), Contains("nope.safetensors"));
  }
}

TEST_CASE("safetensors checkpoint: single file and sharded index", "[model][safetensors]") {
  test::TempDir dir;
  Tensor x = Tensor::empty(DType::f32, {2});
  x.data<float>()[0] = 1.5f;
  Tensor y = Tensor::empty(DType::bf16, {3});
  y.data<uint16_t>()[2] = f32_to_bf16(-4.0f);
  Tensor z = Tensor::empty(DType::f16, {1, 1});

  SECTION("model.safetensors") {
    write_safetensors(dir / "model.safetensors", {{"x", x}, {"y", y}});
    const SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(dir.path());
    CHECK(ck.names() == std::vector<std::string>{"x", "y"});
    CHECK(ck.tensor("x").data<float>()[0] == 1.5f);
    CHECK(ck.files().size() == 1);
    REQUIRE_THROWS_WITH(ck.tensor("q"), Contains("tensor q not found in " + dir.path().string()) &&
                                            Contains("looked in") && Contains("model.safetensors"));
    // A file path works too.
    CHECK(SafetensorsCheckpoint::open(dir / "model.safetensors").contains("y"));
  }
  SECTION("sharded") {
    write_safetensors(dir / "model-00001-of-00002.safetensors", {{"x", x}, {"z", z}});
    write_safetensors(dir / "model-00002-of-00002.safetensors", {{"y", y}});
    json index = {{"metadata", {{"total_size", 20}}},
                  {"weight_map",
                   {{"x", "model-00001-of-00002.safetensors"},
                    {"y", "model-00002-of-00002.safetensors"},
                    {"z", "model-00001-of-00002.safetensors"}}}};
    test::write_text(dir / "model.safetensors.index.json", index.dump());
    const SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(dir.path());
    CHECK(ck.files().size() == 2);  // each shard opened once
    CHECK(ck.names() == std::vector<std::string>{"x", "y", "z"});
    CHECK(bf16_to_f32(ck.tensor("y").data<uint16_t>()[2]) == -4.0f);
    CHECK(ck.file_of("z").path().filename() == "model-00001-of-00002.safetensors");
    REQUIRE_THROWS_WITH(ck.tensor("w"), Contains("tensor w not found in " + dir.path().string()) &&
                                            Contains("model.safetensors.index.json"));

    // A tensor the index lists in a shard that lacks it.
    index["weight_map"]["w"] = "model-00002-of-00002.safetensors";
    test::write_text(dir / "model.safetensors.index.json", index.dump());
    REQUIRE_THROWS_WITH(SafetensorsCheckpoint::open(dir.path()),
                        Contains("tensor w") && Contains("model-00002-of-00002.safetensors") &&
                            Contains("does not contain it"));

    // A missing shard.
    index["weight_map"].erase("w");
    index["weight_map"]["v"] = "model-00003-of-00002.safetensors";
    test::write_text(dir / "model.safetensors.index.json", index.dump());
    REQUIRE_THROWS_WITH(SafetensorsCheckpoint::open(dir.path()),
                        Contains("model.safetensors.index.json") && Contains("model-00003-of-00002.safetensors") &&
                            Contains("tensor v") && Contains("does not exist"));

    // A malformed index.
    test::write_text(dir / "model.safetensors.index.json", "{\"weight_map\": [");
    REQUIRE_THROWS_WITH(SafetensorsCheckpoint::open(dir.path()),
                        Contains("model.safetensors.index.json") && Contains("invalid JSON"));
    test::write_text(dir / "model.safetensors.index.json", "{\"metadata\": {}}");
    REQUIRE_THROWS_WITH(SafetensorsCheckpoint::open(dir.path()), Contains("weight_map"));
    test::write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"x": "../escape.safetensors"}})");
    REQUIRE_THROWS_WITH(SafetensorsCheckpoint::open(dir.path()), Contains("not a plain file name"));
  }
  SECTION("nothing there") {
    REQUIRE_THROWS_WITH(SafetensorsCheckpoint::open(dir.path()),
                        Contains("no model.safetensors or model.safetensors.index.json in " + dir.path().string()));
    REQUIRE_THROWS_WITH(SafetensorsCheckpoint::open(dir / "missing"), Contains("missing"));
  }
}

TEST_CASE("safetensors: corrupted bytes give hack::Error or a valid file, never a crash", "[model][safetensors]") {
  test::TempDir dir;
  const auto good = dir / "good.safetensors";
  write_two_tensor_file(good);
  std::vector<char> bytes(std::filesystem::file_size(good));
  {
    std::ifstream in(good, std::ios::binary);
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const uint64_t seed = 20261121;
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  int ok = 0, rejected = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    std::vector<char> b = bytes;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      // Mostly the length field and the header, where the parser works.
      const size_t header_end = std::min(b.size(), size_t{8} + 200);
      const size_t pos = rng() % 4 == 0 ? rng() % b.size() : rng() % header_end;
      const char printable[] = "0123456789[]{},:\"-eE.FIU ";
      b[pos] = rng() % 2 ? static_cast<char>(rng()) : printable[rng() % (sizeof(printable) - 1)];
    }
    if (rng() % 8 == 0) b.resize(rng() % b.size());
    const auto path = dir / "fuzz.safetensors";
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(b.data(), static_cast<std::streamsize>(b.size()));
    }
    try {
      auto f = SafetensorsFile::open(path);
      for (const SafetensorsEntry& e : f->entries()) {
        REQUIRE(e.end <= f->file_bytes());
        if (e.shape.size() <= 4) {
          const Tensor t = f->tensor(e);
          volatile unsigned char sink = t.bytes() ? static_cast<const unsigned char*>(t.raw())[t.bytes() - 1] : 0;
          (void)sink;
        }
      }
      ++ok;
    } catch (const Error&) {
      ++rejected;
    }
  }
  CHECK(rejected > 0);
  CHECK(ok + rejected == 1500);
}
