#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "hack/core/cpu_features.h"
#include "hack/core/error.h"
#include "hack/core/mapped_file.h"
#include "hack/core/tensor.h"

using namespace hack;

TEST_CASE("host tensors: shape, bytes, zeroed, slices share memory", "[core][tensor]") {
  Tensor t = Tensor::empty(DType::bf16, {4, 3});
  REQUIRE(t.numel() == 12);
  REQUIRE(t.bytes() == 24);
  REQUIRE(t.describe() == "[4, 3] bf16");
  REQUIRE(reinterpret_cast<uintptr_t>(t.raw()) % 64 == 0);
  for (int i = 0; i < 12; ++i) REQUIRE(t.data<uint16_t>()[i] == 0);
  Tensor rows = t.slice_rows(1, 2);
  rows.data<uint16_t>()[0] = 7;
  REQUIRE(t.data<uint16_t>()[3] == 7);
  REQUIRE_THROWS_AS(t.slice_rows(3, 2), Error);
  REQUIRE(t.reshape({12}).dim(0) == 12);
  REQUIRE_THROWS_AS(t.reshape({5}), Error);
}

TEST_CASE("pinned and device allocation fail clearly without a device", "[core][tensor]") {
  if (cuda_device_available()) return;  // covered by the gpu tests
  REQUIRE_THROWS_AS(Buffer::allocate(MemoryKind::device, 16), Error);
}

TEST_CASE("mapped files: contents, and errors naming the path", "[core][mapped_file]") {
  const auto p = std::filesystem::temp_directory_path() / "hack_mapped_file_test.bin";
  { std::ofstream(p) << "hello"; }
  auto f = MappedFile::open(p);
  REQUIRE(f->size() == 5);
  REQUIRE(std::string(reinterpret_cast<const char*>(f->data()), 5) == "hello");
  std::filesystem::remove(p);
  REQUIRE_THROWS_WITH(MappedFile::open("/nonexistent/x.bin"), Catch::Contains("/nonexistent/x.bin"));
}

TEST_CASE("cpu features: AVX2 present on every supported machine", "[core][cpu]") {
  REQUIRE(cpu_supports(CpuIsa::avx2));
  REQUIRE(cpu_supports(CpuIsa::scalar));
  REQUIRE(!cpu_features().describe().empty());
}

TEST_CASE("tensor of a block type: rows are whole blocks, bytes and row slices by block", "[core][tensor]") {
  const Tensor t = Tensor::empty(DType::q4_k, {3, 512});
  CHECK(t.bytes() == 3 * 2 * 144);
  CHECK(static_cast<const char*>(t.slice_rows(2, 1).raw()) - static_cast<const char*>(t.raw()) == 2 * 2 * 144);
  CHECK(Tensor::empty(DType::q4_0, {5, 64}).bytes() == 5 * 2 * 18);
  CHECK(Tensor::empty(DType::q6_k, {1, 256}).bytes() == 210);
  CHECK_THROWS_AS(Tensor::empty(DType::q8_0, {2, 48}), Error);
  CHECK_THROWS_AS(t.reshape({3, 2, 256}).reshape({1536, 1}), Error);
  CHECK(dtype_bytes(DType::q5_k, 1024) == 4 * 176);
  CHECK(dtype_is_quantized(DType::q4_1));
  CHECK_FALSE(dtype_is_quantized(DType::bf16));
}
