#!/usr/bin/env bash
# Configures and builds hackserve into ${BUILD_DIR:-build} (Release, Ninja, ccache).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"
