#!/usr/bin/env bash
# Packs what bench/cuda/device_check.sh runs on a GPU machine that has CUDA but none of our
# Debian libraries: the gpu test binary, cuda_attention_bench and hack-run (stripped) and
# the shared libraries they need beyond CUDA's own, as .devcarry/bundle.tar.xz (ignored by
# git; the device tool carries it). Build first: cmake --build build --target gpu_test
# cuda_attention_bench cuda_decode_bench hack-run.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/../.." && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$root/.devcarry"
cp "$build/tests/gpu_test" "$build/bin/cuda_attention_bench" "$build/bin/cuda_decode_bench" "$build/bin/hack-run" "$stage/bin/"
strip "$stage"/bin/*
# Every library ldd resolves outside glibc and CUDA's cuBLAS (too large to carry; the GPU
# machine has its own), libcudart included so its version is the one we built against.
ldd "$stage"/bin/* | awk '/=> \// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|libcublas' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
tar -cJf "$root/.devcarry/bundle.tar.xz" -C "$stage" .
ls -la "$root/.devcarry/bundle.tar.xz"
