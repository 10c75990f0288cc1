#!/usr/bin/env bash
# The whole test suite: install dependencies, build, run every ctest test.
# Then the fuzz targets build and run briefly (scripts/fuzz-smoke.sh).
# gpu-labelled tests report "Skipped" (exit 77) where no CUDA device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 1500 "$@")
# Unit and e2e tests under ASan + UBSan, the threaded ones under TSan (HACK_SANITIZE=0 skips).
if [ "${HACK_SANITIZE:-1}" != 0 ]; then scripts/sanitize.sh; fi
# libFuzzer targets: built with clang + sanitizers and run briefly (HACK_FUZZ_SMOKE=0 skips).
if [ "${HACK_FUZZ_SMOKE:-1}" != 0 ]; then scripts/fuzz-smoke.sh; fi
