#!/usr/bin/env bash
# e2e: scripts/local-cluster.sh starts a 2 prefill + 1 decode cluster with a vault on loopback, it answers a
# chat request and a streamed completion through the router, and `stop` leaves no daemon.
# It runs the script's default model, SmolLM2-135M-Instruct (what scripts/quickstart.sh serves),
# so the quickstart path is tested on a real model: the capital of France must be Paris.
set -euo pipefail
cd "$(dirname "$0")/../.."
export BUILD_DIR=${HACK_BUILD_DIR:-build}
export STATE_DIR=$(mktemp -d /tmp/hack_cluster_test.XXXXXX)
export PORT=18000 PREFILL_PORT=18200 DECODE_PORT=18300 VAULT_PORT=18400 PREFILL=2 DECODE=1
trap 'scripts/local-cluster.sh stop >/dev/null 2>&1 || true; rm -rf "$STATE_DIR"' EXIT
scripts/local-cluster.sh start
pids=$(awk '{print $1}' "$STATE_DIR/pids")
[ "$(echo "$pids" | wc -w)" = 5 ] || { echo "expected 5 daemons (vault, 2 prefill, decode, router), got: $pids"; exit 1; }
curl -fsS http://127.0.0.1:18400/health | grep -q '"role":"vault"' || { echo "no vault on 18400"; exit 1; }

chat=$(curl -fsS http://127.0.0.1:$PORT/v1/chat/completions -H 'Content-Type: application/json' \
  -d '{"model":"smollm2-135m-instruct","messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":12,"temperature":0}')
python3 - "$chat" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
assert r["object"] == "chat.completion", r
c = r["choices"][0]
assert c["message"]["role"] == "assistant" and c["message"]["content"], r
assert c["finish_reason"] in ("stop", "length"), r
assert r["usage"]["completion_tokens"] >= 1 and r["usage"]["prompt_tokens"] > 3, r
assert "Paris" in c["message"]["content"], r
PY
stream=$(curl -fsSN http://127.0.0.1:$PORT/v1/completions -H 'Content-Type: application/json' \
  -d '{"prompt":"In the beginning","max_tokens":6,"temperature":0,"stream":true}')
echo "$stream" | grep -q '^data: \[DONE\]' || { echo "no [DONE] in stream: $stream"; exit 1; }
[ "$(echo "$stream" | grep -c '"text_completion"')" -ge 2 ] || { echo "too few chunks: $stream"; exit 1; }

scripts/local-cluster.sh stop
for pid in $pids; do
  if kill -0 "$pid" 2>/dev/null; then echo "daemon $pid still running after stop"; exit 1; fi
done
echo "local-cluster e2e: ok"
