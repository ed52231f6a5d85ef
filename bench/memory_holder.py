#!/usr/bin/env python3
"""A process that holds N MiB of seeded memory and answers with its checksum.

The workload of bench/noshim_bench.py: with `--device cuda` the memory is on
the GPU (PyTorch, no gpushare shim: the driver's checkpoint parks it in host
memory, where CRIU saves it); with `--device cpu` it is a bytearray (a dry run
of the benchmark on a machine without a GPU). Each connection to 127.0.0.1:PORT
gets one line of JSON: {"checksum": ..., "pid": ..., "answers": n}, computed
from the memory there and then, so an answer after a restore proves the memory
came back.
"""
import argparse
import hashlib
import json
import os
import random
import socket
import sys

SEED = 2468


def cuda_memory(mib):
    import torch
    g = torch.Generator(device="cuda")
    g.manual_seed(SEED)
    t = torch.empty(mib << 18, dtype=torch.int32, device="cuda")
    t.random_(-2**31, 2**31 - 1, generator=g)
    torch.cuda.synchronize()

    def checksum():
        # Exact: int64 sums of int32 values, block by block (a whole-tensor
        # int64 copy would double what the process holds), folded with the
        # block's position so that a moved block is caught too.
        total, step = 0, 64 << 20
        for i, off in enumerate(range(0, t.numel(), step)):
            total += (i + 1) * t[off:off + step].to(torch.int64).sum().item()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()   # hold the N MiB, not the temporaries
        return str(total)
    return checksum


def cpu_memory(mib):
    rng = random.Random(SEED)
    buf = bytearray()
    for _ in range(mib):
        buf += rng.randbytes(1 << 20)

    def checksum():
        return hashlib.sha256(buf).hexdigest()
    return checksum


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, required=True, help="memory to hold, MiB")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    a = p.parse_args(argv)
    checksum = cuda_memory(a.mib) if a.device == "cuda" else cpu_memory(a.mib)
    first = checksum()
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", a.port))
    srv.listen(8)
    print(f"READY {first}", flush=True)
    answers = 0
    while True:
        conn, _ = srv.accept()
        with conn:
            answers += 1
            conn.sendall((json.dumps({"checksum": checksum(), "pid": os.getpid(), "answers": answers}) + "\n").encode())


if __name__ == "__main__":
    sys.exit(main())
