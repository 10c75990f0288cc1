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


PageScore parse_page_score(std::string_view name) {
  for (const PageScore s : {PageScore::quest, PageScore::mpcache, PageScore::streaming, PageScore::random, PageScore::oracle})
    if (name == page_score_name(s)) return s;
  fail("--kv-select-bound must be quest or mpcache (baselines: streaming, random, oracle), got '{}'", name);
}

std::string_view page_score_name(PageScore score) {
  switch (score) {
    case PageScore::quest: return "quest";
    case PageScore::mpcache: return "mpcache";
    case PageScore::streaming: return "streaming";
    case PageScore::random: return "random";
    case PageScore::oracle: return "oracle";
  }
  return "?";
}

void validate(const PageSelectOptions& o) {
  HACK_CHECK(o.ratio >= 0 && o.ratio <= 1, "--kv-select-ratio must be in (0, 1] (0 = off), got {}", o.ratio);
  HACK_CHECK(o.tokens >= 0, "--kv-select-tokens must be a token count (0 = off), got {}", o.tokens);
  HACK_CHECK(o.ratio == 0 || o.tokens == 0, "give --kv-select-ratio or --kv-select-tokens, not both");
  HACK_CHECK(o.alpha >= 0 && o.alpha <= 1, "--kv-select-alpha must be in [0, 1], got {}", o.alpha);
  HACK_CHECK(o.group_pages >= 1 && o.group_pages <= 1024, "--kv-select-group must be in [1, 1024] pages, got {}",
             o.group_pages);
  HACK_CHECK(o.coarse_ratio > 0 && o.coarse_ratio <= 1, "--kv-select-coarse must be in (0, 1], got {}", o.coarse_ratio);
  HACK_CHECK(o.dense_layers >= 0, "--kv-select-dense must not be negative, got {}", o.dense_layers);
  HACK_CHECK(o.share_layers >= 1, "--kv-select-share must be at least 1, got {}", o.share_layers);
  HACK_CHECK(o.min_tokens >= 0, "--kv-select-min-tokens must not be negative, got {}", o.min_tokens);
  HACK_CHECK(o.min_context >= 0, "--kv-select-min-context must not be negative, got {}", o.min_context);
}

std::string describe(const PageSelectOptions& o) {
  if (!o.enabled()) return "";
  std::string s = o.tokens > 0 ? fmt::format(" select={}tok", o.tokens) : fmt::format(" select={:g}", o.ratio);
  s += fmt::format(" {}", page_score_name(o.score));
  if (o.score == PageScore::mpcache) s += fmt::format(" alpha={:g}", o.alpha);
  if (o.score == PageScore::quest || o.score == PageScore::mpcache)
    s += fmt::format(" group={} coarse={:g}", o.group_pages, o.coarse_ratio);
  s += fmt::format(" dense={} share={}", o.dense_layers, o.share_layers);
  if (o.min_tokens > 0) s += fmt::format(" min-tokens={}", o.min_tokens);
  if (o.min_context > 0) s += fmt::format(" min-context={}", o.min_context);
  return s;
}

}  // namespace hack
