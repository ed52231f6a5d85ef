# What the GPU suite (run_gpu_tests.sh) and the soak (soak.sh) share: waiting
# on a workload's output, reading the GPU's processes and memory, ending a
# workload, and checking that nothing was left behind. Sourced; the caller
# defines fail MESSAGE (counting a failure) and sets GPUSNAP.

# Exits 77 (skipped) on a machine without an NVIDIA GPU.
skip_without_gpu() {
  if ! command -v nvidia-smi >/dev/null 2>&1 || [ ! -e /dev/nvidia0 ]; then
    echo "SKIP: no NVIDIA GPU here (nvidia-smi or /dev/nvidia0 is missing)"
    exit 77
  fi
}

# wait_for FILE REGEX [SECONDS]
wait_for() {
  local i
  for ((i = 0; i < ${3:-60} * 10; i++)); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

last_step() { grep -oE '^step [0-9]+' "$1" | tail -1 | cut -d' ' -f2; }
# The steps printed are 1, 2, 3, ... without a gap or a repeat, and none failed.
steps_contiguous() {
  grep -q -e MISMATCH -e SIGSEGV -e 'CUDA error' "$1" && return 1
  grep -oE '^step [0-9]+' "$1" | cut -d' ' -f2 | awk '$1 != NR { exit 1 }'
}

gpu_mem_of() { nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader | awk -F', ' -v p="$1" '$1 == p { print $2 }'; }
gpu_mem_mib_of() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p="$1" '$1 == p { print $2 }'; }
reaper_of() { ps -o ppid= -p "$1" | tr -d ' '; }
# end_workload NAME: a test ends the workload it ran or restored (its whole
# namespace), so that the next test meets a GPU as the suite found it.
end_workload() {
  local p
  p=$("$GPUSNAP" --json ps | python3 -c 'import json, sys; print(next((w["pid"] for w in json.load(sys.stdin) if w["name"] == sys.argv[1] and w["state"] != "exited"), ""))' "$1")
  [ -n "$p" ] || return 0
  "$GPUSNAP" kill "$1" >/dev/null || fail "gpusnap kill $1 failed"
  local i
  for ((i = 0; i < 100; i++)); do kill -0 "$p" 2>/dev/null && [ "$(ps -o stat= -p "$p")" != Z ] || return 0; sleep 0.1; done
  fail "workload $1 (pid $p) still runs after gpusnap kill"
}

# note_machine_state: what the machine holds before a run (set once, at its
# start). left_behind PIDS...: what more it holds now, each a fail: the pids
# given that still run, workload records still running or standby, GPU
# processes, files in /dev/shm, mounts. Then one INFO line of GPU memory,
# host memory and the disk of $OUT, before and now.
gpu_pids() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | sort -n | paste -sd' '; }
gpu_used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | awk '{ s += $1 } END { print s }'; }
host_used_mib() { free -m | awk '/^Mem:/ { print $3 }'; }
mount_points() { awk '{ print $5 }' /proc/self/mountinfo | sort; }
disk_free_mib() { df -Pm "$1" | awk 'NR == 2 { print $4 }'; }
note_machine_state() {
  shm_before=$(ls -A /dev/shm | sort)
  mounts_before=$(mount_points)
  gpu_pids_before=$(gpu_pids)
  gpu_used_before=$(gpu_used_mib)
  host_used_before=$(host_used_mib)
  disk_free_before=$(disk_free_mib "$OUT")
}
left_behind() {
  local p i
  for p in "$@"; do
    [ -n "$p" ] && kill -0 "$p" 2>/dev/null && [ "$(ps -o stat= -p "$p" | cut -c1)" != Z ] &&
      fail "pid $p ($(ps -o args= -p "$p" | cut -c1-80)) still runs"
  done
  local running
  running=$("$GPUSNAP" --json ps | python3 -c 'import json, sys; print(" ".join(w["name"] + "(" + w["state"] + ")" for w in json.load(sys.stdin) if w["state"] != "exited"))')
  [ -z "$running" ] || fail "workload records still running or standby: $running"
  for ((i = 0; i < 100; i++)); do [ "$(gpu_pids)" = "$gpu_pids_before" ] && break; sleep 0.1; done
  [ "$(gpu_pids)" = "$gpu_pids_before" ] || fail "GPU processes left: $(gpu_pids) (before: ${gpu_pids_before:-none})"
  local shm_new
  # The test weights (GPU_TEST_WEIGHTS) may be put in /dev/shm on purpose, and are kept for the next run.
  local weights_kept
  weights_kept=$(case "${GPU_TEST_WEIGHTS:-}" in /dev/shm/*) w=${GPU_TEST_WEIGHTS#/dev/shm/}; echo "${w%%/*}" ;; esac)
  shm_new=$(comm -13 <(echo "$shm_before") <(ls -A /dev/shm | grep -vxF -- "${weights_kept:-/}" | sort) | paste -sd' ')
  [ -z "$shm_new" ] || fail "files left in /dev/shm: $shm_new"
  local mounts_new
  mounts_new=$(comm -13 <(echo "$mounts_before") <(mount_points) | paste -sd' ')
  [ -z "$mounts_new" ] || fail "mounts left: $mounts_new"
  echo "INFO: GPU memory used ${gpu_used_before} MiB before, $(gpu_used_mib) MiB now; host memory used" \
    "${host_used_before} MiB before, $(host_used_mib) MiB now; ${disk_free_before} MiB free on the output's disk" \
    "before, $(disk_free_mib "$OUT") MiB now (the run's store, $(du -sm "$GPUSNAP_STORE" 2>/dev/null | cut -f1) MiB, goes on exit)"
}
