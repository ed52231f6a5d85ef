#!/usr/bin/env python3
"""A torchrun job whose ranks all-reduce over NCCL every step (P2P over NVLink
between the GPUs of one node), for gpusnap's gpushare tests.

Each rank holds a seeded int32 tensor (--mib MiB) and a seeded "weights"
tensor (--weights-mib MiB). Every step each rank all-reduces its tensor plus
the step number; the result must be the sum of all ranks' tensors plus
world_size * step, checked on every rank. After a pause longer than a second
(a suspend, a checkpoint) each rank also checks its weights' sum. Rank 0
prints "step N counter N sum S" (S: the all-reduced tensor's sum at step 0,
the same at every step when all is well); any wrong value prints MISMATCH and
exits 1.

    torchrun --nproc-per-node 2 nccl_allreduce.py [--mib 64] [--weights-mib 1024] [--interval-ms 100]

Run it with NCCL_NVLS_ENABLE=0 (no NVLink multicast).
"""
import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--weights-mib", type=int, default=1024)
    p.add_argument("--interval-ms", type=int, default=100)
    args = p.parse_args()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    g = torch.Generator(device=dev)
    g.manual_seed(1000 + rank)
    n = args.mib * (1 << 20) // 4
    mine = torch.randint(0, 1000, (n,), dtype=torch.int32, device=dev, generator=g)
    weights = torch.randint(0, 1 << 20, (args.weights_mib * (1 << 20) // 4,), dtype=torch.int32, device=dev,
                            generator=g)
    weights_sum = int(weights.sum(dtype=torch.int64))
    total = mine.clone()
    dist.all_reduce(total)
    total_sum = int(total.sum(dtype=torch.int64))
    last = time.monotonic()
    step = 0
    while not stop:
        step += 1
        x = mine + step
        dist.all_reduce(x)
        ok = torch.equal(x, total + world * step)
        now = time.monotonic()
        if ok and now - last > 1.0:
            ok = int(weights.sum(dtype=torch.int64)) == weights_sum
        last = now
        if not ok:
            print(f"MISMATCH at step {step} on rank {rank}", flush=True)
            sys.exit(1)
        if rank == 0:
            print(f"step {step} counter {step} sum {total_sum}", flush=True)
        time.sleep(args.interval_ms / 1000)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
