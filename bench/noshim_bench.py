#!/usr/bin/env python3
"""gpusnap's restore without the shim against the driver API plus CRIU alone.

One process holding N MiB on the GPU (bench/memory_holder.py, no gpushare
shim: the driver's checkpoint parks that memory in host memory and CRIU saves
it with the rest) is checkpointed twice: once by gpusnap into its store, once
by hand (`gpusnap cuda suspend`, then the bundle's `criu dump` into a plain
directory). Each image is then restored in turn, side by side in one run, from
the page cache and after dropping the caches:

    gpusnap     `gpusnap restore ID` (verify, namespace, CRIU, driver restore)
    bare        `criu restore -d` of the same process, then `gpusnap cuda resume`

and timed from the command's start to the restored process's first answer,
whose checksum must equal the one before the checkpoint. The bytes each image
holds and the disk's read rate (a sequential read of the image after dropping
the caches) are measured in the same run, so the cold rows can be read against
`bytes ÷ rate`.

    sudo python3 bench/noshim_bench.py --mib 8192                     # GPU
    sudo python3 bench/noshim_bench.py --device cpu --mib 512 --rounds 1   # dry run, no GPU

Prints a Markdown table and writes the raw figures as JSON (--out).
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import benchlib
from client import alive  # bench/client.py: the script's own folder is on the path

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(port, timeout_s):
    """The holder's answer, polled for until timeout_s; None if none came."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as c:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = c.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                if data:
                    return json.loads(data)
        except (OSError, ValueError):
            pass
        time.sleep(0.002)
    return None


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def tree_bytes(path):
    total = 0
    for d, _, names in os.walk(path):
        for n in names:
            p = os.path.join(d, n)
            if os.path.isfile(p) and not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def read_rate(path):
    """Bytes per second of a sequential read of every file under path, caches dropped first."""
    drop_caches()
    total, t = 0, time.monotonic()
    for d, _, names in os.walk(path):
        for n in names:
            p = os.path.join(d, n)
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb", buffering=0) as f:
                    while True:
                        b = f.read(8 << 20)
                        if not b:
                            break
                        total += len(b)
    return total / max(time.monotonic() - t, 1e-9)


def end(pid):
    if not pid or not alive(pid):
        return
    os.kill(pid, signal.SIGKILL)
    # Gone, not only dead: the bare restore needs its pid free again.
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.02)


class Bench:
    def __init__(self, a):
        self.a = a
        self.work = a.work_dir
        os.makedirs(self.work, exist_ok=True)
        self.store = os.path.join(self.work, "store")
        self.env = dict(os.environ, GPUSNAP_STORE=self.store, GPUSNAP_RUN_DIR=os.path.join(self.work, "run"),
                        NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
        self.bundle = a.criu or os.path.join(os.path.dirname(os.path.abspath(a.gpusnap)), "criu-bundle")
        self.criu = [os.path.join(self.bundle, "lib", "ld-linux-x86-64.so.2"), os.path.join(self.bundle, "bin", "criu")]
        self.to_end = []   # pids to end on the way out

    def gs(self, *args, check=True):
        return benchlib.run_gpusnap(self.a.gpusnap, args, self.env, check=check)

    def holder_argv(self, port):
        return [sys.executable, os.path.join(HERE, "memory_holder.py"), "--mib", str(self.a.mib), "--port", str(port),
                "--device", self.a.device]

    def wait_ready(self, port, what, pid=None):
        deadline = time.monotonic() + self.a.start_timeout
        got = None
        while got is None and time.monotonic() < deadline and (pid is None or alive(pid)):
            got = ask(port, 1)
        if got is None:
            raise SystemExit(f"{what} never answered on 127.0.0.1:{port}")
        return got["checksum"]

    # --- gpusnap: run, checkpoint; restore ---------------------------------
    def gpusnap_image(self, port):
        run = json.loads(self.gs("run", "--name", "noshim-bench", "--", *self.holder_argv(port)).stdout)
        self.to_end.append(run.get("reaper_pid"))
        checksum = self.wait_ready(port, "the gpusnap-run holder", run.get("pid"))
        snap = json.loads(self.gs("checkpoint", "noshim-bench").stdout)
        return snap["id"], checksum

    def gpusnap_restore(self, snap_id, port):
        t = time.monotonic()
        p = self.gs("restore", snap_id, "--name", "noshim-bench")
        got = ask(port, self.a.start_timeout)
        wall = time.monotonic() - t
        res = json.loads(p.stdout)
        w = res.get("workload", res)
        return wall, got, res.get("timings_s", {}), w.get("reaper_pid")

    # --- bare: driver API + CRIU by hand ------------------------------------
    def bare_image(self, port, images):
        log = open(os.path.join(self.work, "bare-holder.log"), "w")
        holder = subprocess.Popen(self.holder_argv(port), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                  start_new_session=True, env=self.env, cwd="/")
        self.bare_pid = holder.pid
        self.to_end.append(holder.pid)
        checksum = self.wait_ready(port, "the bare holder", holder.pid)
        if self.a.device == "cuda":
            self.gs("cuda", "suspend", str(holder.pid))
        shutil.rmtree(images, ignore_errors=True)
        os.makedirs(images)
        subprocess.run(self.criu + ["dump", "-t", str(holder.pid), "-D", images, "-o", "dump.log", "--file-locks",
                                    "--ghost-limit", str(256 << 20)], check=True, env=self.env)
        holder.wait()
        return checksum

    def bare_restore(self, images, port):
        pidfile = os.path.join(images, "restored.pid")
        if os.path.exists(pidfile):
            os.unlink(pidfile)
        t = time.monotonic()
        r = subprocess.run(self.criu + ["restore", "-D", images, "-o", "restore.log", "-d", "--file-locks",
                                        "--pidfile", pidfile], env=self.env)
        if r.returncode != 0:
            raise SystemExit(f"criu restore failed ({r.returncode}); see {images}/restore.log")
        with open(pidfile) as f:
            pid = int(f.read())
        t_criu = time.monotonic() - t
        if self.a.device == "cuda":
            self.gs("cuda", "resume", str(pid))
        got = ask(port, self.a.start_timeout)
        return time.monotonic() - t, got, {"criu-restore": t_criu}, pid

    def run(self):
        a = self.a
        port_g, port_b = free_port(), free_port()
        images = os.path.join(self.work, "bare-images")
        snap_id, sum_g = self.gpusnap_image(port_g)
        sum_b = self.bare_image(port_b, images)
        snap_dir = os.path.join(self.store, "snapshots", snap_id)
        out = {"mib": a.mib, "device": a.device, "rows": [],
               "bytes": {"gpusnap": tree_bytes(snap_dir), "bare": tree_bytes(images)}}
        caches = ["page cache"] + ([] if a.no_drop_caches else ["dropped"])
        for rnd in range(a.rounds):
            for cache in caches:
                for who in ("gpusnap", "bare") if rnd % 2 == 0 else ("bare", "gpusnap"):
                    if cache == "dropped":
                        drop_caches()
                    if who == "gpusnap":
                        wall, got, phases, pid = self.gpusnap_restore(snap_id, port_g)
                        want = sum_g
                    else:
                        wall, got, phases, pid = self.bare_restore(images, port_b)
                        want = sum_b
                    ok = got is not None and got["checksum"] == want
                    out["rows"].append({"round": rnd, "cache": cache, "who": who, "seconds": wall, "ok": ok,
                                        "phases": phases})
                    print(f"{cache:10} {who:8} {wall:7.3f} s {'ok' if ok else 'WRONG ANSWER: ' + repr(got)}",
                          flush=True)
                    end(pid)
                    if not ok:
                        raise SystemExit(f"{who} restore gave {got!r}, expected checksum {want}")
        if not a.no_drop_caches:
            out["read_rate"] = read_rate(snap_dir)
        self.gs("rm", snap_id, check=False)
        shutil.rmtree(images, ignore_errors=True)
        return out

    def cleanup(self):
        for p in self.to_end:
            end(p)


def table(out):
    lines = [f"{out['mib']} MiB on the {'GPU' if out['device'] == 'cuda' else 'CPU'}, no shim; image bytes: "
             f"gpusnap {out['bytes']['gpusnap'] / 1e9:.2f} GB, bare {out['bytes']['bare'] / 1e9:.2f} GB"
             + (f"; disk read rate {out['read_rate'] / 1e9:.2f} GB/s" if "read_rate" in out else ""), "",
             "| cache | restore → first answer | gpusnap | driver API + CRIU | ratio | gpusnap phases |",
             "|---|---|---:|---:|---:|---|"]
    for cache in ("page cache", "dropped"):
        g = [r for r in out["rows"] if r["cache"] == cache and r["who"] == "gpusnap"]
        b = [r for r in out["rows"] if r["cache"] == cache and r["who"] == "bare"]
        if not g or not b:
            continue
        gs, bs = sorted(r["seconds"] for r in g), sorted(r["seconds"] for r in b)
        gm, bm = gs[len(gs) // 2], bs[len(bs) // 2]
        ph = ", ".join(f"{k} {v:.2f}" for k, v in sorted(g[len(g) // 2]["phases"].items())
                       if isinstance(v, (int, float)) and v >= 0.01)
        lines.append(f"| {cache} | median of {len(g)} | {gm:.2f} s | {bm:.2f} s | {bm / gm:.2f}x | {ph} |")
        if cache == "dropped" and "read_rate" in out:
            lines.append(f"| | bytes ÷ read rate | {out['bytes']['gpusnap'] / out['read_rate']:.2f} s | "
                         f"{out['bytes']['bare'] / out['read_rate']:.2f} s | | |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=8192, help="memory the process holds (default 8192)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a dry run without a GPU")
    p.add_argument("--rounds", type=int, default=2, help="rounds of (gpusnap, bare) per cache state, order alternating")
    p.add_argument("--no-drop-caches", action="store_true", help="only restores from the page cache")
    p.add_argument("--gpusnap", default=os.path.join(REPO, "build", "gpusnap"))
    p.add_argument("--criu", help="CRIU bundle (default: criu-bundle beside gpusnap)")
    p.add_argument("--work-dir", default="/var/tmp/gpusnap-noshim-bench")
    p.add_argument("--start-timeout", type=float, default=300)
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", tempfile.gettempdir()), "noshim-bench.json"))
    a = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("noshim_bench.py needs root (CRIU, dropping the page cache)")
    b = Bench(a)
    try:
        out = b.run()
    finally:
        b.cleanup()
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
