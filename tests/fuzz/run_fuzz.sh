#!/usr/bin/env bash
# run_fuzz.sh BUILD_DIR [RUNS] - build the agent's libFuzzer target with clang
# into BUILD_DIR and run it over RUNS inputs (default 200000), starting from
# the checked-in corpus (copied: libFuzzer adds to the corpus it is given).
# Exits 77 (skipped) where clang or its libFuzzer runtime is not installed.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD_DIR=${1:?usage: run_fuzz.sh BUILD_DIR [RUNS]}
RUNS=${2:-200000}
CLANGXX=$(command -v clang++ || command -v clang++-14 || true)
if [ -z "$CLANGXX" ] || ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    "$CLANGXX" -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  echo "clang++ with libFuzzer (clang, libclang-rt-14-dev) is not installed: skipped"
  exit 77
fi
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  CXX="$CLANGXX" cmake -S "$HERE" -B "$BUILD_DIR" -G Ninja >/dev/null
fi
cmake --build "$BUILD_DIR" -- -j"$(nproc)" >/dev/null
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
cp "$HERE"/corpus/* "$corpus"/
# libFuzzer's own failure status is 77, which ctest would take for "skipped".
"$BUILD_DIR/agent_request_fuzz" -runs="$RUNS" -max_len=4096 -seed=1 -error_exitcode=1 \
  -artifact_prefix="$BUILD_DIR/" "$corpus" >"$BUILD_DIR/fuzz.log" 2>&1 || {
  tail -n 30 "$BUILD_DIR/fuzz.log"
  exit 1
}
tail -n 2 "$BUILD_DIR/fuzz.log"
