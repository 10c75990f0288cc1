#include "hack/core/cpu_features.h"

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace hack {

namespace {

uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = (ecx >> 27) & 1;
  const bool avx = (ecx >> 28) & 1;
  f.fma = (ecx >> 12) & 1;
  f.f16c = (ecx >> 29) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = read_xcr0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;            // XMM and YMM state
  const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;       // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;    // XTILECFG, XTILEDATA
  if (!os_avx) {
    f.fma = f.f16c = false;
    return f;
  }
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  f.avx2 = (ebx >> 5) & 1;
  if (os_avx512) {
    f.avx512f = (ebx >> 16) & 1;
    f.avx512dq = (ebx >> 17) & 1;
    f.avx512bw = (ebx >> 30) & 1;
    f.avx512vl = (ebx >> 31) & 1;
    f.avx512vnni = (ecx >> 11) & 1;
  }
  if (os_amx) {
    f.amx_bf16 = (edx >> 22) & 1;
    f.amx_tile = (edx >> 24) & 1;
    f.amx_int8 = (edx >> 25) & 1;
  }
  unsigned eax1 = 0, ebx1 = 0, ecx1 = 0, edx1 = 0;
  __cpuid_count(7, 1, eax1, ebx1, ecx1, edx1);
  f.avx_vnni = (eax1 >> 4) & 1;
  if (os_avx512) f.avx512bf16 = (eax1 >> 5) & 1;
  return f;
}

}  // namespace

std::string CpuFeatures::describe() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512vnni, "avx512vnni");
  add(avx512bf16, "avx512bf16");
  add(avx_vnni, "avxvnni");
  add(amx_tile, "amx-tile");
  add(amx_int8, "amx-int8");
  add(amx_bf16, "amx-bf16");
  return s.empty() ? "none" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

bool cpu_supports(CpuIsa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case CpuIsa::scalar: return true;
    case CpuIsa::avx2: return f.avx2 && f.fma && f.f16c;
    case CpuIsa::avx512:
      return cpu_supports(CpuIsa::avx2) && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni;
    case CpuIsa::avx512bf16: return cpu_supports(CpuIsa::avx512) && f.avx512bf16;
  }
  return false;
}

CpuIsa cpu_isa() {
  CpuIsa best = CpuIsa::scalar;
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16})
    if (cpu_supports(isa)) best = isa;
  if (const char* env = std::getenv("HACK_CPU_ISA")) {
    for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16})
      if (std::strcmp(env, cpu_isa_name(isa)) == 0 && isa < best) return isa;
  }
  return best;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::scalar: return "scalar";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
    case CpuIsa::avx512bf16: return "avx512bf16";
  }
  return "?";
}

}  // namespace hack
