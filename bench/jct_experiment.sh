#!/usr/bin/env bash
# JCT experiment (the disaggregation issue): TTFT and job completion time of the same workload
# with --kv fp (bf16 KV on the wire) and --kv hack (2-bit HACK pages) when the KV crosses a
# rate-limited link.
#
# Two network namespaces joined by a veth pair, with a tc token-bucket rate limit (tbf) on
# both ends; for each link rate and each KV mode:
#   prefill namespace  hack-prefill (HTTP on 127.0.0.1, UCX out through the veth),
#                      hack-router, and the load client (bench/hack_bench.py)
#   decode namespace   hack-decode (HTTP and UCX listener on its veth address)
# UCX runs over tcp on the veth only (UCX_TLS=tcp, UCX_NET_DEVICES=<that side's veth>). The
# router reaches decode's HTTP (the token stream) over the same link.
# The workload (hack_bench): REQUESTS requests at CONCURRENCY, random token-id prompts of
# PROMPT_TOKENS tokens (distinct, no shared prefix), MAX_TOKENS output tokens, greedy,
# EOS ignored. KV bytes per request come from kv_bytes_transferred in both nodes' /health
# (delta over the run / completed requests).
#
# Prints, per (rate, kv): link rate measured with a TCP transfer through the qdisc, TTFT and
# JCT p50/p99, req/s, KV MB per request, and the bound "link ms/req" = KV bytes per request
# × 8 / rate (the time one request's KV occupies the link); then fp vs hack per rate.
# Namespaces, veths and daemons are removed on exit, also on failure or Ctrl-C.
#
# Why low rates too: hack-tiny's KV is small (6 layers × 2 KV heads × 64 dims: 3 KB/token
# in bf16, ~0.5 KB/token in HACK 2-bit: 6.15 MB vs 1.07 MB for a 2000-token prompt). At
# 1–10 Gbit/s that is 1–50 ms of link time per request against ~0.4–0.8 s of CPU prefill
# per request (one thread), streamed layer by layer, so fp and hack should tie there (any
# gap is CPU cost, not the link). The link becomes the bottleneck once its rate drops below
# KV bytes/token × prefill tokens/s: ≈ 3 KB × 2.5–5K tok/s ≈ 60–120 Mbit/s for fp and
# ≈ 10–20 Mbit/s for hack on this class of CPU. 200 Mbit/s is the edge (fp's ~250 ms per
# request is still mostly hidden); at 50 Mbit/s fp is link-bound (~1 s of link per request)
# and at 20 Mbit/s strongly so (~2.5 s), while hack stays (nearly) compute-bound. The same
# regime holds for the paper's setting at far higher rates: a GPU prefill is ~100× faster
# and an 8B model's KV is 128 KB/token in bf16, so 10–100 Gbit/s links are the tight ones.
#
#   sudo bench/jct_experiment.sh [--json PATH]
#
# Settings (environment): RATES ("10gbit 2500mbit 1gbit 200mbit 50mbit 20mbit"; tc units), KVS
# ("fp hack"), REQUESTS (32), CONCURRENCY (8), PROMPT_TOKENS (2000), MAX_TOKENS (16),
# WARMUP (2), MAX_MODEL_LEN (4096), MODEL (models/hack-tiny), THREADS (1 per node),
# KV_DTYPE (bf16), DELAY (one-way netem delay added on each end, e.g. 1ms; default none),
# LINK_CHECK (1: measure each rate with a TCP transfer), SUBNET (10.231.7), BUILD_DIR (build),
# KEEP_LOGS (1: keep the logs dir), PYTHON (python3), PREFILL_BIN (another hack-prefill, e.g. an
# older build), PREFILL_FLAGS (appended to hack-prefill's command line, e.g. --max-draining-jobs 0).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

RATES=${RATES:-10gbit 2500mbit 1gbit 200mbit 50mbit 20mbit}
KVS=${KVS:-fp hack}
REQUESTS=${REQUESTS:-32}
CONCURRENCY=${CONCURRENCY:-8}
PROMPT_TOKENS=${PROMPT_TOKENS:-2000}
MAX_TOKENS=${MAX_TOKENS:-16}
WARMUP=${WARMUP:-2}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-4096}
MODEL=${MODEL:-models/hack-tiny}
THREADS=${THREADS:-1}
KV_DTYPE=${KV_DTYPE:-bf16}
DELAY=${DELAY:-}
LINK_CHECK=${LINK_CHECK:-1}
SUBNET=${SUBNET:-10.231.7}
BUILD_DIR=${BUILD_DIR:-build}
PYTHON=${PYTHON:-python3}
BIN=$ROOT/$BUILD_DIR/bin
JSON_OUT=""
if [ "${1:-}" = "--json" ]; then JSON_OUT=$2; fi

[ "$(id -u)" = 0 ] || { echo "jct_experiment: needs root (ip netns, tc)" >&2; exit 1; }
for b in hack-router hack-prefill hack-decode; do
  [ -x "$BIN/$b" ] || { echo "jct_experiment: $BIN/$b not built (cmake --build $BUILD_DIR --target $b)" >&2; exit 1; }
done

TAG=$$
NS_P=hackjct-p-$TAG
NS_D=hackjct-d-$TAG
VETH_P=hjp$TAG   # <= 15 characters
VETH_D=hjd$TAG
IP_P=$SUBNET.1
IP_D=$SUBNET.2
LOGS=$(mktemp -d /tmp/jct_experiment.XXXXXX)
PIDS=()

stop_daemons() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
}
cleanup() {
  set +e
  stop_daemons
  ip netns del "$NS_P" 2>/dev/null
  ip netns del "$NS_D" 2>/dev/null
  ip link del "$VETH_P" 2>/dev/null
  if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "jct_experiment: logs in $LOGS" >&2; else rm -rf "$LOGS"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

in_p() { ip netns exec "$NS_P" "$@"; }
in_d() { ip netns exec "$NS_D" "$@"; }

# --- topology ------------------------------------------------------------------------------
ip netns add "$NS_P"
ip netns add "$NS_D"
ip link add "$VETH_P" type veth peer name "$VETH_D"
ip link set "$VETH_P" netns "$NS_P"
ip link set "$VETH_D" netns "$NS_D"
in_p ip addr add "$IP_P/24" dev "$VETH_P"
in_d ip addr add "$IP_D/24" dev "$VETH_D"
for ns in "$NS_P" "$NS_D"; do ip netns exec "$ns" ip link set lo up; done
in_p ip link set "$VETH_P" up
in_d ip link set "$VETH_D" up

# set_rate RATE: tbf on both ends (netem delay under it when DELAY is set). burst: 4 ms of
# traffic, at least 64 KiB (GSO segments on veth reach 64 KiB); queue limit: 100 ms.
set_rate() {
  local rate=$1 bps burst
  bps=$($PYTHON -c "
import re,sys
m=re.fullmatch(r'([0-9.]+)([kmg]?)(bit|bps)','$rate'.lower())
if not m: sys.exit('bad rate $rate (use e.g. 200mbit, 2500mbit, 10gbit)')
v=float(m[1])*{'':1,'k':1e3,'m':1e6,'g':1e9}[m[2]]*(8 if m[3]=='bps' else 1)
print(int(v))")
  burst=$((bps / 8 / 250))
  [ $burst -ge 65536 ] || burst=65536
  for side in p d; do
    local ns dev
    if [ $side = p ]; then ns=$NS_P dev=$VETH_P; else ns=$NS_D dev=$VETH_D; fi
    ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
    if [ -n "$DELAY" ]; then
      ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$DELAY" limit 100000
      ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$rate" burst "$burst" latency 100ms
    else
      ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 100ms
    fi
  done
  echo "$bps"
}

# link_check BPS: Mbit/s of one TCP stream prefill side -> decode side (~0.5 s of data).
link_check() {
  local bytes=$(($1 / 8 / 2))
  [ $bytes -ge 1000000 ] || bytes=1000000
  [ $bytes -le 400000000 ] || bytes=400000000
  in_d $PYTHON -c "
import socket
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('$IP_D', 5599)); s.listen(1)
c,_=s.accept()
while c.recv(1<<20): pass
" &
  local srv=$!
  sleep 0.3
  in_p $PYTHON -c "
import socket,time
s=socket.create_connection(('$IP_D',5599)); buf=b'x'*(1<<20); n=$bytes; t=time.perf_counter()
while n>0: k=min(n,len(buf)); s.sendall(buf[:k]); n-=k
s.shutdown(socket.SHUT_WR); s.recv(1); dt=time.perf_counter()-t
print(f'{$bytes*8/dt/1e6:.0f}')"
  wait $srv 2>/dev/null || true
}

# start NAME NS ENV... -- CMD...: a daemon in a namespace, output in $LOGS/NAME.{out,log}
start() {
  local name=$1 ns=$2
  shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  ip netns exec "$ns" env "${envs[@]}" "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.log" &
  PIDS+=($!)
}
ready() {  # NAME PATTERN: prints the ready line (waits 120 s)
  local name=$1 pattern=$2 deadline=$((SECONDS + 120)) line
  while :; do
    line=$(grep -m1 "$pattern" "$LOGS/$name.out" 2>/dev/null || true)
    [ -n "$line" ] && { echo "$line"; return 0; }
    if [ $SECONDS -ge $deadline ] || ! kill -0 "${PIDS[-1]}" 2>/dev/null; then
      echo "jct_experiment: $name did not become ready:" >&2
      tail -20 "$LOGS/$name.log" >&2
      return 1
    fi
    sleep 0.1
  done
}

start_cluster() {  # KV
  local kv=$1 secret
  secret="$LOGS/secret-$kv"  # a file: daemons take secrets from files, never argv
  (umask 077 && head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secret")
  local node=(--model "$ROOT/$MODEL" --kv "$kv" --kv-dtype "$KV_DTYPE" --threads "$THREADS"
    --max-model-len "$MAX_MODEL_LEN" --secret-file "$secret" --port 0 --log-level warn)
  start "decode-$kv" "$NS_D" UCX_TLS=tcp "UCX_NET_DEVICES=$VETH_D" -- \
    "$BIN/hack-decode" "${node[@]}" --host "$IP_D" --ucx-port 0
  DEC_PORT=$(ready "decode-$kv" 'hack-decode ready' | awk '{print $4}')
  start "prefill-$kv" "$NS_P" UCX_TLS=tcp "UCX_NET_DEVICES=$VETH_P" -- \
    "${PREFILL_BIN:-$BIN/hack-prefill}" "${node[@]}" --host 127.0.0.1 ${PREFILL_FLAGS:-}
  PRE_PORT=$(ready "prefill-$kv" 'hack-prefill ready' | awk '{print $4}')
  start "router-$kv" "$NS_P" -- "$BIN/hack-router" --model "$ROOT/$MODEL" --port 0 \
    --max-model-len "$MAX_MODEL_LEN" --prefill "127.0.0.1:$PRE_PORT" --decode "$IP_D:$DEC_PORT" \
    --secret-file "$secret" --log-level warn
  RT_PORT=$(ready "router-$kv" 'hack-router ready' | awk '{print $4}')
  for _ in $(seq 100); do
    in_p curl -fsS -o /dev/null "http://127.0.0.1:$RT_PORT/health" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "jct_experiment: the router never saw both nodes healthy" >&2
  tail -5 "$LOGS/router-$kv.log" >&2
  return 1
}

echo "jct_experiment: $REQUESTS requests at concurrency $CONCURRENCY, prompts $PROMPT_TOKENS tokens" \
  "(random ids), max_tokens $MAX_TOKENS, model $MODEL, $THREADS thread(s) per node, $(nproc) cores;" \
  "veth $VETH_P ($IP_P) <-> $VETH_D ($IP_D), tbf on both ends${DELAY:+, netem delay $DELAY each way}"
declare -A MEASURED
RESULTS=()
for kv in $KVS; do
  set_rate 100gbit >/dev/null  # no limit while starting
  start_cluster "$kv"
  echo "  kv $kv: prefill 127.0.0.1:$PRE_PORT, decode $IP_D:$DEC_PORT, router 127.0.0.1:$RT_PORT"
  i=0
  for rate in $RATES; do
    i=$((i + 1))
    bps=$(set_rate "$rate")
    if [ "$LINK_CHECK" = 1 ] && [ -z "${MEASURED[$rate]:-}" ]; then MEASURED[$rate]=$(link_check "$bps"); fi
    out=$LOGS/$kv-$i-$rate.json
    if ! in_p "$PYTHON" "$ROOT/bench/hack_bench.py" --base-url "http://127.0.0.1:$RT_PORT/v1" \
        -n "$REQUESTS" -c "$CONCURRENCY" --prompt-tokens "$PROMPT_TOKENS" --max-tokens "$MAX_TOKENS" \
        --warmup "$WARMUP" --seed "$RANDOM" --label "kv=$kv rate=$rate" \
        --node-health "http://127.0.0.1:$PRE_PORT/health" --node-health "http://$IP_D:$DEC_PORT/health" \
        --json "$out" >"$LOGS/$kv-$i-$rate.txt" 2>&1; then
      echo "jct_experiment: kv $kv at $rate had errors:" >&2
      cat "$LOGS/$kv-$i-$rate.txt" >&2
    fi
    [ -f "$out" ] || { echo "jct_experiment: no result for kv $kv at $rate" >&2; exit 1; }
    RESULTS+=("$kv|$rate|$bps|${MEASURED[$rate]:-}|$out")
    echo "    $rate done"
  done
  stop_daemons
done

"$PYTHON" - "$JSON_OUT" "${RESULTS[@]}" <<'EOF'
import json, sys
out_path, rows = sys.argv[1], []
for item in sys.argv[2:]:
    kv, rate, bps, measured, path = item.split("|")
    s = json.load(open(path))
    kvb = list(s.get("kv_bytes", {}).values())
    sent = kvb[0]["per_request"] if kvb else 0      # prefill node: bytes sent
    recv = kvb[1]["per_request"] if len(kvb) > 1 else 0  # decode node: bytes received
    rows.append(dict(kv=kv, rate=rate, rate_bps=int(bps), measured_mbit=float(measured) if measured else None,
                     ttft_p50=s["ttft_ms"].get("p50", 0), ttft_p99=s["ttft_ms"].get("p99", 0),
                     jct_p50=s["jct_ms"].get("p50", 0), jct_p99=s["jct_ms"].get("p99", 0),
                     tpot_p50=s["tpot_ms"].get("p50", 0), rps=s["requests_per_s"], errors=s["errors"],
                     completed=s["completed"], prompt_tokens=s["prompt_tokens_mean"],
                     kv_bytes_sent=sent, kv_bytes_received=recv,
                     link_ms=sent * 8 / int(bps) * 1e3))
print()
print("| rate | measured Mbit/s | kv | KV MB/req (sent / recv) | link ms/req (bound) | TTFT p50 | TTFT p99 | JCT p50 | JCT p99 | TPOT p50 | req/s | errors |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    m = f"{r['measured_mbit']:.0f}" if r["measured_mbit"] else "–"
    print(f"| {r['rate']} | {m} | {r['kv']} | {r['kv_bytes_sent']/1e6:.2f} / {r['kv_bytes_received']/1e6:.2f} | "
          f"{r['link_ms']:.1f} | {r['ttft_p50']:.0f} | {r['ttft_p99']:.0f} | {r['jct_p50']:.0f} | {r['jct_p99']:.0f} | "
          f"{r['tpot_p50']:.2f} | {r['rps']:.2f} | {r['errors']} |")
by = {(r["rate"], r["kv"]): r for r in rows}
rates = list(dict.fromkeys(r["rate"] for r in rows))
if any((rt, "fp") in by and (rt, "hack") in by for rt in rates):
    print()
    print("fp / hack (> 1: hack faster)")
    print()
    print("| rate | KV bytes | TTFT p50 | TTFT p99 | JCT p50 | JCT p99 |")
    print("|---|---|---|---|---|---|")
    for rt in rates:
        if (rt, "fp") in by and (rt, "hack") in by:
            f, h = by[(rt, "fp")], by[(rt, "hack")]
            q = lambda k: f"{f[k] / h[k]:.2f}×" if h[k] else "–"
            print(f"| {rt} | {q('kv_bytes_sent')} | {q('ttft_p50')} | {q('ttft_p99')} | {q('jct_p50')} | {q('jct_p99')} |")
if out_path:
    json.dump(rows, open(out_path, "w"), indent=2)
EOF
