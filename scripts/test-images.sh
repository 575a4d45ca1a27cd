#!/usr/bin/env bash
# The container-image test fixtures (issue 11), built on this machine from
# Debian packages only: no image is pulled from a public registry.
#
#   msbx-test/base:1   Debian bookworm from debootstrap (minbase + python3, git, patch), docker import
#   msbx-test/app:1    test/images/docker/app/Dockerfile  (whiteout, opaque dir, user dev, venv, ENV/WORKDIR/USER/CMD)
#   msbx-test/app2:1   test/images/docker/app2/Dockerfile (the base plus one small layer)
#
# and under /var/cache/minisandbox/images/: app.tar, app2.tar, base.tar
# (`docker save`), app-oci/ (an OCI layout of app, tag "app", by skopeo);
# a registry (Debian's docker-registry) on 127.0.0.1:5000 holding
# msbx-test/app:1 and msbx-test/app2:1. test/images/fixtures.ts reads these.
#
# Run as root (.ci/run does). Idempotent: each step is redone only when its
# output is missing or its inputs changed (the rootfs tarball, a Dockerfile,
# the base image), which a state file per step records, so a warm run takes
# seconds. Starts dockerd and the registry when they do not answer; both are
# left running for the tests.
set -euo pipefail

CACHE=${MSBX_CACHE:-/var/cache/minisandbox}
DIR=$CACHE/images
STATE=$DIR/.state
REGDIR=$CACHE/registry
REGISTRY=127.0.0.1:5000
SUITE=bookworm
INCLUDE=python3,git,patch
HERE=$(cd "$(dirname "$0")/.." && pwd)
CONTEXTS=$HERE/test/images/docker
# The base image's config: docker import leaves Env empty, and app's
# `ENV PATH=/opt/venv/bin:$PATH` must extend a real PATH (Debian's images set this one).
BASE_CHANGES=('ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'CMD ["bash"]')

started=$SECONDS
say() { printf '[test-images] %s\n' "$*" >&2; }
die() { say "FAILED: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it starts dockerd, runs debootstrap and writes $CACHE)"
for tool in debootstrap skopeo docker-registry curl python3 flock; do
  command -v "$tool" >/dev/null || die "$tool is missing (apt-get install debootstrap skopeo docker-registry curl python3 util-linux)"
done

# The docker.io CLI goes with the docker.io engine; a newer CLI elsewhere in
# PATH may default to BuildKit/buildx, which this engine's builds do not need.
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=$(command -v docker) || die "no docker CLI (apt-get install docker.io)"
export DOCKER_BUILDKIT=0

mkdir -p "$DIR" "$STATE" "$REGDIR"
# One run at a time: several test runs (or helpers) may call this at once.
exec 9>"$CACHE/.test-images.lock"
flock 9

state_get() { cat "$STATE/$1" 2>/dev/null || true; }
state_put() { printf '%s\n' "$2" >"$STATE/$1.tmp" && mv "$STATE/$1.tmp" "$STATE/$1"; }
image_id() { "$DOCKER" image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }
sha() { sha256sum | cut -d' ' -f1; }

# --- the engine ---------------------------------------------------------------
if ! "$DOCKER" info >/dev/null 2>&1; then
  command -v dockerd >/dev/null || die "docker info fails and dockerd is not installed (apt-get install docker.io)"
  say "docker info fails: starting dockerd (log: /var/log/dockerd.log)"
  # 9>&-: the daemons must not hold the lock of this run.
  setsid nohup dockerd >>/var/log/dockerd.log 2>&1 </dev/null 9>&- &
  for _ in $(seq 60); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 1; done
  "$DOCKER" info >/dev/null 2>&1 || die "dockerd did not answer within 60 s; /var/log/dockerd.log ends with:
$(tail -n 15 /var/log/dockerd.log)"
  say "dockerd is up"
fi

# --- the Debian root ----------------------------------------------------------
# The mirror apt uses here (a local mirror or proxy stays in use), else deb.debian.org.
debian_mirror() {
  {
    grep -hsE '^[[:space:]]*deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
      awk '{ for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; break } }'
    grep -hsE '^[[:space:]]*URIs:' /etc/apt/sources.list.d/*.sources | awk '{ for (i = 2; i <= NF; i++) print $i }'
  } | grep -vE -- '-security/?$' | grep -E '/debian/?$' | head -n 1
}
MIRROR=$(debian_mirror)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
eval "$(apt-config shell http_proxy Acquire::http::Proxy)"
[ -n "${http_proxy:-}" ] && export http_proxy

ROOTFS=$DIR/rootfs-$SUITE-minbase.tar
rootfs_args="$SUITE minbase $INCLUDE"
if [ ! -s "$ROOTFS" ] || [ "$(state_get rootfs.args)" != "$rootfs_args" ]; then
  work=$(mktemp -d "$CACHE/debootstrap.XXXXXX")
  # debootstrap mounts /proc and /sys (and may bind host devices) inside and
  # unmounts them when it exits; if any is left, it must be unmounted before
  # anything is packed or removed, or rm would reach the host's files.
  unmount_work() { findmnt -rno TARGET | { grep "^$work/" || true; } | sort -r | while read -r m; do umount -l "$m"; done; }
  trap 'unmount_work; rm -rf --one-file-system "$work"' EXIT
  say "debootstrap --variant=minbase --include=$INCLUDE $SUITE from $MIRROR (a few minutes) ..."
  if ! debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$work/root" "$MIRROR" >"$work/out.log" 2>&1; then
    tail -n 20 "$work/out.log" >&2
    [ -f "$work/root/debootstrap/debootstrap.log" ] && tail -n 20 "$work/root/debootstrap/debootstrap.log" >&2
    die "debootstrap of $SUITE from $MIRROR failed (output above)"
  fi
  unmount_work
  # Like Debian's own images: an empty /dev (device nodes in a layer are
  # refused by importers, MiniSandbox's included), no package caches.
  find "$work/root/dev" -mindepth 1 -delete
  rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"* "$work/root/debootstrap"
  tar -C "$work/root" --one-file-system --numeric-owner -cf "$ROOTFS.tmp" .
  mv "$ROOTFS.tmp" "$ROOTFS"
  sha <"$ROOTFS" >"$STATE/rootfs.sha256"
  state_put rootfs.args "$rootfs_args"
  rm -rf --one-file-system "$work"
  trap - EXIT
  say "rootfs tarball: $ROOTFS ($(du -h "$ROOTFS" | cut -f1))"
fi

# --- the images ---------------------------------------------------------------
# Each image is rebuilt when the hash of its inputs differs from the recorded
# one or the image with the recorded id is gone.
base_inputs=$( (cat "$STATE/rootfs.sha256"; printf '%s\n' "${BASE_CHANGES[@]}") | sha)
base_id=$(image_id msbx-test/base:1)
if [ -z "$base_id" ] || [ "$base_id" != "$(state_get base.id)" ] || [ "$base_inputs" != "$(state_get base.inputs)" ]; then
  say "docker import $ROOTFS as msbx-test/base:1"
  changes=()
  for c in "${BASE_CHANGES[@]}"; do changes+=(--change "$c"); done
  "$DOCKER" import "${changes[@]}" "$ROOTFS" msbx-test/base:1 >/dev/null
  base_id=$(image_id msbx-test/base:1)
  state_put base.id "$base_id"
  state_put base.inputs "$base_inputs"
fi

build() { # NAME: test/images/docker/NAME -> msbx-test/NAME:1
  local name=$1 ctx=$CONTEXTS/$1 inputs id
  [ -f "$ctx/Dockerfile" ] || die "$ctx/Dockerfile is missing"
  inputs=$( (echo "$base_id"; cd "$ctx" && find . -type f -print0 | sort -z | xargs -0 sha256sum) | sha)
  id=$(image_id "msbx-test/$name:1")
  if [ -z "$id" ] || [ "$id" != "$(state_get "$name.id")" ] || [ "$inputs" != "$(state_get "$name.inputs")" ]; then
    say "docker build msbx-test/$name:1 from $ctx"
    "$DOCKER" build -q -t "msbx-test/$name:1" "$ctx" >/dev/null || die "docker build of msbx-test/$name:1 failed"
    state_put "$name.id" "$(image_id "msbx-test/$name:1")"
    state_put "$name.inputs" "$inputs"
  fi
}
build app
build app2

# --- the archives ---------------------------------------------------------------
save() { # NAME: msbx-test/NAME:1 -> NAME.tar, when missing or of another image id
  local name=$1 id
  id=$(image_id "msbx-test/$name:1")
  if [ ! -s "$DIR/$name.tar" ] || [ "$(state_get "$name.tar.id")" != "$id" ]; then
    say "docker save msbx-test/$name:1 > $DIR/$name.tar"
    "$DOCKER" save -o "$DIR/$name.tar.tmp" "msbx-test/$name:1"
    mv "$DIR/$name.tar.tmp" "$DIR/$name.tar"
    state_put "$name.tar.id" "$id"
  fi
}
save app
save app2
save base

app_id=$(image_id msbx-test/app:1)
if [ ! -f "$DIR/app-oci/index.json" ] || [ "$(state_get app-oci.id)" != "$app_id" ]; then
  say "skopeo copy docker-archive:$DIR/app.tar oci:$DIR/app-oci:app"
  rm -rf "$DIR/app-oci.tmp"
  skopeo copy -q "docker-archive:$DIR/app.tar" "oci:$DIR/app-oci.tmp:app" >/dev/null
  rm -rf "$DIR/app-oci"
  mv "$DIR/app-oci.tmp" "$DIR/app-oci"
  state_put app-oci.id "$app_id"
fi

# --- the registry ---------------------------------------------------------------
registry_up() { curl -fsS -o /dev/null --max-time 3 "http://$REGISTRY/v2/" 2>/dev/null; }
if ! registry_up; then
  mkdir -p "$REGDIR/storage"
  cat >"$REGDIR/config.yml" <<EOF
# Written by scripts/test-images.sh: the test registry, loopback only.
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: $REGDIR/storage
  delete:
    enabled: true
http:
  addr: $REGISTRY
EOF
  say "starting docker-registry on $REGISTRY (config $REGDIR/config.yml, log $REGDIR/registry.log)"
  setsid nohup docker-registry serve "$REGDIR/config.yml" >>"$REGDIR/registry.log" 2>&1 </dev/null 9>&- &
  echo $! >"$REGDIR/registry.pid"
  for _ in $(seq 30); do registry_up && break; sleep 0.5; done
  registry_up || die "docker-registry did not answer on http://$REGISTRY/v2/; $REGDIR/registry.log ends with:
$(tail -n 15 "$REGDIR/registry.log")"
fi

# The config digest of the manifest the registry holds for NAME:1 (= the image id it was pushed from).
registry_config() {
  curl -fsS --max-time 10 -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
    "http://$REGISTRY/v2/msbx-test/$1/manifests/1" 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["config"]["digest"])' 2>/dev/null || true
}
for name in app app2; do
  id=$(image_id "msbx-test/$name:1")
  if [ "$(registry_config "$name")" != "$id" ]; then
    say "docker push $REGISTRY/msbx-test/$name:1"
    "$DOCKER" tag "msbx-test/$name:1" "$REGISTRY/msbx-test/$name:1"
    "$DOCKER" push -q "$REGISTRY/msbx-test/$name:1" >/dev/null || die "docker push to $REGISTRY failed"
    "$DOCKER" rmi "$REGISTRY/msbx-test/$name:1" >/dev/null # the tag only; the image stays
    [ "$(registry_config "$name")" = "$id" ] || die "the registry does not serve msbx-test/$name:1 with config $id after the push"
  fi
done

# Every user reads the fixtures (the tests also run as an unprivileged user).
chmod a+rx "$CACHE" "$DIR"
chmod -R a+rX "$DIR"

say "ready in $((SECONDS - started)) s: $DIR/{app,app2,base}.tar, $DIR/app-oci, registry http://$REGISTRY"
