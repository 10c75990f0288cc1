#!/usr/bin/env bash
# The CPU rehearsal of a device call (issue 49 item 8): everything bench/cuda/device_check.sh
# needs that is not GPU work, checked here so a lent GPU's minutes go to GPU work.
#   1. builds the bundle's targets and packs .devcarry/bundle.tar.xz (pack_device.sh);
#   2. measures what the device tool would carry — the files git tracks or would add, less the
#      tokenizer fixtures that device_check.sh's header says to untrack for the call, plus the
#      bundle — against the tool's 64 MiB;
#   3. runs device_check.sh itself with the step that needs no GPU to get through (`tests`:
#      gpu_test exits 77, Skipped, where no device is present), from the unpacked bundle, and
#      checks its summary names the step with an rc;
#   4. runs the cluster check on `cpu` with the bundle's binaries and libraries (the same
#      script the `cluster` step runs on `cuda`), so a missing library or a broken daemon
#      shows here.
# Exit 0 when all four hold.
#   bench/cuda/rehearse.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
limit=$((64 * 1024 * 1024))
fail=0

echo "== 1. bundle"
cmake --build "$build" --target gpu_test cuda_attention_bench cuda_decode_bench hack-run hack-prefill hack-decode \
  hack-router > /dev/null
bash bench/cuda/pack_device.sh "$build"
bundle=$(stat -c %s .devcarry/bundle.tar.xz)

echo "== 2. carried tree"
tree=$(git ls-files -co --exclude-standard -z | grep -zvE '^tests/fixtures/(shared|tokenizers)/' |
       xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
total=$((tree + bundle))
awk -v t="$tree" -v b="$bundle" -v l="$limit" \
  'BEGIN {printf "tree %.1f MiB + bundle %.1f MiB = %.1f MiB of %.0f MiB\n", t / 2^20, b / 2^20, (t + b) / 2^20, l / 2^20}'
[ "$total" -lt "$limit" ] || { echo "over the device tool's 64 MiB"; fail=1; }

echo "== 3. device_check.sh, step tests"
out=$(mktemp -d)
OUT="$out" bash bench/cuda/device_check.sh tests > "$out/device_check.out" 2>&1 || true
tail -n 3 "$out/device_check.out"
if grep -qE '^gpu_test rc=[0-9]+ [0-9]+s$' "$out/summary.log"; then
  rc=$(sed -nE 's/^gpu_test rc=([0-9]+).*/\1/p' "$out/summary.log")
  # No device here: 77 (Skipped). 0 would mean a device was found; anything else is a failure.
  [ "$rc" = 77 ] || [ "$rc" = 0 ] || { echo "gpu_test rc=$rc"; fail=1; }
else
  echo "summary.log does not name the step with its rc"; fail=1
fi

echo "== 4. cluster check on cpu with the bundle's binaries"
if OUT="$out/cluster" LD_LIBRARY_PATH=/tmp/hb/lib UCX_MODULE_DIR=/tmp/hb/lib/ucx \
   bash bench/cuda/cluster_check.sh cpu /tmp/hb/bin models/hack-tiny > "$out/cluster.out" 2>&1; then
  tail -n 3 "$out/cluster.out"
else
  tail -n 20 "$out/cluster.out"; echo "cluster check failed (logs in $out/cluster)"; fail=1
fi
[ "$fail" = 0 ] && echo "rehearsal passed" || echo "rehearsal FAILED"
exit "$fail"
