#!/usr/bin/env bash
# The whole test suite: install dependencies, build, run every ctest test.
# gpu-labelled tests report "Skipped" (exit 77) where no CUDA device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 1500 "$@"
