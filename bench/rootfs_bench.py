#!/usr/bin/env python3
"""The rootfs capture path against a cold start, and the process path beside them.

The benchmark server (bench/server.py, static engine, --compile: its prompt's
forward through torch.compile, inductor and Triton caches in the container's
root) runs in runc containers whose root is an overlay of this machine's own
root (the "image") under a fresh writable layer, as a node's runtime gives a
container. Side by side in one run, each timed to the first token of a
streamed answer (and to the whole answer):

    cold          a new container, nothing cached: the server imports, loads,
                  compiles and captures
    cold+rootfs   a new placeholder container into which `gpusnap restore
                  --into-container` applies the rootfs snapshot of the first
                  container (its writable layer: the compile caches) and starts
                  the same command: a cold start with warm caches
    process       `gpusnap restore` of a process snapshot of the same server
                  (run by `gpusnap run --gpushare`, outside a container, its
                  first start compiling, untimed): the warm path

Every answer must carry the cold start's tokens. Prints a Markdown table with
the server's phases (import, weights, compile, capture) and gpusnap's, and
writes the raw figures as JSON (--out).

    sudo python3 bench/rootfs_bench.py --gpusnap build/gpusnap --runc /usr/sbin/runc \\
        --weights-dir /dev/shm/gpusnap-weights --model 8b [--rounds 1] [--out F]

--backend fake runs the same harness with the server's stand-in backend (no
GPU, nothing compiled): a dry run of the containers and the restores.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import benchlib
import client  # bench/client.py: the script's own folder is on the path

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "server.py")
IMAGE = "localhost/gpusnap-bench-host-root:1"
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CACHE_ENV = {"TORCHINDUCTOR_CACHE_DIR": "/var/cache/gpusnap-bench/inductor",
             "TRITON_CACHE_DIR": "/var/cache/gpusnap-bench/triton"}


def mounts_beside_root():
    """This machine's mount points that hold files a container of its root
    needs (its own root's overlay shows none of them): bound into it."""
    skip = ("/proc", "/sys", "/dev", "/run", "/tmp", "/var/tmp", "/boot", "/mnt", "/media")
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == "/" or any(point == s or point.startswith(s + "/") for s in skip):
                continue
            if not any(point.startswith(o + "/") for o in out):
                out.append(point)
    return out


class Containers:
    """runc containers of this machine's root, each on an overlay with a fresh
    writable layer on a tmpfs of its own (an upper directory cannot lie on an
    overlay, which this machine's root may be)."""

    def __init__(self, a, base):
        self.a, self.base = a, base
        self.layers = os.path.join(base, "layers")
        os.makedirs(self.layers)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16g", "tmpfs", self.layers], check=True)
        self.running = {}  # id -> (runc Popen, merged dir)
        self.cgroup_top = "gpusnap-bench-" + uuid.uuid4().hex[:8]

    def start(self, args, env, binds=()):
        cid = uuid.uuid4().hex + uuid.uuid4().hex
        upper, work = (os.path.join(self.layers, cid[:12], d) for d in ("upper", "work"))
        merged = os.path.join(self.base, "merged-" + cid[:12])
        bundle = os.path.join(self.base, "bundle-" + cid[:12])
        for d in (upper, work, merged, bundle):
            os.makedirs(d)
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir=/,upperdir={upper},workdir={work}",
                        merged], check=True)

        def bind(path, writable=False):
            return {"destination": path, "type": "bind", "source": path, "options": ["rbind", "rw" if writable else "ro"]}

        caps = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
                "CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_IPC_LOCK", "CAP_NET_BIND_SERVICE"]
        config = {
            "ociVersion": "1.0.2",
            "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": args, "cwd": "/",
                        "env": [f"{k}={v}" for k, v in env.items()],
                        "capabilities": {k: caps for k in ("bounding", "effective", "permitted")}},
            "root": {"path": merged, "readonly": False},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                       {"destination": "/dev", "type": "bind", "source": "/dev", "options": ["rbind", "rw"]},
                       {"destination": "/sys", "type": "bind", "source": "/sys", "options": ["rbind", "ro"]},
                       *(bind(m) for m in mounts_beside_root()),
                       *(bind(b) for b in binds)],
            # The runtime names the image, as containerd's CRI plugin does: what a rootfs snapshot records.
            "annotations": {"io.kubernetes.cri.image-name": IMAGE},
            "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}],
                      "cgroupsPath": f"/{self.cgroup_top}/{cid}",
                      "resources": {"devices": [{"allow": True, "access": "rwm"}]}},
        }
        with open(os.path.join(bundle, "config.json"), "w") as f:
            json.dump(config, f)
        log = open(os.path.join(self.base, f"{cid[:12]}.log"), "w")
        # In the foreground, in the bundle: runc stays the init's parent there, as a runtime's shim does.
        p = subprocess.Popen([self.a.runc, "run", "--bundle", bundle, cid], cwd=bundle, stdin=subprocess.DEVNULL,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.running[cid] = (p, merged)
        return cid

    def init(self, cid, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            st = subprocess.run([self.a.runc, "state", cid], capture_output=True, text=True)
            if st.returncode == 0:
                state = json.loads(st.stdout)
                if state.get("pid") and state.get("status") == "running":
                    return state["pid"]
            time.sleep(0.02)
        raise SystemExit(f"container {cid[:12]} did not start: {self.log(cid)}")

    def tree_root(self, cid, timeout=30):
        init = self.init(cid)
        end = time.time() + timeout
        while time.time() < end:
            with open(f"/proc/{init}/task/{init}/children") as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
            time.sleep(0.02)
        raise SystemExit(f"container {cid[:12]}'s init started no child")

    def log(self, cid, whole=False):
        try:
            with open(os.path.join(self.base, f"{cid[:12]}.log")) as f:
                text = f.read()
                return text if whole else text[-2000:]
        except OSError:
            return ""

    def stop(self, cid):
        p, merged = self.running.pop(cid)
        subprocess.run([self.a.runc, "kill", cid, "KILL"], capture_output=True)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
        subprocess.run([self.a.runc, "delete", "--force", cid], capture_output=True)
        subprocess.run(["umount", "-l", merged], capture_output=True)

    def close(self):
        for cid in list(self.running):
            self.stop(cid)
        subprocess.run(["umount", "-l", self.layers], capture_output=True)
        for root, dirs, _ in os.walk("/sys/fs/cgroup"):
            if self.cgroup_top in dirs:
                try:
                    os.rmdir(os.path.join(root, self.cgroup_top))
                except OSError:
                    pass


class Bench:
    def __init__(self, a):
        self.a = a
        self.env = dict(os.environ, **SAFE_ENV)
        self.env["GPUSNAP_STORE"] = a.store
        self.base = tempfile.mkdtemp(prefix="gpusnap-rootfs-bench-", dir="/var/tmp")
        self.containers = Containers(a, self.base)
        self.results = []

    def gs(self, *args, check=True):
        p = benchlib.run_gpusnap(self.a.gpusnap, args, self.env, check=check, timeout=900)
        return json.loads(p.stdout) if p.stdout.strip() else {}

    def server_args(self):
        a = self.a
        args = [sys.executable, SERVER, "--model", a.model, "--weights-dir", a.weights_dir, "--port", str(a.port),
                "--backend", a.backend, "--compile"]
        if a.kv_cache_gib:
            args += ["--kv-cache-gib", str(a.kv_cache_gib)]
        return args

    def container_env(self):
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", **SAFE_ENV,
               **CACHE_ENV}
        for k in ("PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_HOME"):
            if os.environ.get(k):
                env[k] = os.environ[k]
        return env

    def first_token(self, t0, watch_pid=None):
        client.wait_health("127.0.0.1", self.a.port, t0 + self.a.timeout, watch_pid=watch_pid)
        ans, t_first = client.generate_streamed("127.0.0.1", self.a.port, timeout=self.a.timeout)
        return ans, t_first - t0, time.time() - t0

    def record(self, row, t0, ans, first, full, phases=None, log=""):
        """`log`: the server's output (its PHASE and INFO lines), for its start's breakdown."""
        server = benchlib.parse_phase_lines(log)
        info = benchlib.parse_info_lines(log)
        r = {"row": row, "first_token_s": round(first, 3), "full_answer_s": round(full, 3), "tokens": ans["tokens"],
             "server_phases": [(label, round(s, 3)) for label, s in benchlib.cold_intervals(server, t0, t0 + first)]
             if server else [],
             "compile_s": info.get("compile_s"), "gpusnap": phases or {}}
        self.results.append(r)
        print(f"{row}: first token {first:.2f} s, whole answer {full:.2f} s", flush=True)
        return r

    def cold(self):
        sh = " ".join(f"'{x}'" for x in self.server_args())
        t0 = time.time()
        cid = self.containers.start(["/bin/sh", "-c", f"{sh} & wait"], self.container_env())
        try:
            ans, first, full = self.first_token(t0)
        except client.Failure as e:
            raise SystemExit(f"cold start failed: {e}\n{self.containers.log(cid)}")
        return cid, self.record("cold", t0, ans, first, full, log=self.containers.log(cid, whole=True))

    def capture(self, cid):
        root = self.containers.tree_root(cid)
        t = time.time()
        meta = self.gs("checkpoint", "--capture-path", "rootfs", str(root))
        info = self.gs("inspect", meta["id"])
        return meta["id"], {"capture_s": round(time.time() - t, 3), "snapshot_bytes": info.get("total_bytes"),
                            "diff_entries": info.get("rootfs", {}).get("entries")}

    def rootfs_restore(self, snap):
        gpusnap = os.path.realpath(self.a.gpusnap)
        cid = self.containers.start([gpusnap, "__placeholder"], self.container_env(),
                                    binds=[os.path.dirname(gpusnap)])
        self.containers.init(cid)
        t0 = time.time()
        out = self.gs("restore", snap, "--into-container", cid, "--name", "rootfs-bench-" + cid[:6])
        try:
            ans, first, full = self.first_token(t0, watch_pid=out.get("pid"))
        except client.Failure as e:
            raise SystemExit(f"rootfs restore's start failed: {e}\n{self.containers.log(cid)}")
        r = self.record("cold+rootfs", t0, ans, first, full, out.get("timings_s"), log=self.containers.log(cid, whole=True))
        self.gs("kill", "rootfs-bench-" + cid[:6], check=False)
        self.containers.stop(cid)
        return r

    def process(self):
        """The same server by `gpusnap run` (caches warm from the host's own
        run), checkpointed and restored into a fresh namespace."""
        name = "rootfs-bench-process"
        # One compile thread: inductor's worker pool would be part of the tree CRIU takes.
        env = dict(self.env, TORCHINDUCTOR_COMPILE_THREADS="1", **CACHE_ENV)
        shim = ["--gpushare"] if self.a.backend == "torch" else []
        run = subprocess.run([self.a.gpusnap, "--json", "-q", "run", *shim, "--name", name, "--",
                              *self.server_args()],
                             env=env, capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            raise SystemExit(f"gpusnap run failed: {run.stderr}")
        pid = json.loads(run.stdout)["pid"]
        client.wait_health("127.0.0.1", self.a.port, time.time() + self.a.timeout, watch_pid=pid)
        snap = self.gs("checkpoint", name)["id"]
        t0 = time.time()
        out = self.gs("restore", snap)
        ans, first, full = self.first_token(t0, watch_pid=out.get("pid"))
        r = self.record("process", t0, ans, first, full, out.get("timings_s"))
        self.gs("kill", name, check=False)
        self.gs("rm", snap, check=False)
        return r

    def run(self):
        try:
            for i in range(self.a.rounds):
                cid, cold = self.cold()
                snap, cap = self.capture(cid)
                cold.update(cap)
                self.containers.stop(cid)
                self.rootfs_restore(snap)
                self.gs("rm", snap, check=False)
            if not self.a.skip_process:
                self.process()
        finally:
            self.containers.close()
            shutil.rmtree(self.base, ignore_errors=True)
        ref = self.results[0]["tokens"]
        for r in self.results:
            if r["tokens"] != ref:
                raise SystemExit(f"row {r['row']} answered other tokens than the cold start: {r['tokens'][:8]} "
                                 f"against {ref[:8]}")
        return self.results


def markdown(results):
    cold = [r for r in results if r["row"] == "cold"]
    base = sum(r["first_token_s"] for r in cold) / len(cold)
    lines = ["| row | first token (s) | whole answer (s) | speed-up vs cold | compile in the start (s) | "
             "gpusnap phases (s) |", "|---|---|---|---|---|---|"]
    for r in results:
        phases = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["gpusnap"].items()) if isinstance(v, (int, float)))
        compile_s = f"{r['compile_s']:.2f}" if isinstance(r.get("compile_s"), (int, float)) else "-"
        lines.append(f"| {r['row']} | {r['first_token_s']:.2f} | {r['full_answer_s']:.2f} | "
                     f"{base / r['first_token_s']:.2f}x | {compile_s} | {phases or '-'} |")
    for r in results:
        if r["server_phases"]:
            lines += ["", f"{r['row']}: " + "; ".join(f"{label} {s:.2f}" for label, s in r["server_phases"])]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpusnap", default=os.path.join(os.path.dirname(HERE), "build", "gpusnap"))
    p.add_argument("--runc", default=shutil.which("runc") or "/usr/sbin/runc")
    p.add_argument("--store", default="/var/tmp/gpusnap-rootfs-bench-store")
    p.add_argument("--weights-dir", default="/dev/shm/gpusnap-weights")
    p.add_argument("--model", default="8b")
    p.add_argument("--backend", choices=["torch", "fake"], default="torch")
    p.add_argument("--kv-cache-gib", type=float, default=None)
    p.add_argument("--port", type=int, default=18090)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--skip-process", action="store_true", help="leave out the process row")
    p.add_argument("--out", default=None, help="write the raw figures here as JSON")
    a = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (containers, overlay mounts)")
    results = Bench(a).run()
    print(markdown(results))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
