"""N restores of one snapshot at once, through every door (issue 21): in
process, as standbys, right after a restore killed while CRIU ran, and
through the agent. The counter holds a deleted file, which CRIU brings back
through a "ghost" at a name its images alone decide (<path>.cr.<id>.ghost):
such restores take turns at CRIU (phase `wait-turn`), and none may fail on
another's ghost. Every restored tree must run, each on its own."""
import glob
import json
import os
import signal
import subprocess
import time
import unittest

import test_agent
from harness import GPUSNAP, FakeGpuCase, GpusnapCase, StderrLines

# CRIU's notification once the ghosts are made and before it removes them
# (criu/cr-restore.c): a restore paused there holds its ghosts on disk.
AT_CRIU = "criu-post-restore"
WAITING = "wait-turn: waiting for the restore at CRIU"


class Command:
    """One `gpusnap` process of the test, its stderr read as it comes."""

    def __init__(self, case, args, env):
        self.proc = subprocess.Popen([GPUSNAP, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        case.addCleanup(lambda: self.proc.poll() is None and self.proc.kill())
        self.err = StderrLines(self.proc)

    def stderr(self):
        return self.err.text()

    def wait_line(self, needle, timeout=60):
        """True once a line holds `needle`; False when the process ended or the time ran out first."""
        return self.err.wait(needle, timeout) is not None

    def finish(self, timeout=300):
        out = self.proc.stdout.read()
        self.proc.wait(timeout=timeout)
        self.err.join()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return self.proc.returncode, out, self.stderr()


class TurnsCase(GpusnapCase):
    def counter_snapshot(self, env=None, gpu=False):
        """A snapshot of the counter (which the checkpoint ends) whose images hold its deleted file."""
        pid = self.run_gpu_counter("src") if gpu else self.run_counter("src")
        snap = self.gs("checkpoint", "-q", "src", env=env).stdout.strip().splitlines()[-1]
        self.assertTrue(self.wait_gone(pid))
        images = os.listdir(os.path.join(self.store, "snapshots", snap, "checkpoint"))
        self.assertTrue([n for n in images if n.startswith("ghost-file-")], f"no ghost image among {images}")
        return snap

    @staticmethod
    def children(pid):
        out = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        return out

    def criu_of(self, pid):
        """The CRIU that gpusnap `pid` runs: its launcher's child (`criu: restore ...`, as CRIU names itself)."""
        for launcher in self.children(pid):
            for p in self.children(launcher):
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if b"criu" in f.read():
                        return p
        self.fail(f"gpusnap {pid} runs no CRIU")

    def ghosts(self):
        return glob.glob(os.path.join(self.data, "*.ghost"))

    def start(self, *args, env=None):
        return Command(self, args, env or self.env)

    def at_criu(self, *args, env=None):
        """`gpusnap ARGS` paused inside CRIU's restore, its ghost on disk; the resume file."""
        resume = os.path.join(self.tmp, f"resume-{time.monotonic_ns()}")
        env = dict(env or self.env, GPUSNAP_TEST_PAUSE_AT=AT_CRIU, GPUSNAP_TEST_RESUME_FILE=resume)
        cmd = self.start(*args, env=env)
        self.assertTrue(cmd.wait_line(f"paused at {AT_CRIU}"), cmd.stderr())
        self.assertNotEqual(self.ghosts(), [], "CRIU made no ghost before the pause: the test proves nothing")
        return cmd, resume

    def finished_pid(self, cmd):
        rc, out, err = cmd.finish()
        self.assertEqual(rc, 0, f"{err}\n{self.logs()}")
        self.assertNotIn("ghost", err)  # no CRIU collision, not even one recovered from
        return int(out.strip().splitlines()[-1])

    def holds_the_turn(self, pid):
        """Whether process `pid` has the turn's lock file open."""
        fds = f"/proc/{pid}/fd"
        for fd in os.listdir(fds):
            try:
                if os.readlink(os.path.join(fds, fd)).endswith("criu-ghosts.lock"):
                    return True
            except FileNotFoundError:
                pass
        return False

    def tree(self, pid):
        out, todo = [], [pid]
        while todo:
            p = todo.pop()
            out.append(p)
            todo += self.children(p)
        return out

    def assert_each_runs(self, pids):
        self.assertEqual(len(set(pids)), len(pids), pids)
        for pid in pids:
            self.wait_count(pid, self.count(pid) + 5)
            # The turn went with CRIU: no restored task keeps it.
            self.assertEqual([p for p in self.tree(pid) if self.holds_the_turn(p)], [])
        self.assertEqual(self.ghosts(), [], "a ghost outlived its restore")
        self.assert_no_fail_in_logs()


class RestoreTurns(TurnsCase):
    def test_four_restores_of_one_snapshot_at_once_all_run(self):
        snap = self.counter_snapshot()
        cmds = [self.start("--json", "restore", snap, "--name", f"r{i}") for i in range(4)]
        results = []
        for cmd in cmds:
            rc, out, err = cmd.finish()
            self.assertEqual(rc, 0, f"{err}\n{self.logs()}")
            results.append(json.loads(out))
        for r in results:
            self.assertIn("wait-turn", r["timings_s"])  # its images hold a deleted file
        self.assert_each_runs([r["pid"] for r in results])
        self.assertEqual(sorted(w["name"] for w in self.workloads() if w["running"]), ["r0", "r1", "r2", "r3"])

    def test_restores_wait_for_the_one_at_criu_and_say_so(self):
        snap = self.counter_snapshot()
        first, resume = self.at_criu("restore", snap, "--name", "r0")
        self.assertTrue(self.holds_the_turn(self.criu_of(first.proc.pid)), "CRIU does not hold the turn")
        timed = self.start("--json", "restore", snap, "--name", "r1")
        told = self.start("restore", snap, "--name", "r2")
        self.assertTrue(told.wait_line(WAITING), told.stderr())
        self.assertIn("pid ", told.stderr())  # the restore it waits for is named
        time.sleep(1)
        self.assertIsNone(timed.proc.poll(), timed.stderr())
        open(resume, "w").close()
        pids = [self.finished_pid(first), self.finished_pid(told)]
        rc, out, err = timed.finish()
        self.assertEqual(rc, 0, err)
        result = json.loads(out)
        self.assertGreaterEqual(result["timings_s"]["wait-turn"], 1.0)
        self.assert_each_runs(pids + [result["pid"]])

    def test_a_restore_right_after_one_killed_while_criu_ran(self):
        snap = self.counter_snapshot()
        killed, _ = self.at_criu("restore", snap, "--name", "killed")
        # Stopped, CRIU is as it is for most of its run, busy: it cannot see gpusnap go and
        # roll back; the killed restore's namespace ends it where it is, its ghost on disk.
        os.kill(self.criu_of(killed.proc.pid), signal.SIGSTOP)
        killed.proc.send_signal(signal.SIGKILL)
        killed.finish()
        after = self.start("restore", snap, "--name", "after")
        rc, out, err = after.finish()
        self.assertEqual(rc, 0, f"{err}\n{self.logs()}")
        # The killed restore's namespace took its CRIU along, ghost left behind: removed, and said so.
        self.assertIn("left by a restore killed while CRIU ran", err)
        self.assertNotIn("killed", [w["name"] for w in self.workloads() if w["running"]])
        self.assert_each_runs([int(out.strip().splitlines()[-1])])

    def test_a_snapshot_without_a_deleted_file_takes_no_turn(self):
        self.gs("run", "--name", "plain", "--", "sleep", "1000")
        snap = self.checkpoint("plain")
        images = os.listdir(os.path.join(self.store, "snapshots", snap, "checkpoint"))
        self.assertEqual([n for n in images if n.startswith("ghost-file-")], [])
        results = [self.start("--json", "restore", snap, "--name", f"p{i}") for i in range(2)]
        for cmd in results:
            rc, out, err = cmd.finish()
            self.assertEqual(rc, 0, err)
            self.assertNotIn("wait-turn", json.loads(out)["timings_s"])


class StandbyTurns(TurnsCase, FakeGpuCase):
    def test_standbys_of_one_snapshot_at_once(self):
        snap = self.counter_snapshot(env=self.gpu_env, gpu=True)
        first, resume = self.at_criu("--json", "restore", snap, "--standby", "--name", "sb0", env=self.gpu_env)
        others = [self.start("--json", "restore", snap, "--standby", "--name", f"sb{i}", env=self.gpu_env)
                  for i in (1, 2)]
        time.sleep(1)
        open(resume, "w").close()
        for cmd in [first] + others:
            rc, out, err = cmd.finish()
            self.assertEqual(rc, 0, f"{err}\n{self.logs()}")
            self.assertIn("wait-turn", json.loads(out)["timings_s"])
        states = {w["name"]: w["state"] for w in self.workloads() if w["name"].startswith("sb")}
        self.assertEqual(states, {"sb0": "standby", "sb1": "standby", "sb2": "standby"})
        self.assertEqual(self.ghosts(), [])
        # Each is a tree of its own: the one woken runs, the others stay stopped.
        woken = json.loads(self.gs("--json", "wake", "sb1", env=self.gpu_env).stdout)
        self.wait_count(woken["pid"], self.count(woken["pid"]) + 5)
        self.assertEqual({w["name"]: w["state"] for w in self.workloads()}["sb2"], "standby")
        self.assert_no_fail_in_logs()


class AgentTurns(TurnsCase, test_agent.AgentCase):
    def test_four_restores_of_one_snapshot_through_the_agent(self):
        snap = self.counter_snapshot()
        resume = os.path.join(self.tmp, "resume")
        agent = self.start_agent(env=dict(self.env, GPUSNAP_TEST_PAUSE_AT="restore-namespace",
                                          GPUSNAP_TEST_RESUME_FILE=resume))
        jobs = []
        for i in range(4):
            status, reply = agent.request("POST", "/v1/restores", {"snapshot": snap, "name": f"a{i}"})
            self.assertEqual(status, 202, reply)
            jobs.append(reply["job"])
        agent.wait_line("paused at restore-namespace", times=4)
        # While they use it, the snapshot is not deleted.
        status, refused = agent.request("DELETE", f"/v1/snapshots/{snap}")
        self.assertEqual(status, 409, refused)
        self.assertIn("using snapshot", refused["error"])
        open(resume, "w").close()
        done = [self.wait_job(agent, j) for j in jobs]
        for job in done:
            self.assertEqual(job["state"], "succeeded", f"{job}\n{agent.log()}")
            self.assertIn("wait-turn", job["timings"])
        self.assert_each_runs([job["restoredPid"] for job in done])
        # Once they are done it is deleted; the trees run on.
        status, reply = agent.request("DELETE", f"/v1/snapshots/{snap}")
        self.assertEqual(status, 200, reply)
        for job in done:
            self.wait_count(job["restoredPid"], self.count(job["restoredPid"]) + 3)


if __name__ == "__main__":
    unittest.main()
