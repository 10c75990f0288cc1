#!/usr/bin/env bash
# Installs every Debian and Python package hackserve's build and tests need, on a fresh
# Debian 12 machine. Idempotent: packages already present are left alone.
# The CUDA toolkit is expected at /usr/local/cuda (it is not a Debian 12 package).
set -euo pipefail

DEBIAN_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  clang libclang-rt-14-dev            # libFuzzer targets
  libucx-dev ucx-utils                # UCX transport
  libboost-dev libboost-system-dev    # Asio / Beast
  nlohmann-json3-dev libspdlog-dev libfmt-dev catch2
  libopenblas-dev liblapacke-dev libeigen3-dev
  libxxhash-dev libpcre2-dev libutf8proc-dev
  libssl-dev zlib1g-dev               # SHA-256 block keys, CRC-32 of vault segment records
  prometheus-cpp-dev
  bible-kjv                           # training corpus for fixtures (scripts/make_fixtures.py)
  python3 python3-pip python3-venv
  curl iproute2                       # local-cluster.sh readiness checks; bench/jct_experiment.sh (ip netns, tc)
  podman podman-compose runc          # tests/e2e/compose_test.py (deploy/docker-compose.yml); runc: crun fails on hybrid cgroups
  debootstrap uidmap slirp4netns      # deploy/docker/make-base-image.sh (debian:12 without a registry), rootless podman
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
else
  echo "install-deps: Debian packages present"
fi

# Python packages the tests use (goldens are committed; the tests need only these), gguf
# for scripts/fetch-models.sh and matplotlib for bench/load/hack_load.py's plots. The fixture generator's heavier needs (torch,
# transformers) are in scripts/requirements-fixtures.txt and are not needed to build or test.
PY=python3
if ! $PY -c "import jinja2, numpy, openai, gguf, matplotlib" 2>/dev/null; then
  $PY -m pip install -q -r "$(dirname "$0")/requirements-test.txt" \
    || $PY -m pip install -q --break-system-packages -r "$(dirname "$0")/requirements-test.txt"
fi

# The real pretrained model the quickstart serves and the SmolLM2 tests load (a no-op once
# models/smollm2-135m-instruct/ is complete).
"$(dirname "$0")/fetch-models.sh"
echo "install-deps: done"
