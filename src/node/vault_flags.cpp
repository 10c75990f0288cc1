#include "hack/node/vault_flags.h"

namespace hack::server {

void add_vault_flags(FlagSet& flags, VaultFlags& c, bool restores) {
  flags.add_string("vault", &c.address,
                   restores ? "hack-vault UCX address host:port: restore cached prefixes from it, store new blocks in it"
                            : "hack-vault UCX address host:port: store each finished conversation's new KV blocks in it "
                              "(the next turn restores them)");
  flags.add_string("vault-namespace", &c.name_space,
                   "prefix-cache namespace (tenants that must never share KV use different ones)");
  flags.add_string("vault-codec", &c.codec,
                   "block codec: int8-head (~0.53x the bytes of bf16) or exact (bit copies: restored == recomputed)");
  if (!restores) return;
  flags.add_int("vault-min-blocks", &c.min_blocks, "ask the vault only when at least this many blocks could come from it");
  flags.add_float("vault-timeout", &c.timeout_s, "seconds a whole restore from the vault may take before the node recomputes instead");
}

}  // namespace hack::server
