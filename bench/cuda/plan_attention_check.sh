#!/usr/bin/env bash
# The CUDA runner of the AttentionPlan inside the whole model (issue 32): hack-run --device
# cuda --cuda-attention plan must answer as --cuda-attention kernels (the measured decode and
# prefill kernels) token for token — greedy, fp and hack KV, prompts of several lengths so the
# KV crosses pages and HACK blocks close — and with prompts prefilled in chunks of 64.
#
#   bench/cuda/plan_attention_check.sh BIN_DIR MODEL_DIR
# Exit 0 when every pair is equal (and every run answered), 1 otherwise.
set -u
bin=${1:?usage: plan_attention_check.sh BIN_DIR MODEL_DIR}
model=${2:?usage: plan_attention_check.sh BIN_DIR MODEL_DIR}
prompt() { seq -s, 100 $((99 + $1)); }  # N token ids
answer() {  # answer KV N ATTENTION [flags...]: the greedy text as JSON, or ERROR
  local kv=$1 n=$2 attn=$3
  shift 3
  "$bin/hack-run" --model "$model" --device cuda --cuda-attention "$attn" --kv "$kv" --prompt-ids "$(prompt "$n")" \
    --max-tokens 48 --temperature 0 --ignore-eos --json --log-level warn "$@" 2>&1 |
    python3 -c 'import json, sys
raw = sys.stdin.read()
try:
    print(json.dumps(json.loads(raw[raw.index("{"):])["text"]))
except Exception:
    print("ERROR " + raw[-300:].replace("\n", " "))'
}
fails=0
for kv in fp hack; do
  for n in 5 70 300 300/64; do
    len=${n%/*} chunk=()
    [ "$n" != "$len" ] && chunk=(--prefill-chunk "${n#*/}")
    want=$(answer "$kv" "$len" kernels "${chunk[@]}")
    got=$(answer "$kv" "$len" plan "${chunk[@]}")
    if [ "${want#ERROR}" = "$want" ] && [ "$want" = "$got" ]; then
      echo "equal  kv=$kv prompt=$n: $want"
    else
      echo "DIFFER kv=$kv prompt=$n: kernels $want vs plan $got"
      fails=$((fails + 1))
    fi
  done
done
echo "plan attention check: $fails failure(s)"
[ "$fails" -eq 0 ]
