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

/// Instruction set a kernel family runs with; each tier includes the ones before it.
///
///   scalar      the references (any x86-64)
///   avx2        AVX2 + FMA + F16C (x86-64-v3, the build's baseline)
///   avx512      AVX-512 F/BW/VL/DQ + VNNI (Intel Cascade Lake, Ice Lake): GEMV, HACK attention
///               (VPDPBUSD), page scores, and MatmulPrecision::bf16 by fp32 FMA (activations
///               rounded to bf16, bf16 × bf16 products FMA'd in VDPBF16PS's order)
///   avx512bf16  avx512 + AVX-512 BF16 (Intel Cooper Lake, Sapphire Rapids; AMD Zen 4): the same
///               kernels, and MatmulPrecision::bf16 on VDPBF16PS
///
/// Only the MatmulPrecision::bf16 kernels differ between the two AVX-512 tiers; an AVX-512 CPU
/// without VNNI (Skylake-SP) runs avx2.
enum class CpuIsa { scalar, avx2, avx512, avx512bf16 };

/// Best ISA this CPU supports, lowered by the environment variable HACK_CPU_ISA
/// (scalar|avx2|avx512|avx512bf16) so tests and benches can force a path; a value above what the
/// CPU supports, or not one of these names, leaves the best.
CpuIsa cpu_isa();
/// Whether the CPU can run kernels of `isa` (scalar: always).
bool cpu_supports(CpuIsa isa);
/// "scalar", "avx2", "avx512", "avx512bf16" (HACK_CPU_ISA's values).
const char* cpu_isa_name(CpuIsa isa);

}  // namespace hack
