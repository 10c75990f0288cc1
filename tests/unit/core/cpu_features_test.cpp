// The ISA tiers: what each needs of cpu_features(), and HACK_CPU_ISA lowering (never raising) the choice.
#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "hack/core/cpu_features.h"
#include "support/isa_override.h"

using namespace hack;

namespace {

constexpr CpuIsa kTiers[] = {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16};

// cpu_isa() with HACK_CPU_ISA set to `value` (unset for nullopt).
CpuIsa isa_with(std::optional<std::string> value) {
  const test::IsaOverride force(std::move(value));
  return cpu_isa();
}

}  // namespace

TEST_CASE("cpu tiers: each needs its features and the tier below", "[core][cpu]") {
  const CpuFeatures& f = cpu_features();
  INFO("features: " << f.describe());
  REQUIRE(cpu_supports(CpuIsa::avx2) == (f.avx2 && f.fma && f.f16c));
  // avx512: F/BW/VL/DQ and VNNI (HACK attention's VPDPBUSD), not BF16.
  REQUIRE(cpu_supports(CpuIsa::avx512) ==
          (cpu_supports(CpuIsa::avx2) && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni));
  REQUIRE(cpu_supports(CpuIsa::avx512bf16) == (cpu_supports(CpuIsa::avx512) && f.avx512bf16));
}

TEST_CASE("cpu tiers: HACK_CPU_ISA lowers the best tier, never raises it", "[core][cpu]") {
  const CpuIsa best = isa_with(std::nullopt);
  INFO("best " << cpu_isa_name(best) << ", features: " << cpu_features().describe());
  REQUIRE(cpu_supports(best));
  for (CpuIsa above : kTiers)
    if (above > best) REQUIRE(!cpu_supports(above));
  for (CpuIsa isa : kTiers) {
    INFO("HACK_CPU_ISA=" << cpu_isa_name(isa));
    REQUIRE(isa_with(cpu_isa_name(isa)) == std::min(isa, best));
  }
  REQUIRE(isa_with("avx512_bf16") == best);  // not a tier's name: ignored
  REQUIRE(isa_with("") == best);
  REQUIRE(std::string(cpu_isa_name(CpuIsa::avx512)) == "avx512");
  REQUIRE(std::string(cpu_isa_name(CpuIsa::avx512bf16)) == "avx512bf16");
}
