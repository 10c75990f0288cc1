#!/usr/bin/env bash
# Stages what the runtime image needs into OUT_DIR, laid out as the image's root: the
# daemons and tools in /usr/local/bin, every shared library they load (from ldd, at the
# path ldd resolved, with /lib folded into /usr/lib as on merged-/usr Debian 12) and UCX's
# transport modules, which UCX dlopens from <libucs dir>/ucx/ and ldd cannot see.
# glibc, libstdc++ and libgcc_s are left out: the debian:12 runtime base has them.
#   stage-runtime.sh BIN_DIR OUT_DIR
# Used by deploy/docker/Dockerfile (build stage) and tests/e2e/compose_test.py (host binaries).
set -euo pipefail
bin_dir=$1
out=$2
binaries=(hack-router hack-prefill hack-decode hack-vault hack-run hack-tokenize hack-probe)
mkdir -p "$out/usr/local/bin" "$out/usr/lib"
for b in "${binaries[@]}"; do
  [ -x "$bin_dir/$b" ] || { echo "stage-runtime: $bin_dir/$b not built" >&2; exit 1; }
  install -m 0755 -s "$bin_dir/$b" "$out/usr/local/bin/$b" 2>/dev/null || install -m 0755 "$bin_dir/$b" "$out/usr/local/bin/$b"
done
base_libs='/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so'
for b in "${binaries[@]}"; do
  ldd "$bin_dir/$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
done | sort -u | grep -Ev "$base_libs" | while read -r lib; do
  dest=${lib#/usr}
  dest=/usr$dest
  mkdir -p "$out$(dirname "$dest")"
  cp -L "$lib" "$out$dest"
done
if ldd "$bin_dir/hack-decode" | grep -q libucs; then
  ucs=$(ldd "$bin_dir/hack-decode" | awk '/libucs\.so/ { print $3 }')
  modules=$(dirname "$(readlink -f "$ucs")")/ucx
  if [ -d "$modules" ]; then
    dest=/usr${modules#/usr}
    mkdir -p "$out$dest"
    find "$modules" -maxdepth 1 -name "*.so*" -exec cp -a {} "$out$dest/" \;
    # The modules' own dependencies (libibverbs and such for the RDMA ones) that the
    # binaries do not load directly.
    for m in "$modules"/*.so*; do ldd "$m" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'; done |
      sort -u | grep -Ev "$base_libs" | while read -r lib; do
        d=/usr${lib#/usr}
        [ -e "$out$d" ] && continue
        mkdir -p "$out$(dirname "$d")"
        cp -L "$lib" "$out$d"
      done
  fi
fi
du -sh "$out" | awk '{ print "stage-runtime: " $1 " staged in '"$out"'" }'
