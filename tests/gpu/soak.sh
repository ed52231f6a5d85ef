#!/bin/bash
# A GPU node's day in a few minutes: SOAK_CYCLES cycles on one GPU, mixing
# `run` (plain and --gpushare), `checkpoint` (with and without
# --leave-running), `restore`, `restore --standby` + `wake`, `gpushare
# suspend`/`resume` and `kill`, over the suite's workloads (gpu_counter,
# pinned_reader, share_pair) and the bench's server with its KV-cache pool.
# Every cycle checks the workload's own state (its step sequence unbroken, the
# server's tokens those of its first answer); after every kill the GPU's
# processes and memory return to what they were before the cycle; at the end
# nothing is left behind (tests/gpu/lib.sh). Prints each cycle's time, then
# the cycles, failures, GPU and host memory at start and end, and the slowest
# cycle. Exits 77 (skip) without an NVIDIA GPU.
#
# Env: GPUSNAP_BIN       the gpusnap binary (default build/gpusnap)
#      GPU_TESTS_BIN     gpu_counter and pinned_reader (default build/gpu-tests; built when missing)
#      SOAK_CYCLES       cycles (default 60)
#      SOAK_SERVER_EVERY every Nth cycle is the server's (default 12; 0: none)
#      SOAK_MODEL        the server's model (default 1b); SOAK_KV_GIB its KV-cache pool (default 8)
#      SOAK_OUT          where output goes (default a temp dir)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=tests/gpu/lib.sh
. "$here/lib.sh"
skip_without_gpu
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
GPUSNAP=${GPUSNAP_BIN:-$root/build/gpusnap}
BIN=${GPU_TESTS_BIN:-$root/build/gpu-tests}
WL=$(dirname "$GPUSNAP")/workloads
CYCLES=${SOAK_CYCLES:-60}
SERVER_EVERY=${SOAK_SERVER_EVERY:-12}
MODEL=${SOAK_MODEL:-1b}
OUT=${SOAK_OUT:-$(mktemp -d /tmp/gpusnap-soak-XXXXXX)}
PORT=18431
mkdir -p "$OUT" "$BIN"
export GPUSNAP_STORE="$OUT/store" GPUSNAP_RUN_DIR="$OUT/run"
trap 'for n in $("$GPUSNAP" --json ps 2>/dev/null | python3 -c "import json, sys; print(\" \".join(w[\"name\"] for w in json.load(sys.stdin) if w[\"state\"] != \"exited\"))"); do "$GPUSNAP" kill "$n" >/dev/null 2>&1; done; rm -rf "$GPUSNAP_STORE"' EXIT
for src in "$here"/workloads/*.cu; do
  name=$(basename "$src" .cu)
  [ -x "$BIN/$name" ] || /usr/local/cuda/bin/nvcc -O2 -std=c++17 -gencode 'arch=compute_90,code=[sm_90,compute_90]' \
    -o "$BIN/$name" "$src" || exit 1
done

failures=0
cycle_failed=0
fail() { echo "FAIL: cycle $cycle ($kind): $*"; cycle_failed=1; }
gs() { "$GPUSNAP" "$@"; }
# run_wl NAME [RUN FLAGS] -- CMD...: sets $pid.
run_wl() {
  local name=$1
  shift
  rm -f "$OUT/$name.out"  # a cycle's steps start at 1 again
  pid=$(gs run --name "$name" --log "$OUT/$name.out" "$@") || { fail "run failed"; return 1; }
}
steps_go_on() {  # NAME: reaches 3 steps past the last, unbroken
  local f="$OUT/$1.out" from
  from=$(last_step "$f")
  wait_for "$f" "^step $((${from:-0} + 3)) " 60 || { fail "$1: no progress: $(tail -2 "$f")"; return 1; }
  steps_contiguous "$f" || { fail "$1: the sequence broke: $(grep -m2 -e MISMATCH -e SIGSEGV -e error "$f")"; return 1; }
}
steps_go_on_after_restore() {  # NAME: a log that starts mid-sequence: 3 steps, each one more than the last
  local f="$OUT/$1.out"
  wait_for "$f" '^step [0-9]+ ' 60 || { fail "$1: no step after the restore"; return 1; }
  local from; from=$(grep -m1 -oE '^step [0-9]+' "$f" | cut -d' ' -f2)
  wait_for "$f" "^step $((from + 3)) " 60 || { fail "$1: no progress after the restore: $(tail -2 "$f")"; return 1; }
  grep -q -e MISMATCH -e SIGSEGV -e 'CUDA error' "$f" && { fail "$1: $(grep -m1 -e MISMATCH -e SIGSEGV -e 'CUDA error' "$f")"; return 1; }
  grep -oE '^step [0-9]+' "$f" | cut -d' ' -f2 | awk -v s="$from" '$1 != s + NR - 1 { exit 1 }' ||
    { fail "$1: the sequence broke after the restore"; return 1; }
}
snapshot_of() { gs checkpoint -q "$@" || { fail "checkpoint $* failed"; return 1; }; }
restore_as() {  # SNAPSHOT [FLAGS]: sets $pid
  pid=$(gs restore "$@") || { fail "restore $* failed"; return 1; }
}
standby_then_wake() {  # SNAPSHOT NAME: restored as a standby holding no GPU, then woken
  gs restore "$1" --standby --name "$2" >/dev/null || { fail "restore --standby failed"; return 1; }
  local sb
  sb=$(gs --json ps | python3 -c 'import json, sys; print(next(w["pid"] for w in json.load(sys.stdin) if w["name"] == sys.argv[1]))' "$2")
  [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -w -e "$sb" $(for c in $(cat "/proc/$sb/task/$sb/children" 2>/dev/null); do echo "-e $c"; done))" ] ||
    fail "the standby $2 holds GPU memory"
  gs wake "$2" >/dev/null || { fail "wake failed"; return 1; }
}
forget() { gs rm "$@" >/dev/null 2>&1; }

cycle_counter_plain() {  # run, checkpoint, restore, kill
  run_wl cc -- "$BIN/gpu_counter" --gib 1 --interval-ms 50 && wait_for "$OUT/cc.out" '^step 3 ' 60 || return
  local snap; snap=$(snapshot_of cc) || return
  restore_as "$snap" && steps_go_on cc
  end_workload cc; forget "$snap"
}
cycle_counter_gpushare() {  # run --gpushare, suspend/resume, checkpoint --leave-running, kill, restore, kill
  run_wl cg --gpushare -- "$BIN/gpu_counter" --gib 2 --interval-ms 50 && wait_for "$OUT/cg.out" '^step 3 ' 60 || return
  gs gpushare suspend "$pid" >/dev/null && gs gpushare resume "$pid" >/dev/null || { fail "suspend/resume failed"; return; }
  steps_go_on cg || return
  local snap; snap=$(snapshot_of cg --leave-running) || return
  steps_go_on cg || return
  end_workload cg
  # The restored process goes on from the checkpoint: it prints again the
  # steps the source printed after it, into a log of its own.
  mv "$OUT/cg.out" "$OUT/cg.source.out" && : >"$OUT/cg.out"
  restore_as "$snap" && steps_go_on_after_restore cg
  end_workload cg; forget "$snap"
}
cycle_pinned_standby() {  # run, checkpoint, restore --standby, wake, kill
  run_wl ps_ -- "$BIN/pinned_reader" --mib 256 --interval-ms 50 && wait_for "$OUT/ps_.out" '^step 3 ' 60 || return
  local snap; snap=$(snapshot_of ps_) || return
  standby_then_wake "$snap" ps_ && steps_go_on ps_
  end_workload ps_; forget "$snap"
}
cycle_share_pair() {  # two processes sharing through a VMM fd, under gpushare: checkpoint, restore, kill
  run_wl sp --gpushare -- "$WL/share_pair" --share fd --mib 256 --interval-ms 50 --device 0 --importer-device 0 &&
    wait_for "$OUT/sp.out" '^step 3 ' 60 || return
  local snap; snap=$(snapshot_of sp) || return
  restore_as "$snap" && steps_go_on sp
  end_workload sp; forget "$snap"
}
cycle_counter_gpushare_standby() {  # run --gpushare, checkpoint, restore --standby, wake, kill
  run_wl cs --gpushare -- "$BIN/gpu_counter" --gib 2 --interval-ms 50 && wait_for "$OUT/cs.out" '^step 3 ' 60 || return
  local snap; snap=$(snapshot_of cs) || return
  standby_then_wake "$snap" cs && steps_go_on cs
  end_workload cs; forget "$snap"
}
answer() { python3 "$root/bench/client.py" --port "$PORT" | python3 -c 'import json, sys; print(json.load(sys.stdin)["tokens"])'; }
cycle_server() {  # the static-engine server under gpushare: checkpoint --leave-running, kill, restore, standby + wake
  run_wl srv --gpushare -- python3 "$root/bench/server.py" --model "$MODEL" --engine static \
    --kv-cache-gib "${SOAK_KV_GIB:-8}" --port "$PORT" --weights-dir "${GPU_TEST_WEIGHTS:-/tmp/gpusnap-weights}" || return
  local first now snap
  first=$(answer) || { fail "the server's first answer failed: $(tail -3 "$OUT/srv.out")"; return; }
  snap=$(snapshot_of srv --leave-running) || return
  now=$(answer) && [ "$now" = "$first" ] || { fail "the source's answer changed after checkpoint --leave-running"; return; }
  end_workload srv
  restore_as "$snap" || return
  now=$(answer) && [ "$now" = "$first" ] || { fail "the restored server answered other tokens"; return; }
  end_workload srv
  standby_then_wake "$snap" srv || return
  now=$(answer) && [ "$now" = "$first" ] || { fail "the woken server answered other tokens"; return; }
  end_workload srv; forget "$snap"
}
kinds=(cycle_counter_plain cycle_counter_gpushare cycle_pinned_standby cycle_share_pair cycle_counter_gpushare_standby)

python3 "$root/bench/server.py" --model "$MODEL" --prepare --weights-dir "${GPU_TEST_WEIGHTS:-/tmp/gpusnap-weights}" >/dev/null ||
  { echo "FAIL: writing the $MODEL weights"; exit 1; }
note_machine_state
echo "soak: $CYCLES cycles on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); gpusnap $GPUSNAP; output $OUT"
slowest=0 slowest_at=""
start_all=$(date +%s.%N)
for ((cycle = 1; cycle <= CYCLES; cycle++)); do
  if [ "$SERVER_EVERY" -gt 0 ] && [ $((cycle % SERVER_EVERY)) = 0 ]; then kind=cycle_server
  else kind=${kinds[$(((cycle - 1) % ${#kinds[@]}))]}; fi
  cycle_failed=0
  gpu_before=$(gpu_pids); used_before=$(gpu_used_mib)
  t0=$(date +%s.%N)
  $kind
  t=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t0" "$(date +%s.%N)")
  for ((i = 0; i < 100; i++)); do [ "$(gpu_pids)" = "$gpu_before" ] && break; sleep 0.1; done
  [ "$(gpu_pids)" = "$gpu_before" ] || fail "GPU processes after the kill: $(gpu_pids) (before: ${gpu_before:-none})"
  used_after=$(gpu_used_mib)
  [ "$used_after" -le $((used_before + 64)) ] || fail "GPU memory used ${used_after} MiB after the kill, ${used_before} MiB before"
  failures=$((failures + cycle_failed))
  echo "cycle $cycle ${kind#cycle_}: $t s, GPU ${used_after} MiB used$([ "$cycle_failed" = 0 ] || echo ", FAILED")"
  if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$t" "$slowest"; then
    slowest=$t slowest_at="cycle $cycle (${kind#cycle_})"
  fi
done
kind=end cycle=end
left_behind
failures=$((failures + cycle_failed))
total=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.0f}')" "$start_all" "$(date +%s.%N)")
echo "soak: $CYCLES cycles in $total s, $failures failure(s); slowest: $slowest_at, $slowest s"
[ "$failures" = 0 ]
