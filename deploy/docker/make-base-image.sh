#!/usr/bin/env bash
# Makes the `debian:12` base image locally where no container registry is reachable:
# debootstrap a minimal bookworm from the machine's Debian mirror and `podman import` it
# (~45 s). A no-op when the image exists (FORCE=1 rebuilds it).
#   deploy/docker/make-base-image.sh
# Settings (environment): MIRROR (http://deb.debian.org/debian), IMAGE (debian:12),
# CONTAINERS_CONF (deploy/docker/containers.conf: runc, no default ulimits).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
IMAGE=${IMAGE:-debian:12}

if [ "${FORCE:-0}" != 1 ] && podman image exists "$IMAGE"; then
  echo "make-base-image: $IMAGE present"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "make-base-image: needs debootstrap (scripts/install-deps.sh)" >&2; exit 1; }
root=$(mktemp -d /var/tmp/debian12-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
start=$SECONDS
debootstrap --variant=minbase bookworm "$root" "$MIRROR" >"$root.log" 2>&1 \
  || { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# What an official debian image has that minbase does not: the apt sources of the mirror
# used, and no apt caches or logs.
cat >"$root/etc/apt/sources.list" <<SOURCES
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*
tar -C "$root" -c . | podman import --quiet --change 'CMD ["bash"]' - "$IMAGE" >/dev/null
echo "make-base-image: $IMAGE imported in $((SECONDS - start)) s ($(podman image inspect -f '{{.Size}}' "$IMAGE") bytes)"
