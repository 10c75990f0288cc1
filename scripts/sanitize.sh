#!/usr/bin/env bash
# The sanitizer stage of CI (scripts/test.sh runs it after the main ctest; HACK_SANITIZE=0 skips
# it). Two clang builds of their own, both -O1 -g, no CUDA, no bench/ (HACK_SANITIZE, applied to
# every library, daemon and test through hack_flags):
#
#   build-asan  ASan + UBSan (-fno-sanitize-recover: UB aborts), LSan on at every exit:
#               every C++ unit test, and the e2e tests openai_api, vault and migration (router,
#               prefill, decode, vault daemons and a killed/stopped decode node), whose daemons
#               run from build-asan/bin
#               (ASAN_OPTIONS/UBSAN_OPTIONS/LSAN_OPTIONS reach them through tests/e2e/cluster.py's
#               inherited environment).
#   build-tsan  TSan: the tests that run our threads against each other — thread pool, decode
#               scheduler, UCX worker + KV transfer, vault client/server, HTTP server/client,
#               router server, prefill worker, in-process disaggregation (prefill + decode nodes
#               over UCX), and router + cluster e2e (migration).
#
# A finding must fail the stage wherever it happens, also in a daemon an e2e test started and
# stopped (whose exit status no test reads, or that a chaos test killed): every sanitized
# process writes its report to $REPORT_DIR/<exe>.<pid> (log_path, log_exe_name), and after each
# ctest run a report file there fails the stage and is printed. A test binary that hits one
# also fails its ctest test (halt_on_error / abort).
#
# Suppressions: tests/sanitizers/lsan.supp and tsan.supp, third-party code only, each with its
# reason (UBSan has none); reports in our own code are fixed, never suppressed.
#
# Not run under a sanitizer, and why:
#   unit_gguf_to_hf, unit_deploy_config  Python only (no C++ of ours runs, or only --help).
#   e2e_compose, e2e_two_networks        containers from the CPU image's binaries; not a sanitizer
#   e2e_cpu_image_binaries               build (the last builds those binaries for the other two).
#   e2e_fidelity_smoke                   needs bench/ (HACK_BUILD_BENCH=OFF here).
#   e2e_chaos, e2e_load_harness          timed load runs (stall timeouts of 2 s, fixed request
#                                        rates) sized for Release daemons; the Release suite runs them.
#   e2e_tools_api, e2e_structured_output, e2e_local_cluster
#                                        SmolLM2-135M forward passes, the slowest tests of the
#                                        Release suite already (16-22 s), for no thread or memory
#                                        path hack-tiny does not take.
#   e2e_disaggregation_test under ASan   runs under TSan (its daemons too); under ASan its three
#                                        greedy-vs-hack-run cases took 60-70 s each and found
#                                        nothing the unit suite and the Python e2e tests miss.
#   unit areas outside TSan's list       single-threaded code (kernels, tokenizer, grammar, ...):
#                                        nothing for TSan to find; ASan runs them all.
#
# Measured on dev-2c (2 vCPUs shared with other engineers' builds, load average 4-9; `nice -n 10`,
# JOBS=2), 2026-11-26 — details in bench/RESULTS.md "Sanitizers":
#   cold build dirs + cold ccache (CCACHE_DIR=$(mktemp -d)), builds only:
#     build-asan  1244 CPU-s, 2267 s wall    build-tsan  519 CPU-s, 470 s wall
#   clean build dirs, warm ccache, the whole script: 792 s wall —
#     asan build 98 s, unit tests 394 s (384 tests), e2e 63 s (3);
#     tsan build 15 s, tests 222 s (175: unit areas + disaggregation + migration)
#   so from cold: ~57 min wall on this loaded box; on an idle 2-core runner the builds'
#   CPU (~1760 s / 2 cores ≈ 15 min) plus the tests (9-11 min) ≈ 24-26 min, over the ~20 min
#   budget — -gline-tables-only instead of -g is the next cut to measure.
#
#   JOBS        parallel build jobs and ctest jobs (default nproc)
#   SAN_ASAN=0 / SAN_TSAN=0  skip one of the two builds
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
ROOT=$(pwd)
REPORT_DIR=${REPORT_DIR:-$ROOT/build-san-reports}
rm -rf "$REPORT_DIR"
mkdir -p "$REPORT_DIR"

configure() {  # configure <dir> <sanitizers>
  CC=clang CXX=clang++ cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" -DHACK_SANITIZE="$2" \
    -DHACK_CUDA=OFF -DHACK_BUILD_BENCH=OFF -DHACK_BUILD_TESTS=ON > /dev/null
}

# A stage fails when its ctest fails or any sanitized process of the run wrote a report (printed);
# the other stages still run, so one CI run shows every finding.
failed=()
run_ctest() {  # run_ctest <build dir> <stage> ctest-args...
  local dir=$1 stage=$2 status=0 reports
  shift 2
  # --timeout: no test here takes over 2 minutes; TSan's runtime can deadlock while reporting
  # a race from several threads at once (clang 14), and such a hang should fail in minutes.
  (cd "$dir" && ctest --output-on-failure -j "$JOBS" --timeout 300 "$@") || status=$?
  reports=$(find "$REPORT_DIR" -type f ! -name "*.seen" | sort)
  if [ -n "$reports" ]; then
    for f in $reports; do echo "==== $f"; head -n 100 "$f"; mv "$f" "$f.$stage.seen"; done
    echo "sanitize: $stage: $(echo "$reports" | wc -l) sanitizer report(s) (above)"
    failed+=("$stage")
  elif [ "$status" -ne 0 ]; then
    echo "sanitize: $stage: ctest failed"
    failed+=("$stage")
  fi
}

stamp() { echo "sanitize: $(date -u +%H:%M:%S) $*"; }

# Daemons and tools the e2e tests start from <build>/bin.
DAEMONS=(hack-router hack-prefill hack-decode hack-vault hack-run hack-tokenize)

if [ "${SAN_ASAN:-1}" != 0 ]; then
  stamp "asan: configure + build"
  configure build-asan "address,undefined"
  units=$(cd build-asan && ninja -t targets all | sed -n 's/^\(unit_[a-z]*\): phony$/\1/p' | sort -u)
  # shellcheck disable=SC2086
  cmake --build build-asan -j "$JOBS" --target $units "${DAEMONS[@]}"
  stamp "asan: tests"
  # detect_leaks: LSan at every exit; halt_on_error + abort_on_error: the first report ends the
  # process with SIGABRT (a daemon's failure is not mistaken for a clean exit status).
  export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1:log_path=$REPORT_DIR/asan:log_exe_name=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$REPORT_DIR/asan:log_exe_name=1"
  export LSAN_OPTIONS="suppressions=$ROOT/tests/sanitizers/lsan.supp:print_suppressions=0"
  run_ctest build-asan asan -L unit -E '^unit_(gguf_to_hf|deploy_config)$'
  run_ctest build-asan asan-e2e -R '^(e2e_openai_api|e2e_vault|e2e_migration)$'
  unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
fi

if [ "${SAN_TSAN:-1}" != 0 ]; then
  stamp "tsan: configure + build"
  configure build-tsan thread
  cmake --build build-tsan -j "$JOBS" --target unit_core unit_decode unit_net unit_vault unit_http unit_router \
    unit_prefill e2e_disaggregation_test hack-router hack-prefill hack-decode hack-vault
  stamp "tsan: tests"
  # halt_on_error + abort_on_error as above; second_deadlock_stack for lock-order reports.
  export TSAN_OPTIONS="halt_on_error=1:abort_on_error=1:second_deadlock_stack=1:log_path=$REPORT_DIR/tsan:log_exe_name=1:suppressions=$ROOT/tests/sanitizers/tsan.supp"
  run_ctest build-tsan tsan -R '^(unit_(core|decode|net|vault|http|router|prefill):.*|e2e_disaggregation_test:.*|e2e_migration)$'
  unset TSAN_OPTIONS
fi
# A CI log may be read from its tail only: each report's gist again, last — its headline
# lines (what raced or overflowed, where the memory came from, which threads), each stack's
# first frame and its first three frames in our own code, build ids and offsets cut.
digest() {  # digest <report file>
  echo "==== digest of $1"
  awk '
    /^(WARNING|ERROR|SUMMARY)|^ *(Read|Write|Previous|Atomic|Location|Mutex|Thread T|READ|WRITE|freed|previously|allocated)/ {
      print; ours = 0; next }
    /^ +#0 / { print; next }
    /^ +#[0-9]+ .*\/(src|daemons|tests|kernels|include\/hack)\// { if (ours++ < 3) print }
  ' "$1" | sed -E 's/ \(BuildId: [0-9a-f]+\)//; s/ \([^ ()]+\+0x[0-9a-f]+\)//' | cut -c1-220 | head -n 40
}

if [ ${#failed[@]} -ne 0 ]; then
  for f in $(find "$REPORT_DIR" -type f -name "*.seen" | sort); do digest "$f"; done
  stamp "failed: ${failed[*]} (reports kept in $REPORT_DIR)"
  exit 1
fi
stamp "all sanitizer runs clean"
