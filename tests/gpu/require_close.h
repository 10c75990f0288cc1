// The tolerance the CUDA differential tests compare device outputs with their CPU twins by:
// |gpu − cpu| ≤ 1e-6 + 1e-5·|cpu| everywhere, no NaN; the count of bit-identical outputs and
// the worst place are reported. The kernels follow the CPU scalar reference op for op, so
// outputs are expected bit-identical; a wrong page, row, split merge or causal bound moves an
// output by O(1).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace hack::test {

/// require_written: more than half of cpu's outputs are non-zero (a device runner that
/// writes nothing into a zeroed output cannot pass).
inline void require_close(const std::vector<float>& gpu, const std::vector<float>& cpu, const std::string& what,
                          bool require_written = false) {
  REQUIRE(gpu.size() == cpu.size());
  size_t worst = 0, exact = 0, nonzero = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double d = std::fabs(static_cast<double>(gpu[i]) - cpu[i]);
    const double excess = d - (1e-6 + 1e-5 * std::fabs(static_cast<double>(cpu[i])));
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
    exact += gpu[i] == cpu[i] ? 1 : 0;
    nonzero += cpu[i] != 0.0f ? 1 : 0;
  }
  INFO(what << ": " << exact << " of " << cpu.size() << " outputs bit-identical; worst at " << worst << ": gpu "
            << gpu[worst] << " cpu " << cpu[worst]);
  if (require_written) REQUIRE(nonzero > cpu.size() / 2);
  REQUIRE(worst_excess <= 0.0);
  REQUIRE(std::none_of(gpu.begin(), gpu.end(), [](float x) { return std::isnan(x); }));
}

}  // namespace hack::test
