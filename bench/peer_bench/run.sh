#!/usr/bin/env bash
# llama.cpp peer benchmark (issue 16): hack-run vs llama.cpp on the same token ids.
#
# Once: a venv under the build tree with llama-cpp-python built from source (GGML_NATIVE),
# and a bf16 GGUF made by llama.cpp's own convert_hf_to_gguf.py. Then bench.py measures
# both engines in one run. Everything it makes lives under ${BUILD_DIR:-build}/peer (ignored).
#
#   bench/peer_bench/run.sh                      # SmolLM2-135M, 1 and 2 threads
#   bench/peer_bench/run.sh --model 1b           # the llama-1b shape (random bf16 weights)
#   bench/peer_bench/run.sh --model qwen         # Qwen2.5-Coder-1.5B-Instruct (models/, fetch-models.sh)
#   bench/peer_bench/run.sh --help               # bench.py's flags
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
PEER_DIR="$BUILD_DIR/peer"
VENV="$PEER_DIR/venv"
LLAMA_CPP_PYTHON_VERSION=0.3.36  # pinned: llama.cpp as vendored in this sdist
SENTENCEPIECE_VERSION=0.2.3      # convert_hf_to_gguf.py imports it for every Llama (even BPE tokenizers)
SDIST="$PEER_DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
SRC="$PEER_DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
mkdir -p "$PEER_DIR"

installed_version() {
  "$VENV/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || true
}

if [[ ! -x "$VENV/bin/python" ]]; then
  # System site packages: numpy, and torch, transformers, safetensors where installed.
  python3 -m venv --system-site-packages "$VENV"
fi
if [[ ! -f "$SDIST" ]]; then
  "$VENV/bin/pip" download --no-binary :all: --no-deps -d "$PEER_DIR" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
fi
if [[ ! -d "$SRC" ]]; then
  tar xzf "$SDIST" -C "$PEER_DIR"  # vendor/llama.cpp holds convert_hf_to_gguf.py and gguf-py
fi
if [[ "$(installed_version)" != "$LLAMA_CPP_PYTHON_VERSION" ]]; then
  echo "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION from source (GGML_NATIVE=ON; several minutes on 2 cores)" >&2
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    nice "$VENV/bin/pip" install --no-binary llama-cpp-python --no-cache-dir "$SDIST"
fi
if ! "$VENV/bin/python" -c 'import sentencepiece' 2>/dev/null; then
  "$VENV/bin/pip" install "sentencepiece==$SENTENCEPIECE_VERSION"
fi
# llama.cpp's converter imports torch and transformers (and the 1B shape is written with
# safetensors): where the system site packages lack them (a machine without the fixture
# generator's requirements), install the versions scripts/requirements-fixtures.txt pins.
# Qwen needs none of them: its bf16 GGUF is written by gguf_from_hf.py (numpy + gguf-py).
model=smollm2
for ((i = 1; i <= $#; i++)); do
  case "${!i}" in
    --model) j=$((i + 1)); model=${!j:-} ;;
    --model=*) model=${!i#--model=} ;;
  esac
done
if [[ "$model" != qwen* ]] && ! "$VENV/bin/python" -c 'import torch, transformers, safetensors' 2>/dev/null; then
  echo "installing the converter's requirements into $VENV" >&2
  "$VENV/bin/pip" install -c scripts/requirements-fixtures.txt torch transformers safetensors
fi

if [[ ! -x "$BUILD_DIR/bin/hack-run" ]]; then
  echo "no $BUILD_DIR/bin/hack-run: run scripts/build.sh first" >&2
  exit 1
fi
exec "$VENV/bin/python" bench/peer_bench/bench.py --build-dir "$BUILD_DIR" --llama-src "$SRC/vendor/llama.cpp" "$@"
