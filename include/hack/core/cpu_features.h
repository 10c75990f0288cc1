/// @file cpu_features.h
/// @brief Run-time x86 feature detection (cpuid + xgetbv) and the kernel ISA choice.
#pragma once

#include <string>

namespace hack {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool avx_vnni = false;
  bool amx_tile = false;
  bool amx_int8 = false;
  bool amx_bf16 = false;
  /// "avx2 fma f16c avx512f ..." for logs and bench output.
  std::string describe() const;
};

/// Features of this CPU, also checking that the OS saves the AVX / AVX-512 / AMX state.
const CpuFeatures& cpu_features();

/// Instruction set a kernel family runs with.
enum class CpuIsa { scalar, avx2, avx512 };

/// Best ISA this CPU supports, lowered by the environment variable HACK_CPU_ISA
/// (scalar|avx2|avx512) so tests and benches can force a path.
CpuIsa cpu_isa();
/// Whether the CPU can run kernels of `isa` (scalar: always).
bool cpu_supports(CpuIsa isa);
const char* cpu_isa_name(CpuIsa isa);

}  // namespace hack
