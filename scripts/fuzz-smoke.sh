#!/usr/bin/env bash
# Builds every libFuzzer target (clang, ASan + UBSan, own build dir) and runs each briefly
# from its seeds, so the targets keep building and a regression that crashes on the seeds
# fails CI. Long fuzzing runs are done by hand (see tests/fuzz/CMakeLists.txt).
#   FUZZ_SECONDS   seconds per target (default 30)
#   FUZZ_BUILD_DIR build directory (default build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
CC=clang CXX=clang++ cmake -S . -B "$FUZZ_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DHACK_FUZZ=ON -DHACK_CUDA=OFF -DHACK_BUILD_BENCH=OFF -DHACK_BUILD_TESTS=ON > /dev/null
targets=()
for src in tests/fuzz/fuzz_*.cpp; do targets+=("$(basename "${src%.cpp}")"); done
cmake --build "$FUZZ_BUILD_DIR" -j "${JOBS:-$(nproc)}" --target "${targets[@]}"

seeds_fuzz_chat_template=(tests/fixtures/chat/templates)
dict_fuzz_chat_template=tests/fixtures/chat/jinja.dict
seeds_fuzz_node_protocol=(tests/fixtures/fuzz/node_protocol)
seeds_fuzz_wire=(tests/fixtures/fuzz/wire)
seeds_fuzz_gguf=(tests/fixtures/gguf tests/fixtures/fuzz/gguf)
# Undefined behaviour (a cast out of range, a misaligned load) fails the run like a crash.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
for t in "${targets[@]}"; do
  corpus=$(mktemp -d)
  seeds_var="seeds_${t}[@]"
  dict_var="dict_${t}"
  args=(-max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1)
  if [ -n "${!dict_var:-}" ]; then args+=(-dict="${!dict_var}"); fi
  echo "fuzz-smoke: $t for ${FUZZ_SECONDS}s"
  status=0
  "$FUZZ_BUILD_DIR/tests/fuzz/$t" "${args[@]}" "$corpus" ${!seeds_var:-} > "$corpus.log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$corpus.log"
    echo "fuzz-smoke: $t failed (exit $status)"
    exit 1
  fi
  grep -E "^stat::number_of_executed_units" "$corpus.log" || true
  rm -rf "$corpus" "$corpus.log"
done
echo "fuzz-smoke: all targets built and ran clean"
