/// @file kv_flags.h
/// @brief The `--kv` / `--hack-*` flags, one definition for every program that builds a KV
/// cache (hack-run, hack-prefill, hack-decode, the benches), so the reference and the
/// cluster read the same options the same way.
#pragma once

#include <string>

#include "hack/core/flags.h"
#include "hack/kv/paged_kv_cache.h"

namespace hack {

/// Flag values as given; kv_options_from() validates and converts them.
struct KvFlags {
  std::string kv = "hack";          ///< fp | hack
  int hack_bits = 2;                ///< K and V code bits unless one is given below
  int hack_k_bits = 0;              ///< 0 = hack_bits
  int hack_v_bits = 0;              ///< 0 = hack_bits
  int hack_block = 64;              ///< Π
  int hack_sinks = 4;
  int hack_recent = 0;              ///< bf16 recent window, tokens
  int hack_k_group = 64;            ///< Q / K partition channels
  int hack_v_group = 64;            ///< P / V partition channels
  std::string hack_rounding = "nearest";
  std::string kv_dtype = "bf16";    ///< element type of --kv fp pages
};

/// Registers the flags on `flags`; the values already in `config` are the defaults shown.
void add_kv_flags(FlagSet& flags, KvFlags& config);

/// KvCacheOptions for the flags (seed, capacity and ISA are left at their defaults).
/// Throws hack::Error naming the bad flag.
KvCacheOptions kv_options_from(const KvFlags& config);

}  // namespace hack
