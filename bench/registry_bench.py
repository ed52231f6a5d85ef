#!/usr/bin/env python3
"""registry_bench.py - gpusnap pull against plain blob GETs, side by side.

Starts Debian's docker-registry on 127.0.0.1 (tests/e2e/registry.py, plain
HTTP, storage on the store's filesystem), pushes a snapshot, then in
alternating rounds:
  - `gpusnap pull` of it into an empty store;
  - curl GETs of the very same blobs from the same registry into files on
    the same filesystem, as many at once as the pull's --jobs.
The ratio curl time / pull time is the pull's share of what the registry and
the disk give (goal: >= 0.9). With --second, a second snapshot of the same
model is pushed and pulled after the first: the bytes that move against the
bytes it holds (goal: only the changed chunks).

With --make-fake MIB it makes its own snapshot first: a vmm_worker under
`gpusnap run --gpushare` on the fake libcuda (GPUSNAP_FAKE_CUDA_DIR), MIB of
device memory in chunks, checkpointed twice (the second after more steps) -
a dry run of the harness on a machine without a GPU.

usage: registry_bench.py [--store DIR] [--snapshot ID [--second ID2]]
                         [--make-fake MIB] [--rounds N] [--jobs J] [--json OUT]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
import registry  # noqa: E402  (the project's own registry fixture)

GPUSNAP = os.environ.get("GPUSNAP_BIN", os.path.join(REPO, "build", "gpusnap"))


def run(args, env=None, check=True):
    p = subprocess.run(args, capture_output=True, text=True, env=env)
    if check and p.returncode != 0:
        sys.exit(f"registry_bench: {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p


def gs(env, *args):
    return json.loads(run([GPUSNAP, "--json", *args], env=env).stdout)


def make_fake(env, mib, work):
    """Two snapshots of one vmm_worker on the fake driver; returns their ids."""
    build = os.path.dirname(GPUSNAP)
    fakes = os.environ.get("GPUSNAP_FAKE_CUDA_DIR", os.path.join(build, "fakes"))
    worker = os.path.join(os.environ.get("GPUSNAP_WORKLOADS", os.path.join(build, "workloads")), "vmm_worker")
    # The fake's stand-ins: a device file the worker maps, the driver's /proc version.
    device = f"/dev/nvidia-gpusnap-bench-{os.getpid()}"
    with open(device, "wb") as f:
        f.write(b"\0" * 4096)
    nvproc = os.path.join(work, "nvidia")
    os.makedirs(nvproc)
    with open(os.path.join(nvproc, "version"), "w") as f:
        f.write("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Release Build\n")
    env = dict(env, LD_LIBRARY_PATH=fakes, FAKE_CUDA_LOG=os.path.join(work, "fake-cuda.log"),
               FAKE_CUDA_STATE_FILE=os.path.join(work, "states"), FAKE_CUDA_GPUS="1",
               GPUSNAP_NVIDIA_PROC_DIR=nvproc)
    pid = int(run([GPUSNAP, "run", "--gpushare", "--name", "bench-vmm", "--", worker, "--mib", str(mib),
                   "--interval-ms", "50", "--device-file", device], env=env).stdout.strip())
    time.sleep(2)
    first = run([GPUSNAP, "checkpoint", "-q", "bench-vmm", "--leave-running"], env=env).stdout.split()[-1]
    time.sleep(1)
    second = run([GPUSNAP, "checkpoint", "-q", "bench-vmm"], env=env).stdout.split()[-1]
    del pid  # checkpointed without --leave-running: gone
    os.unlink(device)
    return first, second


def blobs_of(reg, ref_path):
    """The manifest's blobs (config first) as (digest, size)."""
    raw = run(["curl", "-sf", "-H", "Accept: application/vnd.oci.image.manifest.v1+json",
               f"{reg.url}/v2/{ref_path[0]}/manifests/{ref_path[1]}"]).stdout
    m = json.loads(raw)
    return [(d["digest"], d["size"]) for d in [m["config"], *m["layers"]]]


def curl_all(reg, repo, blobs, jobs, into):
    os.makedirs(into)
    urls = "\n".join(f"{reg.url}/v2/{repo}/blobs/{d} {into}/{i}" for i, (d, _) in enumerate(blobs))
    t = time.monotonic()
    subprocess.run(["xargs", "-P", str(jobs), "-L", "1", "sh", "-c", 'curl -sf -o "$1" "$0"'],
                   input=urls, text=True, check=True)
    subprocess.run(["sync", "-f", into], check=True)
    return time.monotonic() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default=os.environ.get("GPUSNAP_STORE", "/var/lib/gpusnap"))
    ap.add_argument("--snapshot")
    ap.add_argument("--second")
    ap.add_argument("--make-fake", type=int, metavar="MIB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--registry-dir", help="where the registry keeps its storage (a folder of its own in it, removed at the end; "
                    "default: the work directory beside the store)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="gpusnap-registry-bench-", dir=os.path.dirname(os.path.abspath(a.store)))
    try:
        env = dict(os.environ, GPUSNAP_STORE=a.store)
        if a.make_fake:
            env["GPUSNAP_RUN_DIR"] = os.path.join(work, "run")
            a.snapshot, a.second = make_fake(env, a.make_fake, work)
        if not a.snapshot:
            sys.exit("registry_bench: name a snapshot (--snapshot ID) or make one (--make-fake MIB)")
        reg_dir = os.path.join(a.registry_dir, f"gpusnap-registry-bench-{os.getpid()}") if a.registry_dir else \
            os.path.join(work, "registry")
        reg = registry.Registry(reg_dir, "plain")
        reg.start()
        try:
            ref = f"{reg.host}/bench/snapshot:one"
            t = time.monotonic()
            pushed = gs(env, "push", a.snapshot, ref, "--plain-http", "--jobs", str(a.jobs))
            push_s = time.monotonic() - t
            blobs = blobs_of(reg, ("bench/snapshot", "one"))
            total = sum(s for _, s in blobs)
            pull_s, curl_s = [], []
            for r in range(a.rounds):
                for kind in (("curl", "pull") if r % 2 == 0 else ("pull", "curl")):
                    into = os.path.join(work, f"{kind}-{r}")
                    if kind == "curl":
                        curl_s.append(curl_all(reg, "bench/snapshot", blobs, a.jobs, into))
                    else:
                        t = time.monotonic()
                        gs(dict(env, GPUSNAP_STORE=into), "pull", ref, "--plain-http", "--jobs", str(a.jobs))
                        subprocess.run(["sync", "-f", work], check=True)
                        pull_s.append(time.monotonic() - t)
                    shutil.rmtree(into)
            res = {"date": time.strftime("%Y-%m-%d"), "snapshot": a.snapshot, "second": a.second, "bytes": total, "blobs": len(blobs),
                   "jobs": a.jobs, "rounds": a.rounds, "push_s": push_s, "push": pushed,
                   "pull_s": pull_s, "curl_s": curl_s,
                   "pull_median_s": statistics.median(pull_s), "curl_median_s": statistics.median(curl_s)}
            res["pull_vs_curl"] = res["curl_median_s"] / res["pull_median_s"]
            if a.second:
                ref2 = f"{reg.host}/bench/snapshot:two"
                res["second_push"] = gs(env, "push", a.second, ref2, "--plain-http", "--jobs", str(a.jobs))
                node = os.path.join(work, "node-b")
                gs(dict(env, GPUSNAP_STORE=node), "pull", ref, "--plain-http")
                res["second_pull"] = gs(dict(env, GPUSNAP_STORE=node), "pull", ref2, "--plain-http")
        finally:
            reg.close()
        mb = total / 1e6
        print(f"snapshot {a.snapshot}: {len(blobs)} blobs, {mb:.1f} MB; push {push_s:.2f} s")
        print(f"pull  median {res['pull_median_s']:.3f} s ({mb / res['pull_median_s']:.0f} MB/s)  runs {pull_s}")
        print(f"curl  median {res['curl_median_s']:.3f} s ({mb / res['curl_median_s']:.0f} MB/s)  runs {curl_s}")
        print(f"pull against curl: {res['pull_vs_curl']:.2f}x of curl's rate (goal >= 0.9)")
        if a.second:
            for k in ("second_push", "second_pull"):
                r = res[k]
                print(f"{k}: {r['bytes_moved'] / 1e6:.1f} of {r['bytes_total'] / 1e6:.1f} MB moved, "
                      f"{r['blobs_skipped']} of {r['blobs']} blobs already there")
        if a.json_out:
            with open(a.json_out, "w") as f:
                json.dump(res, f, indent=2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if a.registry_dir:
            shutil.rmtree(os.path.join(a.registry_dir, f"gpusnap-registry-bench-{os.getpid()}"), ignore_errors=True)


if __name__ == "__main__":
    main()
