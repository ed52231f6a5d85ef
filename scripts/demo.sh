#!/usr/bin/env bash
# demo.sh - set everything up (scripts/setup.sh), then checkpoint and restore a
# demo workload: the GPU inference server of bench/ where a GPU is present
# (bench/run_bench.sh), else a CPU process tree that counts.
set -euo pipefail
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${GPUSNAP_BUILD_DIR:-$REPO_DIR/build}
"$REPO_DIR/scripts/setup.sh"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && [ -x "$REPO_DIR/bench/run_bench.sh" ]; then
  exec "$REPO_DIR/bench/run_bench.sh" --demo
fi

G="$BUILD_DIR/gpusnap"
demo=$(mktemp -d /tmp/gpusnap-demo.XXXXXX)
export GPUSNAP_STORE="$demo/store" GPUSNAP_RUN_DIR="$demo/run"
count() { cut -d: -f2 "/proc/$1/comm"; }
cleanup() {
  for r in $("$G" --json ps | python3 -c 'import json,sys; print(" ".join(str(w["reaper_pid"]) for w in json.load(sys.stdin) if w["running"]))'); do
    kill "$r" 2>/dev/null || true
  done
  data="$demo/data"
  rm -rf "$demo" "/dev/shm/gpusnap-counter${data//\//_}"
}
trap cleanup EXIT

echo "== no GPU here: the demo checkpoints a CPU process tree (threads, children, pipes, sockets, files)"
mkdir -p "$demo/data"
pid=$("$G" run --name demo -- "$BUILD_DIR/workloads/counter" "$demo/data")
sleep 2
echo "== running as pid $pid, count $(count "$pid")"
id=$("$G" checkpoint demo | tail -1)
echo "== checkpointed into snapshot $id; the source is gone"
"$G" ls
new=$("$G" restore "$id" | tail -1)
first=$(count "$new")
sleep 1
echo "== restored as pid $new: count went on from $first to $(count "$new") (not from zero)"
"$G" ps
grep -q FAIL "$demo/run/logs/demo.log" && { echo "the workload reported a failure:"; cat "$demo/run/logs/demo.log"; exit 1; }
echo "== demo OK"
