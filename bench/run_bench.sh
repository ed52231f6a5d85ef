#!/usr/bin/env bash
# run_bench.sh - an LLM inference server's cold start against gpusnap's
# checkpoint and restore of it, side by side, in one run (docs/BENCHMARK.md).
#
#   bench/run_bench.sh                 8b: cold start, checkpoint, restore from the page cache,
#                                      restore after dropping the caches; a Markdown table
#   bench/run_bench.sh --model 1b      the same, quicker
#   bench/run_bench.sh --demo          1b: one cold start, checkpoint, restore; short output
#   bench/run_bench.sh --cycles 5      cold start, then 5 checkpoint/restore cycles in a row,
#                                      then the last snapshot restored after dropping the caches
#   bench/run_bench.sh --engines static,eager
#                                      the whole run once per server engine, then both side by side
#
# Every answer after a restore must carry the cold start's tokens (and the
# restored process's own state: same start time, request count one on);
# anything else fails the run. Every workload it started is stopped on exit.
set -euo pipefail
export LC_NUMERIC=C

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$BENCH_DIR/.." && pwd)
# The interpreter itself (not a wrapper such as a pyenv shim): it starts the
# server, and runs the helpers many times.
PY=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)') || { echo "run_bench.sh: no python3" >&2; exit 2; }
LIB="$BENCH_DIR/benchlib.py"
orig_args=("$@")

usage() {
  cat <<EOF
usage: $0 [options]
  --model tiny|1b|8b     model shape (default 8b; 1b with --demo)
  --demo                 1b, one cold start, one checkpoint, one restore, short output
  --cycles N             after the cold start, N checkpoint/restore cycles in a row (default 1)
  --no-drop-caches       skip the restore after dropping the page cache
  --gpusnap PATH         gpusnap binary (default \${GPUSNAP_BUILD_DIR:-$REPO_DIR/build}/gpusnap);
                         its CRIU bundle: next to it, or \$GPUSNAP_CRIU
  --weights-dir DIR      weight files (default /tmp/gpusnap-weights); written once, not timed
  --work-dir DIR         logs, results, run records (default /var/tmp/gpusnap-bench)
  --store DIR            snapshot store (default \$GPUSNAP_STORE, else WORK_DIR/store)
  --out FILE             raw results as JSON (default \$OUT/bench.json if \$OUT is set, else /tmp/gpusnap-bench.json)
  --pinned-mb N          the server also holds an N MiB pinned host buffer (default 256; 0: none)
  --max-new-tokens N     tokens per generate (default 32)
  --gpu N                CUDA_VISIBLE_DEVICES for the server
  --port N               server port (default: a free one)
  --cold-timeout S       seconds a cold start may take to its first token (default 1800)
  --restore-timeout S    seconds a restore may take to its first token (default 900)
  --keep                 keep the snapshots (default: removed at the end)
  --check-targets        exit 3 when an 8b run misses a target
  --gpushare             start the server with the gpushare shim (device memory through the chunk store)
  --registry             after the cycles, push the snapshot to a docker-registry started on 127.0.0.1
                         and restore it from its reference into an empty store, and by pull-then-restore
  --registry-sealed      --registry, the push signed and encrypted (an ECDSA P-256 signing key, an RSA-3072
                         recipient and a tenant secret made for the run) and every restore and pull under a
                         policy that requires that signature, with the recipient's private key
  --huge-pages-even      restores of even cycles with \`gpusnap restore --huge-pages\` (gpusnap sets the
                         host's THP to always while CRIU restores), odd ones without
  --lazy-pages-even      restores of even cycles with \`gpusnap restore --lazy-pages\` (the memory arrives
                         after the restore returns), odd ones without; the next checkpoint waits for every page
  --thp-even MODE        restores of even cycles with the host's transparent huge pages set to MODE
                         (always|madvise|never), odd ones as the host has it: side by side in one run;
                         the setting is put back after each
  --registry-dir DIR     where the registry keeps its storage (a gpusnap-bench-registry folder in it,
                         removed at the end; default WORK_DIR)
  --backend torch|fake   fake: a CPU stand-in server (tests of this script without a GPU)
  --engine static|eager  the server's engine (default static): static holds a KV-cache pool and decodes
                         from a CUDA graph captured at start; eager is transformers' generate
  --engines E1,E2        the whole run once per engine (each its own cold start, checkpoints and restores,
                         in WORK_DIR/engine-E), then a table of them side by side; --out gets both
  --gpu-memory-utilization F
                         static: the share of the GPU's memory the server may hold, its KV-cache pool
                         taking what the weights leave (the server's default: 0.9)
  --kv-cache-gib N       static: a KV-cache pool of N GiB instead
EOF
}

die_usage() { echo "run_bench.sh: $*" >&2; usage >&2; exit 2; }

model=""; demo=0; cycles=""; drop_caches=1; gpusnap=""; weights_dir=/tmp/gpusnap-weights
work_dir=/var/tmp/gpusnap-bench; store=""; out_file=""; pinned_mb=256; max_new_tokens=32; gpu=""; port=""
cold_timeout=1800; restore_timeout=900; keep=0; check_targets=0; backend=torch; gpushare=0; use_registry=0; sealed=0
registry_dir=""; thp_even=""; huge_pages_even=0; lazy_pages_even=0; engine=""; engines=""; gpu_mem_util=""; kv_cache_gib=""
THP_FILE=${GPUSNAP_BENCH_THP_FILE:-/sys/kernel/mm/transparent_hugepage/enabled}  # another file: tests
while [ $# -gt 0 ]; do
  opt=$1
  case "$opt" in
    -h|--help) usage; exit 0 ;;
    --demo) demo=1; shift; continue ;;
    --registry) use_registry=1; shift; continue ;;
    --registry-sealed) use_registry=1; sealed=1; shift; continue ;;
    --huge-pages-even) huge_pages_even=1; shift; continue ;;
    --lazy-pages-even) lazy_pages_even=1; shift; continue ;;
    --no-drop-caches) drop_caches=0; shift; continue ;;
    --keep) keep=1; shift; continue ;;
    --check-targets) check_targets=1; shift; continue ;;
    --gpushare) gpushare=1; shift; continue ;;
  esac
  [ $# -ge 2 ] || die_usage "$opt needs a value"
  val=$2; shift 2
  case "$opt" in
    --model) model=$val ;;
    --cycles) cycles=$val ;;
    --gpusnap) gpusnap=$val ;;
    --weights-dir) weights_dir=$val ;;
    --work-dir) work_dir=$val ;;
    --registry-dir) registry_dir=$val ;;
    --thp-even) thp_even=$val ;;
    --store) store=$val ;;
    --out) out_file=$val ;;
    --pinned-mb) pinned_mb=$val ;;
    --max-new-tokens) max_new_tokens=$val ;;
    --gpu) gpu=$val ;;
    --port) port=$val ;;
    --cold-timeout) cold_timeout=$val ;;
    --restore-timeout) restore_timeout=$val ;;
    --backend) backend=$val ;;
    --engine) engine=$val ;;
    --engines) engines=$val ;;
    --gpu-memory-utilization) gpu_mem_util=$val ;;
    --kv-cache-gib) kv_cache_gib=$val ;;
    *) die_usage "unknown option $opt" ;;
  esac
done

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
[ -n "$model" ] || { [ "$demo" = 1 ] && model=1b || model=8b; }
case "$model" in tiny|1b|8b) ;; *) die_usage "--model must be tiny, 1b or 8b" ;; esac
case "$backend" in torch|fake) ;; *) die_usage "--backend must be torch or fake" ;; esac
case "$thp_even" in ''|always|madvise|never) ;; *) die_usage "--thp-even takes always, madvise or never" ;; esac
for v in pinned_mb max_new_tokens cold_timeout restore_timeout; do is_uint "${!v}" || die_usage "--${v//_/-} must be a number"; done
[ -z "$cycles" ] || { is_uint "$cycles" && [ "$cycles" -ge 1 ]; } || die_usage "--cycles must be a number ≥ 1"
[ -z "$port" ] || is_uint "$port" || die_usage "--port must be a number"
[ -z "$gpu" ] || [[ $gpu =~ ^[0-9,]+$ ]] || die_usage "--gpu must be a GPU index"
[ -z "$engine" ] || [ -z "$engines" ] || die_usage "--engine and --engines exclude each other"
[ -n "$engines" ] || engines=${engine:-static}
IFS=, read -r -a engine_list <<<"$engines"
[ ${#engine_list[@]} -ge 1 ] || die_usage "--engines needs at least one engine"
for e in "${engine_list[@]}"; do
  case "$e" in static|eager) ;; *) die_usage "--engine(s) takes static or eager, not '$e'" ;; esac
done
[ "$(printf '%s\n' "${engine_list[@]}" | sort | uniq -d)" = "" ] || die_usage "--engines names an engine twice"
engine=${engine_list[0]}
[ -z "$gpu_mem_util" ] || [ -z "$kv_cache_gib" ] || die_usage "--gpu-memory-utilization and --kv-cache-gib exclude each other"
[ -z "$gpu_mem_util" ] || [[ $gpu_mem_util =~ ^(0?\.[0-9]+|1(\.0*)?)$ ]] || die_usage "--gpu-memory-utilization must be in (0, 1]"
[ -z "$kv_cache_gib" ] || [[ $kv_cache_gib =~ ^([0-9]+(\.[0-9]*)?|\.[0-9]+)$ ]] || die_usage "--kv-cache-gib must be a number of GiB"
if [ "$demo" = 1 ]; then drop_caches=0; cycles=${cycles:-1}; fi
cycles=${cycles:-1}
[ "$backend" = fake ] && pinned_mb=0

gpusnap=${gpusnap:-${GPUSNAP_BUILD_DIR:-$REPO_DIR/build}/gpusnap}
[ -x "$gpusnap" ] || { echo "run_bench.sh: no gpusnap binary at $gpusnap (build it, or pass --gpusnap)" >&2; exit 2; }
gpusnap=$(cd "$(dirname "$gpusnap")" && pwd)/$(basename "$gpusnap")
store=${store:-${GPUSNAP_STORE:-$work_dir/store}}
if [ -z "$out_file" ]; then
  if [ -n "${OUT:-}" ]; then out_file=$OUT/bench.json; else out_file=/tmp/gpusnap-bench.json; fi
fi

# --- several engines: the whole run once per engine, then side by side ------
if [ ${#engine_list[@]} -gt 1 ]; then
  child_args=(); skip=0
  for a in "${orig_args[@]}"; do
    if [ "$skip" = 1 ]; then skip=0; continue; fi
    case "$a" in --engines|--work-dir|--out) skip=1; continue ;; esac
    child_args+=("$a")
  done
  mkdir -p "$work_dir"
  child=""; rc=0; outs=()
  # A run in the background still gets a TERM (timeout, a Ctrl-C here) passed on, and stops its workloads.
  trap '[ -z "$child" ] || { kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; }; exit 130' INT
  trap '[ -z "$child" ] || { kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; }; exit 143' TERM
  for e in "${engine_list[@]}"; do
    echo "== engine $e: run_bench.sh ${child_args[*]} --engine $e"
    rm -f "$work_dir/engine-$e.json"
    bash "$BENCH_DIR/run_bench.sh" "${child_args[@]}" --engine "$e" --work-dir "$work_dir/engine-$e" \
      --out "$work_dir/engine-$e.json" &
    child=$!
    r=0; wait "$child" || r=$?
    child=""
    [ "$r" = 0 ] || { echo "== engine $e: run_bench.sh failed (status $r)" >&2; [ "$rc" != 0 ] || rc=$r; }
    outs+=("$e=$work_dir/engine-$e.json")
  done
  "$PY" "$LIB" combine --out "$out_file" "${outs[@]}" || { [ "$rc" != 0 ] || rc=1; }
  exit "$rc"
fi

name=bench
logs=$work_dir/logs
results=$work_dir/results
server_log=$logs/server.log
export GPUSNAP_STORE=$store GPUSNAP_RUN_DIR=$work_dir/run
mkdir -p "$logs" "$results" "$store" "$GPUSNAP_RUN_DIR" "$weights_dir"
rm -f "$results"/*.json "$results"/*.raw "$server_log"

say() { [ "$demo" = 1 ] && [ "${2:-}" = detail ] && return 0; echo "== $1"; }
now() { date +%s.%N; }
gs() { "$gpusnap" "$@"; }

# --- workloads: every one under our run directory is ours ---------------------
reapers=()      # reaper pids seen, in case `gpusnap ps` itself fails at cleanup
snapshots=()    # snapshot ids made by this run and not yet removed

add_reaper() {  # client output file
  local r
  r=$("$PY" "$LIB" get "$1" cmd_output.reaper_pid)
  if [ -n "$r" ]; then reapers+=("$r"); fi
}

forget_snapshot() {
  local id kept=()
  for id in "${snapshots[@]}"; do [ "$id" = "$1" ] || kept+=("$id"); done
  snapshots=("${kept[@]}")
}

running() { gs --json ps 2>/dev/null | "$PY" "$LIB" running || true; }

alive() {  # pid -> 0 while it runs (a zombie does not)
  local stat
  [[ $1 =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  case "${stat%% *}" in Z|X|"") return 1 ;; esac
}

wait_gone() {  # pid seconds -> 0 when the pid is gone (or a zombie)
  local pid=$1 deadline=$(( $(date +%s) + $2 ))
  while alive "$pid"; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.05
  done
}

stop_workloads() {  # stop every running workload (by its reaper) and wait for it
  local p r pids=()
  while read -r _ p r; do
    [ -n "$r" ] || continue
    kill -TERM "$r" 2>/dev/null || true
    pids+=("$p" "$r")
  done < <(running)
  for r in "${reapers[@]}"; do
    if alive "$r"; then kill -TERM "$r" 2>/dev/null || true; pids+=("$r"); fi
  done
  for p in "${pids[@]}"; do
    wait_gone "$p" 30 || { kill -KILL "$p" 2>/dev/null || true; wait_gone "$p" 10 || echo "warning: pid $p did not go away" >&2; }
  done
}

error=""
finished=0
registry_pid=""
agent_pid=""
thp_host=""
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local rc=$? last id
  set +e
  trap - EXIT INT TERM
  stop_workloads
  [ -z "$thp_host" ] || echo "$thp_host" >"$THP_FILE" 2>/dev/null
  if [ -n "$registry_pid" ]; then kill -TERM "$registry_pid" 2>/dev/null; wait "$registry_pid" 2>/dev/null; fi
  if [ -n "$agent_pid" ]; then kill -TERM "$agent_pid" 2>/dev/null; wait "$agent_pid" 2>/dev/null; fi
  rm -rf "$work_dir/store-ref" "$work_dir/store-pull" "$work_dir/store-agent" "$work_dir/trust"
  [ -z "$registry_dir" ] || rm -rf "$registry_dir/gpusnap-bench-registry"
  # A checkpoint that finished after the signal came has not been recorded yet.
  last=$("$PY" "$LIB" get "$results/ckpt.raw" id 2>/dev/null)
  if [ -n "$last" ]; then forget_snapshot "$last"; snapshots+=("$last"); fi
  if [ "$keep" = 0 ]; then
    for id in "${snapshots[@]}"; do gs rm "$id" >/dev/null 2>&1; done
  elif [ ${#snapshots[@]} -gt 0 ]; then
    echo "snapshots kept in $store: ${snapshots[*]}"
  fi
  if [ "$rc" -ne 0 ] && [ -z "$error" ] && [ "$finished" = 0 ]; then error="run_bench.sh stopped with status $rc"; fi
  if [ -n "$error" ]; then
    echo "FAILED: $error" >&2
    if [ -s "$server_log" ]; then echo "--- last lines of the server log $server_log" >&2; tail -n 30 "$server_log" >&2; fi
    "$PY" "$LIB" report --dir "$results" --out "$out_file" --error "$error" >/dev/null 2>&1 &&
      echo "partial results: $out_file" >&2
    [ "$rc" -ne 0 ] || rc=1
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'error="interrupted"; exit 130' INT
trap 'error="terminated"; exit 143' TERM

fail() { error=$1; exit 1; }

# Leftovers of an earlier run that died: ours, so stopped.
if [ -n "$(running)" ]; then
  echo "stopping workloads left running in $GPUSNAP_RUN_DIR by an earlier run"
  stop_workloads
fi

if [ "$(stat -f -c %T "$store" 2>/dev/null)" = tmpfs ] && [ "$drop_caches" = 1 ]; then
  echo "warning: the store $store is on tmpfs: dropping the page cache does not evict it" >&2
fi

# --- the server ---------------------------------------------------------------
[ -n "$port" ] || port=$("$PY" "$LIB" free-port)
"$PY" "$LIB" port-free "$port" || fail "port $port is taken: the server could not listen on it (pass another --port)"
server_args=(--model "$model" --backend "$backend" --engine "$engine" --weights-dir "$weights_dir" --port "$port"
             --max-new-tokens "$max_new_tokens" --pinned-mb "$pinned_mb")
[ -z "$gpu_mem_util" ] || server_args+=(--gpu-memory-utilization "$gpu_mem_util")
[ -z "$kv_cache_gib" ] || server_args+=(--kv-cache-gib "$kv_cache_gib")
server_env=(NCCL_NVLS_ENABLE=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false)
[ -z "$gpu" ] || server_env+=(CUDA_VISIBLE_DEVICES="$gpu")

say "preparing the weights of the $model model in $weights_dir (not timed)" detail
env "${server_env[@]}" "$PY" -u "$BENCH_DIR/server.py" "${server_args[@]}" --prepare >"$logs/prepare.log" 2>&1 ||
  { tail -n 30 "$logs/prepare.log" >&2; fail "preparing the weights failed (log: $logs/prepare.log)"; }

gpu_name=""; driver=""
if command -v nvidia-smi >/dev/null 2>&1; then
  q=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)
  gpu_name=${q%%,*}; driver=${q##*, }
fi
"$PY" "$LIB" env --out "$results/env.json" --prepare-log "$logs/prepare.log" \
  model="$model" backend="$backend" engine="$engine" gpushare="$gpushare" cycles="$cycles" drop_caches="$drop_caches" pinned_mb="$pinned_mb" \
  max_new_tokens="$max_new_tokens" gpu="$gpu_name" driver="$driver" kernel="$(uname -r)" host="$(hostname)" \
  gpusnap="$gpusnap" gpusnap_version="$(gs version 2>&1 || true)" store="$store" weights_dir="$weights_dir" \
  commit="$(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || true)"

# The cold start gets its best case: the weight file in the page cache, as the
# restore from the page cache has its snapshot there.
if [ -d "$weights_dir/$model" ]; then cat "$weights_dir/$model"/* >/dev/null; fi

# A snapshot holds about the GPU memory (the weights), the pinned buffer and
# the CPU state (a few GiB for a PyTorch process).
need=$("$PY" -c "import sys; print(int(sys.argv[1] or 0) + (int(sys.argv[2]) << 20) + (4 << 30))" \
       "$("$PY" "$LIB" get "$results/env.json" server.weights_bytes)" "$pinned_mb")
avail=$(df -PB1 "$store" | awk 'NR == 2 { print $4 }')
if [ -n "$avail" ] && [ "$avail" -lt "$need" ]; then
  echo "warning: $((avail >> 30)) GiB free in $store; a snapshot may need about $((need >> 30)) GiB" >&2
fi

# --- cold start ---------------------------------------------------------------
run_flags=()
[ "$gpushare" = 0 ] || run_flags=(--gpushare)
if [ "$demo" = 1 ]; then
  case "$model" in 1b) shape="Llama-3.2-1B" ;; 8b) shape="Llama-3.1-8B" ;; *) shape="tiny Llama" ;; esac
  say "gpusnap demo: a $shape-shaped inference server (random bf16 weights) on ${gpu_name:-the GPU}"
fi
say "cold start: gpusnap run -- python3 bench/server.py --model $model --engine $engine (to the first token of a streamed /generate)"
"$PY" "$BENCH_DIR/client.py" --port "$port" --timeout "$cold_timeout" --stream --exec -- \
  "$gpusnap" --json run "${run_flags[@]}" --name "$name" --log "$server_log" -- env "${server_env[@]}" \
  "$PY" -u "$BENCH_DIR/server.py" "${server_args[@]}" >"$results/cold.raw" 2>"$logs/cold.err" ||
  { cat "$logs/cold.err" >&2; fail "the cold start failed"; }
add_reaper "$results/cold.raw"
"$PY" "$LIB" cold --raw "$results/cold.raw" --log "$server_log" --out "$results/cold.json"
say "  first token after $(printf %.2f "$("$PY" "$LIB" get "$results/cold.json" first_token_s)") s" detail
pool=$("$PY" "$LIB" get "$results/cold.json" server.kv_pool_bytes)
scratch=$("$PY" "$LIB" get "$results/cold.json" server.kv_scratch)
if [ -n "$pool" ] && [ "$pool" != 0 ]; then
  say "  KV-cache pool $((pool >> 20)) MiB, scratch: ${scratch:-?}" detail
  if [ "$gpushare" = 0 ]; then
    echo "warning: without --gpushare the driver's checkpoint copies the whole KV-cache pool ($((pool >> 30)) GiB) to host memory and the snapshot (--kv-cache-gib bounds it)" >&2
  elif [ "$scratch" != marked ]; then
    echo "warning: the KV-cache pool ($((pool >> 30)) GiB) is not marked scratch ($scratch): the checkpoint saves it as chunks" >&2
  fi
fi

# The same prompt again on the cold server: greedy decoding must repeat itself
# here, or no comparison after a restore means anything.
"$PY" "$BENCH_DIR/client.py" --port "$port" --timeout 60 >"$results/cold-repeat.json" 2>"$logs/client.err" ||
  { cat "$logs/client.err" >&2; fail "the second generate on the cold server failed"; }
"$PY" "$LIB" compare --tokens-ref "$results/cold.json" --prev "$results/cold.json" --new "$results/cold-repeat.json" \
  --label "second generate on the cold server" || fail "the cold server does not repeat its own tokens"
prev=$results/cold-repeat.json   # the answer just before the state that gets checkpointed

# --- checkpoint / restore -----------------------------------------------------
current_pid() { running | awk -v n="$name" '$1 == n { print $2; exit }'; }

checkpoint() {  # cycle number -> snapshot id in $snap
  local k=$1 src t0 t1
  src=$(current_pid)
  [ -n "$src" ] || fail "no running workload '$name' to checkpoint"
  say "checkpoint #$k: gpusnap checkpoint $name" detail
  t0=$(now)
  gs --json checkpoint "$name" >"$results/ckpt.raw" 2>"$logs/checkpoint-$k.err" ||
    { cat "$logs/checkpoint-$k.err" >&2; fail "checkpoint #$k failed"; }
  t1=$(now)
  snap=$("$PY" "$LIB" checkpoint --raw "$results/ckpt.raw" --t0 "$t0" --t1 "$t1" --store "$store" \
         --out "$results/cycle-$k-checkpoint.json")
  [ -n "$snap" ] || fail "checkpoint #$k printed no snapshot id"
  snapshots+=("$snap")
  wait_gone "$src" 60 || fail "the checkpointed workload (pid $src) is still running"
  say "  snapshot $snap in $(printf %.2f "$("$PY" "$LIB" get "$results/cycle-$k-checkpoint.json" wall_s)") s" detail
}

restore() {  # snapshot id, result name, label, gpusnap restore's extra flags...
  local id=$1 res=$2 label=$3
  shift 3
  say "$label: gpusnap restore $id $* (to the first token of a streamed /generate)" detail
  "$PY" "$BENCH_DIR/client.py" --port "$port" --timeout "$restore_timeout" --stream --exec -- \
    "$gpusnap" --json restore "$id" "$@" >"$results/$res.json" 2>"$logs/$res.err" ||
    { rm -f "$results/$res.json"; cat "$logs/$res.err" >&2; fail "$label failed"; }
  add_reaper "$results/$res.json"
  "$PY" "$LIB" compare --tokens-ref "$results/cold.json" --prev "$prev" --new "$results/$res.json" --label "$label" ||
    fail "$label: the restored server does not answer as the cold one did"
  say "  first token after $(printf %.2f "$("$PY" "$LIB" get "$results/$res.json" first_token_s)") s, tokens identical" detail
}

# After a --lazy-pages restore: until its memory is all in (the next
# checkpoint reads all of it), how long that took into the result.
lazy_pages_wait() {  # result name
  local res=$1 state=""
  for _ in $(seq 1 "$((restore_timeout * 10))"); do
    state=$(gs --json ps | "$PY" -c 'import json, sys
print(next((w.get("lazy_pages", {}).get("state", "") for w in json.load(sys.stdin) if w["name"] == sys.argv[1]), ""))' "$name")
    case "$state" in done:*|failed:*) break ;; esac
    sleep 0.1
  done
  case "$state" in done:*) ;; *) fail "restore with --lazy-pages: the memory did not all arrive (${state:-no state})" ;; esac
  say "  every page in: ${state#done: }" detail
  "$PY" -c 'import json, re, sys
d = json.load(open(sys.argv[1])); d["lazy_pages"] = True
d["lazy_pages_s"] = float(re.search(r"in ([0-9.]+) s", sys.argv[2])[1]); json.dump(d, open(sys.argv[1], "w"))' \
    "$results/$res.json" "$state"
}

# The host's THP mode: the word in brackets of "always [madvise] never".
thp_mode() { local m; m=$(cat "$THP_FILE" 2>/dev/null) || return 0; case "$m" in *\[*\]*) m=${m#*[}; m=${m%%]*} ;; esac; echo "$m"; }
if [ -n "$thp_even" ]; then
  thp_host=$(thp_mode)
  [ -n "$thp_host" ] || fail "--thp-even: cannot read $THP_FILE"
fi

for k in $(seq 1 "$cycles"); do
  checkpoint "$k"
  if [ -n "$thp_even" ] && [ $((k % 2)) = 0 ]; then
    echo "$thp_even" >"$THP_FILE" || fail "--thp-even: cannot write $THP_FILE (not root?)"
  fi
  thp_now=""
  [ -z "$thp_even" ] || thp_now=$(thp_mode)
  flags=()
  [ "$huge_pages_even" = 0 ] || [ $((k % 2)) != 0 ] || { flags=(--huge-pages); thp_now="always (gpusnap --huge-pages)"; }
  lazy_now=0
  [ "$lazy_pages_even" = 0 ] || [ $((k % 2)) != 0 ] || { flags+=(--lazy-pages); lazy_now=1; }
  restore "$snap" "cycle-$k-restore" "restore #$k (page cache${thp_now:+, THP $thp_now}$([ "$lazy_now" = 0 ] || echo ", lazy pages"))" \
    "${flags[@]}"
  [ "$lazy_now" = 0 ] || lazy_pages_wait "cycle-$k-restore"
  [ -z "$thp_host" ] || echo "$thp_host" >"$THP_FILE"
  [ -z "$thp_now" ] || "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); d["thp"] = sys.argv[2]; json.dump(d, open(sys.argv[1], "w"))' \
    "$results/cycle-$k-restore.json" "$thp_now"
  before=$prev
  prev=$results/cycle-$k-restore.json
  if [ "$cycles" -gt 1 ] && [ "$k" -lt "$cycles" ] && [ "$keep" = 0 ]; then
    gs rm "$snap" >/dev/null && forget_snapshot "$snap"
  fi
done

registry_restore() {  # result name, label, command...: into an empty store, to the first token of a streamed /generate
  local res=$1 label=$2
  shift 2
  rm -rf "$work_dir/store-ref" "$work_dir/store-pull"
  say "$label, into an empty store (to the first token of a streamed /generate)" detail
  "$PY" "$BENCH_DIR/client.py" --port "$port" --timeout "$restore_timeout" --stream --exec -- "$@" \
    >"$results/$res.json" 2>"$logs/$res.err" ||
    { rm -f "$results/$res.json"; cat "$logs/$res.err" >&2; fail "$label failed"; }
  add_reaper "$results/$res.json"
  "$PY" "$LIB" compare --tokens-ref "$results/cold.json" --prev "$prev" --new "$results/$res.json" \
    --label "$label" || fail "$label: the server does not answer as the cold one did"
  stop_workloads
  rm -rf "$work_dir/store-ref" "$work_dir/store-pull"
}

if [ "$use_registry" = 1 ]; then
  # The same snapshot through a registry on this machine, into empty stores:
  # restored from its reference (the chunks arriving as the restore goes),
  # and pulled first, then restored.
  say "starting a docker-registry on 127.0.0.1; pushing $snap" detail
  [ -n "$registry_dir" ] || registry_dir=$work_dir
  rm -rf "$registry_dir/gpusnap-bench-registry" "$results/registry.host"
  "$PY" "$BENCH_DIR/registry_serve.py" "$registry_dir/gpusnap-bench-registry" "$results/registry.host" \
    >"$logs/registry.log" 2>&1 &
  registry_pid=$!
  for _ in $(seq 1 300); do [ -s "$results/registry.host" ] && break; alive "$registry_pid" || break; sleep 0.1; done
  [ -s "$results/registry.host" ] || { cat "$logs/registry.log" >&2; fail "the registry did not start"; }
  reg_host=$(cat "$results/registry.host")
  repo=bench/server
  ref="$reg_host/$repo:v1"
  push_flags=(); pull_flags=(--plain-http)
  if [ "$sealed" = 1 ]; then
    # Keys as docs/DISTRIBUTION.md makes them, for this run only.
    trust=$work_dir/trust
    rm -rf "$trust"; mkdir -m 700 "$trust"
    { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$trust/sign.pem" &&
      openssl pkey -in "$trust/sign.pem" -pubout -out "$trust/sign.pub" &&
      openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:3072 -out "$trust/enc.pem" &&
      openssl pkey -in "$trust/enc.pem" -pubout -out "$trust/enc.pub" &&
      head -c 32 /dev/urandom >"$trust/secret"; } >"$logs/trust-keys.log" 2>&1 ||
      { cat "$logs/trust-keys.log" >&2; fail "making the signing and encryption keys failed (openssl)"; }
    chmod 600 "$trust/sign.pem" "$trust/enc.pem" "$trust/secret"
    "$PY" -c 'import json, sys; json.dump({"default": [{"type": "reject"}], "transports": {"docker": {sys.argv[1]: [{"type": "sigstoreSigned", "keyPath": sys.argv[2]}]}}}, open(sys.argv[3], "w"))' \
      "$reg_host/bench" "$trust/sign.pub" "$trust/policy.json"
    push_flags=(--sign-by-sigstore-private-key "$trust/sign.pem" --encryption-key "jwe:$trust/enc.pub"
                --encryption-secret-file "$trust/secret")
    pull_flags+=(--policy "$trust/policy.json" --decryption-key "$trust/enc.pem")
  fi
  t0=$(now)
  gs --json push "$snap" "$ref" --plain-http "${push_flags[@]}" >"$results/registry-push.raw" \
    2>"$logs/registry-push.err" || { cat "$logs/registry-push.err" >&2; fail "gpusnap push failed"; }
  # With the manifest's layers as the registry holds them: how many are encrypted.
  "$PY" - "$results/registry-push.raw" "$t0" "$(now)" "$results/registry-push.json" "$sealed" \
    "$reg_host" "$repo" <<'PYEOF' || fail "reading the pushed manifest back failed"
import json, sys, urllib.request
raw, t0, t1, out, sealed, host, repo = sys.argv[1:]
d = json.load(open(raw))
d["wall_s"] = float(t1) - float(t0)
d["sealed"] = sealed == "1"
req = urllib.request.Request(f"http://{host}/v2/{repo}/manifests/v1",
                             headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=60) as r:
    layers = json.load(r)["layers"]
d["layers"] = len(layers)
d["layers_encrypted"] = sum(1 for layer in layers if layer["mediaType"].endswith("+encrypted"))
json.dump(d, open(out, "w"))
PYEOF
  stop_workloads
  prev=$before  # both restore the state the last checkpoint took
  registry_restore registry-ref "restore from the reference" \
    env GPUSNAP_STORE="$work_dir/store-ref" "$gpusnap" --json restore "$ref" "${pull_flags[@]}"
  # The same through a node agent, the path Kubernetes takes: one restore
  # story, the chunks arriving as it restores (the job's phases say so).
  rm -rf "$work_dir/store-agent" "$work_dir/agent.sock"
  GPUSNAP_STORE="$work_dir/store-agent" "$gpusnap" agent --socket "$work_dir/agent.sock" "${pull_flags[@]}" \
    >"$logs/agent.log" 2>&1 &
  agent_pid=$!
  for _ in $(seq 1 300); do [ -S "$work_dir/agent.sock" ] && break; alive "$agent_pid" || break; sleep 0.1; done
  [ -S "$work_dir/agent.sock" ] || { cat "$logs/agent.log" >&2; fail "the agent did not start"; }
  registry_restore registry-agent "restore from the reference through the agent" \
    env GPUSNAP_STORE="$work_dir/store-agent" "$gpusnap" --json restore "$ref" --agent "$work_dir/agent.sock"
  kill -TERM "$agent_pid" 2>/dev/null; wait "$agent_pid" 2>/dev/null; agent_pid=""
  rm -rf "$work_dir/store-agent"
  registry_restore registry-pull-restore "pull-then-restore" \
    sh -c 'store=$1 gs=$2 ref=$3 out=$4 snap=$5; shift 5
           GPUSNAP_STORE="$store" "$gs" --json pull "$ref" "$@" >"$out" && GPUSNAP_STORE="$store" exec "$gs" --json restore "$snap"' \
    sh "$work_dir/store-pull" "$gpusnap" "$ref" "$results/registry-pull.json" "$snap" "${pull_flags[@]}"
  kill -TERM "$registry_pid" 2>/dev/null; wait "$registry_pid" 2>/dev/null; registry_pid=""
  rm -rf "$work_dir/trust"
fi

if [ "$drop_caches" = 1 ]; then
  # The same snapshot again, this time read from the disk: stop the restored
  # server, drop the page cache, restore.
  say "stopping the restored server; dropping the page cache" detail
  stop_workloads
  sync
  if (echo 3 >/proc/sys/vm/drop_caches) 2>/dev/null; then
    prev=$before
    restore "$snap" restore-dropped "restore (dropped caches)"
  else
    echo "warning: cannot write /proc/sys/vm/drop_caches (not root?): no restore after dropping the caches" >&2
  fi
fi

# --- report -------------------------------------------------------------------
stop_workloads
say "results" detail
rc=0
finished=1
targets_flag=()
[ "$check_targets" = 0 ] || targets_flag=(--check-targets)
if [ "$demo" = 1 ]; then
  "$PY" "$LIB" report --dir "$results" --out "$out_file" --demo || rc=$?
  echo "== demo OK"
else
  "$PY" "$LIB" report --dir "$results" --out "$out_file" "${targets_flag[@]}" || rc=$?
fi
exit $rc
