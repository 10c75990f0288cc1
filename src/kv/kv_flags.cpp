#include "hack/kv/kv_flags.h"

#include <algorithm>
#include <filesystem>

#include "hack/core/error.h"
#include "hack/kv/hack_allocation.h"

namespace hack {

void add_kv_flags(FlagSet& flags, KvFlags& c) {
  flags.add_string("kv", &c.kv,
                   "KV cache and wire format: fp (uncompressed) or hack (quantized codes, attention computed on them: "
                   "fewer KV bytes in memory and on the wire for some accuracy. Widths come from the model's "
                   "hack_kv.json when present, else --hack-bits. Measured on the decode path vs fp32: K4/V4 30 % "
                   "of bf16 bytes, SmolLM2-135M ppl +0.1 % / top-1 97 %, Qwen2.5-Coder-1.5B ppl +0.6 % / top-1 98 %; "
                   "K2/V2 17 %, top-1 81 % / 86 %; bench/RESULTS.md)");
  flags.add_int("hack-bits", &c.hack_bits,
                "HACK code bits of K and V: 2, 4 or 8 (4: the width measured safe on every model tried; 2 halves "
                "the bytes at a cost in accuracy that varies by model)");
  flags.add_int("hack-k-bits", &c.hack_k_bits, "HACK code bits of K (0 = --hack-bits)");
  flags.add_int("hack-v-bits", &c.hack_v_bits, "HACK code bits of V (0 = --hack-bits)");
  flags.add_int("hack-block", &c.hack_block, "KV page (HACK block) tokens, a multiple of 16");
  flags.add_int("hack-sinks", &c.hack_sinks, "leading tokens kept in bf16");
  flags.add_int("hack-recent", &c.hack_recent,
                "newest tokens kept in bf16 (a block is quantized once it is older than this window); -1 = the "
                "bit allocation's window, else 0");
  flags.add_string("hack-allocation", &c.hack_allocation,
                   "per-layer K/V bits from hack-calibrate --hack: auto (the model directory's hack_kv.json when "
                   "present), none, or a file; replaces --hack-bits/--hack-k-bits/--hack-v-bits");
  flags.add_int("hack-k-group", &c.hack_k_group, "channels per K partition (Q quantization group), multiple of 16");
  flags.add_int("hack-v-group", &c.hack_v_group, "channels per V partition (V min/scale group), multiple of 16");
  flags.add_string("hack-rounding", &c.hack_rounding, "HACK rounding: nearest or stochastic");
  flags.add_string("kv-dtype", &c.kv_dtype, "element type of --kv fp pages: bf16 or f32");
  flags.add_float("kv-select-ratio", &c.kv_select_ratio,
                  "MPCache page selection in decode (--kv hack): each decode token attends to this fraction of its "
                  "context — sinks, exact blocks, the newest page and the best-scoring pages; 0 = off (all pages). "
                  "Measured on SmolLM2-135M in bench/RESULTS.md");
  flags.add_int("kv-select-tokens", &c.kv_select_tokens,
                "instead of --kv-select-ratio: the selection budget in tokens; 0 = off");
  flags.add_string("kv-select-bound", &c.kv_select_bound,
                   "page score: quest (exact upper bound of q·k from the page's K min/max) or mpcache "
                   "(Σ q·(α·max + (1−α)·min))");
  flags.add_float("kv-select-alpha", &c.kv_select_alpha, "α of --kv-select-bound mpcache, in [0, 1]");
  flags.add_int("kv-select-group", &c.kv_select_group,
                "pages per coarse group of the coarse-to-fine selection; 1 = pages only");
  flags.add_float("kv-select-coarse", &c.kv_select_coarse,
                  "fraction of coarse groups kept before pages are chosen among them, (0, 1]");
  flags.add_int("kv-select-dense", &c.kv_select_dense, "leading layers that attend to every page");
  flags.add_int("kv-select-share", &c.kv_select_share,
                "layers (after the dense ones) that share one selection, made in the first of them");
  flags.add_int("kv-select-min-tokens", &c.kv_select_min_tokens,
                "page selection's floor: the budget never falls below this many tokens (0 = no floor; the default "
                "kept the short-prompt passkeys that a 20 % budget loses, bench/RESULTS.md)");
  flags.add_int("kv-select-min-context", &c.kv_select_min_context,
                "page selection is off for contexts shorter than this many tokens (0 = always on)");
  flags.add_float("kv-keep-ratio", &c.kv_keep_ratio,
                  "MPCache static eviction in prefill: keep this fraction of the prompt's tokens — the sinks "
                  "(--hack-sinks), the newest --kv-keep-recent and those the last --kv-keep-window of the prompt's "
                  "queries attend to most — and drop the rest before quantizing and sending; 0 = off. Measured on "
                  "SmolLM2-135M in bench/RESULTS.md");
  flags.add_int("kv-keep-tokens", &c.kv_keep_tokens, "instead of --kv-keep-ratio: the tokens kept per prompt; 0 = off");
  flags.add_int("kv-keep-recent", &c.kv_keep_recent, "newest prompt tokens static eviction always keeps");
  flags.add_float("kv-keep-window", &c.kv_keep_window,
                  "fraction of the prompt (its end) whose queries' attention scores the tokens, (0, 1]");
  flags.add_string("kv-keep-scope", &c.kv_keep_scope,
                   "layer (each layer keeps the tokens its own attention favours) or model (one set from the sum "
                   "over layers, chosen once every layer is done)");
}

KvCacheOptions kv_options_from(const KvFlags& c, const std::string& model_dir, int num_layers) {
  KvCacheOptions o;
  o.mode = parse_kv_mode(c.kv);
  o.k_bits = c.hack_k_bits > 0 ? c.hack_k_bits : c.hack_bits;
  o.v_bits = c.hack_v_bits > 0 ? c.hack_v_bits : c.hack_bits;
  for (const int b : {o.k_bits, o.v_bits})
    HACK_CHECK(is_hack_bits(b), "--hack-bits / --hack-k-bits / --hack-v-bits must be 2, 4 or 8, got {}", b);
  o.block_tokens = c.hack_block;
  o.sinks = c.hack_sinks;
  HACK_CHECK(c.hack_recent >= -1, "--hack-recent must be -1 or a token count, got {}", c.hack_recent);
  o.recent_tokens = std::max(c.hack_recent, 0);
  HACK_CHECK(c.hack_k_group >= 16 && c.hack_k_group % 16 == 0 && c.hack_k_group <= 256,
             "--hack-k-group must be a multiple of 16 in [16, 256], got {}", c.hack_k_group);
  HACK_CHECK(c.hack_v_group >= 16 && c.hack_v_group % 16 == 0, "--hack-v-group must be a multiple of 16, got {}",
             c.hack_v_group);
  o.k_group = c.hack_k_group;
  o.v_group = c.hack_v_group;
  o.rounding = parse_rounding(c.hack_rounding);
  o.fp_dtype = parse_dtype(c.kv_dtype);
  HACK_CHECK(o.fp_dtype == DType::bf16 || o.fp_dtype == DType::f32, "--kv-dtype must be bf16 or f32, got {}",
             c.kv_dtype);
  o.select.ratio = c.kv_select_ratio;
  o.select.tokens = c.kv_select_tokens;
  o.select.score = parse_page_score(c.kv_select_bound);
  HACK_CHECK(o.select.score == PageScore::quest || o.select.score == PageScore::mpcache,
             "--kv-select-bound must be quest or mpcache, got '{}'", c.kv_select_bound);
  o.select.alpha = c.kv_select_alpha;
  o.select.group_pages = c.kv_select_group;
  o.select.coarse_ratio = c.kv_select_coarse;
  o.select.dense_layers = c.kv_select_dense;
  o.select.share_layers = c.kv_select_share;
  o.select.min_tokens = c.kv_select_min_tokens;
  o.select.min_context = c.kv_select_min_context;
  validate(o.select);
  HACK_CHECK(!o.select.enabled() || o.mode == KvMode::hack, "--kv-select-ratio / --kv-select-tokens need --kv hack");
  std::string file;
  if (c.hack_allocation == "auto") {
    const std::filesystem::path p = std::filesystem::path(model_dir) / kHackAllocationFile;
    if (!model_dir.empty() && std::filesystem::exists(p)) file = p.string();
  } else if (c.hack_allocation != "none" && !c.hack_allocation.empty()) {
    file = c.hack_allocation;
  }
  if (o.mode == KvMode::hack && !file.empty()) {
    HACK_CHECK(num_layers > 0, "--hack-allocation {}: the model's layer count is unknown here", file);
    apply_hack_allocation(o, load_hack_allocation(file), num_layers, c.hack_recent >= 0);
  }
  return o;
}

KeepOptions keep_options_from(const KvFlags& c) {
  KeepOptions k;
  k.ratio = c.kv_keep_ratio;
  k.tokens = c.kv_keep_tokens;
  k.recent = c.kv_keep_recent;
  k.window = c.kv_keep_window;
  k.sinks = c.hack_sinks;
  k.scope = parse_keep_scope(c.kv_keep_scope);
  validate(k);
  return k;
}

}  // namespace hack
