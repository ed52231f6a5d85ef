#!/bin/bash
# launch_ranks.sh N SCRIPT [ARGS...]: start N ranks of a torch.distributed
# script on this node, as torchrun does, but without torchrun's elastic agent:
# the agent's rendezvous store maps io_uring, which CRIU cannot dump, so a job
# to be checkpointed as a whole is started this way. Rank 0 hosts the store
# (torch's plain TCPStore backend: USE_LIBUV=0); the ranks reach it over
# loopback. SIGTERM stops every rank; the first rank to fail stops the rest.
set -u
n=$1
shift
export MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29511} WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n USE_LIBUV=0
pids=()
for ((r = 0; r < n; r++)); do
  RANK=$r LOCAL_RANK=$r python3 "$@" &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' TERM INT
wait -n
rc=$?
kill "${pids[@]}" 2>/dev/null
wait
exit $rc
