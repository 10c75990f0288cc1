#!/usr/bin/env bash
# hack-probe (the container health check) against a real daemon: 0 for a 200, 1 for a 404,
# a refused port and a server that never answers (bounded by --timeout-s), 2 for a bad URL.
#   hack_probe_test.sh BIN_DIR
set -euo pipefail
bin=$1
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

"$bin/hack-vault" --port 0 --ucx-port 0 --max-bytes 16M >"$tmp/vault.out" 2>"$tmp/vault.log" &
pids+=($!)
for _ in $(seq 100); do grep -q ready "$tmp/vault.out" && break; sleep 0.1; done
port=$(sed -n 's/^hack-vault ready: http \([0-9]*\) .*/\1/p' "$tmp/vault.out")
[ -n "$port" ] || { echo "hack-vault did not start"; cat "$tmp/vault.log"; exit 1; }

expect() {  # expect CODE ARGS...
  local want=$1 got=0
  shift
  "$bin/hack-probe" "$@" || got=$?
  if [ "$got" != "$want" ]; then echo "FAIL: hack-probe $* exited $got, expected $want"; exit 1; fi
}
expect 0 --url "http://127.0.0.1:$port/health"
expect 0 --url "http://localhost:$port/health" --quiet
expect 1 --url "http://127.0.0.1:$port/no-such-path"
# A port nothing listens on: take a free one from the kernel and close it again.
closed=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
expect 1 --url "http://127.0.0.1:$closed/health"
# A listener that accepts and never answers: the probe gives up after --timeout-s (well
# before the listener goes away at 30 s, when the probe would see EOF instead).
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(30)' >"$tmp/silent.port" &
pids+=($!)
for _ in $(seq 50); do [ -s "$tmp/silent.port" ] && break; sleep 0.1; done
start=$SECONDS
expect 1 --url "http://127.0.0.1:$(cat "$tmp/silent.port")/health" --timeout-s 1
[ $((SECONDS - start)) -lt 10 ] || { echo "FAIL: --timeout-s 1 took $((SECONDS - start)) s"; exit 1; }
expect 2 --url "https://127.0.0.1:$port/health"
expect 2 --url "http://127.0.0.1/health"
echo "hack-probe: ok"
