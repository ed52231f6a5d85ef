#!/bin/bash
# GPU tests of `gpusnap cuda` against the real driver on a real GPU: the
# workloads of tests/gpu/workloads are suspended and resumed and must go on
# exactly where they were. Exits 77 (skip) on a machine without an NVIDIA GPU.
#
# Env: GPUSNAP_BIN    the gpusnap binary (default build/gpusnap)
#      GPU_TESTS_BIN  directory of gpu_counter and pinned_reader (default
#                     build/gpu-tests; built here with nvcc when missing)
#      GPU_TEST_GIB   device memory gpu_counter holds (default 4)
#      GPU_TESTS_OUT  where the workloads' output goes (default a temp dir)
#      GPU_TESTS      the tests to run (default all), e.g. test_llm_server_cycles
#      GPU_TEST_MODEL, GPU_TEST_CYCLES  the server test's model (8b) and cycles (5)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=tests/gpu/lib.sh
. "$here/lib.sh"
skip_without_gpu
GPUSNAP=${GPUSNAP_BIN:-$root/build/gpusnap}
BIN=${GPU_TESTS_BIN:-$root/build/gpu-tests}
GIB=${GPU_TEST_GIB:-4}
OUT=${GPU_TESTS_OUT:-$(mktemp -d /tmp/gpusnap-gpu-tests-XXXXXX)}
mkdir -p "$OUT"
[ -x "$GPUSNAP" ] || { echo "FAIL: no gpusnap binary at $GPUSNAP"; exit 1; }

build_workloads() {
  local nvcc
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  mkdir -p "$BIN"
  for src in "$here"/workloads/*.cu; do
    local name
    name=$(basename "$src" .cu)
    [ -x "$BIN/$name" ] && continue
    echo "building $name with $nvcc"
    "$nvcc" -O2 -std=c++17 -gencode 'arch=compute_90,code=[sm_90,compute_90]' -o "$BIN/$name" "$src" || exit 1
  done
}
build_workloads

started=()  # every workload this script started; killed on exit
trap 'for p in "${started[@]}"; do kill -9 "$p" 2>/dev/null; done' EXIT
failures=0
current=""

fail() { echo "FAIL: $current: $*"; failures=$((failures + 1)); }
# start NAME CMD... : runs CMD in the background, output in $OUT/NAME.out; sets $pid.
start() {
  local name=$1
  shift
  "$@" >"$OUT/$name.out" 2>&1 &
  pid=$!
  started+=("$pid")
}
# running NAME STEP: NAME's output reaches step STEP.
running() {
  wait_for "$OUT/$1.out" "^step $2 " 120 || { fail "$1 did not reach step $2: $(tail -3 "$OUT/$1.out")"; return 1; }
}
# goes_on NAME FROM: after a resume, NAME reaches step FROM + 3 with its sequence unbroken.
goes_on() {
  local f="$OUT/$1.out"
  wait_for "$f" "^step $(($2 + 3)) " 60 || { fail "$1: no progress after resume: $(tail -3 "$f")"; return 1; }
  steps_contiguous "$f" || { fail "$1: the sequence broke: $(grep -m3 -e MISMATCH -e SIGSEGV -e error "$f")"; return 1; }
}
# passed FAILURES_BEFORE
passed() { [ "$failures" = "$1" ] && echo "PASS: $current"; }
gs() { echo "+ gpusnap $*" >&2; "$GPUSNAP" "$@"; }
uuid_of_gpu() { nvidia-smi --query-gpu=index,uuid --format=csv,noheader | awk -F', ' -v i="$1" '$1 == i { print $2 }'; }

test_counter_suspend_resume() {
  current="gpu_counter ${GIB} GiB: suspend, resume"
  start counter "$BIN/gpu_counter" --gib "$GIB" --interval-ms 100
  local p=$pid
  running counter 5 || return
  [ -n "$(gpu_mem_of "$p")" ] || fail "nvidia-smi does not list pid $p before the suspend"
  gs cuda suspend "$p" || { fail "suspend failed"; return; }
  [ "$(gs cuda state "$p")" = "$p CHECKPOINTED" ] || fail "state is not CHECKPOINTED"
  [ -z "$(gpu_mem_of "$p")" ] || fail "pid $p still holds GPU memory while CHECKPOINTED"
  local before during
  before=$(last_step "$OUT/counter.out")
  sleep 2
  during=$(last_step "$OUT/counter.out")
  [ "$during" = "$before" ] || fail "it advanced while checkpointed ($before -> $during)"
  gs cuda resume "$p" || { fail "resume failed"; return; }
  goes_on counter "$before"
  kill "$p"
  passed "$1"
}

test_two_counters_in_one_call() {
  current="two gpu_counters: suspend and resume in one gpusnap call"
  start counter_a "$BIN/gpu_counter" --gib 1 --interval-ms 100
  local a=$pid
  start counter_b "$BIN/gpu_counter" --gib 1 --interval-ms 100
  local b=$pid
  running counter_a 3 && running counter_b 3 || return
  gs cuda suspend "$a" "$b" || { fail "suspend failed"; return; }
  [ "$(gs cuda state "$a" "$b" | awk '{print $2}' | sort -u)" = "CHECKPOINTED" ] || fail "not both CHECKPOINTED"
  local sa sb
  sa=$(last_step "$OUT/counter_a.out")
  sb=$(last_step "$OUT/counter_b.out")
  gs cuda resume "$a" "$b" || { fail "resume failed"; return; }
  goes_on counter_a "$sa"
  goes_on counter_b "$sb"
  kill "$a" "$b"
  passed "$1"
}

test_gpu_map() {
  current="gpu_counter moved from GPU 0 to GPU 1 (--gpu-map 0=1,1=0)"
  if [ "$(nvidia-smi -L | grep -c '^GPU ')" -lt 2 ]; then
    echo "SKIP: $current: needs 2 GPUs"
    return
  fi
  start moved "$BIN/gpu_counter" --gib 1 --interval-ms 100 --device 0
  local p=$pid uuid1
  uuid1=$(uuid_of_gpu 1)
  running moved 3 || return
  gs cuda suspend "$p" || { fail "suspend failed"; return; }
  local before
  before=$(last_step "$OUT/moved.out")
  gs cuda resume --gpu-map 0=1,1=0 "$p" || { fail "resume failed"; return; }
  goes_on moved "$before"
  [ "$(gpu_mem_of "$p")" = "$uuid1" ] || fail "pid $p is on $(gpu_mem_of "$p"), not GPU 1 ($uuid1)"
  kill "$p"
  passed "$1"
}

test_pinned_reader_paused() {
  current="pinned_reader, reader paused across suspend/resume"
  start pinned "$BIN/pinned_reader" --mib 256 --interval-ms 100
  local p=$pid
  running pinned 3 || return
  kill -USR1 "$p"
  wait_for "$OUT/pinned.out" '^reader paused' 10 || { fail "reader did not pause"; return; }
  gs cuda suspend "$p" || { fail "suspend failed"; return; }
  sleep 1
  gs cuda resume "$p" || { fail "resume failed"; return; }
  kill -USR2 "$p"
  local before
  before=$(last_step "$OUT/pinned.out")
  goes_on pinned "$before"
  kill "$p"
  passed "$1"
}

# Informational: what a CPU thread that keeps reading pinned memory meets while
# the GPU is checkpointed (docs/GPU-CHECKPOINT.md, "Checkpoint", step 3).
# Never counted as a failure.
# probe_pinned_reader_running 0|1 (0: the reader only reads; 1: it also writes)
probe_pinned_reader_running() {
  current="pinned_reader, reader running across suspend/resume, --write $1"
  start "pinned_live_$1" "$BIN/pinned_reader" --mib 256 --interval-ms 100 --write "$1"
  local p=$pid f="$OUT/pinned_live_$1.out"
  wait_for "$f" '^step 3 ' 120 || { echo "INFO: $current: did not start"; return; }
  gs cuda suspend "$p" >/dev/null 2>&1
  local mark
  mark=$(wc -l <"$f")
  sleep 3
  local during
  during=$(tail -n +"$((mark + 1))" "$f" | grep -c '^reader rounds')
  local rounds_during
  rounds_during=$(tail -n +"$((mark + 1))" "$f" | grep '^reader rounds' | sed -n '1p;$p' | awk '{print $3}' | tr '\n' ' ')
  local after="dead"
  if kill -0 "$p" 2>/dev/null; then
    gs cuda resume "$p" >/dev/null 2>&1
    local before
    before=$(last_step "$f")
    if wait_for "$f" "^step $((before + 3)) " 20; then after="alive, steps go on"; else after="alive, no steps after resume"; fi
  fi
  echo "INFO: $current: while checkpointed $during reader reports (rounds $rounds_during); fault: $(grep -m1 -e SIGSEGV -e MISMATCH "$f" || echo none); after resume: $after"
  kill -9 "$p" 2>/dev/null
  wait "$p" 2>/dev/null  # no "Killed" job notice
}


# --- gpusnap checkpoint / restore of whole workloads (CRIU + the driver) ----
export GPUSNAP_STORE="$OUT/store" GPUSNAP_RUN_DIR="$OUT/run"
reapers=()  # namespaces this script started; stopped on exit
stores=("$GPUSNAP_STORE")  # and the tests' own stores
# The suite's snapshots (tens of GiB a run) go with it: runs in a row on one
# disk must not fill it. The workloads' output stays for reading.
trap 'for p in "${started[@]}"; do kill -9 "$p" 2>/dev/null; done; for r in "${reapers[@]}"; do kill "$r" 2>/dev/null; done; rm -rf "${stores[@]}"' EXIT

# run_ns NAME CMD...: `gpusnap run` with output in $OUT/NAME.out; sets $pid.
run_ns() {
  local name=$1
  shift
  pid=$(gs run --name "$name" --log "$OUT/$name.out" -- "$@") || return 1
  reapers+=("$(reaper_of "$pid")")
}
# cr NAME [restore flags...]: checkpoint NAME, check the source is gone,
# restore; sets $pid to the restored host pid and $before to the last step.
cr() {
  local name=$1 src=$pid snap
  shift
  snap=$(timeout 240 "$GPUSNAP" checkpoint -q "$name") || { fail "checkpoint failed"; return 1; }
  local i
  for ((i = 0; i < 100; i++)); do kill -0 "$src" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$src" 2>/dev/null && [ "$(ps -o stat= -p "$src")" != Z ] && { fail "source $src still runs"; return 1; }
  before=$(last_step "$OUT/$name.out")
  pid=$(timeout 240 "$GPUSNAP" restore "$snap" "$@") || { fail "restore failed"; return 1; }
  reapers+=("$(reaper_of "$pid")")
}

test_counter_checkpoint_restore() {
  current="(a) gpu_counter ${GIB} GiB: checkpoint, restore into a new pid namespace"
  run_ns gc "$BIN/gpu_counter" --gib "$GIB" --interval-ms 100 || { fail "run failed"; return; }
  running gc 5 || return
  cr gc || return
  goes_on gc "$before"
  end_workload gc
  passed "$1"
}

test_pinned_checkpoint_restore() {
  current="(c) pinned_reader: CPU thread reading pinned memory through checkpoint and restore"
  run_ns pr "$BIN/pinned_reader" --mib 256 --interval-ms 100 || { fail "run failed"; return; }
  running pr 3 || return
  cr pr || return
  goes_on pr "$before"
  grep -q -e SIGSEGV -e MISMATCH "$OUT/pr.out" && fail "$(grep -m1 -e SIGSEGV -e MISMATCH "$OUT/pr.out")"
  end_workload pr
  passed "$1"
}

# moved_to_gpu1 NAME [RUN FLAGS...]: gpu_counter started on GPU 0 (with RUN
# FLAGS), checkpointed, restored with --gpus 1; its sequence goes on there.
moved_to_gpu1() {
  local name=$1 uuid1
  shift
  if [ "$(nvidia-smi -L | grep -c '^GPU ')" -lt 2 ]; then
    echo "SKIP: $current: needs 2 GPUs"
    return 1
  fi
  uuid1=$(uuid_of_gpu 1)
  pid=$(gs run "$@" --name "$name" --log "$OUT/$name.out" -- "$BIN/gpu_counter" --gib 2 --interval-ms 100 --device 0) ||
    { fail "run failed"; return 1; }
  reapers+=("$(reaper_of "$pid")")
  running "$name" 3 || return 1
  cr "$name" --gpus 1 || return 1
  goes_on "$name" "$before" || return 1
  [ "$(gpu_mem_of "$pid")" = "$uuid1" ] || { fail "restored pid $pid is on $(gpu_mem_of "$pid"), not GPU 1 ($uuid1)"; return 1; }
  end_workload "$name"
}

test_restore_on_other_gpu() {
  current="(d) gpu_counter checkpointed on GPU 0, restored on GPU 1"
  moved_to_gpu1 moved_cr && passed "$1"
}


# gpushare (e), the shim's part on a real driver: gpu_counter (cudart, static:
# it reaches the driver through dlsym and cuGetProcAddress) started with the
# shim; its device memory leaves the GPU while suspended in place and comes
# back at the same addresses; then a checkpoint whose device memory goes
# through the chunk store instead of CRIU's images.
test_gpushare_counter() {
  current="gpushare: gpu_counter ${GIB} GiB with the shim: suspend/resume in place, checkpoint/restore through the chunk store"
  pid=$(gs run --gpushare --name gsc --log "$OUT/gsc.out" -- "$BIN/gpu_counter" --gib "$GIB" --interval-ms 100) ||
    { fail "run --gpushare failed"; return; }
  reapers+=("$(reaper_of "$pid")")
  running gsc 3 || return
  gs gpushare state "$pid" || { fail "gpushare state failed"; return; }
  local held suspended step
  held=$(gpu_mem_mib_of "$pid")
  gs gpushare suspend "$pid" || { fail "gpushare suspend failed"; return; }
  suspended=$(gpu_mem_mib_of "$pid")
  echo "INFO: GPU memory of pid $pid: ${held:-?} MiB running, ${suspended:-?} MiB suspended"
  [ -n "$suspended" ] && [ "$suspended" -lt $((GIB * 1024 / 2)) ] || fail "suspended, it still holds ${suspended:-?} MiB"
  step=$(last_step "$OUT/gsc.out")
  sleep 1
  [ "$(last_step "$OUT/gsc.out")" -le $((step + 1)) ] || fail "steps went on while suspended"
  gs gpushare resume "$pid" || { fail "gpushare resume failed"; return; }
  goes_on gsc "$(last_step "$OUT/gsc.out")" || return
  cr gsc || return
  local bytes
  bytes=$("$GPUSNAP" --json ls | python3 -c 'import json, sys; print(json.load(sys.stdin)[-1]["total_bytes"])')
  echo "INFO: snapshot of a ${GIB} GiB gpu_counter with the shim: $((bytes >> 20)) MiB (the device memory is in the chunk store)"
  [ "$bytes" -lt $((GIB << 30)) ] || fail "the snapshot holds $bytes bytes: the device memory went through CRIU"
  goes_on gsc "$before" || return
  gs gpushare state "$pid" || fail "gpushare state after restore failed"
  end_workload gsc
  passed "$1"
}

# The unchanged-chunk release: the fingerprint kernel's PTX equals its
# reference on this GPU (a byte flipped deep in a chunk changes that chunk's
# fingerprint only), then gpu_counter holding 16 GiB, of which 15 never change
# (as a server's weights), is checkpointed with --leave-running three times
# with GPUSNAP_GPUSHARE_KEEP=0: the first release copies every chunk, the next
# ones only the 1 GiB that steps, and the source loads its memory back. A
# fourth time keeping it (the default: gpusnap holds the memory through the
# driver's checkpoint and the source adopts it back). Prints each release's
# copies and the pause.
test_gpushare_unchanged_chunks() {
  current="gpushare: a release copies only the chunks changed since they were stored"
  local check json round
  check=$(dirname "$GPUSNAP")/gpusnap_fingerprint_check
  [ -x "$check" ] || { fail "no $check (build target gpusnap_fingerprint_check)"; return; }
  "$check" --gib 16 >"$OUT/fingerprint_check.out" 2>&1
  local rc=$?
  cat "$OUT/fingerprint_check.out"
  [ "$rc" = 0 ] || { fail "$check exited $rc: the fingerprint kernel differs from its reference, or failed, on this GPU"; return; }
  pid=$(gs run --gpushare --name gsu --log "$OUT/gsu.out" -- "$BIN/gpu_counter" --gib 1 --static-gib 15 \
    --interval-ms 100) || { fail "run --gpushare failed"; return; }
  reapers+=("$(reaper_of "$pid")")
  running gsu 3 || return
  for round in 1 2 3 4; do
    local keep=0
    [ "$round" = 4 ] && keep=1
    json=$(GPUSNAP_GPUSHARE_KEEP=$keep timeout 240 "$GPUSNAP" --json checkpoint gsu --leave-running 2>"$OUT/gsu-cp$round.err")
    if [ $? != 0 ]; then
      if [ "$keep" = 1 ]; then
        echo "INFO: GPUSNAP_GPUSHARE_KEEP=1: the checkpoint failed: $(tail -2 "$OUT/gsu-cp$round.err")"
        goes_on gsu "$(last_step "$OUT/gsu.out")" || return
        continue
      fi
      fail "checkpoint $round failed: $(tail -2 "$OUT/gsu-cp$round.err")"
      return
    fi
    [ "$keep" = 1 ] && echo "INFO: GPUSNAP_GPUSHARE_KEEP=1: $(grep -h gpushare-adopt "$OUT/gsu-cp$round.err") load: $(
      "$GPUSNAP" --json gpushare state "$pid" | python3 -c 'import json, sys; l = json.load(sys.stdin)["pids"][0]["last"]; print("adopted", l.get("adopted"), "allocation(s),", l.get("adopted_bytes"), "bytes; filled", l.get("bytes"), "bytes in", round(l.get("load_s", 0), 3), "s")')"
    echo "$json" | python3 -c '
import json, sys
t = json.load(sys.stdin)["timings_s"]
r = int(sys.argv[1])
copied, unchanged = int(t["gpushare-chunks-copied"]), int(t["gpushare-chunks-unchanged"])
spent = [t["gpushare-fingerprint"], t["gpushare-release"], t.get("gpushare-load", 0), t["paused"]]
print("INFO: release %d: copied %d chunk(s), %d unchanged; fingerprint %.3f s, release %.3f s, load %.3f s, "
      "paused %.3f s" % tuple([r, copied, unchanged] + spent))
# 16 GiB are 256 chunks of 64 MiB; the first release has nothing recorded,
# the next find the 15 static GiB (240 chunks) unchanged.
ok = copied >= 256 and unchanged == 0 if r == 1 else copied <= 16 and unchanged >= 240
sys.exit(0 if ok else 1)' "$round" || fail "release $round: not the copies expected"
    goes_on gsu "$(last_step "$OUT/gsu.out")" || return
  done
  end_workload gsu
  passed "$1"
}

test_gpushare_other_gpu() {
  current="gpushare: gpu_counter with the shim checkpointed on GPU 0, restored on GPU 1"
  moved_to_gpu1 gsm --gpushare && passed "$1"
}

# gpushare (a) and (d): share_pair (tests/workloads, plain C on the driver
# API) is a parent and a child sharing one buffer: through CUDA IPC, or through
# an exported VMM fd. The child runs on GPU 1 where there is one (peer memory
# over NVLink), else on GPU 0 with its parent. Each step both write and check
# words of it; after a pause the child checks all of it.
WL=${GPU_TESTS_WORKLOADS:-$(dirname "$GPUSNAP")/workloads}
child_of() { cat "/proc/$1/task/$1/children" | tr -d ' '; }
ns_pid_of() { awk '/^NSpid:/ { print $NF }' "/proc/$1/status"; }
# start_pair NAME MODE: sets $pid (the parent) and $child.
start_pair() {
  local name=$1 mode=$2 dev2=0
  [ "$(nvidia-smi -L | grep -c '^GPU ')" -ge 2 ] && dev2=1
  [ -x "$WL/share_pair" ] || { fail "no $WL/share_pair (build target wl_share_pair)"; return 1; }
  pid=$(GPUSNAP_GPUSHARE_TEST_FAIL=$OUT/inject gs run --gpushare --name "$name" --log "$OUT/$name.out" -- \
    "$WL/share_pair" --share "$mode" --mib 512 --interval-ms 50 --device 0 --importer-device "$dev2") ||
    { fail "run --gpushare failed"; return 1; }
  reapers+=("$(reaper_of "$pid")")
  running "$name" 3 || return 1
  child=$(child_of "$pid")
  echo "INFO: $name: parent $pid on GPU 0, child $child on GPU $dev2, sharing through $mode"
}
share_pair_cycle() {
  local name=sp_$1
  start_pair "$name" "$1" || return 1
  gs gpushare suspend "$pid" "$child" || { fail "gpushare suspend failed"; return 1; }
  sleep 1.5  # the child checks the whole buffer after a pause
  gs gpushare resume "$pid" "$child" || { fail "gpushare resume failed"; return 1; }
  goes_on "$name" "$(last_step "$OUT/$name.out")" || return 1
  cr "$name" || return 1
  goes_on "$name" "$before" || return 1
  echo "INFO: $name: $(grep -c '^step' "$OUT/$name.out") steps, the child's sums: $(grep -oE 'sum [1-9][0-9]*' "$OUT/$name.out" | sort -u | tr '\n' ' ')"
  [ "$(grep -oE 'sum [1-9][0-9]*' "$OUT/$name.out" | sort -u | wc -l)" = 1 ] || { fail "the child read different bytes"; return 1; }
  end_workload "$name"
}
test_gpushare_ipc() {
  current="gpushare (a): two processes sharing memory through cuIpcGetMemHandle: suspend/resume, checkpoint/restore"
  share_pair_cycle ipc && passed "$1"
}
test_gpushare_vmm_fd() {
  current="gpushare (a): two processes sharing memory through an exported VMM fd: suspend/resume, checkpoint/restore"
  share_pair_cycle fd && passed "$1"
}
test_gpushare_release_failure() {
  current="gpushare (d): a failure injected in the release of one of two sharing processes: both resume and go on"
  start_pair sp_fail fd || return
  echo "release $(ns_pid_of "$child")" >"$OUT/inject"
  if gs gpushare suspend "$pid" "$child"; then fail "suspend succeeded despite the injected failure"; fi
  rm -f "$OUT/inject"
  "$GPUSNAP" gpushare state "$pid" "$child" | grep -c running | grep -qx 2 || fail "not both running: $("$GPUSNAP" gpushare state "$pid" "$child")"
  goes_on sp_fail "$(last_step "$OUT/sp_fail.out")" || return
  cr sp_fail || return
  goes_on sp_fail "$before" || return
  end_workload sp_fail
  passed "$1"
}

# gpushare (b) and (c): torchrun jobs of N ranks over NCCL, one GPU each
# (NVLink P2P, multicast off), checkpointed whole: torchrun's agent, its
# rendezvous store and the ranks with their TCP connections. Under the shim
# libuv gets no io_uring (which CRIU cannot dump) and runs on epoll. Need N GPUs.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# torchrun_job NAME N SCRIPT ARGS...: N ranks; sets $pid (torchrun's agent)
torchrun_job() {
  local name=$1 n=$2
  shift 2
  pid=$(NCCL_SOCKET_IFNAME=lo NCCL_CUMEM_HOST_ENABLE=0 gs run --gpushare --name "$name" --log "$OUT/$name.out" -- \
    python3 -m torch.distributed.run --standalone --nproc-per-node "$n" "$@") || { fail "run failed"; return 1; }
  reapers+=("$(reaper_of "$pid")")
}
ranks_of() { pgrep -P "$1" -f "$2" | tr '\n' ' '; }
# suspend_resume NAME SCRIPT_NAME N: the N ranks give their GPU memory up in place and take it back.
suspend_resume() {
  local name=$1 ranks
  ranks=$(ranks_of "$pid" "$2")
  [ "$(echo $ranks | wc -w)" = "$3" ] || { fail "expected $3 ranks under $pid, found: $ranks"; return 1; }
  gs gpushare suspend $ranks || { fail "gpushare suspend failed"; return 1; }
  sleep 1.5
  gs gpushare resume $ranks || { fail "gpushare resume failed"; return 1; }
  goes_on "$name" "$(last_step "$OUT/$name.out")"
}
# checkpoint_restore NAME [RESTORE FLAGS...]: the whole job, with its TCP
# connections, into a new pid namespace.
checkpoint_restore() {
  local name=$1 snap src=$pid
  shift
  snap=$(timeout 300 "$GPUSNAP" checkpoint -q --tcp-established --gpu-lock-timeout-ms 30000 "$name") ||
    { fail "checkpoint failed"; return 1; }
  # The restored sockets take the same ports: the source must be gone first.
  local i
  for ((i = 0; i < 100; i++)); do kill -0 "$src" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$src" 2>/dev/null && [ "$(ps -o stat= -p "$src")" != Z ] && { fail "source $src still runs"; return 1; }
  before=$(last_step "$OUT/$name.out")
  pid=$(timeout 300 "$GPUSNAP" restore "$snap" "$@") || { fail "restore $* failed"; return 1; }
  reapers+=("$(reaper_of "$pid")")
  goes_on "$name" "$before"
}
gpus_at_least() { [ "$(nvidia-smi -L | grep -c '^GPU ')" -ge "$1" ] || { echo "SKIP: $current: needs $1 GPUs"; return 1; }; }
test_gpushare_nccl() {
  current="gpushare (b): a torchrun job of 2 ranks, an NCCL all-reduce every step: suspend/resume, checkpoint/restore"
  gpus_at_least 2 || return
  torchrun_job nccl 2 "$here/workloads/nccl_allreduce.py" --mib 64 --weights-mib 1024 || return
  running nccl 5 || return
  suspend_resume nccl nccl_allreduce 2 || return
  checkpoint_restore nccl || return
  end_workload nccl
  passed "$1"
}
# The GPUs each rank of the job under $pid holds memory on, in rank order:
# "rank0-uuid rank1-uuid ..." (several GPUs of one rank joined by +).
rank_gpus() {
  local r
  for r in $(ranks_of "$pid" "$1"); do
    echo "$(tr '\0' '\n' <"/proc/$r/environ" | sed -n 's/^LOCAL_RANK=//p') $(gpu_mem_of "$r" | paste -sd+)"
  done | sort -n | cut -d' ' -f2 | paste -sd' '
}
# tp_cycle N MODEL: a TP=N Llama under torchrun; suspended and resumed in
# place, checkpointed and restored, then restored with its GPUs reversed
# (rank i onto GPU N-1-i): its tokens never change.
tp_cycle() {
  local n=$1 model=$2 name=tp$1 map="" i gpus reversed
  for ((i = 0; i < n; i++)); do map+="${map:+,}$i=$((n - 1 - i))"; done
  torchrun_job "$name" "$n" "$here/workloads/tp_llama.py" --model "$model" \
    --weights-dir "${GPU_TEST_WEIGHTS:-/tmp/gpusnap-weights}" --tokens 16 || return 1
  running "$name" 3 || return 1
  grep -m1 '^TOKENS' "$OUT/$name.out"
  suspend_resume "$name" tp_llama "$n" || return 1
  checkpoint_restore "$name" || return 1
  gpus=$(rank_gpus tp_llama)
  checkpoint_restore "$name" --gpu-map "$map" || return 1
  reversed=$(rank_gpus tp_llama)
  echo "INFO: $name: the ranks' GPUs: $gpus before, $reversed after --gpu-map $map"
  [ "$(echo $gpus | awk '{ for (i = NF; i > 0; i--) printf "%s%s", $i, (i > 1 ? " " : "\n") }')" = "$reversed" ] ||
    { fail "the ranks did not move as mapped: $gpus, then $reversed"; return 1; }
  # Every step's tokens hash the same as the first step's.
  [ "$(grep -oE 'sum [0-9]+' "$OUT/$name.out" | sort -u | wc -l)" = 1 ] || { fail "the tokens changed"; return 1; }
  end_workload "$name"
}
test_gpushare_tp2() {
  local model=${GPU_TEST_TP_MODEL:-1b}
  current="gpushare (c): a TP=2 Llama ($model) under torchrun generating tokens: identical after suspend/resume, checkpoint/restore, and a restore with its GPUs swapped"
  gpus_at_least 2 || return
  tp_cycle 2 "$model" && passed "$1"
}
# Issue 7's run, on a machine of 4 GPUs (nvidia-h200-x4): the 8B-class shape
# over 4 ranks; the benchmark beside it is bench/tp_bench.py --tp 4.
test_gpushare_tp4() {
  local model=${GPU_TEST_TP_MODEL:-8b}
  current="gpushare: a TP=4 Llama ($model) under torchrun: identical tokens after suspend/resume, checkpoint/restore, and a restore onto the GPUs reversed"
  gpus_at_least 4 || return
  tp_cycle 4 "$model" && passed "$1"
}

# (b) and (e): the Llama-architecture server of bench/ (8B-class by default),
# checkpointed and restored GPU_TEST_CYCLES times in a row, then once more
# after dropping the page cache. The driver's own checkpoint copies all of a
# process's device memory to host memory: the static engine's KV-cache pool
# is bounded (GPU_TEST_KV_GIB, default 8), since a pool of most of the GPU
# (122 GiB on an H200) does not fit the host's memory (cuCheckpoint fails with
# 304). The benchmark fails on any answer that differs
# from the cold start's (a fresh run); its JSON is checked here again.
test_llm_server_cycles() {
  local model=${GPU_TEST_MODEL:-8b} n=${GPU_TEST_CYCLES:-5} json
  current="(b)+(e) the $model Llama server: $n checkpoint/restore cycles, tokens equal to a fresh run's"
  json=$OUT/bench-$model.json
  PYTHON=${PYTHON:-python3} bash "$root/bench/run_bench.sh" --model "$model" --cycles "$n" \
    --kv-cache-gib "${GPU_TEST_KV_GIB:-8}" --gpusnap "$GPUSNAP" --out "$json" >"$OUT/bench-$model.out" 2>&1
  local rc=$?
  sed -n '/^| phase/,$p' "$OUT/bench-$model.out"
  [ "$rc" = 0 ] || { fail "run_bench.sh exited $rc: $(grep -m3 -e FAILED -e differ "$OUT/bench-$model.out")"; return; }
  python3 - "$json" "$n" <<'PY' || fail "the benchmark's results do not show $n identical restores"
import json, sys
res = json.load(open(sys.argv[1]))
want = res["cold_start"]["answer"]["tokens"]
restores = [c["restore"] for c in res["cycles"]] + [res["restore_dropped_caches"]]
assert len(res["cycles"]) == int(sys.argv[2]), f"{len(res['cycles'])} cycles"
assert want and len(want) > 0
for r in restores:
    assert r["answer"]["tokens"] == want, r["answer"]["tokens"]
print(f"{len(restores)} restores, each answered the cold start's {len(want)} tokens")
PY
  passed "$1"
}

# bench_snapshot MODEL PORT NAME: the bench server (static engine) under
# gpushare, started cold and checkpointed by run_bench.sh, its snapshot kept:
# sets the caller's $store and $id; the cold start's answer is in $OUT/NAME.json.
bench_snapshot() {
  local kept
  PYTHON=${PYTHON:-python3} bash "$root/bench/run_bench.sh" --model "$1" --gpushare --engine static --cycles 1 \
    --no-drop-caches --keep --port "$2" --gpusnap "$GPUSNAP" --weights-dir "${GPU_TEST_WEIGHTS:-/tmp/gpusnap-weights}" \
    --out "$OUT/$3.json" >"$OUT/$3.out" 2>&1 || { fail "run_bench.sh failed: $(grep -m3 FAILED "$OUT/$3.out")"; return 1; }
  kept=$(grep -m1 '^snapshots kept in ' "$OUT/$3.out")
  store=${kept#snapshots kept in }; store=${store%%: *}; id=${kept##* }
  [ -n "$id" ] || { fail "run_bench.sh kept no snapshot"; return 1; }
}

# (f) Issue 15: the bench server as a production engine runs (a KV-cache pool
# of most of the GPU, marked scratch; decode replayed from a CUDA graph)
# under gpushare: checkpointed, restored as a standby that holds no GPU
# memory, then woken: its answer must be the cold start's, which the static
# engine can only give by replaying its graph.
test_standby_server() {
  local model=${GPU_TEST_MODEL:-1b} port=18411 json=$OUT/standby-bench.json store id sb_pid held
  current="(f) the $model static-engine server (KV pool marked scratch, CUDA-graph decode) under gpushare: a standby holding no GPU memory, woken with the cold start's tokens"
  bench_snapshot "$model" "$port" standby-bench || return
  GPUSNAP_STORE=$store gs restore "$id" --standby --name sbs || { fail "restore --standby failed"; return; }
  sb_pid=$("$GPUSNAP" --json ps | python3 -c 'import json, sys; print([w["pid"] for w in json.load(sys.stdin) if w["name"] == "sbs" and w["state"] == "standby"][0])') ||
    { fail "ps does not show sbs as a standby"; return; }
  reapers+=("$(reaper_of "$sb_pid")")
  held=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c -w -e "$sb_pid" $(for c in $(cat "/proc/$sb_pid/task/$sb_pid/children"); do echo "-e $c"; done))
  echo "INFO: standby sbs (pid $sb_pid): $held GPU process(es) seen by nvidia-smi"
  [ "$held" = 0 ] || fail "the standby holds GPU memory"
  GPUSNAP_STORE=$store python3 "$root/bench/client.py" --port "$port" --stream --exec -- "$GPUSNAP" --json wake sbs \
    >"$OUT/standby-wake.json" || { fail "wake or its first answer failed"; return; }
  python3 - "$json" "$OUT/standby-wake.json" "$port" <<'PY' || fail "the woken server's answer is not the cold start's"
import json, sys, urllib.request
cold = json.load(open(sys.argv[1]))["cold_start"]["answer"]
woke = json.load(open(sys.argv[2]))
info = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[3]}/info", timeout=30))
assert woke["answer"]["tokens"] == cold["tokens"], (woke["answer"]["tokens"][:8], cold["tokens"][:8])
assert info["engine"] == "static" and info["cuda_graphs"] == 1, info
print(f"woken: first token {woke['first_token_s']:.2f} s after `gpusnap wake`, the cold start's {len(cold['tokens'])} tokens "
      f"from the CUDA graph; KV pool {info['kv_pool_bytes'] / 2**30:.1f} GiB, scratch {info.get('kv_scratch')}")
PY
  gs kill sbs
  GPUSNAP_STORE=$store gs rm "$id" >/dev/null
  passed "$1"
}


# (h) Issue 24: two bench servers on one GPU under gpushare, driven by the
# agent: one suspended in place, then swapped (suspend a, resume b) and back.
# Each resumed server must answer its own first answer's tokens; the time
# from the swap's request to the resumed server's first streamed token is
# printed (target: 1.0 s for 8B-class servers).
test_agent_swap_servers() {
  local model=${GPU_TEST_MODEL:-1b} weights=${GPU_TEST_WEIGHTS:-/tmp/gpusnap-weights}
  local sock=$OUT/swap-agent.sock store=$OUT/swap-store port_a=18421 port_b=18422 agent_pid
  stores+=("$store")
  current="(h) two $model static-engine servers on one GPU swapped through the agent, each answering its own tokens"
  # Two models of one shape, their weights of two seeds: each answers its own tokens.
  local seed_a=1234 seed_b=4321 seed
  for seed in $seed_a $seed_b; do
    python3 "$root/bench/server.py" --model "$model" --weights-dir "$weights" --weight-seed "$seed" --prepare \
      >"$OUT/swap-prepare.out" 2>&1 || { fail "preparing the weights: $(tail -3 "$OUT/swap-prepare.out")"; return; }
  done
  "$GPUSNAP" agent --socket "$sock" --store "$store" --state-dir "$OUT/swap-agent-state" --pinned-cache "${GPU_TEST_PINNED_CACHE:-64GiB}" \
    >"$OUT/swap-agent.out" 2>&1 &
  agent_pid=$!
  started+=("$agent_pid")
  wait_for "$OUT/swap-agent.out" "listening on" 60 ||
    { fail "the agent did not start: $(tail -3 "$OUT/swap-agent.out")"; kill "$agent_pid"; return; }
  # The steps (not indented for their here-documents); whatever a failure
  # leaves behind is ended after them.
  swap_steps() {
  # One request to the agent, then its job followed to the end: the job's JSON, exit 1 unless it succeeded.
  cat >"$OUT/agent_call.py" <<'PY'
import http.client, json, socket, sys, time
class Conn(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sys.argv[1])
def call(method, path, body=None):
    c = Conn("agent", timeout=600); c.request(method, path, body=body); r = c.getresponse()
    return r.status, json.loads(r.read())
status, reply = call(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
if status != 202: sys.exit(f"{sys.argv[3]}: HTTP {status}: {reply}")
while True:
    _, job = call("GET", "/v1/jobs/" + reply["job"])
    if job["state"] != "running": break
    time.sleep(0.01)
print(json.dumps(job))
sys.exit(0 if job["state"] == "succeeded" else f"job failed: {job.get('error')}")
PY
  local name port
  for name in a b; do
    port=$([ "$name" = a ] && echo $port_a || echo $port_b)
    seed=$([ "$name" = a ] && echo $seed_a || echo $seed_b)
    gs run --gpushare --name "swap-$name" -- python3 -u "$root/bench/server.py" --model "$model" --weight-seed "$seed" --engine static \
      --kv-cache-gib "${GPU_TEST_KV_GIB:-8}" --weights-dir "$weights" --port "$port" >/dev/null ||
      { fail "starting server $name"; return; }
    reapers+=("$(reaper_of "$("$GPUSNAP" --json ps | python3 -c "import json, sys; print([w['pid'] for w in json.load(sys.stdin) if w['name'] == 'swap-$name'][0])")")")
    python3 "$root/bench/client.py" --port "$port" >"$OUT/swap-$name-first.json" || { fail "server $name's first answer"; return; }
  done
  python3 "$OUT/agent_call.py" "$sock" POST /v1/workloads/swap-b/suspend >"$OUT/swap-suspend-b.json" ||
    { fail "suspending b: $(cat "$OUT/swap-suspend-b.json")"; return; }
  cmp -s <(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["tokens"])' "$OUT/swap-a-first.json") \
    <(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["tokens"])' "$OUT/swap-b-first.json") &&
    { fail "a and b answer the same tokens: the check of each one's own answer could not fail"; return; }
  # Three swaps. A suspend through the agent queues the workload's chunks for
  # the tier, pinned in the background ahead of its resume: each swap first
  # waits (bounded) for the tier to settle, as a suspended server waits for
  # its turn, so each resume copies from pinned memory.
  local round n out in port_in m0 m1 settle_start
  for round in "1 a b $port_b" "2 b a $port_a" "3 a b $port_b"; do
    read -r n out in port_in <<<"$round"
    settle_start=$(date +%s.%N)
    for _ in $(seq 1200); do
      curl -s --unix-socket "$sock" http://agent/metrics | grep -q '^gpusnap_agent_pinned_tier_admissions_pending 0$' && break
      sleep 0.1
    done
    curl -s --unix-socket "$sock" http://agent/metrics | grep -q '^gpusnap_agent_pinned_tier_admissions_pending 0$' ||
      { fail "the pinned tier did not settle in 120 s before swap $n"; return; }
    echo "INFO: swap $n: the tier settled $(python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$settle_start") s after the last step"
    m0=$(curl -s --unix-socket "$sock" http://agent/metrics | grep '^gpusnap_agent_pinned_tier')
    python3 "$root/bench/client.py" --port "$port_in" --stream --exec -- python3 "$OUT/agent_call.py" "$sock" POST \
      /v1/workloads/swap "{\"suspend\": \"swap-$out\", \"resume\": \"swap-$in\"}" >"$OUT/swap-$n.json" ||
      { fail "swap $n ($out out, $in in) or $in's first answer failed: $(tail -c 600 "$OUT/swap-$n.json")"; return; }
    m1=$(curl -s --unix-socket "$sock" http://agent/metrics | grep '^gpusnap_agent_pinned_tier')
    python3 - "$OUT/swap-$in-first.json" "$OUT/swap-$n.json" "$n" "$out" "$in" "$m0" "$m1" <<'PY' || fail "server $in's answer after swap $n is not its own"
import json, sys
first = json.load(open(sys.argv[1]))["tokens"]
swap = json.load(open(sys.argv[2]))
job = swap["cmd_output"]
assert swap["answer"]["tokens"] == first, (swap["answer"]["tokens"][:8], first[:8])
def metrics(text):
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.strip()}
m0, m1 = metrics(sys.argv[6]), metrics(sys.argv[7])
hits = m1["gpusnap_agent_pinned_tier_hits_total"] - m0["gpusnap_agent_pinned_tier_hits_total"]
misses = m1["gpusnap_agent_pinned_tier_misses_total"] - m0["gpusnap_agent_pinned_tier_misses_total"]
t = job["timings"]
phases = " ".join(f"{k}={v:.3f}" for k, v in sorted(t.items()))
print(f"INFO: swap {sys.argv[3]} ({sys.argv[4]} out, {sys.argv[5]} in): first token {swap['first_token_s']:.3f} s "
      f"after the request; job {swap['cmd_s']:.3f} s: {phases}; tier hits {hits:.0f}, misses {misses:.0f}; "
      f"{len(first)} tokens, its own")
PY
  done
  "$GPUSNAP" --json ps | python3 -c 'import json, sys; s = {w["name"]: w["state"] for w in json.load(sys.stdin)}; assert (s["swap-a"], s["swap-b"]) == ("suspended", "running"), s' ||
    fail "ps does not show swap-a suspended and swap-b running"
  }
  swap_steps
  "$GPUSNAP" kill swap-a >/dev/null 2>&1
  "$GPUSNAP" kill swap-b >/dev/null 2>&1
  kill "$agent_pid"; wait "$agent_pid" 2>/dev/null
  passed "$1"
}

# (g) Issue 24: the agent as the fast path. The agent loads the driver once
# and keeps a context per GPU (what that costs on GPU 0 is printed from
# nvidia-smi before and after it starts), and with --pinned-cache keeps the
# gpushare chunks in pinned host memory. The bench server's standby is woken
# through the agent twice: cold (made in-process: nothing pinned) and pinned
# (made through the agent, which pins its chunks); each prints its phases and
# the tier's hits and misses, and answers with the cold start's tokens.
test_agent_pinned_wake() {
  local model=${GPU_TEST_MODEL:-1b} port=18412 json=$OUT/pinned-bench.json store id sock agent_pid before after
  current="(g) the $model server's standby woken through the agent with --pinned-cache, cold then pinned"
  bench_snapshot "$model" "$port" pinned-bench || return
  sock=$OUT/pinned-agent/agent.sock
  mkdir -p "$OUT/pinned-agent"
  before=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0)
  start pinned-agent "$GPUSNAP" agent --socket "$sock" --store "$store" --state-dir "$OUT/pinned-agent/state" \
    --pinned-cache "${GPU_TEST_PINNED_CACHE:-64GiB}" --huge-pages
  agent_pid=$pid
  wait_for "$OUT/pinned-agent.out" "listening on" 60 ||
    { fail "the agent did not start: $(tail -3 "$OUT/pinned-agent.out")"; kill "$agent_pid"; return; }
  after=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0)
  echo "INFO: the agent's kept driver and contexts: GPU 0 memory used $before MiB before it started, $after MiB after ($((after - before)) MiB; the agent's process: $(gpu_mem_mib_of "$agent_pid") MiB)"
  echo "INFO: $(grep -m1 'loaded once' "$OUT/pinned-agent.out")"
  # wake_through NAME LABEL: the standby NAME woken through the agent, to the first streamed token.
  wake_through() {
    local m0 m1
    m0=$(curl -s --unix-socket "$sock" http://agent/metrics | grep '^gpusnap_agent_pinned_tier')
    python3 "$root/bench/client.py" --port "$port" --stream --exec -- "$GPUSNAP" --json wake "$1" --agent "$sock" \
      >"$OUT/pinned-wake-$2.json" || { fail "the $2 wake or its first answer failed"; return 1; }
    m1=$(curl -s --unix-socket "$sock" http://agent/metrics | grep '^gpusnap_agent_pinned_tier')
    python3 - "$json" "$OUT/pinned-wake-$2.json" "$2" "$m0" "$m1" <<'PY' || { fail "the $2 wake's answer is not the cold start's"; return 1; }
import json, sys
cold = json.load(open(sys.argv[1]))["cold_start"]["answer"]
woke = json.load(open(sys.argv[2]))
assert woke["answer"]["tokens"] == cold["tokens"], (woke["answer"]["tokens"][:8], cold["tokens"][:8])
def metrics(text):
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.strip()}
m0, m1 = metrics(sys.argv[4]), metrics(sys.argv[5])
hits = m1["gpusnap_agent_pinned_tier_hits_total"] - m0["gpusnap_agent_pinned_tier_hits_total"]
misses = m1["gpusnap_agent_pinned_tier_misses_total"] - m0["gpusnap_agent_pinned_tier_misses_total"]
t = woke["cmd_output"]["timings_s"]
phases = " ".join(f"{k}={t[k]:.2f}" for k in ("check", "gpushare-preload", "gpushare-preload-map", "gpushare-preload-fill",
                                             "gpu-restore", "gpushare-adopt", "gpushare-load", "total") if k in t)
rate = hits / (hits + misses) if hits + misses else 0.0
print(f"INFO: {sys.argv[3]} wake: first token {woke['first_token_s']:.2f} s; {phases}; "
      f"tier hits {hits:.0f}, misses {misses:.0f} (hit rate {rate:.0%}); "
      f"tier {m1['gpusnap_agent_pinned_tier_bytes{kind=\"used\"}'] / 2**30:.1f} GiB used")
PY
  }
  # The steps (not indented for their here-documents); whatever a failure
  # leaves behind is ended after them.
  pinned_wake_steps() {
  # Cold: a standby made in this process, so the agent has pinned nothing of it.
  GPUSNAP_STORE=$store gs restore "$id" --standby --name sbcold --no-agent >/dev/null || { fail "restore --standby failed"; return; }
  reapers+=("$(reaper_of "$("$GPUSNAP" --json ps | python3 -c 'import json, sys; print([w["pid"] for w in json.load(sys.stdin) if w["name"] == "sbcold"][0])')")")
  wake_through sbcold cold || return
  gs kill sbcold
  # Pinned: the agent makes the standby and pins its chunks as it does.
  gs restore "$id" --standby --name sbpinned --agent "$sock" >/dev/null || { fail "restore --standby through the agent failed"; return; }
  reapers+=("$(reaper_of "$("$GPUSNAP" --json ps | python3 -c 'import json, sys; print([w["pid"] for w in json.load(sys.stdin) if w["name"] == "sbpinned"][0])')")")
  echo "INFO: $(grep -m1 "pinned .* chunks of \`$id\`" "$OUT/pinned-agent.out")"
  wake_through sbpinned pinned || return
  # The pause of `checkpoint --leave-running` through the agent, twice: the
  # second finds every chunk stored and unchanged but the KV pool's scratch.
  local round cp
  for round in 1 2; do
    cp=$(gs --json checkpoint sbpinned --leave-running --agent "$sock" 2>"$OUT/pinned-cp$round.err") ||
      { fail "checkpoint --leave-running $round through the agent: $(tail -2 "$OUT/pinned-cp$round.err")"; return; }
    echo "$cp" | python3 -c '
import json, sys
t = json.load(sys.stdin)["timings_s"]
keys = ("paused", "gpushare-fingerprint", "gpushare-chunks-copied", "gpushare-chunks-unchanged", "gpushare-release",
        "gpushare-load", "dump")
print("INFO: checkpoint --leave-running %s: %s" % (sys.argv[1], " ".join(f"{k}={t[k]:.3f}" for k in keys if k in t)))' "$round"
    GPUSNAP_STORE=$store gs rm "$(echo "$cp" | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')" >/dev/null
  done
  python3 "$root/bench/client.py" --port "$port" >/dev/null || fail "the server answers no more after the checkpoints"
  gs kill sbpinned
  # Restores to the first streamed token, side by side: in this process
  # (no tier, the chunks from the page cache), then through the agent (its
  # tier holds them since the pinned standby).
  # restore_to_token LABEL ARGS...: prints the phases; the answer must be the cold start's.
  restore_to_token() {
    local label=$1
    shift
    GPUSNAP_STORE=$store python3 "$root/bench/client.py" --port "$port" --stream --exec -- "$GPUSNAP" --json restore "$id" \
      --name "rs-$label" "$@" >"$OUT/pinned-restore-$label.json" || { fail "the $label restore or its first answer failed"; return 1; }
    reapers+=("$(reaper_of "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["cmd_output"]["pid"])' "$OUT/pinned-restore-$label.json")")")
    python3 - "$json" "$OUT/pinned-restore-$label.json" "$label" <<'PY' || { fail "the $label restore's answer is not the cold start's"; return 1; }
import json, sys
cold = json.load(open(sys.argv[1]))["cold_start"]["answer"]
r = json.load(open(sys.argv[2]))
assert r["answer"]["tokens"] == cold["tokens"], (r["answer"]["tokens"][:8], cold["tokens"][:8])
t = r["cmd_output"]["timings_s"]
print(f"INFO: {sys.argv[3]} restore: first token {r['first_token_s']:.2f} s; command {r['cmd_s']:.2f} s: "
      + " ".join(f"{k}={v:.2f}" for k, v in sorted(t.items())))
PY
    gs kill "rs-$label"
  }
  # Both with huge pages: the agent's from its configuration (--huge-pages above).
  restore_to_token in-process --no-agent --huge-pages || return
  restore_to_token agent-pinned --agent "$sock" || return
  }
  pinned_wake_steps
  local w
  for w in sbcold sbpinned rs-in-process rs-agent-pinned; do "$GPUSNAP" kill "$w" >/dev/null 2>&1; done
  kill "$agent_pid"; wait "$agent_pid" 2>/dev/null
  GPUSNAP_STORE=$store gs rm "$id" >/dev/null
  passed "$1"
}

note_machine_state
echo "gpusnap: $GPUSNAP; workloads: $BIN; output: $OUT"
nvidia-smi -L
gs cuda gpus || { echo "FAIL: gpusnap cuda gpus"; exit 1; }
tests="test_counter_suspend_resume test_two_counters_in_one_call test_gpu_map test_pinned_reader_paused
  test_counter_checkpoint_restore test_pinned_checkpoint_restore test_restore_on_other_gpu test_gpushare_counter
  test_gpushare_unchanged_chunks test_gpushare_other_gpu
  test_gpushare_ipc test_gpushare_vmm_fd test_gpushare_release_failure test_gpushare_nccl test_gpushare_tp2 test_gpushare_tp4
  test_llm_server_cycles test_standby_server test_agent_pinned_wake test_agent_swap_servers"
for t in ${GPU_TESTS:-$tests}; do
  $t "$failures"
done
probe_pinned_reader_running 0
probe_pinned_reader_running 1
current="nothing left behind"
before_leaks=$failures
left_behind "${started[@]}" "${reapers[@]}"
passed "$before_leaks"
echo "$failures failure(s)"
[ "$failures" = 0 ]
