#!/usr/bin/env bash
# Router overhead: what hack-router adds to short requests, and its max requests/s.
# Starts 1 hack-prefill + 1 hack-decode + hack-router on loopback (free ports, --port 0) with
# the bundled model, then runs build/bin/node_direct_bench: the same short requests
# (PROMPT_TOKENS random token ids, MAX_TOKENS output tokens, greedy, EOS ignored) straight to
# the node pair (DisaggregatedCall, the router's own node path) and through the router, at
# each concurrency level. Prints latency p50/p90/p99 and req/s of both, the router overhead
# (router − direct) and the max req/s through the router against the node path's (the bound).
# Daemons are stopped on exit, also on failure or Ctrl-C.
#
#   bench/router_overhead.sh [extra node_direct_bench flags, e.g. --json]
#
# Settings (environment): MODEL (models/hack-tiny), KV (hack | fp), THREADS (compute threads
# per node, 1), CONCURRENCY (1,2,4,8,16,32), REQUESTS (400 per level and mode), WARMUP (20),
# PROMPT_TOKENS (8), MAX_TOKENS (1), BUILD_DIR (build), UCX_TLS (tcp),
# ROUTER_HTTP_THREADS (router's HTTP threads, 4), KEEP_LOGS (1: keep the daemons' logs dir).
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=${MODEL:-models/hack-tiny}
KV=${KV:-hack}
THREADS=${THREADS:-1}
CONCURRENCY=${CONCURRENCY:-1,2,4,8,16,32}
REQUESTS=${REQUESTS:-400}
WARMUP=${WARMUP:-20}
PROMPT_TOKENS=${PROMPT_TOKENS:-8}
MAX_TOKENS=${MAX_TOKENS:-1}
BUILD_DIR=${BUILD_DIR:-build}
ROUTER_HTTP_THREADS=${ROUTER_HTTP_THREADS:-4}
BIN=$BUILD_DIR/bin
export UCX_TLS=${UCX_TLS:-tcp}

for b in hack-router hack-prefill hack-decode node_direct_bench; do
  [ -x "$BIN/$b" ] || { echo "router_overhead: $BIN/$b not built (cmake --build $BUILD_DIR --target $b)" >&2; exit 1; }
done

LOGS=$(mktemp -d /tmp/router_overhead.XXXXXX)
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "router_overhead: logs in $LOGS" >&2; else rm -rf "$LOGS"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME CMD... : starts a daemon, stdout/stderr to $LOGS/NAME.{out,log}
start() {
  local name=$1
  shift
  "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.log" &
  PIDS+=($!)
}
# ready NAME PATTERN : waits (120 s) for the ready line, prints it
ready() {
  local name=$1 pattern=$2 deadline=$((SECONDS + 120)) line
  while :; do
    line=$(grep -m1 "$pattern" "$LOGS/$name.out" 2>/dev/null || true)
    [ -n "$line" ] && { echo "$line"; return 0; }
    if [ $SECONDS -ge $deadline ] || ! kill -0 "${PIDS[-1]}" 2>/dev/null; then
      echo "router_overhead: $name did not become ready:" >&2
      tail -20 "$LOGS/$name.log" >&2
      return 1
    fi
    sleep 0.1
  done
}

SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
SECRET_FILE="$LOGS/secret"  # daemons take secrets from files, never argv
(umask 077 && echo "$SECRET" >"$SECRET_FILE")
NODE=(--model "$MODEL" --kv "$KV" --threads "$THREADS" --secret-file "$SECRET_FILE" --port 0 --log-level warn)
start decode "$BIN/hack-decode" "${NODE[@]}" --ucx-port 0
DEC_PORT=$(ready decode 'hack-decode ready' | awk '{print $4}')
start prefill "$BIN/hack-prefill" "${NODE[@]}"
PRE_PORT=$(ready prefill 'hack-prefill ready' | awk '{print $4}')
start router "$BIN/hack-router" --model "$MODEL" --port 0 --prefill "127.0.0.1:$PRE_PORT" \
  --decode "127.0.0.1:$DEC_PORT" --secret-file "$SECRET_FILE" --http-threads "$ROUTER_HTTP_THREADS" --log-level warn
RT_PORT=$(ready router 'hack-router ready' | awk '{print $4}')
# The router routes only after its first successful health poll of each node (/health: 200).
for _ in $(seq 100); do
  curl -fsS -o /dev/null "http://127.0.0.1:$RT_PORT/health" 2>/dev/null && break
  sleep 0.1
done

echo "router_overhead: kv $KV, model $MODEL, $THREADS compute thread(s) per node, $(nproc) cores;" \
  "prefill :$PRE_PORT, decode :$DEC_PORT, router :$RT_PORT (UCX_TLS=$UCX_TLS)"
"$BIN/node_direct_bench" --prefill "127.0.0.1:$PRE_PORT" --decode "127.0.0.1:$DEC_PORT" \
  --router "127.0.0.1:$RT_PORT" --secret-file "$SECRET_FILE" --concurrency "$CONCURRENCY" --requests "$REQUESTS" \
  --warmup "$WARMUP" --prompt-tokens "$PROMPT_TOKENS" --max-tokens "$MAX_TOKENS" "$@"
