#!/usr/bin/env bash
# The README's first command: install dependencies, build, start a local cluster (router +
# prefill + decode on loopback, KV streamed as HACK pages over UCX) on the bundled model
# (models/hack-tiny, trained on the King James Bible), answer a real chat request through
# the OpenAI-compatible API, and stop the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
export STATE_DIR=${STATE_DIR:-.cluster}
scripts/local-cluster.sh start
trap 'scripts/local-cluster.sh stop' EXIT
PORT=${PORT:-8000}
MESSAGE=${MESSAGE:-"And it came to pass, when the king"}
BODY=$(python3 -c 'import json, sys; print(json.dumps({"model": "hack-tiny", "max_tokens": 48, "temperature": 0,
  "messages": [{"role": "user", "content": sys.argv[1]}]}))' "$MESSAGE")
echo "== POST /v1/chat/completions: $MESSAGE"
curl -fsS "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d "$BODY" |
  python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["choices"][0]["message"]["content"]); print("usage:", r["usage"])'
