#!/usr/bin/env bash
# pack-portable.sh - gather gpusnap into one relocatable directory for another
# Linux x86-64 node (a GPU node running another distribution, the webhook's
# node bundle): the binary with its non-glibc libraries beside it (RPATH
# $ORIGIN/lib, so no LD_LIBRARY_PATH reaches CRIU or a workload), the CRIU
# bundle, and the test workloads.
#
# usage: scripts/pack-portable.sh [--with-registry] [OUTDIR]     (default build/portable)
set -euo pipefail
WITH_REGISTRY=0
if [ "${1:-}" = --with-registry ]; then WITH_REGISTRY=1; shift; fi
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${GPUSNAP_BUILD_DIR:-$REPO_DIR/build}
OUT=${1:-$BUILD_DIR/portable}
[ -x "$BUILD_DIR/gpusnap" ] || { echo "build gpusnap first (scripts/setup.sh)" >&2; exit 1; }

tmp=$(mktemp -d "${OUT%/}.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lib"
cp "$BUILD_DIR/gpusnap" "$tmp/gpusnap"
# Every shared library but glibc's own (the node's glibc is as new or newer).
ldd "$BUILD_DIR/gpusnap" | awk '/=> \// {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|ld-linux*|libpthread.so.*|libdl.so.*|librt.so.*) ;;
    *) cp -L "$lib" "$tmp/lib/" ;;
  esac
done
strip --strip-debug "$tmp/gpusnap"
# The gpushare shim goes beside the binary, where `gpusnap run --gpushare`
# looks first; it needs nothing but the node's libstdc++.
if [ -f "$BUILD_DIR/libgpusnap_gpushare.so" ]; then
  cp "$BUILD_DIR/libgpusnap_gpushare.so" "$tmp/"
  strip --strip-debug "$tmp/libgpusnap_gpushare.so"
fi
# The GPU suite's check of the shim's fingerprint kernel against its
# reference (tests/gpu/run_gpu_tests.sh), when it was built.
if [ -x "$BUILD_DIR/gpusnap_fingerprint_check" ]; then
  cp "$BUILD_DIR/gpusnap_fingerprint_check" "$tmp/"
  strip --strip-debug "$tmp/gpusnap_fingerprint_check"
  patchelf --force-rpath --set-rpath '$ORIGIN/lib' "$tmp/gpusnap_fingerprint_check"
fi
patchelf --force-rpath --set-rpath '$ORIGIN/lib' "$tmp/gpusnap"
for lib in "$tmp"/lib/*; do patchelf --force-rpath --set-rpath '$ORIGIN' "$lib"; done
cp -a "$BUILD_DIR/criu-bundle" "$tmp/criu-bundle"
[ -d "$BUILD_DIR/workloads" ] && cp -a "$BUILD_DIR/workloads" "$tmp/workloads"
# With --with-registry, Debian's docker-registry (it needs only glibc) for the
# benchmarks' registry on a node that has none: tools/docker-registry.
if [ "${WITH_REGISTRY:-0}" = 1 ] && command -v docker-registry >/dev/null; then
  mkdir -p "$tmp/tools"
  cp "$(command -v docker-registry)" "$tmp/tools/docker-registry"
  strip --strip-debug "$tmp/tools/docker-registry" 2>/dev/null || true
fi
rm -rf "$OUT"
mv "$tmp" "$OUT"
trap - EXIT
echo "[pack] $OUT ($(du -sh "$OUT" | cut -f1)): run $OUT/gpusnap"
