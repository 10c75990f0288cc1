/// @file vault_flags.h
/// @brief The flags that point a node at hack-vault, shared by hack-prefill (restores and
/// stores prompt blocks) and hack-decode (stores a finished conversation's new blocks). Both
/// nodes must agree on namespace and codec for their blocks to be found by each other.
#pragma once

#include <string>

#include "hack/core/flags.h"

namespace hack::server {

struct VaultFlags {
  std::string address;               ///< hack-vault's UCX address host:port ("" = no vault)
  std::string name_space = "default";
  std::string codec = "int8-head";   ///< exact | int8-head
  int min_blocks = 2;                ///< prefill: fewer missing blocks than this skip the vault
  float timeout_s = 2;               ///< prefill: a whole restore from the vault; then recompute
};

/// --vault, --vault-namespace, --vault-codec; with `restores` also --vault-min-blocks and
/// --vault-timeout (only a node that restores blocks has a use for them).
void add_vault_flags(FlagSet& flags, VaultFlags& config, bool restores);

}  // namespace hack::server
