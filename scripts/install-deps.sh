#!/usr/bin/env bash
# Installs the Debian and Python packages hackserve needs, on a fresh Debian 12 machine.
# Idempotent: packages already present are left alone.
#   scripts/install-deps.sh             everything: the build, the tests, fuzzing, containers
#                                       (scripts/test.sh)
#   scripts/install-deps.sh --runtime   only what building and running the daemons and hack-run
#                                       needs, and fetching SmolLM2 (scripts/quickstart.sh)
# The CUDA toolkit is expected at /usr/local/cuda (it is not a Debian 12 package).
set -euo pipefail

SET=all
case "${1:-}" in
  --runtime) SET=runtime ;;
  "") ;;
  *) echo "usage: $0 [--runtime]" >&2; exit 2 ;;
esac

# Building and running the daemons and hack-run (the quickstart).
RUNTIME_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libucx-dev ucx-utils                # UCX transport
  libboost-dev libboost-system-dev    # Asio / Beast
  nlohmann-json3-dev libspdlog-dev libfmt-dev
  libopenblas-dev liblapacke-dev libeigen3-dev
  libxxhash-dev libpcre2-dev libutf8proc-dev
  libssl-dev zlib1g-dev               # SHA-256 block keys, CRC-32 of vault segment records
  prometheus-cpp-dev
  python3 python3-pip                 # scripts/fetch-models.sh (numpy + gguf)
  curl                                # local-cluster.sh readiness checks, the quickstart's question
)
# The tests, fuzzing, fixtures and containers on top (scripts/test.sh).
TEST_PACKAGES=(
  clang libclang-rt-14-dev            # libFuzzer targets
  catch2
  bible-kjv                           # training corpus for fixtures (scripts/make_fixtures.py)
  python3-venv
  iproute2                            # bench/jct_experiment.sh (ip netns, tc), tests/e2e/two_networks_test.py (ip netns, routes)
  iptables                            # tests/e2e/two_networks_test.py (the gateway's filter between its two networks)
  podman podman-compose runc          # tests/e2e/compose_test.py (deploy/docker-compose.yml), two_networks_test.py; runc: crun fails on hybrid cgroups
  debootstrap uidmap slirp4netns      # deploy/docker/make-base-image.sh (debian:12 without a registry), rootless podman
)
DEBIAN_PACKAGES=("${RUNTIME_PACKAGES[@]}")
if [ "$SET" = all ]; then DEBIAN_PACKAGES+=("${TEST_PACKAGES[@]}"); fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -q
  # The runtime set skips recommended packages (python3-pip would pull python3-dev and more).
  no_recommends=()
  if [ "$SET" = runtime ]; then no_recommends=(--no-install-recommends); fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${no_recommends[@]}" "${missing[@]}"
else
  echo "install-deps: Debian packages present"
fi

# Python packages: numpy + gguf for scripts/fetch-models.sh (requirements-runtime.txt); for
# the full set also what the tests use (goldens are committed; the tests need only these) and
# matplotlib for bench/load/hack_load.py's plots (requirements-test.txt). The fixture
# generator's heavier needs (torch, transformers) are in scripts/requirements-fixtures.txt and
# are not needed to build or test.
PY=python3
if [ "$SET" = all ]; then
  REQUIREMENTS="$(dirname "$0")/requirements-test.txt"
  PROBE="import jinja2, numpy, openai, gguf, matplotlib, jsonschema"
else
  REQUIREMENTS="$(dirname "$0")/requirements-runtime.txt"
  PROBE="import numpy, gguf"
fi
if ! $PY -c "$PROBE" 2>/dev/null; then
  echo "install-deps: installing Python packages from $REQUIREMENTS"
  $PY -m pip install -q -r "$REQUIREMENTS" 2>/dev/null \
    || $PY -m pip install -q --break-system-packages -r "$REQUIREMENTS"
fi

# The real pretrained model the quickstart serves and the SmolLM2 tests load (a no-op once
# models/smollm2-135m-instruct/ is complete). HACK_FETCH_MODELS=0 skips it (the CPU image's
# build stage: the image carries no model).
if [ "${HACK_FETCH_MODELS:-1}" != 0 ]; then "$(dirname "$0")/fetch-models.sh"; fi
echo "install-deps: done"
