#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "hack/core/tensor.h"

using namespace hack;

TEST_CASE("device and pinned buffers round-trip bytes", "[gpu][core]") {
  const size_t n = 1 << 20;
  Buffer pinned = Buffer::allocate(MemoryKind::pinned, n);
  Buffer device = Buffer::allocate(MemoryKind::device, n);
  auto* p = static_cast<unsigned char*>(pinned.data());
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(i * 7 + 3);
  REQUIRE(cudaMemcpy(device.data(), pinned.data(), n, cudaMemcpyHostToDevice) == cudaSuccess);
  std::vector<unsigned char> back(n);
  REQUIRE(cudaMemcpy(back.data(), device.data(), n, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(std::memcmp(back.data(), p, n) == 0);
}
