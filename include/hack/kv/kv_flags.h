/// @file kv_flags.h
/// @brief The `--kv` / `--hack-*` flags, one definition for every program that builds a KV
/// cache (hack-run, hack-prefill, hack-decode, the benches), so the reference and the
/// cluster read the same options the same way.
#pragma once

#include <string>

#include "hack/core/flags.h"
#include "hack/kv/kv_options.h"
#include "hack/kv/static_eviction.h"

namespace hack {

/// Flag values as given; kv_options_from() validates and converts them.
struct KvFlags {
  std::string kv = "hack";          ///< fp | hack
  int hack_bits = 4;                ///< K and V code bits unless one is given below (a model without a calibrated
                                    ///< hack_kv.json gets K4/V4: measured safe on SmolLM2 and Qwen2.5-1.5B)
  int hack_k_bits = 0;              ///< 0 = hack_bits
  int hack_v_bits = 0;              ///< 0 = hack_bits
  int hack_block = 64;              ///< Π
  int hack_sinks = 4;
  int hack_recent = -1;             ///< bf16 recent window, tokens; -1 = the allocation's, else 0
  int hack_k_group = 64;            ///< Q / K partition channels
  int hack_v_group = 64;            ///< P / V partition channels
  std::string hack_rounding = "nearest";
  std::string kv_dtype = "bf16";    ///< element type of --kv fp pages
  std::string hack_allocation = "auto";  ///< auto (the model's hack_kv.json if present) | none | FILE
  // MPCache page selection in decode (backend/cpu_page_selector.h); off unless a budget is given.
  float kv_select_ratio = 0;        ///< budget as a fraction of the context, (0, 1]
  int kv_select_tokens = 0;         ///< budget in tokens
  std::string kv_select_bound = "quest";  ///< quest | mpcache
  float kv_select_alpha = 0.6f;
  int kv_select_group = 2;          ///< pages per coarse group (1 = one level)
  float kv_select_coarse = 0.5f;    ///< fraction of groups the coarse level keeps
  int kv_select_dense = 2;          ///< leading layers that attend to everything
  int kv_select_share = 2;          ///< layers sharing one selection
  /// Selection's floor (PageSelectOptions::min_tokens / min_context), measured on SmolLM2 and
  /// Qwen2.5-Coder-1.5B with the held-out passkey probe at 400–1K tokens (bench/RESULTS.md
  /// "Selection floor"): a 20 % budget of such a prompt is three pages and loses the key.
  int kv_select_min_tokens = 512;
  int kv_select_min_context = 1024;
  // MPCache static eviction in prefill (kv/static_eviction.h); off unless a budget is given.
  float kv_keep_ratio = 0;          ///< fraction of the prompt's tokens kept, (0, 1]
  int kv_keep_tokens = 0;           ///< budget in tokens
  int kv_keep_recent = 32;          ///< newest prompt tokens always kept
  float kv_keep_window = 0.2f;      ///< fraction of the prompt whose queries score
  std::string kv_keep_scope = "layer";  ///< layer | model
};

/// Registers the flags on `flags`; the values already in `config` are the defaults shown.
void add_kv_flags(FlagSet& flags, KvFlags& config);

/// KvCacheOptions for the flags (seed, capacity and ISA are left at their defaults). With
/// --kv hack and a bit allocation (--hack-allocation FILE, or `auto` and `model_dir`
/// holding hack_kv.json) the allocation's per-layer bits replace --hack-*-bits and its
/// recent window applies unless --hack-recent is given. Throws hack::Error naming the bad
/// flag or file.
KvCacheOptions kv_options_from(const KvFlags& config, const std::string& model_dir = "", int num_layers = 0);

/// The static eviction the flags ask for (the engine runs it, EngineOptions::keep); sinks
/// are --hack-sinks. Throws hack::Error naming the bad flag.
KeepOptions keep_options_from(const KvFlags& config);

}  // namespace hack
