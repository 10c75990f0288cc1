#!/usr/bin/env bash
# Packs what bench/cuda/device_check.sh runs on a GPU machine that has CUDA but none of our
# Debian libraries: the gpu test binary, cuda_attention_bench, hack-run and the three daemons
# of the cluster step (stripped), the shared libraries they need beyond CUDA's own and UCX's
# transport modules, as .devcarry/bundle.tar.xz (ignored by git; the device tool carries it).
# Build first: cmake --build build --target gpu_test cuda_attention_bench cuda_decode_bench
# hack-run hack-prefill hack-decode hack-router.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/../.." && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$root/.devcarry"
cp "$build/tests/gpu_test" "$build/bin/cuda_attention_bench" "$build/bin/cuda_decode_bench" "$build/bin/hack-run" \
  "$build/bin/hack-prefill" "$build/bin/hack-decode" "$build/bin/hack-router" "$stage/bin/"
strip "$stage"/bin/*
# UCX loads its transports (cma, ib, rdmacm) at run time from its module directory: the
# daemons' step points UCX_MODULE_DIR at this copy (tcp, shared memory and self are in libuct).
ucx_modules=$(dirname "$(ldd "$build/bin/hack-decode" | awk '/libucp/ {print $3}')")/ucx
if [ -d "$ucx_modules" ]; then mkdir -p "$stage/lib/ucx" && cp -L "$ucx_modules"/*.so.0 "$stage/lib/ucx/"; fi
# Every library ldd resolves outside glibc and CUDA's cuBLAS (too large to carry; the GPU
# machine has its own), libcudart included so its version is the one we built against.
ldd "$stage"/bin/* | awk '/=> \// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|libcublas' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
# xz -9e: its 64 MiB dictionary spans the binaries, which share most of their code (the same
# static libraries): 12.8 MB instead of 20.6 MB at the default -6 (2026-12-07), which keeps
# tree + bundle under the device tool's 64 MiB (bench/cuda/rehearse.sh checks it). ~1 min.
XZ_OPT=-9e tar -cJf "$root/.devcarry/bundle.tar.xz" -C "$stage" .
ls -la "$root/.devcarry/bundle.tar.xz"
