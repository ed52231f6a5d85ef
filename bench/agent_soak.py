#!/usr/bin/env python3
"""agent_soak.py - a CPU soak of the node agent: many checkpoint, restore and
kill cycles of a small tree through `gpusnap agent`, with API reads beside
them, and what the agent holds at the start and at the end.

It starts an agent of its own (tests/e2e/test_agent.py's, with its own store,
state directory, run directory and socket, under a temporary directory) and a
counter (tests/workloads/counter.c: two threads, a child fed through a pipe, a
grandchild pair, files, /dev/shm) with `gpusnap run`. Each cycle, through the agent's API:

  1. POST /v1/checkpoints of the counter, every other cycle with leaveRunning;
  2. a source left running must count on; it is then killed (SIGTERM to its
     reaper), and one that was not must be gone;
  3. POST /v1/restores of the snapshot under the same name: once the job has
     succeeded, no task of the restored tree may be stopped (read at once from
     /proc), its count is at least the count before the checkpoint and it
     counts on; the restored tree is the next cycle's source;
  4. DELETE /v1/snapshots/ID.

Threads beside the cycles read GET /v1/jobs, /v1/snapshots, /metrics and
/healthz in a loop; any answer but 200 fails the run. After --warmup cycles
and at the end (the readers paused, no job running) it samples the agent's
resident memory (VmRSS), open descriptors (/proc/PID/fd), threads
(/proc/PID/task) and job records (the journal's files, and GET /v1/jobs), and
reports the files of the run directory's logs/ (one CRIU log a restore keeps,
not judged). It fails when one of the figures grows past its
tolerance (TOLERANCES): a leak of a descriptor, a thread or a record per
cycle cannot hide in it. The job records are bounded by --max-job-records
(the agent keeps that many finished records, the newest), so after a warm-up
that fills it, flat means equal to it.

Prints the figures as a Markdown table and, with --json, writes them.

    sudo python3 bench/agent_soak.py                        # 1000 cycles
    sudo python3 bench/agent_soak.py --cycles 200 --json soak.json

usage: agent_soak.py [--cycles N] [--warmup N] [--readers N] [--max-job-records N]
                     [--json OUT] [--keep]
(the binary: $GPUSNAP_BIN, else build/gpusnap; the workloads: $GPUSNAP_WORKLOADS)
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
# The project's own e2e harness: the binary ($GPUSNAP_BIN, else build/gpusnap), the workloads
# ($GPUSNAP_WORKLOADS, else build/workloads), the agent it runs, what it reads of processes.
from harness import GPUSNAP, WORKLOADS, GpusnapCase, stopped_tasks  # noqa: E402
from test_agent import Agent  # noqa: E402

BENCH_CYCLES = 1000
WARMUP_CYCLES = 10
MAX_JOB_RECORDS = 20  # reached within the warm-up: two jobs a cycle
READ_PATHS = ("/v1/jobs", "/v1/snapshots", "/metrics", "/healthz")
READ_PAUSE_S = 0.005  # between one reader's requests: the cycles keep most of a small machine
# What "flat" allows between the sample after the warm-up and the one at the
# end: (end - start) <= max(absolute, ratio * start).
TOLERANCES = {
    "rss_kib": {"absolute": 4096, "ratio": 0.10},
    "fds": {"absolute": 2, "ratio": 0},
    "threads": {"absolute": 2, "ratio": 0},
    "journal_records": {"absolute": 0, "ratio": 0},
    "listed_jobs": {"absolute": 0, "ratio": 0},
}


class SoakFailure(Exception):
    pass


def growth_allowed(name, start):
    t = TOLERANCES[name]
    return max(t["absolute"], t["ratio"] * start)


def compare(start, end):
    """{figure: {start, end, ratio, allowed, ok}} for every figure TOLERANCES names."""
    out = {}
    for name in TOLERANCES:
        allowed = growth_allowed(name, start[name])
        out[name] = {"start": start[name], "end": end[name],
                     "ratio": round(end[name] / start[name], 3) if start[name] else None,
                     "allowed_growth": allowed, "ok": end[name] - start[name] <= allowed}
    return out


class AgentCase:
    """What test_agent.Agent asks of its test case: a directory, the environment, a way to fail."""

    def __init__(self, tmp, env):
        self.tmp, self.env = tmp, env

    def fail(self, message):
        raise SoakFailure(message)


def run_job(agent, path, body, timeout=120):
    """POSTs a job to `agent` and waits for its end: the job, which must have succeeded."""
    status, reply = agent.request("POST", path, body)
    if status != 202:
        raise SoakFailure(f"POST {path} {body}: {status} {reply}")
    end = time.time() + timeout
    while time.time() < end:
        status, job = agent.request("GET", f"/v1/jobs/{reply['job']}")
        if status != 200:
            raise SoakFailure(f"GET /v1/jobs/{reply['job']}: {status} {job}")
        if job["state"] == "succeeded":
            return job
        if job["state"] != "running":
            raise SoakFailure(f"job {job['id']} {job['state']}: {job.get('error')}")
        time.sleep(0.02)
    raise SoakFailure(f"job {reply['job']} still running after {timeout} s")


class Readers:
    """Threads that GET the read paths in a loop; pause() waits until none is in a request."""

    def __init__(self, agent, count):
        self.agent = agent
        self.go = threading.Event()
        self.stopping = False
        self.idle = [threading.Event() for _ in range(count)]
        self.requests = 0
        self.errors = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.loop, args=(i,), daemon=True) for i in range(count)]
        self.go.set()
        for t in self.threads:
            t.start()

    def loop(self, i):
        n = i
        while not self.stopping:
            if not self.go.is_set():
                self.idle[i].set()
                self.go.wait()
                continue
            self.idle[i].clear()
            path = READ_PATHS[n % len(READ_PATHS)]
            n += 1
            try:
                status, body = self.agent.request("GET", path)
                if status != 200:
                    raise SoakFailure(f"GET {path}: {status} {str(body)[:200]}")
            except (OSError, SoakFailure) as e:
                with self.lock:
                    self.errors.append(f"GET {path}: {e}")
            with self.lock:
                self.requests += 1
            time.sleep(READ_PAUSE_S)

    def pause(self):
        self.go.clear()
        for e in self.idle:
            e.wait(timeout=30)

    def resume(self):
        for e in self.idle:
            e.clear()
        self.go.set()

    def stop(self):
        self.stopping = True
        self.go.set()
        for t in self.threads:
            t.join(timeout=30)


class Soak:
    def __init__(self, tmp, max_job_records, readers):
        self.counter = os.path.join(WORKLOADS, "counter")
        self.tmp = tmp
        self.data = os.path.join(tmp, "data")
        os.makedirs(self.data)
        # No other agent is asked: the CLI's commands here (run, ps) run in-process.
        self.env = dict(os.environ, GPUSNAP_STORE=os.path.join(tmp, "store"), GPUSNAP_RUN_DIR=os.path.join(tmp, "run"),
                        GPUSNAP_AGENT_SOCKET=os.path.join(tmp, "agent", "agent.sock"))
        self.state_dir = os.path.join(tmp, "agent", "state")
        self.agent = Agent(AgentCase(tmp, self.env), ["--state-dir", self.state_dir,
                                                      "--max-job-records", str(max_job_records)],
                           socket_path=self.env["GPUSNAP_AGENT_SOCKET"])
        self.readers = Readers(self.agent, readers)
        self.max_job_records = max_job_records
        self.pid = self.start_counter()
        self.samples = []

    # --- the tree ---------------------------------------------------------
    def start_counter(self):
        p = subprocess.run([GPUSNAP, "run", "--name", "soak", "--", self.counter, self.data, "0"],
                           env=self.env, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise SoakFailure(f"gpusnap run: {p.stderr}")
        pid = int(p.stdout.strip())
        self.wait_count(pid, 3)
        return pid

    count = staticmethod(GpusnapCase.count)
    alive = staticmethod(GpusnapCase.alive)

    def wait_count(self, pid, at_least, timeout=20):
        end = time.time() + timeout
        while time.time() < end:
            if not self.alive(pid):
                raise SoakFailure(f"counter {pid} died; its log:\n{self.counter_log()}")
            if self.count(pid) >= at_least:
                return
            time.sleep(0.02)
        raise SoakFailure(f"counter {pid} did not reach {at_least} (at {self.count(pid)})")

    def wait_gone(self, pid, timeout=20):
        end = time.time() + timeout
        while time.time() < end:
            if not self.alive(pid):
                return
            time.sleep(0.02)
        raise SoakFailure(f"pid {pid} still there {timeout} s on")

    def counter_log(self):
        path = os.path.join(self.env["GPUSNAP_RUN_DIR"], "logs", "soak.log")
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return f.read()[-2000:]

    def kill_tree(self, pid):
        """SIGTERM to the tree's reaper (its parent, pid 1 of its namespace), which ends it whole."""
        with open(f"/proc/{pid}/stat") as f:
            reaper = int(f.read().rsplit(")", 1)[1].split()[1])
        os.kill(reaper, signal.SIGTERM)
        self.wait_gone(pid)

    # --- one cycle ----------------------------------------------------------
    def cycle(self, i):
        leave_running = i % 2 == 1
        before = self.count(self.pid)
        job = run_job(self.agent, "/v1/checkpoints", {"pid": self.pid, "leaveRunning": leave_running})
        snapshot = job["snapshot"]
        if leave_running:
            self.wait_count(self.pid, self.count(self.pid) + 2)
            self.kill_tree(self.pid)
        else:
            self.wait_gone(self.pid)
        job = run_job(self.agent, "/v1/restores", {"snapshot": snapshot, "name": "soak"})
        pid = job["restoredPid"]
        stopped = stopped_tasks(pid)
        if stopped:
            raise SoakFailure(f"cycle {i}: the restore job succeeded with tasks still stopped: {stopped}")
        at = self.count(pid)
        if at < before:
            raise SoakFailure(f"cycle {i}: restored at count {at}, below the {before} before the checkpoint")
        self.wait_count(pid, at + 2)
        status, reply = self.agent.request("DELETE", f"/v1/snapshots/{snapshot}")
        if status not in (200, 204):
            raise SoakFailure(f"cycle {i}: DELETE /v1/snapshots/{snapshot}: {status} {reply}")
        self.pid = pid

    # --- what the agent holds -------------------------------------------------
    def sample(self, cycles_done):
        """The agent's figures, the readers paused and no job running; the least
        of a few looks, so that a thread or a descriptor on its way out is not counted."""
        self.readers.pause()
        try:
            looks = []
            for _ in range(5):
                looks.append(self.look())
                time.sleep(0.1)
        finally:
            self.readers.resume()
        s = {k: min(look[k] for look in looks) for k in looks[0]}
        s["cycles"] = cycles_done
        self.samples.append(s)
        return s

    def look(self):
        pid = self.agent.proc.pid
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        status, jobs = self.agent.request("GET", "/v1/jobs")
        if status != 200:
            raise SoakFailure(f"GET /v1/jobs: {status}")
        if any(j["state"] == "running" for j in jobs):
            raise SoakFailure("a job still runs between cycles")
        logs = os.path.join(self.env["GPUSNAP_RUN_DIR"], "logs")
        return {
            "rss_kib": int(fields["VmRSS"].split()[0]),
            "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": len(os.listdir(f"/proc/{pid}/task")),
            "journal_records": len([n for n in os.listdir(os.path.join(self.state_dir, "jobs"))
                                    if n.endswith(".json")]),
            "listed_jobs": len(jobs),
            "run_dir_log_files": len(os.listdir(logs)) if os.path.isdir(logs) else 0,
        }

    def run(self, cycles, warmup, progress):
        started = time.monotonic()
        for i in range(warmup):
            self.cycle(i)
        start = self.sample(warmup)
        if start["journal_records"] != self.max_job_records:
            raise SoakFailure(f"the warm-up left {start['journal_records']} job records, not the "
                              f"{self.max_job_records} kept: raise --warmup")
        cycle_started = time.monotonic()
        for i in range(warmup, warmup + cycles):
            self.cycle(i)
            if progress and (i - warmup + 1) % 50 == 0:
                s = self.sample(i + 1)
                progress(f"{i - warmup + 1} cycles: rss {s['rss_kib']} KiB, fds {s['fds']}, "
                         f"threads {s['threads']}, records {s['journal_records']}")
        seconds = time.monotonic() - cycle_started
        end = self.sample(warmup + cycles)
        self.readers.stop()
        report = {"cycles": cycles, "warmup": warmup, "max_job_records": self.max_job_records,
                  "seconds": round(time.monotonic() - started, 1),
                  "seconds_per_cycle": round(seconds / cycles, 3) if cycles else None,
                  "api_reads": self.readers.requests, "api_read_errors": self.readers.errors[:10],
                  "figures": compare(start, end), "run_dir_log_files": [start["run_dir_log_files"],
                                                                         end["run_dir_log_files"]],
                  "samples": self.samples}
        report["ok"] = all(f["ok"] for f in report["figures"].values()) and not self.readers.errors
        return report

    def close(self):
        self.readers.stop()
        if self.alive(self.pid):
            try:
                self.kill_tree(self.pid)
            except (OSError, SoakFailure):
                pass
        self.agent.stop()
        shm = "/dev/shm/gpusnap-counter" + self.data.replace("/", "_")
        if os.path.exists(shm):
            os.unlink(shm)


def table(report):
    lines = ["| figure | start | end | end/start | allowed growth | |", "|---|---:|---:|---:|---:|---|"]
    for name, f in report["figures"].items():
        ratio = f"{f['ratio']:.2f}" if f["ratio"] is not None else "-"
        lines.append(f"| {name} | {f['start']} | {f['end']} | {ratio} | {f['allowed_growth']:g} | "
                     f"{'ok' if f['ok'] else 'GREW'} |")
    return "\n".join(lines)


def soak(cycles, warmup=WARMUP_CYCLES, readers=2, max_job_records=MAX_JOB_RECORDS, keep=False, progress=None):
    """Runs the soak; the report (see the module's doc). Raises SoakFailure for
    a cycle that went wrong."""
    tmp = tempfile.mkdtemp(prefix="gpusnap-soak-")
    s = None
    try:
        s = Soak(tmp, max_job_records, readers)
        report = s.run(cycles, warmup, progress)
        report["agent_log_tail"] = s.agent.log()[-1000:] if not report["ok"] else ""
        return report
    except SoakFailure as e:
        raise SoakFailure(f"{e}\n--- agent log:\n{s.agent.log()[-4000:] if s else ''}") from None
    finally:
        if s:
            s.close()
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=BENCH_CYCLES, help="cycles measured, after the warm-up")
    ap.add_argument("--warmup", type=int, default=WARMUP_CYCLES, help="cycles before the first sample")
    ap.add_argument("--readers", type=int, default=2, help="threads reading the API beside the cycles")
    ap.add_argument("--max-job-records", type=int, default=MAX_JOB_RECORDS, help="the agent's --max-job-records")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("agent_soak.py: needs root (CRIU and namespaces)")
    try:
        report = soak(args.cycles, args.warmup, args.readers, args.max_job_records, keep=args.keep,
                      progress=lambda line: print(line, flush=True))
    except SoakFailure as e:
        sys.exit(f"agent_soak.py: {e}")
    print(f"{report['cycles']} cycles after {report['warmup']} of warm-up, {report['seconds']} s "
          f"({report['seconds_per_cycle']} s a cycle), {report['api_reads']} API reads beside them")
    print(table(report))
    print(f"run directory logs/ files: {report['run_dir_log_files'][0]} -> {report['run_dir_log_files'][1]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if not report["ok"]:
        sys.exit("agent_soak.py: the agent grew: " + "; ".join(
            n for n, f in report["figures"].items() if not f["ok"]) + " " + "; ".join(report["api_read_errors"]))


if __name__ == "__main__":
    main()
