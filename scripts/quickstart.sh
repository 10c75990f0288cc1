#!/usr/bin/env bash
# The README's first command: install dependencies, build, start a local cluster (router +
# prefill + decode on loopback, KV streamed as HACK pages over UCX) on SmolLM2-135M-Instruct
# (models/smollm2-135m-instruct, fetched and converted by install-deps via
# scripts/fetch-models.sh), answer a real question through the OpenAI-compatible API, and
# stop the cluster. MODEL=DIR serves another model directory.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
export STATE_DIR=${STATE_DIR:-.cluster}
export MODEL=${MODEL:-models/smollm2-135m-instruct}
SERVED_NAME=$(basename "$MODEL")  # the router's default --served-model-name
scripts/local-cluster.sh start
trap 'scripts/local-cluster.sh stop' EXIT
PORT=${PORT:-8000}
MESSAGE=${MESSAGE:-"What is the capital of France?"}
BODY=$(python3 -c 'import json, sys; print(json.dumps({"model": sys.argv[2], "max_tokens": 48, "temperature": 0,
  "messages": [{"role": "user", "content": sys.argv[1]}]}))' "$MESSAGE" "$SERVED_NAME")
echo "== POST /v1/chat/completions: $MESSAGE"
curl -fsS "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d "$BODY" |
  python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["choices"][0]["message"]["content"]); print("usage:", r["usage"])'
