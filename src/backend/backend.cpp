#include "hack/backend/backend.h"

#include "hack/core/error.h"

namespace hack {

DeviceKind parse_device(const std::string& name) {
  if (name == "cpu") return DeviceKind::cpu;
  if (name == "cuda") return DeviceKind::cuda;
  fail("unknown device '{}' (cpu|cuda)", name);
}

}  // namespace hack
