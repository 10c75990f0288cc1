#!/usr/bin/env bash
# The device-neutral KV headers (include/hack/kv/) include no kernels/ or backend/ header:
# the storages (backend/cpu_paged_kv_cache.h, backend/cuda_paged_kv_cache.h) and their
# kernels sit above kv, and a node that speaks to kv/paged_kv.h pulls in neither device's
# code. kv's headers include only core/ and kv/ headers, and core's include nothing above
# core, so checking the direct includes checks them all.
#   kv_headers_test.sh SOURCE_DIR
set -euo pipefail
src=$1
pattern='^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]hack/(kernels|backend)/'
# The probe must see such an include where one is (the CPU storage includes its kernels).
grep -qE "$pattern" "$src/include/hack/backend/cpu_paged_kv_cache.h" ||
  { echo "probe broken: no kernels/backend include found in backend/cpu_paged_kv_cache.h"; exit 1; }
headers=$(find "$src/include/hack/kv" -name '*.h' | sort)
[ -n "$headers" ] || { echo "no headers under $src/include/hack/kv"; exit 1; }
bad=0 n=0
for h in $headers; do
  n=$((n + 1))
  if grep -nE "$pattern" "$h"; then echo "^ ${h#$src/} includes a kernels/ or backend/ header"; bad=1; fi
done
[ "$bad" = 0 ] || exit 1
echo "$n kv headers: none includes a kernels/ or backend/ header"
