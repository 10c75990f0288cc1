#!/usr/bin/env bash
# Stages what a runtime image needs into OUT_DIR, laid out as the image's root: the daemons
# and tools in /usr/local/bin, every shared library they load (from ldd, at the path ldd
# resolved, with /lib folded into /usr/lib as on merged-/usr Debian 12) and UCX's transport
# modules, which UCX dlopens from <libucs dir>/ucx/ and ldd cannot see.
# glibc, libstdc++ and libgcc_s are left out: the debian:12 runtime base has them.
#   stage-runtime.sh BIN_DIR OUT_DIR          the CPU image: refuses binaries linked to CUDA
#   stage-runtime.sh --cuda BIN_DIR OUT_DIR   the CUDA image: CUDA libraries are not staged,
#                                             its nvidia/cuda runtime base has them
# The CPU image carries no CUDA library (cuBLASLt alone is ~520 MB): stage it from a build
# with -DHACK_CUDA=OFF (deploy/docker/build-cpu-binaries.sh makes one beside a CUDA build).
# Used by deploy/docker/Dockerfile and Dockerfile.cuda (build stage) and tests/e2e/podman_harness.py
# (host binaries).
set -euo pipefail
cuda=0
if [ "${1:-}" = --cuda ]; then cuda=1; shift; fi
if [ $# -ne 2 ]; then
  echo "usage: $0 [--cuda] BIN_DIR OUT_DIR" >&2
  exit 2
fi
bin_dir=$1
out=$2
binaries=(hack-router hack-prefill hack-decode hack-vault hack-run hack-tokenize hack-probe)
base_libs='/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so'
# The CUDA runtime, math libraries, driver and NCCL (libcudart, libcublas, libcublasLt, libcuda,
# libnvrtc, libnvJitLink, libnccl, ...).
cuda_libs='/lib(cu[a-zA-Z_]*|nv[a-zA-Z_-]*|nccl)\.so'
for b in "${binaries[@]}"; do
  [ -x "$bin_dir/$b" ] || { echo "stage-runtime: $bin_dir/$b not built" >&2; exit 1; }
  if [ "$cuda" = 0 ]; then
    linked=$(ldd "$bin_dir/$b" | awk '{ print "/" $1 }' | { grep -E "$cuda_libs" || true; } | cut -c2- | paste -sd ' ')
    if [ -n "$linked" ]; then
      echo "stage-runtime: $bin_dir/$b links CUDA libraries ($linked): it is a CUDA build, and" \
           "the CPU image carries no CUDA library. Stage binaries built with -DHACK_CUDA=OFF" \
           "(deploy/docker/build-cpu-binaries.sh BUILD_DIR), or pass --cuda for Dockerfile.cuda." >&2
      exit 1
    fi
  fi
done
mkdir -p "$out/usr/local/bin" "$out/usr/lib"
for b in "${binaries[@]}"; do
  install -m 0755 -s "$bin_dir/$b" "$out/usr/local/bin/$b" 2>/dev/null || install -m 0755 "$bin_dir/$b" "$out/usr/local/bin/$b"
done
for b in "${binaries[@]}"; do
  ldd "$bin_dir/$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
done | sort -u | grep -Ev "$base_libs" | { grep -Ev "$cuda_libs" || true; } | while read -r lib; do
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
      sort -u | grep -Ev "$base_libs" | { grep -Ev "$cuda_libs" || true; } | while read -r lib; do
        d=/usr${lib#/usr}
        [ -e "$out$d" ] && continue
        mkdir -p "$out$(dirname "$d")"
        cp -L "$lib" "$out$d"
      done
  fi
fi
du -sh "$out" | awk '{ print "stage-runtime: " $1 " staged in '"$out"'" }'
