#!/usr/bin/env python3
"""Tensor-parallel cold start against gpusnap's checkpoint and restore, per rank.

A TP=N Llama-architecture job under torchrun (tests/gpu/workloads/tp_llama.py, bench/server.py's
shapes and seeded weights), in one run: its plain cold start to its first tokens (no gpusnap, no
shim; split at the job's PHASE lines), its cold start under `gpusnap run --gpushare`, `gpusnap
checkpoint --tcp-established` of the whole job, and `gpusnap restore` to the first step the
restored job prints (--restores times, each from a fresh checkpoint of the job restored before),
with gpusnap's phase timings, its per-process ones mapped to ranks, and each rank's GPU before and
after. Every step's token hash must be one value, and the plain start's tokens the gpusnap job's,
or the run fails (exit 1). Both cold starts read the weights from the page cache (read beforehand),
as the restore reads its chunks from it; writing missing weights is an untimed first launch.

On the GPU machine, as root, from the repository root (needs --tp GPUs):

    python3 bench/tp_bench.py --model 8b --tp 2 --gpusnap $PWD/build/portable/gpusnap \\
        --out $OUT/tp-bench.json [--gpu-map 0=1,1=0] [--restores 1] [--keep]

Markdown report on stdout, progress on stderr, every figure as JSON in --out (after a failure too,
"ok": false). Every workload it started is stopped on any exit, Ctrl-C included; its snapshots are
removed unless --keep.
"""
import argparse
import contextlib
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "tpbench"
# Every process gets what tests/gpu/run_gpu_tests.sh's torchrun_job gives the job it checkpoints:
# NVLink multicast off (these machines must not use it), NCCL over loopback only, and NCCL's host
# buffers without cuMem; the plain cold start too, so that both starts run the same NCCL setup.
JOB_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
           "NCCL_SOCKET_IFNAME": "lo", "NCCL_CUMEM_HOST_ENABLE": "0"}
INTERVALS = [("launch → torch imported, NCCL group up", None, "imports"),
             ("weights: safetensors → GPUs", "imports", "weights"),
             ("model sharded, first tokens generated", "weights", "ready")]
PHASE_ORDER = ["resolve", "verify", "namespace", "gpushare-quiesce", "gpushare-quiesce-retries", "gpushare-release",
               "gpu-suspend", "gpu-lock", "gpu-checkpoint", "dump", "publish", "free-ports", "criu-restore", "gpu-restore",
               "gpu-unlock", "gpushare-load", "gpushare-remap", "gpushare-resume", "total"]
RANK_PHASES = ["gpushare-release", "gpushare-load", "gpu-restore"]


class BenchError(Exception):
    def __init__(self, message, *logs):
        super().__init__(message)
        self.logs = [p for p in logs if p]


def say(line):
    print(line, file=sys.stderr, flush=True)


# --- pure helpers: what the job's log, /proc and gpusnap print ----------------------------

def parse_phases(text):
    return {m[1]: float(m[2]) for m in re.finditer(r"^PHASE (\S+) ([0-9.]+)\s*$", text, re.M)}


def parse_steps(text):
    return [(int(n), int(s)) for n, s in re.findall(r"^step (\d+) counter \d+ sum (\d+)\s*$", text, re.M)]


def parse_tokens(text):
    m = re.search(r"^TOKENS (.*?)\s*$", text, re.M)
    if not m:
        return None
    try:
        return json.loads(m[1])
    except ValueError:
        return m[1]


def step_after(n):
    """A match for a step line numbered above n."""
    return lambda line: (m := re.match(r"step (\d+) ", line)) is not None and int(m[1]) > n


def cold_breakdown(phases, t0):
    marks = dict(phases, start=t0)
    intervals = {label: (marks[b] - marks[a or "start"] if b in marks and (a or "start") in marks else None)
                 for label, a, b in INTERVALS}
    return {"seconds": phases["ready"] - t0 if "ready" in phases else None, "intervals": intervals, "phases": phases}


def gpus_by_pid(compute_apps, gpu_indices):
    """{pid: "0" or "0+1"} from nvidia-smi's pid,gpu_uuid and index,uuid CSV lines."""
    rows = lambda text: [[f.strip() for f in line.split(",")] for line in text.splitlines() if "," in line]
    index = {uuid: i for i, uuid in rows(gpu_indices)}
    gpus = {}
    for pid, uuid in rows(compute_apps):
        if pid.isdigit():
            gpus.setdefault(int(pid), set()).add(index.get(uuid, uuid))
    return {pid: "+".join(sorted(g)) for pid, g in gpus.items()}


def split_timings(timings):
    """gpusnap's timings_s: the totals in phase order, and {ns pid: {phase: seconds}}."""
    totals, per_pid = {}, {}
    for key, value in timings.items():
        m = re.fullmatch(r"(.+)\.pid(\d+)", key)
        if m:
            per_pid.setdefault(int(m[2]), {})[m[1]] = value
        else:
            totals[key] = value
    rank = {k: i for i, k in enumerate(PHASE_ORDER)}
    unknown = rank["total"] - 0.5  # phases this script does not know yet: before the total
    return dict(sorted(totals.items(), key=lambda kv: (rank.get(kv[0], unknown), kv[0]))), per_pid


def per_rank_rows(ranks_before, ranks_after, checkpoint_timings, restore_timings):
    before = {r["rank"]: r for r in ranks_before}
    release, restore = split_timings(checkpoint_timings)[1], split_timings(restore_timings)[1]
    rows = []
    for r in ranks_after:
        b = before.get(r["rank"], {})
        phases = dict(release.get(b.get("ns_pid", r["ns_pid"]), {}), **restore.get(r["ns_pid"], {}))
        rows.append({"rank": r["rank"], "ns_pid": r["ns_pid"], "gpu_before": b.get("gpu"), "gpu_after": r["gpu"],
                     "timings_s": phases})
    return rows


def correctness_problems(plain_text, job_text):
    problems = list(dict.fromkeys(f"{label}: {line}" for label, text in (("plain cold start", plain_text),
                                                                         ("gpusnap job", job_text))
                                  for line in text.splitlines() if line.startswith("MISMATCH")))
    steps = parse_steps(job_text)
    sums = sorted({s for _, s in steps})
    if not steps:
        problems.append("the gpusnap job printed no step line")
    elif len(sums) != 1:
        problems.append(f"the gpusnap job's steps hash {len(sums)} different token sequences: {sums}")
    if [n for n, _ in steps] != list(range(1, len(steps) + 1)):
        problems.append("the gpusnap job's step numbers are not 1, 2, 3, ... without a gap or a repeat")
    plain, job = parse_tokens(plain_text), parse_tokens(job_text)
    if plain is None or plain != job:
        problems.append(f"TOKENS differ: plain cold start {plain}, gpusnap job {job}")
    return problems


def fmt_s(v, key=""):
    return "–" if v is None else str(v) if key.endswith("-retries") else f"{v:.2f}"  # retries: a count


def report(res):
    cold = res["cold_plain"]["seconds"]
    out = [f"TP={res['tp']} {res['model']} Llama under torchrun, {len(res['gpus'])} GPUs "
           f"({res['gpus'][0] if res['gpus'] else '?'}), gpu-map {res['gpu_map'] or 'none'}, "
           f"commit {res['commit'] or '?'}", "", "| phase | seconds | ratio |", "|---|---:|---|"]
    for label, key in (("cold start, plain torchrun → first tokens", "cold_plain"),
                       ("cold start, gpusnap run --gpushare → first tokens", "cold_gpushare")):
        c = res[key]
        out.append(f"| **{label}** | {fmt_s(c['seconds'])} | {'reference' if key == 'cold_plain' else ''} |")
        out += [f"| ↳ {k} | {fmt_s(v)} | |" for k, v in c["intervals"].items()]
    for i, (ck, r) in enumerate(zip(res["checkpoints"], res["restores"]), 1):
        size = f"{ck['total_bytes'] / 1e9:.1f} GB" if ck.get("total_bytes") else "?"
        out.append(f"| **checkpoint #{i}** (wall; snapshot {size}, chunks on disk "
                   f"{ck['chunks_disk_bytes'] / 1e9:.1f} GB) | {fmt_s(ck['wall_s'])} | |")
        out += [f"| ↳ {k} | {fmt_s(v, k)} | |" for k, v in ck["phases_s"].items()]
        ratio = f"{cold / r['to_first_step_s']:.1f}x faster" if cold else ""
        how = "gpusnap preloads the device memory" if r.get("preload", True) else "the shims load it (no preload)"
        out.append(f"| **restore #{i} → first step** ({how}) | {fmt_s(r['to_first_step_s'])} | {ratio} |")
        out.append(f"| ↳ gpusnap restore (wall) | {fmt_s(r['gpusnap_wall_s'])} | |")
        out += [f"| ↳ {k} | {fmt_s(v, k)} | |" for k, v in r["phases_s"].items()]
    for i, r in enumerate(res["restores"], 1):
        extra = sorted({p for row in r["ranks"] for p in row["timings_s"]} - set(RANK_PHASES))
        cols = RANK_PHASES + extra
        out += ["", f"restore #{i}, per rank (seconds):", "",
                "| rank | ns pid | GPU before | GPU after | " + " | ".join(cols) + " |",
                "|---" * (4 + len(cols)) + "|"]
        out += [f"| {row['rank']} | {row['ns_pid']} | {row['gpu_before']} | {row['gpu_after']} | "
                + " | ".join(fmt_s(row["timings_s"].get(c)) for c in cols) + " |" for row in r["ranks"]]
    out += ["", f"token hashes: one value over {res['correctness']['steps']} steps, "
                f"TOKENS identical to the plain cold start's"]
    return "\n".join(out)


# --- processes ------------------------------------------------------------------------------

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def wait_gone(pid, seconds):
    deadline = time.time() + seconds
    while alive(pid):
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


def kill(pid, sig):
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def children_of(pid):
    # A child is listed under the thread that forked it, which need not be the main one.
    kids = set()
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                kids.update(int(k) for k in f.read().split())
        except OSError:
            pass
    return sorted(kids)


def command_output(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout
    except OSError:
        return ""


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def ranks_of(agent_pid, tp):
    """The rank processes under torchrun's agent, with their ns pid and GPUs, in rank order."""
    smi = lambda q: command_output(["nvidia-smi", q, "--format=csv,noheader"])
    gpus = gpus_by_pid(smi("--query-compute-apps=pid,gpu_uuid"), smi("--query-gpu=index,uuid"))
    ranks = []
    for pid in children_of(agent_pid):
        try:
            env = dict(kv.partition("=")[::2] for kv in read_text(f"/proc/{pid}/environ").split("\0") if kv)
            nspid = re.search(r"^NSpid:(.*)$", read_text(f"/proc/{pid}/status"), re.M)[1].split()[-1]
        except (OSError, TypeError):
            continue
        if "LOCAL_RANK" in env:
            ranks.append({"rank": int(env["LOCAL_RANK"]), "pid": pid, "ns_pid": int(nspid),
                          "gpu": gpus.get(pid, "none")})
    if len(ranks) != tp:
        raise BenchError(f"expected {tp} ranks under torchrun's agent (pid {agent_pid}), found {len(ranks)}")
    return sorted(ranks, key=lambda r: r["rank"])


class LogFollower:
    """The complete lines another process appended to a log since the last call."""

    def __init__(self, path, offset=0):
        self.path, self.offset, self.partial = path, offset, b""

    def lines(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *done, self.partial = (self.partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in done]

    def seen(self, match, what):
        for line in self.lines():
            if line.startswith("MISMATCH"):
                raise BenchError(f"{what}: the job printed `{line}`", self.path)
            if match(line):
                return True
        return False

    def wait(self, match, timeout, running, what):
        deadline = time.time() + timeout
        while True:
            dead = not running()  # looked at before the log, so no line written before the exit is missed
            if self.seen(match, what):
                return time.time()
            if dead:
                raise BenchError(f"{what}: the job exited before it got there", self.path)
            if time.time() > deadline:
                raise BenchError(f"{what}: not within {timeout} s", self.path)
            time.sleep(0.01)


class Bench:
    def __init__(self, a):
        self.a = a
        self.logs = os.path.join(a.work_dir, "logs")
        self.job_env = dict(os.environ, **JOB_ENV)
        self.gs_env = dict(self.job_env, GPUSNAP_STORE=a.store, GPUSNAP_RUN_DIR=os.path.join(a.work_dir, "run"))
        self.plain = []       # plain torchrun processes not yet stopped
        self.reapers = []     # reapers of the workloads gpusnap started or restored
        self.snapshots = []   # snapshots made by this run
        self.res = {"ok": False, "model": a.model, "tp": a.tp, "gpu_map": a.gpu_map, "cold_plain": None,
                    "cold_gpushare": None, "checkpoints": [], "restores": []}

    def torchrun(self):
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(self.a.tp),
                self.a.workload, "--model", self.a.model, "--weights-dir", self.a.weights_dir, "--tokens", str(self.a.tokens),
                "--interval-ms", "20"]

    def gpusnap(self, *args, timeout=600, job_log=None):
        """`gpusnap --json ARGS`'s output; its stderr kept in logs/gpusnap-SUBCOMMAND.err."""
        err = os.path.join(self.logs, f"gpusnap-{args[0]}.err")
        with open(err, "w") as f:
            try:
                r = subprocess.run([self.a.gpusnap, "--json", *args], env=self.gs_env, stdout=subprocess.PIPE,
                                   stderr=f, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise BenchError(f"`gpusnap {' '.join(args)}` did not finish in {timeout} s", err, job_log) from None
        if r.returncode != 0:
            raise BenchError(f"`gpusnap {' '.join(args)}` failed (exit {r.returncode})", err, job_log)
        return json.loads(r.stdout)

    def plain_start(self, log, timeout, what):
        """A plain torchrun to its first tokens, then stopped: (t0, log text)."""
        with open(log, "wb") as out:
            t0 = time.time()
            proc = subprocess.Popen(self.torchrun(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.job_env, start_new_session=True)
        self.plain.append(proc)
        LogFollower(log).wait(lambda l: l.startswith("TOKENS "), timeout, lambda: proc.poll() is None, what)
        self.stop_plain(proc)
        return t0, read_text(log)

    def stop_plain(self, proc):
        # torchrun starts every rank in a session of its own: a group kill would miss them.
        ranks = children_of(proc.pid)
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in ranks:
            if not wait_gone(pid, 30):
                kill(pid, signal.SIGKILL)
                wait_gone(pid, 10)
        self.plain.remove(proc)

    def add_reaper(self, workload):
        self.reapers.append(workload.get("reaper_pid") or parent_of(workload["pid"]))

    def checkpoint(self, k, src_pid, log):
        ranks = ranks_of(src_pid, self.a.tp)
        say(f"checkpoint #{k}: gpusnap checkpoint --tcp-established {NAME} (ranks on GPUs "
            f"{', '.join(r['gpu'] for r in ranks)})")
        t0 = time.time()
        # A job that generates without pause is rarely between collectives on
        # every rank at once: 30 s to catch that moment, not the default 10 s.
        out = self.gpusnap("checkpoint", "-q", "--no-agent", "--tcp-established", "--gpu-lock-timeout-ms", "30000",
                           NAME, job_log=log)
        wall = time.time() - t0
        snap = out["id"]
        self.snapshots.append(snap)
        listed = {s["id"]: s for s in self.gpusnap("ls", "--no-agent")}
        chunks = sum(os.lstat(os.path.join(d, n)).st_blocks * 512
                     for d, _, names in os.walk(os.path.join(self.a.store, "chunks")) for n in names)
        # The restored sockets take the source's ports: it must be gone first.
        if not wait_gone(src_pid, 60):
            raise BenchError(f"checkpoint #{k}: the checkpointed job (pid {src_pid}) still runs after 60 s")
        ck = {"id": snap, "wall_s": wall, "timings_s": out.get("timings_s", {}),
              "phases_s": split_timings(out.get("timings_s", {}))[0],
              "total_bytes": listed.get(snap, out).get("total_bytes"), "chunks_disk_bytes": chunks, "ranks": ranks}
        self.res["checkpoints"].append(ck)
        say(f"  snapshot {snap}: {wall:.2f} s, {(ck['total_bytes'] or 0) / 1e9:.1f} GB")
        return ck

    def restore(self, k, ck, log):
        preload = self.a.preload == "on" or (self.a.preload == "alternate" and k % 2 == 1)
        size = os.path.getsize(log)
        last_step = parse_steps(read_text(log))[-1][0]
        follow = LogFollower(log, size)
        out_path, err_path = (os.path.join(self.logs, f"restore-{k}.{x}") for x in ("json", "err"))
        cmd = [self.a.gpusnap, "--json", "restore", "--no-agent", ck["id"]]
        if self.a.gpu_map:
            cmd += ["--gpu-map", self.a.gpu_map]
        say(f"restore #{k}: gpusnap restore {ck['id']}")
        wall = first_step = None
        with open(out_path, "w") as out, open(err_path, "w") as err:
            t_r = time.time()
            proc = subprocess.Popen(cmd, env=dict(self.gs_env, GPUSNAP_GPUSHARE_PRELOAD="1" if preload else "0"),
                                    stdout=out, stderr=err, stdin=subprocess.DEVNULL)
            try:
                # The first step may come before gpusnap returns: watch both at once.
                while wall is None or first_step is None:
                    if wall is None and proc.poll() is not None:
                        wall = time.time() - t_r
                        if proc.returncode != 0:
                            raise BenchError(f"restore #{k}: gpusnap restore failed (exit {proc.returncode})",
                                             err_path, log)
                    if first_step is None and follow.seen(step_after(last_step), f"restore #{k}"):
                        first_step = time.time() - t_r
                    if time.time() - t_r > self.a.restore_timeout:
                        raise BenchError(f"restore #{k}: no step after step {last_step} within "
                                         f"{self.a.restore_timeout} s", err_path, log)
                    time.sleep(0.01)
            finally:
                # Let a restore still in flight finish, so that what it restored is recorded and then stopped.
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    proc.kill()
        restored = json.loads(read_text(out_path))
        self.add_reaper(restored)
        ranks = ranks_of(restored["pid"], self.a.tp)
        # Three more steps: the job goes on, its tokens checked with the rest at the end.
        LogFollower(log, size).wait(step_after(last_step + 2), 120, lambda: alive(restored["pid"]), f"restore #{k}")
        timings = restored.get("timings_s", {})
        r = {"snapshot": ck["id"], "preload": preload, "to_first_step_s": first_step, "gpusnap_wall_s": wall,
             "timings_s": timings, "phases_s": split_timings(timings)[0], "pid": restored["pid"],
             "ranks": per_rank_rows(ck["ranks"], ranks, ck["timings_s"], timings)}
        self.res["restores"].append(r)
        cold = self.res["cold_plain"]["seconds"]
        say(f"  first step {first_step:.2f} s after the restore began ({cold / first_step:.1f}x faster than the "
            f"plain cold start; gpusnap itself {wall:.2f} s), ranks now on GPUs {', '.join(x['gpu'] for x in ranks)}")
        return restored["pid"]

    def run(self):
        a, res = self.a, self.res
        for d in (self.logs, a.store, self.gs_env["GPUSNAP_RUN_DIR"], a.weights_dir):
            os.makedirs(d, exist_ok=True)
        res["gpus"] = command_output(["nvidia-smi", "-L"]).splitlines()
        if len(res["gpus"]) < a.tp:
            raise BenchError(f"--tp {a.tp} needs {a.tp} GPUs; nvidia-smi -L lists {len(res['gpus'])}")
        self.stop_workloads(announce=True)  # an earlier run that died may have left some in our run directory
        sys.path.insert(0, os.path.join(REPO_DIR, "bench"))
        import server  # bench/server.py: only the standard library at module level
        spec = argparse.Namespace(model=a.model, weights_dir=a.weights_dir, backend="torch", fake_mb=0)
        res["weights_prepared"] = not server.weights_present(spec)
        if res["weights_prepared"]:
            say(f"weights of {a.model} missing in {server.model_dir(spec)}: one untimed launch writes them")
            self.plain_start(os.path.join(self.logs, "prepare.log"), a.prepare_timeout, "preparing the weights")
            if not server.weights_present(spec):
                raise BenchError("the preparing launch reached its first tokens but left no complete weights")
        for path in glob.glob(os.path.join(server.model_dir(spec), "*")):
            with open(path, "rb") as f:
                while f.read(16 << 20):
                    pass

        plain_log = os.path.join(self.logs, "plain.log")
        t0, plain_text = self.plain_start(plain_log, a.cold_timeout, "cold start (plain torchrun)")
        res["cold_plain"] = cold_breakdown(parse_phases(plain_text), t0)
        say(f"cold start (plain torchrun): {fmt_s(res['cold_plain']['seconds'])} s to first tokens")

        log = os.path.join(self.logs, f"{NAME}.log")
        if os.path.exists(log):
            os.remove(log)
        t0 = time.time()
        w = self.gpusnap("run", "--gpushare", "--name", NAME, "--log", log, "--", *self.torchrun(), job_log=log)
        self.add_reaper(w)
        follow = LogFollower(log)
        follow.wait(lambda l: l.startswith("TOKENS "), a.cold_timeout, lambda: alive(w["pid"]),
                    "cold start (gpusnap run)")
        res["cold_gpushare"] = cold_breakdown(parse_phases(read_text(log)), t0)
        say(f"cold start (gpusnap run --gpushare): {fmt_s(res['cold_gpushare']['seconds'])} s to first tokens")
        follow.wait(step_after(2), 120, lambda: alive(w["pid"]), "gpusnap job reaching step 3")

        pid = w["pid"]
        for k in range(1, a.restores + 1):
            pid = self.restore(k, self.checkpoint(k, pid, log), log)

        problems = correctness_problems(plain_text, read_text(log))
        res["correctness"] = {"steps": len(parse_steps(read_text(log))), "problems": problems}
        if problems:
            raise BenchError("; ".join(problems), log)
        res["ok"] = True

    def stop_workloads(self, announce=False):
        """Every workload in our run directory, and every reaper seen, stopped."""
        try:
            running = [w for w in self.gpusnap("ps", timeout=60) if w.get("running")]
        except (BenchError, ValueError, OSError):
            running = []
        for w in running:
            if announce:
                say(f"stopping workload {w['name']} (pid {w['pid']}) left running by an earlier run")
            self.add_reaper(w)
        # A reaper is the parent of its workload's pid namespace: its exit takes the whole job with it.
        for pid in self.reapers:
            if alive(pid):
                kill(pid, signal.SIGTERM)
        for pid in self.reapers:
            if not wait_gone(pid, 30):
                kill(pid, signal.SIGKILL)
                wait_gone(pid, 10) or say(f"warning: reaper {pid} did not go away")
        self.reapers = []

    def cleanup(self):
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not leave workloads behind
            signal.signal(sig, signal.SIG_IGN)
        try:
            for proc in list(self.plain):
                self.stop_plain(proc)
            self.stop_workloads()
        except Exception as e:  # noqa: BLE001 - the snapshots and the results are still to be dealt with
            say(f"warning: stopping the workloads: {type(e).__name__}: {e}")
        if self.a.keep:
            if self.snapshots:
                say(f"snapshots kept in {self.a.store}: {' '.join(self.snapshots)}")
        else:
            for snap in self.snapshots:
                subprocess.run([self.a.gpusnap, "rm", "--no-agent", snap], env=self.gs_env, capture_output=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="8b", choices=["tiny", "1b", "8b"],
                   help="model shape, as bench/server.py's (default %(default)s)")
    p.add_argument("--tp", type=int, default=2, help="ranks, one GPU each (default %(default)s)")
    p.add_argument("--preload", choices=["on", "off", "alternate"], default="alternate",
                   help="restores with gpusnap preloading the device memory (GPUSNAP_GPUSHARE_PRELOAD), without, or "
                        "odd ones with and even ones without, side by side (default %(default)s)")
    p.add_argument("--tokens", type=int, default=1,
                   help="tokens each step generates (default %(default)s: a step is the time to a first token, so "
                        "the first step after a restore is not a generate the checkpoint caught halfway)")
    p.add_argument("--gpusnap", default=os.path.join(REPO_DIR, "build", "gpusnap"),
                   help="gpusnap binary (default build/gpusnap)")
    p.add_argument("--gpu-map", default="", help="OLD=NEW[,...], passed to every `gpusnap restore` (e.g. 0=1,1=0)")
    p.add_argument("--restores", type=int, default=1,
                   help="restores, each of a fresh checkpoint of the job running then (default %(default)s)")
    p.add_argument("--weights-dir", default="/tmp/gpusnap-weights",
                   help="weight files, written once and not timed (default %(default)s)")
    p.add_argument("--work-dir", default="/var/tmp/gpusnap-tp-bench",
                   help="logs, gpusnap's run directory (default %(default)s)")
    p.add_argument("--store", default=os.environ.get("GPUSNAP_STORE") or None,
                   help="snapshot store (default $GPUSNAP_STORE, else WORK_DIR/store)")
    p.add_argument("--workload", default=os.path.join(REPO_DIR, "tests", "gpu", "workloads", "tp_llama.py"),
                   help="the job torchrun starts (default tests/gpu/workloads/tp_llama.py)")
    p.add_argument("--out", default=os.path.join(os.environ["OUT"], "tp-bench.json") if os.environ.get("OUT")
                   else "/tmp/gpusnap-tp-bench.json",
                   help="results as JSON (default $OUT/tp-bench.json if $OUT is set, else /tmp/gpusnap-tp-bench.json)")
    p.add_argument("--cold-timeout", type=float, default=900,
                   help="seconds a cold start may take to its first tokens (default %(default)s)")
    p.add_argument("--prepare-timeout", type=float, default=3600,
                   help="seconds the launch that writes missing weights may take (default %(default)s)")
    p.add_argument("--restore-timeout", type=float, default=600,
                   help="seconds a restore may take to its first step (default %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the snapshots (default: removed at the end)")
    a = p.parse_args(argv)
    a.store = os.path.abspath(a.store or os.path.join(a.work_dir, "store"))
    a.gpusnap, a.workload = os.path.abspath(a.gpusnap), os.path.abspath(a.workload)
    if not os.access(a.gpusnap, os.X_OK):
        p.error(f"no gpusnap binary at {a.gpusnap} (build it, or pass --gpusnap)")
    if not os.path.isfile(a.workload):
        p.error(f"no workload at {a.workload} (pass --workload)")
    if a.tp < 1 or a.restores < 1:
        p.error("--tp and --restores must be at least 1")
    return a


def main(argv=None):
    a = parse_args(argv)
    bench = Bench(a)
    res = bench.res
    res.update(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), hostname=socket.gethostname(),
               gpusnap=a.gpusnap, store=a.store, workload=a.workload, gpus=[],
               commit=command_output(["git", "-C", REPO_DIR, "rev-parse", "HEAD"]).strip() or None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rc, logs = 0, []
    try:
        bench.run()
    except BenchError as e:
        rc, res["error"], logs = 1, str(e), e.logs
    except KeyboardInterrupt:
        rc, res["error"] = 130, "interrupted"
    except SystemExit as e:
        rc, res["error"] = e.code if isinstance(e.code, int) else 1, "terminated"
    except Exception as e:  # noqa: BLE001 - any failure still stops the workloads and saves what was measured
        rc, res["error"] = 1, f"{type(e).__name__}: {e}"
    finally:
        bench.cleanup()
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    if rc:
        say(f"FAILED: {res['error']}")
        for log in logs:
            say(f"--- last lines of {log}")
            say("\n".join(read_text(log).splitlines()[-30:]) if os.path.exists(log) else "(missing)")
        say(f"partial results: {a.out}")
        return rc
    print(report(res))
    say(f"results: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
