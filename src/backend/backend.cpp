#include "hack/backend/backend.h"

#include "hack/core/error.h"

namespace hack {

KvShape kv_shape(const ModelConfig& c) { return {c.num_layers, c.num_kv_heads, c.head_dim, c.group_size()}; }

DeviceKind parse_device(const std::string& name) {
  if (name == "cpu") return DeviceKind::cpu;
  if (name == "cuda") return DeviceKind::cuda;
  fail("unknown device '{}' (cpu|cuda)", name);
}

}  // namespace hack
