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
    t = torch.randint(-2**31, 2**31 - 1, (mib << 18,), dtype=torch.int32, device="cuda", generator=g)
    torch.cuda.synchronize()

    def checksum():
        # Exact: int64 sums of int32 values, folded with positions so that a
        # moved block is caught too.
        s = t.to(torch.int64).sum().item()
        w = (t[:: 4096].to(torch.int64) * torch.arange(1, t[:: 4096].numel() + 1, device="cuda")).sum().item()
        return f"{s}:{w}"
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
