#include "hack/backend/backend.h"

#include "hack/core/error.h"
#include "hack/model/fdc.h"

namespace hack {

KvShape kv_shape(const ModelConfig& c) { return {c.num_layers, c.num_kv_heads, c.head_dim, c.group_size(), {}, {}}; }

KvShape kv_shape(const Model& model) {
  KvShape shape = kv_shape(model.config);
  if (!model.fdc) return shape;
  for (const FdcRanks& r : model.fdc->ranks) {
    shape.k_dims.push_back(r.d_qk);
    shape.v_dims.push_back(r.d_v);
  }
  return shape;
}

void Backend::set_activation_observer(ActivationObserverFn) { fail("the {} backend does not show activations", name()); }

DeviceKind parse_device(const std::string& name) {
  if (name == "cpu") return DeviceKind::cpu;
  if (name == "cuda") return DeviceKind::cuda;
  fail("unknown device '{}' (cpu|cuda)", name);
}

}  // namespace hack
