#!/usr/bin/env bash
# setup.sh - make this Debian 12 machine ready to build, run and test gpusnap.
#
# Installs the Debian packages in scripts/debian-packages.txt (only those
# missing, without recommends), builds the self-contained CRIU bundle
# (scripts/build-criu-bundle.sh), fetches kubectl for the tests and builds
# gpusnap into build/. Every step
# is skipped when already done, so a second run takes seconds.
set -euo pipefail

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${GPUSNAP_BUILD_DIR:-$REPO_DIR/build}
log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

case "${1:-}" in
  -h|--help)
    echo "Usage: $0    (as root) install packages, build the CRIU bundle and gpusnap into $BUILD_DIR"
    exit 0 ;;
esac
[ "$(id -u)" -eq 0 ] || die "run as root: it installs Debian packages and CRIU needs root"

# 1. Debian packages.
mapfile -t packages < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$REPO_DIR/scripts/debian-packages.txt")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${#missing[@]} Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "Debian packages present"
fi

# 2. The CRIU bundle (Debian 12's own CRIU does not work on current kernels).
"$REPO_DIR/scripts/build-criu-bundle.sh" "$BUILD_DIR/criu-bundle"

# 3. kubectl for the Kubernetes tests (Debian 12 has none recent enough).
"$REPO_DIR/scripts/fetch-kubectl.sh" "$BUILD_DIR/tools/kubectl"

# 4. gpusnap.
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  log "configuring"
  cmake -S "$REPO_DIR" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
log "building"
cmake --build "$BUILD_DIR" -- -j"$(nproc)" | grep -vE '^\[[0-9]+/[0-9]+\]' || true
[ -x "$BUILD_DIR/gpusnap" ] || die "build failed"
log "ready: $BUILD_DIR/gpusnap ($("$BUILD_DIR/gpusnap" version | tail -1))"
