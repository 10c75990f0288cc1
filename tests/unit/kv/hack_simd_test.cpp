// Every SIMD path of the attention kernels is bit-identical to the scalar reference: the
// same streams through caches that differ only in the kernel ISA give the same bytes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "hack/core/cpu_features.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "kv_test_util.h"

using namespace hack;
using hack::test::KvStream;

namespace {

// Output of every attend over the stream (chunks cycled), for one kernel ISA.
std::vector<float> run(const KvShape& shape, KvCacheOptions o, CpuIsa isa, const KvStream& data,
                       const std::vector<int>& chunks) {
  o.isa = isa;
  auto cache = make_paged_kv_cache(shape, o);
  cache->add_sequence(0, data.tokens);
  const int H = shape.num_kv_heads, G = shape.group_size, d = shape.head_dim;
  const size_t row = static_cast<size_t>(H) * G * d;
  std::vector<float> all;
  int pos = 0;
  for (size_t ci = 0; pos < data.tokens; ++ci) {
    const int n = std::min(chunks[ci % chunks.size()], data.tokens - pos);
    std::vector<float> out(n * row), scratch(cache->attend_scratch_floats(n, pos + n));
    for (int l = 0; l < shape.num_layers; ++l) {
      cache->append(l, 0, pos, n, data.k_at(pos), data.v_at(pos));
      for (int h = 0; h < H; ++h) {
        const size_t off = static_cast<size_t>(h) * G * d;
        cache->attend(l, 0, h, pos, n, data.q_at(pos) + off, row, out.data() + off, row,
                      1.0f / std::sqrt(static_cast<float>(d)), scratch.data());
      }
      all.insert(all.end(), out.begin(), out.end());
    }
    pos += n;
  }
  return all;
}

}  // namespace

TEST_CASE("SIMD attention kernels are bit-identical to the scalar reference", "[kv][simd]") {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16})
    if (cpu_supports(isa)) isas.push_back(isa);
  if (isas.empty()) WARN("no SIMD ISA on this CPU; nothing to compare");
  struct Case {
    KvMode mode;
    int bits, block, dim, group, sinks;
    DType fp_dtype;
    int v_bits = 0;  // 0 = bits
  };
  const std::vector<Case> cases = {
      {KvMode::hack, 2, 64, 128, 4, 4, DType::bf16}, {KvMode::hack, 2, 16, 64, 3, 4, DType::bf16},
      {KvMode::hack, 4, 32, 128, 8, 1, DType::bf16}, {KvMode::hack, 8, 16, 64, 1, 0, DType::bf16},
      {KvMode::hack, 8, 64, 128, 5, 4, DType::bf16}, {KvMode::hack, 4, 128, 64, 2, 4, DType::bf16},
      {KvMode::fp, 0, 32, 128, 4, 0, DType::f32},    {KvMode::fp, 0, 16, 40, 3, 0, DType::bf16},
      {KvMode::fp, 0, 16, 72, 2, 0, DType::f32},
      {KvMode::hack, 4, 64, 128, 3, 4, DType::bf16, 2}, {KvMode::hack, 2, 32, 64, 4, 4, DType::bf16, 4},
      {KvMode::hack, 8, 32, 64, 3, 4, DType::bf16, 2},  {KvMode::hack, 2, 16, 128, 2, 0, DType::bf16, 8},
  };
  for (const Case& c : cases) {
    KvCacheOptions o;
    o.mode = c.mode;
    o.k_bits = c.bits == 0 ? 2 : c.bits;
    o.v_bits = c.v_bits > 0 ? c.v_bits : o.k_bits;
    o.block_tokens = c.block;
    o.sinks = c.sinks;
    o.fp_dtype = c.fp_dtype;
    const KvShape shape{2, 2, c.dim, c.group};
    const KvStream data(c.sinks + 3 * c.block + 5, 2, c.group, c.dim, static_cast<uint32_t>(c.bits * 100 + c.block + c.group));
    for (const std::vector<int>& chunks : {std::vector<int>{1}, std::vector<int>{c.block + 5, 3, 1}}) {
      const std::vector<float> ref = run(shape, o, CpuIsa::scalar, data, chunks);
      for (CpuIsa isa : isas) {
        INFO(cpu_isa_name(isa) << " mode " << kv_mode_name(c.mode) << " bits " << c.bits << "/" << c.v_bits << " block " << c.block << " dim "
                               << c.dim << " group " << c.group << " chunks " << chunks.size());
        const std::vector<float> got = run(shape, o, isa, data, chunks);
        REQUIRE(got.size() == ref.size());
        size_t mismatches = 0, first = 0;
        double worst = 0;
        for (size_t i = 0; i < ref.size(); ++i)
          if (std::memcmp(&got[i], &ref[i], sizeof(float)) != 0) {
            if (mismatches++ == 0) first = i;
            worst = std::max(worst, static_cast<double>(std::fabs(got[i] - ref[i])));
          }
        INFO("first mismatch at " << first << ": " << got[first] << " vs " << ref[first] << ", worst |diff| " << worst);
        REQUIRE(mismatches == 0);
      }
    }
  }
}
