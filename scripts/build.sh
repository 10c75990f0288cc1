#!/usr/bin/env bash
# Configures and builds hackserve into ${BUILD_DIR:-build} (Release, Ninja, ccache).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
# Everything (tests, benchmarks, CUDA where nvcc is found), file by file, also in a tree the
# quickstart configured without them and as a unity build; later -D arguments override.
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} \
  -DHACK_BUILD_TESTS=ON -DHACK_BUILD_BENCH=ON -DHACK_CUDA=AUTO -DCMAKE_UNITY_BUILD=OFF "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"
