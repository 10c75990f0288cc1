#!/usr/bin/env bash
# The quickstart's build (the CMake target `quickstart`, scripts/quickstart.sh) stays the
# daemons and hack-run: this lists every library and executable ninja would link to build it
# from scratch and compares that with the list below. A new library in the closure (a daemon
# or hack-run linking the umbrella `hack`, a test or benchmark made a dependency) fails here;
# when the growth is meant, add it to EXPECTED and say why in the commit.
#   tests/scripts/quickstart_targets_test.sh BUILD_DIR HACK_HAVE_CUDA
#   tests/scripts/quickstart_targets_test.sh --unity SOURCE_DIR BUILD_DIR HACK_HAVE_CUDA
# --unity first configures BUILD_DIR as scripts/quickstart.sh does (a unity build, no tests or
# benchmarks) and also checks the batches: the CPU kernels still compiled one file at a time
# (their own ISA flags), no test or benchmark source in a batch.
set -euo pipefail
unity=0
if [ "${1:-}" = --unity ]; then
  unity=1
  src=${2:?source dir}
  build=${3:?build dir}
  have_cuda=${4:-OFF}
  case "$have_cuda" in ON|on|1|TRUE|true) cuda_opt=ON ;; *) cuda_opt=OFF ;; esac
  mkdir -p "$build"
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHACK_BUILD_TESTS=OFF -DHACK_BUILD_BENCH=OFF \
    -DHACK_CUDA=$cuda_opt -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 >"$build/configure.log" 2>&1 \
    || { cat "$build/configure.log" >&2; exit 1; }
  grep -q -- '-DCMAKE_UNITY_BUILD=ON' "$src/scripts/quickstart.sh" \
    || { echo "quickstart_targets: scripts/quickstart.sh no longer configures a unity build; update this test" >&2; exit 1; }
else
  build=${1:?build dir}
  have_cuda=${2:-OFF}
fi

EXPECTED=(
  bin/hack-decode bin/hack-prefill bin/hack-router bin/hack-run bin/hack-vault
  src/libhack_backend.a src/libhack_core.a src/libhack_decode.a src/libhack_grammar.a src/libhack_http.a
  src/libhack_kernels.a src/libhack_kv.a src/libhack_model.a src/libhack_net.a src/libhack_node.a
  src/libhack_prefill.a src/libhack_router.a src/libhack_runtime.a src/libhack_tokenizer.a src/libhack_vault.a
)
case "$have_cuda" in ON|on|1|TRUE|true) EXPECTED+=(src/libhack_cuda.a) ;; esac

commands=$(ninja -C "$build" -t commands quickstart)
actual=$(grep -oE '(ar qc [^ ]+\.a|-o bin/[^ ]+)' <<<"$commands" | sed -E 's/^(ar qc|-o) //' | sort -u)
expected=$(printf '%s\n' "${EXPECTED[@]}" | sort -u)
status=0
if [ "$actual" != "$expected" ]; then
  echo "quickstart_targets: the quickstart builds other artefacts than expected" >&2
  diff <(echo "$expected") <(echo "$actual") | sed 's/^/  /' >&2 || true
  echo "  ('>' = built but not expected, '<' = expected but not built; see this script's header)" >&2
  status=1
fi
# No compile of a test or benchmark source, whatever it links into.
strays=$(grep -oE '(tests|bench)/CMakeFiles/[^ ]+\.o' <<<"$commands" | sort -u | head -5 || true)
if [ -n "$strays" ]; then
  echo "quickstart_targets: the quickstart compiles test or benchmark sources:" >&2
  echo "$strays" | sed 's/^/  /' >&2
  status=1
fi
if [ "$unity" = 1 ]; then
  kernels_dir=$src/kernels/cpu
  for k in "$kernels_dir"/*.cpp; do
    if ! grep -qE -- " -c [^ ]*kernels/cpu/$(basename "$k")( |$)" <<<"$commands"; then
      echo "quickstart_targets: kernels/cpu/$(basename "$k") is not compiled on its own in the unity build" >&2
      status=1
    fi
  done
  batched=$(find "$build" -path '*/Unity/*.cxx' -exec grep -lE '/(tests|bench)/' {} + 2>/dev/null | head -5 || true)
  if [ -n "$batched" ]; then
    echo "quickstart_targets: a unity batch includes test or benchmark sources: $batched" >&2
    status=1
  fi
fi
compiles=$(grep -cE ' -c [^ ]+\.(cpp|cxx|cu)' <<<"$commands" || true)
links=$(wc -l <<<"$actual")
echo "quickstart_targets: $links artefacts from $compiles compiled sources (CUDA $have_cuda$([ "$unity" = 1 ] && echo ', unity build'))"
exit $status
