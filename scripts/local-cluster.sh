#!/usr/bin/env bash
# A whole hackserve cluster on loopback: hack-router + N hack-prefill + M hack-decode (+ hack-vault) on the
# model (SmolLM2-135M-Instruct, fetched by scripts/fetch-models.sh), KV streamed between them
# over UCX.
#
#   scripts/local-cluster.sh start    start in the background, wait until the router is ready
#   scripts/local-cluster.sh stop     stop every daemon (SIGTERM, then SIGKILL after 10 s)
#   scripts/local-cluster.sh status   the router's /health
#   scripts/local-cluster.sh run      start, then stay in the foreground until Ctrl-C, then stop
#
# Settings (environment): MODEL (models/smollm2-135m-instruct; models/hack-tiny is the small
# bundled one; a llama/qwen2/qwen3 GGUF file, e.g. .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf, is
# read natively), PREFILL (1), DECODE (1), PORT (8000,
# router), PREFILL_PORT (8200: prefill node i listens on PREFILL_PORT+i), DECODE_PORT (8300),
# KV (hack | fp), VAULT (1: start hack-vault on VAULT_PORT (8400, UCX on VAULT_PORT+1) and
# point the prefill nodes at it; 0: none), VAULT_BYTES (1G), THREADS (1 per
# node), BUILD_DIR (build), STATE_DIR (.cluster: pids and logs), SECRET (random),
# UCX_TLS (posix,sysv,cma,self,tcp: prefill reaches decode over shared memory; tcp for the vault
# and other hosts), EXTRA_ROUTER_FLAGS / EXTRA_NODE_FLAGS (appended to the command lines).
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=${MODEL:-models/smollm2-135m-instruct}
PREFILL=${PREFILL:-1}
DECODE=${DECODE:-1}
PORT=${PORT:-8000}
PREFILL_PORT=${PREFILL_PORT:-8200}
DECODE_PORT=${DECODE_PORT:-8300}
VAULT=${VAULT:-1}
VAULT_PORT=${VAULT_PORT:-8400}
VAULT_BYTES=${VAULT_BYTES:-1G}
KV=${KV:-hack}
THREADS=${THREADS:-1}
BUILD_DIR=${BUILD_DIR:-build}
STATE_DIR=${STATE_DIR:-.cluster}
BIN=$BUILD_DIR/bin
export UCX_TLS=${UCX_TLS:-posix,sysv,cma,self,tcp}

wait_http() {  # url, seconds
  local url=$1 deadline=$((SECONDS + $2))
  until curl -fsS -o /dev/null "$url" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then return 1; fi
    sleep 0.2
  done
}

start_daemon() {  # name, command...
  local name=$1
  shift
  "$@" >"$STATE_DIR/$name.out" 2>"$STATE_DIR/$name.log" &
  echo "$! $name" >>"$STATE_DIR/pids"
}

stop_all() {
  [ -f "$STATE_DIR/pids" ] || return 0
  # Router first (it cancels open requests), then prefill and decode nodes.
  tac "$STATE_DIR/pids" | while read -r pid name; do kill -TERM "$pid" 2>/dev/null || true; done
  local deadline=$((SECONDS + 10))
  while read -r pid name; do
    while kill -0 "$pid" 2>/dev/null; do
      if [ $SECONDS -ge $deadline ]; then
        echo "local-cluster: $name ($pid) did not stop, killing it" >&2
        kill -KILL "$pid" 2>/dev/null || true
        break
      fi
      sleep 0.1
    done
  done <"$STATE_DIR/pids"
  rm -f "$STATE_DIR/pids"
  echo "local-cluster: stopped"
}

start_all() {
  [ -f "$MODEL/config.json" ] || [ "$(head -c 4 "$MODEL" 2>/dev/null)" = GGUF ] ||
    { echo "local-cluster: no model at $MODEL (run scripts/fetch-models.sh, or set MODEL)" >&2; exit 1; }
  for b in hack-router hack-prefill hack-decode hack-vault; do
    [ -x "$BIN/$b" ] || { echo "local-cluster: $BIN/$b not built (run scripts/build.sh)" >&2; exit 1; }
  done
  if [ -f "$STATE_DIR/pids" ]; then
    echo "local-cluster: already running (scripts/local-cluster.sh stop first)" >&2
    exit 1
  fi
  mkdir -p "$STATE_DIR"
  : >"$STATE_DIR/pids"
  SECRET=${SECRET:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
  # Daemons read the secret from a file only they can read (argv is visible to every user).
  (umask 077 && echo "$SECRET" >"$STATE_DIR/secret")
  local node_flags=(--model "$MODEL" --kv "$KV" --threads "$THREADS" --secret-file "$STATE_DIR/secret")
  local prefill_list="" decode_list="" vault_flags=()
  if [ "$VAULT" = 1 ]; then
    start_daemon vault "$BIN/hack-vault" --port "$VAULT_PORT" --ucx-port $((VAULT_PORT + 1)) --max-bytes "$VAULT_BYTES" \
      --secret-file "$STATE_DIR/secret"
    wait_http "http://127.0.0.1:$VAULT_PORT/health" 60 || { echo "local-cluster: the vault did not start:" >&2; cat "$STATE_DIR/vault.log" >&2; stop_all; exit 1; }
    vault_flags=(--vault "127.0.0.1:$((VAULT_PORT + 1))")
  fi
  for ((i = 0; i < PREFILL; i++)); do
    start_daemon "prefill$i" "$BIN/hack-prefill" "${node_flags[@]}" "${vault_flags[@]}" --port $((PREFILL_PORT + i)) ${EXTRA_NODE_FLAGS:-}
    prefill_list+="${prefill_list:+,}127.0.0.1:$((PREFILL_PORT + i))"
  done
  for ((i = 0; i < DECODE; i++)); do
    start_daemon "decode$i" "$BIN/hack-decode" "${node_flags[@]}" "${vault_flags[@]}" --port $((DECODE_PORT + i)) ${EXTRA_NODE_FLAGS:-}
    decode_list+="${decode_list:+,}127.0.0.1:$((DECODE_PORT + i))"
  done
  for ((i = 0; i < PREFILL; i++)); do
    wait_http "http://127.0.0.1:$((PREFILL_PORT + i))/health" 120 || { echo "local-cluster: prefill$i did not start:" >&2; cat "$STATE_DIR/prefill$i.log" >&2; stop_all; exit 1; }
  done
  for ((i = 0; i < DECODE; i++)); do
    wait_http "http://127.0.0.1:$((DECODE_PORT + i))/health" 120 || { echo "local-cluster: decode$i did not start:" >&2; cat "$STATE_DIR/decode$i.log" >&2; stop_all; exit 1; }
  done
  start_daemon router "$BIN/hack-router" --model "$MODEL" --port "$PORT" --prefill "$prefill_list" \
    --decode "$decode_list" --secret-file "$STATE_DIR/secret" ${EXTRA_ROUTER_FLAGS:-}
  wait_http "http://127.0.0.1:$PORT/health" 60 || { echo "local-cluster: the router did not become ready:" >&2; cat "$STATE_DIR/router.log" >&2; stop_all; exit 1; }
  echo "local-cluster: ready — OpenAI API at http://127.0.0.1:$PORT/v1 ($PREFILL prefill, $DECODE decode, vault $VAULT, kv $KV, model $MODEL); logs in $STATE_DIR/"
}

case "${1:-}" in
  start) start_all ;;
  stop) stop_all ;;
  status) curl -sS "http://127.0.0.1:$PORT/health"; echo ;;
  run)
    start_all
    trap 'stop_all; exit 0' INT TERM
    while sleep 1; do :; done
    ;;
  *) sed -n '2,14p' "$0"; exit 2 ;;
esac
