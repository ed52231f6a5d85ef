"""Shared harness for the end-to-end tests: runs the real gpusnap binary with
the real CRIU on real processes, each test in its own store and run
directory, and stops every workload it started (by its reaper's pid)."""
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

GPUSNAP = os.environ.get("GPUSNAP_BIN", os.path.join(os.path.dirname(__file__), "../../build/gpusnap"))
WORKLOADS = os.environ.get("GPUSNAP_WORKLOADS", os.path.join(os.path.dirname(__file__), "../../build/workloads"))
FAKE_CUDA_DIR = os.environ.get("GPUSNAP_FAKE_CUDA_DIR", os.path.join(os.path.dirname(__file__), "../../build/fakes"))
DRIVER_VERSION_LINE = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  Tue Jan  1 00:00:00 UTC 2026\n"


def require_root(case):
    if os.geteuid() != 0:
        raise unittest.SkipTest("needs root (CRIU and namespaces)")


def require_built(case, *built):
    """Skips `case`, naming the file and its build target, unless every
    (path, target) of `built` is there."""
    for path, target in built:
        if not os.path.exists(path):
            case.skipTest(f"no {path} (build target {target})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _NumberText(str):
    """A non-integer number of gpusnap.json, kept as the file writes it."""


def _canonical(value):
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _canonical(value[k])
                              for k in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_canonical(v) for v in value) + "]"
    if isinstance(value, _NumberText):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def read_meta(path):
    """gpusnap.json as a dict; its non-integer numbers keep their text."""
    with open(path) as f:
        return json.load(f, parse_float=_NumberText)


def write_meta(path, meta):
    """Writes `meta` (from read_meta, edited) with its meta_sha256 recomputed over
    the canonical form (docs/snapshot-format.md), as gpusnap would have written it."""
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    sealed = dict(body, meta_sha256=hashlib.sha256(_canonical(body).encode()).hexdigest())
    with open(path, "w") as f:
        f.write(_canonical(sealed) + "\n")


class StderrLines:
    """A process's stderr read on a thread as it comes: the lines so far, and a
    wait for a line that holds a needle."""

    def __init__(self, proc):
        self.proc = proc
        self.lines = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def text(self):
        with self.cond:
            return "".join(self.lines)

    def wait(self, needle, timeout=60, times=1):
        """The lines holding `needle` once there are `times` of them; None when
        the process ended or the time ran out first."""
        end = time.time() + timeout
        with self.cond:
            while True:
                found = [line for line in self.lines if needle in line]
                if len(found) >= times:
                    return found
                left = end - time.time()
                if (self.proc.poll() is not None and not self.reader.is_alive()) or left <= 0:
                    return None
                self.cond.wait(min(left, 0.5))

    def join(self):
        self.reader.join(timeout=10)


def task_states(pid):
    """{tid: state letter} of every thread of `pid` and of its descendants, read
    from /proc now; a task gone meanwhile is left out."""
    states, todo = {}, [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except (FileNotFoundError, ProcessLookupError):  # gone before, or while, /proc was read
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/stat") as f:
                    states[int(tid)] = f.read().rsplit(")", 1)[1].split()[0]
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except (FileNotFoundError, ProcessLookupError):
                pass
    return states


def stopped_tasks(pid):
    """The threads of `pid`'s tree stopped now (T: by a signal, t: by a tracer),
    as {tid: state}: none once a restore or a wake has returned."""
    return {tid: state for tid, state in task_states(pid).items() if state in ("T", "t")}


def end_workloads(workloads, wait_gone):
    """Ends every running workload `workloads()` lists (its reaper takes the
    tree with it) and waits for each to be gone."""
    for w in workloads():
        if w["running"] and w["reaper_pid"] > 0:
            try:
                os.kill(w["reaper_pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
    for w in workloads():
        wait_gone(w["pid"], timeout=10)


class GpusnapCase(unittest.TestCase):
    def setUp(self):
        require_root(self)
        self.tmp = tempfile.mkdtemp(prefix="gpusnap-e2e-")
        self.store = os.path.join(self.tmp, "store")
        self.run_dir = os.path.join(self.tmp, "run")
        self.data = os.path.join(self.tmp, "data")
        os.makedirs(self.data)
        # No node agent of this machine takes the commands: the socket looked at
        # for one is a path nothing listens on (test_agent_cli.py sets its own).
        self.env = dict(os.environ, GPUSNAP_STORE=self.store, GPUSNAP_RUN_DIR=self.run_dir,
                        GPUSNAP_AGENT_SOCKET=os.path.join(self.tmp, "no-agent", "agent.sock"))

    def tearDown(self):
        end_workloads(self.workloads, self.wait_gone)
        shm = "/dev/shm/gpusnap-counter" + self.data.replace("/", "_")
        if os.path.exists(shm):
            os.unlink(shm)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # --- running gpusnap ---------------------------------------------------
    def gs(self, *args, check=True, env=None, timeout=300):
        p = subprocess.run([GPUSNAP, *args], capture_output=True, text=True, env=env or self.env, timeout=timeout)
        if check and p.returncode != 0:
            self.fail(f"gpusnap {' '.join(args)} failed ({p.returncode}):\n{p.stderr}{p.stdout}")
        return p

    def gs_json(self, *args, **kw):
        return json.loads(self.gs("--json", *args, **kw).stdout)

    def run_counter(self, name, port=0):
        pid = int(self.gs("run", "--name", name, "--", os.path.join(WORKLOADS, "counter"), self.data,
                          str(port)).stdout.strip())
        self.wait_count(pid, 3)
        return pid

    def checkpoint(self, target, *extra):
        out = self.gs("checkpoint", target, *extra).stdout.strip().splitlines()
        return out[-1]

    def restore(self, snapshot_id, *extra):
        """The restored tree's pid, its every task seen running as soon as gpusnap returned."""
        pid = int(self.gs("restore", snapshot_id, *extra).stdout.strip().splitlines()[-1])
        self.assert_runs(pid)
        return pid

    def workloads(self):
        p = self.gs("--json", "ps", check=False)
        return json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else []

    def snapshots(self):
        return self.gs_json("ls")

    # --- observing processes -----------------------------------------------
    @staticmethod
    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (FileNotFoundError, ProcessLookupError):  # gone before, or while, /proc was read
            return False

    def assert_runs(self, pid):
        """No task of `pid`'s tree is stopped: to be called right after the
        restore or wake that let it go returned."""
        self.assertTrue(self.alive(pid), f"workload {pid} is not there")
        self.assertEqual(stopped_tasks(pid), {}, f"tasks of workload {pid} still stopped")

    def wait_gone(self, pid, timeout=10):
        end = time.time() + timeout
        while time.time() < end:
            if not self.alive(pid):
                return True
            time.sleep(0.05)
        return False

    @staticmethod
    def count(pid):
        """The counter's count, which it keeps in its own command name."""
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
        return int(comm.split(":")[1]) if comm.startswith("cnt:") else -1

    def wait_count(self, pid, at_least, timeout=20):
        end = time.time() + timeout
        while time.time() < end:
            if not self.alive(pid):
                self.fail(f"workload {pid} died; log:\n{self.logs()}")
            if self.count(pid) >= at_least:
                return self.count(pid)
            time.sleep(0.05)
        self.fail(f"workload {pid} did not reach count {at_least} (at {self.count(pid)})")

    def logs(self):
        d = os.path.join(self.run_dir, "logs")
        out = []
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            with open(os.path.join(d, name), errors="replace") as f:
                out.append(f"--- {name}\n{f.read()[-3000:]}")
        return "\n".join(out)

    def paused(self, args, phase, env=None):
        """`gpusnap ARGS` stopped at `phase` (GPUSNAP_TEST_PAUSE_AT): it goes on
        once the returned resume file exists, or waits there to be killed."""
        resume = os.path.join(self.tmp, f"resume-{phase}-{time.monotonic_ns()}")
        env = dict(env or self.env, GPUSNAP_TEST_PAUSE_AT=phase, GPUSNAP_TEST_RESUME_FILE=resume)
        proc = subprocess.Popen([GPUSNAP, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        self.addCleanup(proc.stdout.close)
        self.addCleanup(proc.stderr.close)
        line, deadline = "", time.time() + 60
        while time.time() < deadline and f"paused at {phase}" not in line:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
        self.assertIn(f"paused at {phase}", line)
        return proc, resume

    def tmp_dirs(self):
        d = os.path.join(self.store, "snapshots")
        return [n for n in os.listdir(d) if n.startswith(".tmp-")] if os.path.isdir(d) else []

    def assert_no_fail_in_logs(self):
        self.assertNotIn("FAIL:", self.logs())


class FakeGpuCase(GpusnapCase):
    """A GPU-less machine made to look like a GPU node to gpusnap: the fake
    libcuda through gpusnap's own dlopen (self.gpu_env), a /dev/nvidia-*
    stand-in for a workload to map (self.device), and a stand-in of the
    driver's /proc directory (self.nvproc, set_driver)."""

    def setUp(self):
        super().setUp()
        if not os.path.exists(os.path.join(FAKE_CUDA_DIR, "libcuda.so.1")):
            self.skipTest(f"no fake libcuda in {FAKE_CUDA_DIR} (build target fake_cuda)")
        self.device = f"/dev/nvidia-gpusnap-test-{os.urandom(4).hex()}"
        with open(self.device, "wb") as f:
            f.write(b"\0" * 4096)
        self.addCleanup(os.unlink, self.device)
        self.nvproc = os.path.join(self.tmp, "nvidia")
        os.makedirs(self.nvproc)
        self.set_driver("580.159.04")
        self.log = os.path.join(self.tmp, "fake-cuda.log")
        self.states = os.path.join(self.tmp, "states")
        self.gpu_env = dict(self.env, LD_LIBRARY_PATH=FAKE_CUDA_DIR, FAKE_CUDA_LOG=self.log,
                            FAKE_CUDA_STATE_FILE=self.states, FAKE_CUDA_GPUS="1", GPUSNAP_NVIDIA_PROC_DIR=self.nvproc)

    def set_driver(self, version):
        with open(os.path.join(self.nvproc, "version"), "w") as f:
            f.write(DRIVER_VERSION_LINE.format(version))

    def run_gpu_counter(self, name):
        """A counter that maps the device stand-in, started with `gpusnap run`
        (only gpusnap loads the fake: the workload keeps its own environment)."""
        pid = int(self.gs("run", "--name", name, "--", os.path.join(WORKLOADS, "counter"), self.data, "0",
                          self.device).stdout.strip())
        self.wait_count(pid, 3)
        return pid

    def device_state(self):
        """The fake driver's state of the workload, kept in the device stand-in."""
        with open(self.device) as f:
            head = f.read(32).strip("\0").split()
        return int(head[1]) if head else 0

    def set_device_state(self, state):
        """The fake keeps a process's driver state in the device stand-in, not in
        the snapshot: a restore after one that got as far as the GPU restore
        starts from CHECKPOINTED (2) again, as a restore of the snapshot would."""
        with open(self.device, "r+b") as f:
            f.write(f"state {state}\n".encode().ljust(32, b"\0"))


class WorkerSteps:
    """For tests of tests/workloads/vmm_worker, whose output (self.output)
    is one "step N counter N sum S" line per step."""

    def steps(self):
        with open(self.output) as f:
            text = f.read()
        self.assertNotRegex(text, r"MISMATCH|CUDA error", text[-2000:])
        return [int(m[1]) for m in re.finditer(r"^step (\d+) counter \1 sum \d+$", text, re.M)]

    def wait_steps(self, at_least, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            if os.path.exists(self.output) and len(self.steps()) >= at_least:
                return
            time.sleep(0.05)
        self.fail(f"vmm_worker did not reach step {at_least}:\n{self.logs()}")

    def assert_steps_unbroken(self):
        steps = self.steps()
        self.assertEqual(steps, list(range(1, len(steps) + 1)), "steps lost or repeated")
