#!/usr/bin/env bash
# test.sh - set everything up (scripts/setup.sh), then run every test: unit
# tests and end-to-end tests with the real CRIU on real processes. GPU tests
# (tests/gpu) report themselves skipped where there is no GPU.
set -euo pipefail
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${GPUSNAP_BUILD_DIR:-$REPO_DIR/build}
"$REPO_DIR/scripts/setup.sh"
# End-to-end tests share ports and namespaces: one at a time.
# The modules list their skipped tests here (tests/e2e/run_module.py), also
# those of modules that passed, which ctest counts as passed.
SKIPS_FILE="$BUILD_DIR/test-skips.txt"
: >"$SKIPS_FILE"
status=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j1 "$@" || status=$?
if [ -s "$SKIPS_FILE" ]; then
  echo "$(wc -l <"$SKIPS_FILE") tests skipped:"
  sed 's/^/  /' "$SKIPS_FILE"
fi
exit "$status"
