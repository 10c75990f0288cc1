#!/usr/bin/env bash
# bench/fidelity on hack-tiny with small windows: every section runs, the fp32 reference
# scores zero against itself, 8-bit KV is closer than 2-bit, an exact prefill costs nothing
# beyond bf16 while the quantized-prefill ablation does, a prefix hit through the exact codec
# changes nothing, and bytes are reported vs bf16.
# (A smoke test of the harness; its SmolLM2 numbers live in bench/RESULTS.md.)
set -euo pipefail
BUILD_DIR=${1:?build dir}
SRC_DIR=${2:?source dir}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$BUILD_DIR/bin/fidelity" --model "$SRC_DIR/models/hack-tiny" --text "$SRC_DIR/tests/fixtures/tokenizers/kjv-bpe/heldout.txt" \
  --configs "k8v8;k2v2;k2v2 qprefill;k2v2 vault=exact;k2v2 vault=int8-head;alloc=$SRC_DIR/tests/fixtures/allocations/hack-tiny-mixed.hack_kv.json" \
  --sections decode,prefill,copy,greedy --windows 2 --prefill-tokens 96 --decode-tokens 64 --prefill-chunk 32 \
  --copy-probes 1 --copy-gap 64 --copy-span 16 --chats 2 --chat-tokens 8 --threads 1 --json > "$out"
python3 - "$out" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {(r["section"], r.get("config")): r for r in rows}
def num(x): return x["value"] if isinstance(x, dict) else x
for r in rows:
    for k, v in r.items():
        if isinstance(v, (int, float)) or isinstance(v, dict):
            assert math.isfinite(num(v)), (r["section"], r.get("config"), k, v)
for s in ("decode", "prefill"):
    assert num(by[(s, "fp32 (reference)")]["kl_mean"]) == 0, s
    assert 0 < num(by[(s, "k8v8")]["kl_mean"]) or s == "prefill"
dec = lambda c: num(by[("decode", c)]["kl_mean"])
pre = lambda c: num(by[("prefill", c)]["kl_mean"])
assert dec("k8v8") < dec("k2v2"), (dec("k8v8"), dec("k2v2"))
assert pre("k2v2") < 1e-4, pre("k2v2")                      # exact prefill: bf16 rounding only
assert pre("k2v2 qprefill") > 10 * pre("k2v2"), (pre("k2v2 qprefill"), pre("k2v2"))
# A prefix hit through the exact codec is the computed prompt, bit for bit; through int8-head
# it is not (the codec rounds), and stays close.
assert dec("k2v2 vault=exact") == dec("k2v2"), (dec("k2v2 vault=exact"), dec("k2v2"))
assert dec("k2v2 vault=int8-head") != dec("k2v2") and dec("k2v2 vault=int8-head") < 2 * dec("k2v2")
alloc = [r for r in rows if r["section"] == "decode" and r["config"].startswith("alloc=")][0]
assert "layers[" in alloc["kv"], alloc["kv"]
assert 15 < by[("decode", "k2v2")]["closed_pct_bf16"] < 18
for c in ("k8v8", "k2v2"):
    assert by[("greedy", c)]["chats"] == 2
    assert by[("copy", c)]["positions"] > 0
print("fidelity smoke: %d records checked" % len(rows))
PY
