#!/usr/bin/env bash
# A 1P1D cluster on one device answers exactly as hack-run on that device (issue 34 part 5):
# hack-prefill + hack-decode + hack-router on --device DEVICE, greedy completions of token-id
# prompts (several lengths, so KV crosses pages), text compared with `hack-run --device DEVICE
# --json`, for --kv fp and --kv hack. Runs anywhere the binaries run: `cpu` here is the dry
# run of what a lent GPU machine runs with `cuda` (bench/cuda/device_check.sh step "cluster").
#
#   bench/cuda/cluster_check.sh [DEVICE] [BIN_DIR] [MODEL_DIR]    (defaults: cuda build/bin models/hack-tiny)
# Exit 0 when every comparison is equal; the daemons' logs stay in $OUT (default a temp dir).
set -u
device=${1:-cuda}
bin=${2:-build/bin}
model=${3:-models/hack-tiny}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export UCX_TLS=${UCX_TLS:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
secret="$OUT/secret"
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$secret"
# start runs in a command substitution (a subshell), so the daemons' pids go to a file.
pidfile="$OUT/pids"
: > "$pidfile"
cleanup() {
  local p
  for p in $(cat "$pidfile" 2>/dev/null); do kill "$p" 2>/dev/null; done
  for p in $(cat "$pidfile" 2>/dev/null); do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  : > "$pidfile"
}
trap cleanup EXIT

# start NAME READY_REGEX CMD...: runs CMD with stdout to $OUT/NAME.out; prints the first
# capture group of the ready line (the bound port), or fails after 120 s.
start() {
  local name=$1 regex=$2
  shift 2
  "$@" > "$OUT/$name.out" 2> "$OUT/$name.log" &
  local pid=$!
  echo "$pid" >> "$pidfile"
  for _ in $(seq 1200); do
    local port
    port=$(sed -n -E "s/$regex/\\1/p" "$OUT/$name.out" | head -n 1)
    if [ -n "$port" ]; then echo "$port"; return 0; fi
    kill -0 "$pid" 2>/dev/null || { echo "$name exited: $(tail -n 5 "$OUT/$name.log")" >&2; return 1; }
    sleep 0.1
  done
  echo "$name not ready in 120 s: $(tail -n 5 "$OUT/$name.log")" >&2
  return 1
}

prompt() { seq -s, 100 $((99 + $1)); }  # N token ids
fails=0
for kv in fp hack; do
  node_flags=(--model "$model" --device "$device" --kv "$kv" --secret-file "$secret" --port 0)
  pport=$(start "prefill_$kv" '^hack-prefill ready: http ([0-9]+).*' "$bin/hack-prefill" "${node_flags[@]}") || exit 2
  dport=$(start "decode_$kv" '^hack-decode ready: http ([0-9]+).*' "$bin/hack-decode" "${node_flags[@]}" --ucx-port 0) || exit 2
  rport=$(start "router_$kv" '^hack-router ready: http ([0-9]+).*' "$bin/hack-router" --model "$model" --port 0 \
            --secret-file "$secret" --prefill "127.0.0.1:$pport" --decode "127.0.0.1:$dport") || exit 2
  for n in 5 70 300; do
    want=$("$bin/hack-run" --model "$model" --device "$device" --kv "$kv" --prompt-ids "$(prompt "$n")" --max-tokens 48 \
             --temperature 0 --ignore-eos --json --log-level warn 2> "$OUT/hack_run_${kv}_$n.log" |
           python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["text"]))')
    got=$(python3 - "$rport" "$(prompt "$n")" <<'EOF'
import json, sys, time, urllib.request
port, ids = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")]
body = json.dumps({"prompt": ids, "max_tokens": 48, "temperature": 0, "ignore_eos": True}).encode()
for attempt in range(100):  # until the router has seen both nodes healthy
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            print(json.dumps(json.load(r)["choices"][0]["text"]))
            break
    except urllib.error.HTTPError as e:
        if e.code != 503:
            print(json.dumps(f"HTTP {e.code}: {e.read()[:300]!r}"))
            break
        time.sleep(0.2)
EOF
)
    if [ -n "$want" ] && [ "$want" = "$got" ]; then
      echo "equal  kv=$kv prompt=$n device=$device: $want"
    else
      echo "DIFFER kv=$kv prompt=$n device=$device: hack-run $want vs cluster $got"
      fails=$((fails + 1))
    fi
  done
  cleanup
done
echo "cluster_check: $fails difference(s); logs in $OUT"
[ "$fails" = 0 ]
