#!/usr/bin/env bash
# The router links neither UCX nor a backend (DESIGN.md §2): hack-router must carry no UCX
# library and no KV cache, backend or UCX transport code. The same probes must find all of
# them in hack-prefill, so the test cannot pass by probing for the wrong names.
#   router_links_test.sh BIN_DIR
set -euo pipefail
bin=$1
probe() {  # probe BINARY -> prints what it finds
  ldd "$1" | grep -oE 'libuc[a-z]+' | sort -u || true
  nm -C "$1" | grep -oE 'hack::(CpuPagedKvCache|make_cpu_backend|net::UcxWorker)' | sort -u || true
}
router=$(probe "$bin/hack-router")
prefill=$(probe "$bin/hack-prefill")
for want in libucp 'hack::CpuPagedKvCache' 'hack::make_cpu_backend' 'hack::net::UcxWorker'; do
  grep -qF "$want" <<<"$prefill" || { echo "probe broken: '$want' not found in hack-prefill"; exit 1; }
done
if [ -n "$router" ]; then
  echo "hack-router links what it must not:"
  echo "$router"
  exit 1
fi
echo "hack-router: no UCX, no backend, no KV cache"
