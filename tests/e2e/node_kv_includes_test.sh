#!/usr/bin/env bash
# The nodes speak to the paged KV through kv/paged_kv.h only (DESIGN.md §2, "KV is three
# things"), so that they serve on either device: no object of the decode, prefill, vault,
# node, net or router libraries may include the CPU cache's header (backend/cpu_paged_kv_cache.h),
# directly or through another header. Read from ninja's record of every object's headers
# (the compiler's own -MD output), so the test sees what the compiler saw. The CPU backend
# must include it, so the probe cannot pass by looking for the wrong name.
#   node_kv_includes_test.sh BUILD_DIR
set -euo pipefail
build=$1
header=include/hack/backend/cpu_paged_kv_cache.h
deps() { ninja -C "$build" -t deps "$1"; }
control=src/CMakeFiles/hack_backend.dir/backend/cpu/cpu_backend.cpp.o
# Each listing is read whole into a variable before grep looks at it: `ninja -t deps | grep -q`
# under pipefail fails whenever grep stops at the first match and ninja dies of SIGPIPE.
cd_deps=$(deps "$control")
grep -qF "$header" <<<"$cd_deps" || { echo "probe broken: $control does not list $header"; exit 1; }
objs=$(ninja -C "$build" -t targets all | grep -oE '^src/CMakeFiles/hack_(decode|prefill|vault|node|net|router)\.dir/[^:]+\.o' | sort -u)
[ -n "$objs" ] || { echo "no objects of the node libraries found in $build"; exit 1; }
bad=0 n=0
for o in $objs; do
  d=$(deps "$o")
  grep -q "(VALID)" <<<"$d" || { echo "$o: ninja has no header record (not built?)"; bad=1; continue; }
  n=$((n + 1))
  if grep -qF "$header" <<<"$d"; then echo "$o includes $header"; bad=1; fi
done
[ "$bad" = 0 ] || exit 1
echo "$n node-library objects: none includes $header"
