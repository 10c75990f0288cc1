#!/usr/bin/env bash
# Prefill pipelining, before and after: a 1P1D cluster (hack-router, hack-prefill, hack-decode on
# loopback, no vault, no prefix cache) per hack-prefill --max-draining-jobs value, each driven by
# bench/load/hack_load.py with two closed-loop workloads: many concurrent short prompts and a
# few concurrent 1K-token prompts, 4 output tokens each (the prefill node's work dominates).
# Prints req/s and TTFT mean/p99 per run (a markdown table) and leaves each run's results.json
# under $OUT.
#
#   bench/prefill_pipeline.sh                       MODEL=models/hack-tiny, values "0 4"
#   MODEL=../main/models/smollm2-135m-instruct VALUES="0 4" bench/prefill_pipeline.sh
#   PREFILL_BIN=/path/to/old/hack-prefill VALUES="main 0 4" ...   ("main": that binary, no flag)
#   FLAG=prefill-batch-jobs VALUES="1 8" WORKLOADS=short ...   (batched short-prompt prefill instead)
#
# Settings: MODEL, FLAG (the hack-prefill flag VALUES set: max-draining-jobs), VALUES, WORKLOADS ("short long"), BUILD_DIR (build), PORT (18000; prefill PORT+200, decode PORT+300),
# THREADS (1 per node), SHORT_LEN (64), SHORT_CONC (16), SHORT_N (64), LONG_LEN (1000: hack-tiny holds 1024 positions, output included),
# LONG_CONC (4), LONG_N (16), OUT (/tmp/prefill_pipeline).
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=${MODEL:-models/hack-tiny}
FLAG=${FLAG:-max-draining-jobs}
VALUES=${VALUES:-"0 4"}
WORKLOADS=${WORKLOADS:-"short long"}
BUILD_DIR=${BUILD_DIR:-build}
PORT=${PORT:-18000}
THREADS=${THREADS:-1}
SHORT_LEN=${SHORT_LEN:-64} SHORT_CONC=${SHORT_CONC:-16} SHORT_N=${SHORT_N:-64}
LONG_LEN=${LONG_LEN:-1000} LONG_CONC=${LONG_CONC:-4} LONG_N=${LONG_N:-16}
OUT=${OUT:-/tmp/prefill_pipeline}
BIN=$BUILD_DIR/bin
PREFILL_BIN=${PREFILL_BIN:-$BIN/hack-prefill}
export UCX_TLS=${UCX_TLS:-posix,sysv,cma,self,tcp}
mkdir -p "$OUT"
(umask 077 && head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$OUT/secret")

pids=()
run=0
stop() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap stop EXIT

wait_http() {
  local deadline=$((SECONDS + 120))
  until curl -fsS -o /dev/null "$1" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || { echo "prefill_pipeline: $1 did not come up" >&2; exit 1; }
    sleep 0.2
  done
}

node=(--model "$MODEL" --kv hack --threads "$THREADS" --secret-file "$OUT/secret")
echo "| model | prefill | workload | ok | req/s | TTFT mean ms | TTFT p99 ms |"
echo "|---|---|---|---|---|---|---|"
for v in $VALUES; do
  if [ "$v" = main ]; then
    prefill=("$PREFILL_BIN" "${node[@]}")
  else
    prefill=("$BIN/hack-prefill" "${node[@]}" "--$FLAG" "$v")
  fi
  "${prefill[@]}" --port $((PORT + 200)) --prefix-cache-bytes 0 >"$OUT/prefill-$v.out" 2>"$OUT/prefill-$v.log" &
  pids+=($!)
  "$BIN/hack-decode" "${node[@]}" --port $((PORT + 300)) >"$OUT/decode-$v.out" 2>"$OUT/decode-$v.log" &
  pids+=($!)
  wait_http "http://127.0.0.1:$((PORT + 200))/health"
  wait_http "http://127.0.0.1:$((PORT + 300))/health"
  "$BIN/hack-router" --model "$MODEL" --port "$PORT" --prefill 127.0.0.1:$((PORT + 200)) \
    --decode 127.0.0.1:$((PORT + 300)) --secret-file "$OUT/secret" >"$OUT/router-$v.out" 2>"$OUT/router-$v.log" &
  pids+=($!)
  wait_http "http://127.0.0.1:$PORT/health"
  for w in $WORKLOADS; do
    if [ $w = short ]; then len=$SHORT_LEN conc=$SHORT_CONC n=$SHORT_N; else len=$LONG_LEN conc=$LONG_CONC n=$LONG_N; fi
    dir="$OUT/$v-$w-$((++run))"
    python3 bench/load/hack_load.py --base-url "http://127.0.0.1:$PORT/v1" --concurrency-sweep "$conc" -n "$n" \
      --warmup "$conc" --input-len "$len" --output-len 4 --out-dir "$dir" --no-plots --label "$FLAG $v" \
      >"$dir.txt" 2>&1 || { echo "prefill_pipeline: hack_load failed ($dir.txt)" >&2; cat "$dir.txt" >&2; exit 1; }
    python3 - "$dir/results.json" "$MODEL" "$v" "$w $len tok x $conc" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))["points"][0]
print(f"| {sys.argv[2].rstrip('/').split('/')[-1]} | {sys.argv[3]} | {sys.argv[4]} | {p['completed']}/{p['num_prompts']} | "
      f"{p['request_throughput']:.2f} | {p['mean_ttft_ms']:.0f} | {p['p99_ttft_ms']:.0f} |")
EOF
  done
  stop
done
