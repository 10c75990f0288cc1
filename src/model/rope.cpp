#include "hack/model/rope.h"

#include <cmath>
#include <numbers>

namespace hack {

std::vector<float> rope_inv_freq(const ModelConfig& config) {
  const int half = config.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    inv[static_cast<size_t>(i)] = static_cast<float>(
        1.0 / std::pow(static_cast<double>(config.rope_theta), (2.0 * i) / config.head_dim));
  }
  const RopeScaling& s = config.rope_scaling;
  switch (s.type) {
    case RopeScalingType::none: break;
    case RopeScalingType::linear:
      for (float& f : inv) f /= s.factor;
      break;
    case RopeScalingType::llama3: {
      const double old_ctx = s.original_max_position_embeddings;
      const double low_freq_wavelen = old_ctx / s.low_freq_factor;
      const double high_freq_wavelen = old_ctx / s.high_freq_factor;
      for (float& f : inv) {
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen > low_freq_wavelen) {
          f = static_cast<float>(f / s.factor);
        } else if (wavelen >= high_freq_wavelen) {
          const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          f = static_cast<float>((1.0 - smooth) * f / s.factor + smooth * f);
        }
      }
      break;
    }
  }
  return inv;
}

}  // namespace hack
