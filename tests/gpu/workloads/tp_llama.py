#!/usr/bin/env python3
"""A tensor-parallel Llama-architecture model generating tokens under torchrun,
for gpusnap's gpushare tests and benchmark.

The model and its seeded random weights are bench/server.py's (a preset such
as 8b, the weights in a safetensors file, written once with --prepare by rank
0). Each rank loads the file, builds the model on the meta device around the
tensors, and shards every decoder layer's projections over the ranks with
PyTorch's tensor parallelism (q, k, v, gate, up by columns; o, down by rows:
one NCCL all-reduce each per layer and token). Every step all ranks generate
--tokens tokens greedily from the same fixed prompt; rank 0 prints

    TOKENS [...]                       once, the first step's tokens
    step N counter N sum S             S: a hash of the step's tokens

and MISMATCH (then exits 1) when a step's tokens differ from the first
step's. Phases of the start go to stdout as "PHASE <name> <unix time>".

    torchrun --nproc-per-node 2 tp_llama.py --model 8b --weights-dir DIR [--tokens 16] [--interval-ms 200]

Run it with NCCL_NVLS_ENABLE=0 (no NVLink multicast).
"""
import argparse
import hashlib
import os
import signal
import sys
import time


def main():
    t0 = time.time()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "..", "bench"))
    import server  # bench/server.py: presets, weights, prompt

    p = argparse.ArgumentParser()
    p.add_argument("--model", default="8b", choices=sorted(server.PRESETS))
    p.add_argument("--weights-dir", required=True)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--interval-ms", type=int, default=200)
    p.add_argument("--attn", default="sdpa")
    args = p.parse_args()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    mesh = init_device_mesh("cuda", (world,))
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    say(f"PHASE imports {time.time():.3f}")

    args.device = f"cuda:{local}"
    args.backend = "torch"
    args.fake_mb = 0
    backend = server.TorchBackend(args)
    backend.imports()
    if rank == 0 and not server.weights_present(args):
        backend.prepare()
    dist.barrier()
    sd = backend.load()
    say(f"PHASE weights {time.time():.3f}")
    model = backend.build(sd)
    del sd
    plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
    for layer in model.model.layers:
        parallelize_module(layer, mesh, plan)
    torch.cuda.empty_cache()
    ids = server.prompt_ids(args.prompt_len, model.config.vocab_size)
    first = backend.generate(model, ids, args.tokens)
    say(f"PHASE ready {time.time():.3f}")
    say(f"TOKENS {first}")
    step = 0
    while not stop:
        step += 1
        toks = first if step == 1 else backend.generate(model, ids, args.tokens)
        if toks != first:
            print(f"MISMATCH at step {step} on rank {rank}: {toks}", flush=True)
            sys.exit(1)
        digest = int(hashlib.sha256(repr(toks).encode()).hexdigest()[:12], 16)
        say(f"step {step} counter {step} sum {digest}")
        time.sleep(args.interval_ms / 1000)
    say(f"stopped after {time.time() - t0:.1f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
