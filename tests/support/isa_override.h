// HACK_CPU_ISA set for a scope: cpu_isa() reads the variable on every call, so a test can run
// one engine or kernel on a forced tier and the next on another in the same process.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "hack/core/cpu_features.h"

namespace hack::test {

/// Sets HACK_CPU_ISA to `value` (unsets it for nullopt) and puts the old value back on exit.
class IsaOverride {
 public:
  explicit IsaOverride(std::optional<std::string> value) {
    if (const char* old = std::getenv("HACK_CPU_ISA")) old_ = old;
    set(value);
  }
  explicit IsaOverride(CpuIsa isa) : IsaOverride(std::optional<std::string>(cpu_isa_name(isa))) {}
  ~IsaOverride() { set(old_); }
  IsaOverride(const IsaOverride&) = delete;
  IsaOverride& operator=(const IsaOverride&) = delete;

 private:
  static void set(const std::optional<std::string>& value) {
    if (value) {
      setenv("HACK_CPU_ISA", value->c_str(), 1);
    } else {
      unsetenv("HACK_CPU_ISA");
    }
  }
  std::optional<std::string> old_;
};

}  // namespace hack::test
