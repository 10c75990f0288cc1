#!/usr/bin/env bash
# Builds what the CPU image holds (the four daemons, hack-run, hack-tokenize, hack-probe) in
# BUILD_DIR with the CUDA backend off, for deploy/docker/stage-runtime.sh: a host build that
# found nvcc links cuBLAS and the CUDA runtime into the nodes, and the CPU image carries no
# CUDA library. No tests, no benchmarks; ccache (when installed) makes a rebuild cheap.
#   deploy/docker/build-cpu-binaries.sh BUILD_DIR      (binaries in BUILD_DIR/bin)
# Settings (environment): JOBS (nproc), BUILD_TYPE (Release).
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$1
start=$SECONDS
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" -DHACK_CUDA=OFF \
  -DHACK_BUILD_TESTS=OFF -DHACK_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}" \
  --target hack-router hack-prefill hack-decode hack-vault hack-run hack-tokenize hack-probe
echo "build-cpu-binaries: $build/bin in $((SECONDS - start)) s"
