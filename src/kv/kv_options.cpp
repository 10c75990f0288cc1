// The KV options' names, descriptions and byte sizes (include/hack/kv/kv_options.h).
#include "hack/kv/kv_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "hack/core/error.h"

namespace hack {

KvMode parse_kv_mode(std::string_view name) {
  if (name == "fp") return KvMode::fp;
  if (name == "hack") return KvMode::hack;
  fail("--kv must be fp or hack, got '{}'", name);
}

Rounding parse_rounding(std::string_view name) {
  if (name == "nearest") return Rounding::nearest;
  if (name == "stochastic") return Rounding::stochastic;
  fail("--hack-rounding must be nearest or stochastic, got '{}'", name);
}

std::string_view hack_attention_name(HackAttention attention) {
  return attention == HackAttention::homomorphic ? "homomorphic" : "dequantized";
}

std::string_view kv_mode_name(KvMode mode) { return mode == KvMode::fp ? "fp" : "hack"; }
std::string_view rounding_name(Rounding rounding) { return rounding == Rounding::nearest ? "nearest" : "stochastic"; }

std::string describe(const KvCacheOptions& o) {
  if (o.mode == KvMode::fp) return fmt::format("fp {} block={}", dtype_name(o.fp_dtype), o.block_tokens);
  std::string s;
  if (o.layer_bits.empty()) {
    s = fmt::format("hack k{}v{}", o.k_bits, o.v_bits);
  } else {  // "hack layers[k4v2 x10, k2v2 x20]": how many layers have each width
    std::vector<std::pair<HackLayerBits, int>> counts;
    for (const HackLayerBits& b : o.layer_bits) {
      auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == b; });
      if (it == counts.end()) counts.push_back({b, 1});
      else ++it->second;
    }
    s = "hack layers[";
    for (size_t i = 0; i < counts.size(); ++i)
      s += fmt::format("{}k{}v{} x{}", i ? ", " : "", counts[i].first.k_bits, counts[i].first.v_bits, counts[i].second);
    s += "]";
  }
  s += fmt::format(" block={} sinks={} {}", o.block_tokens, o.sinks, rounding_name(o.rounding));
  if (o.rounding == Rounding::stochastic) s += fmt::format(" seed={}", o.seed);
  if (o.recent_tokens > 0) s += fmt::format(" recent={}", o.recent_tokens);
  if (!o.exact_prefill) s += " quantized-prefill";
  if (o.attention != HackAttention::homomorphic) s += fmt::format(" {}", hack_attention_name(o.attention));
  s += describe(o.select);
  return s;
}

double bf16_kv_bytes_per_token(const KvShape& shape) {
  KvCacheOptions bf16;
  bf16.mode = KvMode::fp;
  bf16.fp_dtype = DType::bf16;
  KvShape full = shape;  // the model's bf16 KV: every head at head_dim
  full.k_dims.clear();
  full.v_dims.clear();
  return kv_bytes_per_token(full, bf16);
}

double kv_bytes_per_token(const KvShape& shape, const KvCacheOptions& options) {
  double bytes = 0;
  if (options.mode == KvMode::fp) {
    for (int l = 0; l < shape.num_layers; ++l)
      for (int h = 0; h < shape.num_kv_heads; ++h) bytes += shape.k_dim(l, h) + shape.v_dim(l, h);
    return bytes * static_cast<double>(dtype_size(options.fp_dtype));
  }
  for (int l = 0; l < shape.num_layers; ++l) bytes += hack_page_layout(shape, options, l).bytes_per_token();
  return bytes;
}

HackPageLayout hack_page_layout(const KvShape& shape, const KvCacheOptions& options, int layer) {
  const HackLayerBits bits = options.layer_bits.empty() ? HackLayerBits{options.k_bits, options.v_bits}
                                                        : options.layer_bits.at(static_cast<size_t>(layer));
  HackPageParams params;
  params.k_bits = bits.k_bits;
  params.v_bits = bits.v_bits;
  params.block_tokens = options.block_tokens;
  params.k_group = options.k_group;
  params.v_group = options.v_group;
  for (int h = 0; h < shape.num_kv_heads; ++h) params.heads.push_back({shape.k_dim(layer, h), shape.v_dim(layer, h)});
  return HackPageLayout(params);
}

}  // namespace hack
