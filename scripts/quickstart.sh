#!/usr/bin/env bash
# The README's first command, meant to take minutes on a fresh machine: install only what the
# server needs (scripts/install-deps.sh --runtime: compilers, libraries, numpy + gguf, and
# SmolLM2-135M-Instruct fetched and converted by scripts/fetch-models.sh), build only the
# daemons and hack-run (the CMake target `quickstart`: no tests, no benchmarks; CUDA objects
# only when a GPU is present or HACK_CUDA=1), start a local cluster (router + prefill + decode
# + vault on loopback, KV streamed as HACK pages over UCX), answer a real question through the
# OpenAI-compatible API, and stop the cluster. Each step says what it does and how long it took.
# MODEL=DIR serves another model directory; BUILD_DIR (build), JOBS (all cores), UNITY_BATCH (16).
# scripts/test.sh installs and builds everything else.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
STEP_T0=$SECONDS
step() {  # n, what
  if [ "$1" -gt 1 ]; then echo "== done in $((SECONDS - STEP_T0)) s"; fi
  STEP_T0=$SECONDS
  echo "== quickstart $1/4 ($((SECONDS - T0)) s): $2"
}

step 1 "install the build and runtime packages, fetch SmolLM2-135M-Instruct (scripts/install-deps.sh --runtime)"
scripts/install-deps.sh --runtime

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
CUDA=OFF
if [ "${HACK_CUDA:-}" = 1 ]; then
  CUDA=ON
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  CUDA=AUTO  # a GPU: the CUDA backend when the toolkit is there
fi
step 2 "configure $BUILD_DIR (daemons and hack-run only; CUDA $CUDA)"
mkdir -p "$BUILD_DIR"
# A unity build (CMake batches up to UNITY_BATCH, default 16, of a library's sources into one
# translation unit, so the shared headers are parsed once per batch): about a third less CPU
# than file by file (bench/RESULTS.md "Quickstart"). Only here; scripts/build.sh turns it off.
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} \
  -DHACK_BUILD_TESTS=OFF -DHACK_BUILD_BENCH=OFF -DHACK_CUDA="$CUDA" \
  -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE="${UNITY_BATCH:-16}" >"$BUILD_DIR/quickstart-configure.log" 2>&1 \
  || { cat "$BUILD_DIR/quickstart-configure.log" >&2; exit 1; }
grep -E '^-- hackserve' "$BUILD_DIR/quickstart-configure.log" || true

step 3 "build hack-router, hack-prefill, hack-decode, hack-vault, hack-run ($JOBS jobs; ninja counts [done/total])"
cmake --build "$BUILD_DIR" --target quickstart -j "$JOBS"

export STATE_DIR=${STATE_DIR:-.cluster}
export MODEL=${MODEL:-models/smollm2-135m-instruct}
export BUILD_DIR
SERVED_NAME=$(basename "$MODEL")  # the router's default --served-model-name
step 4 "start a local cluster on $MODEL and ask it a question"
scripts/local-cluster.sh start
trap 'scripts/local-cluster.sh stop' EXIT
PORT=${PORT:-8000}
MESSAGE=${MESSAGE:-"What is the capital of France?"}
BODY=$(python3 -c 'import json, sys; print(json.dumps({"model": sys.argv[2], "max_tokens": 48, "temperature": 0,
  "messages": [{"role": "user", "content": sys.argv[1]}]}))' "$MESSAGE" "$SERVED_NAME")
echo "== POST /v1/chat/completions: $MESSAGE"
curl -fsS "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d "$BODY" |
  python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["choices"][0]["message"]["content"]); print("usage:", r["usage"])'
echo "== done in $((SECONDS - STEP_T0)) s"
echo "== quickstart: answered in $((SECONDS - T0)) s"
