"""A workload name is claimed atomically: of many `gpusnap run --name N` or
`gpusnap restore ID --name N` started at once, exactly one wins and is
listed; every other one fails saying the name is taken, and leaves no
process behind (no workload, no reaper)."""
import os
import random
import re
import signal
import subprocess
import time
import unittest

from harness import GPUSNAP, GpusnapCase

RACERS = 8
TAKEN = re.compile(r"^gpusnap: error: .*a workload named `race` is already (running|being started)")


class NameRaces(GpusnapCase):
    def setUp(self):
        super().setUp()
        # A `sleep` whose arguments no other process on this machine has: it
        # adds this fraction of a second, which marks every copy of the tree.
        self.marker = f"0.{random.randrange(10**8, 10**9)}"
        self.addCleanup(self.kill_strays)

    def marked(self, needle):
        """Live processes with `needle` among their arguments: pid -> ppid."""
        out = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                if not any(needle.encode() in a for a in argv) or not self.alive(int(entry)):
                    continue
                with open(f"/proc/{entry}/stat") as f:
                    out[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError):
                continue
        return out

    def kill_strays(self):
        """What a losing racer left running (before the fix): its tree and reaper."""
        for pid, ppid in self.marked(self.marker).items():
            for p in (ppid, pid):
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def race(self, *args):
        racers = [subprocess.Popen([GPUSNAP, *args], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True) for _ in range(RACERS)]
        results = []
        for r in racers:
            out, err = r.communicate(timeout=300)
            results.append((r.returncode, out, err))
        return results

    def assert_one_winner(self, results):
        winners = [r for r in results if r[0] == 0]
        report = "\n".join(f"exit {rc}: {out.strip()} {err.strip()}" for rc, out, err in results)
        self.assertEqual(len(winners), 1, report)
        for rc, out, err in results:
            if rc != 0:
                errors = [line for line in err.splitlines() if line.startswith("gpusnap: error:")]
                self.assertEqual(len(errors), 1, report)
                self.assertRegex(errors[0], TAKEN, report)
        listed = [w for w in self.workloads() if w["name"] == "race"]
        self.assertEqual(len(listed), 1, report)
        w = listed[0]
        self.assertTrue(w["running"], report)
        self.assertEqual(w["pid"], int(winners[0][1].strip().splitlines()[-1]), report)
        # The winner's tree is the only one: no loser's workload, no loser's
        # reaper (a run's reaper has the workload's command in its own).
        marked = self.marked(self.marker)
        marked.pop(w["reaper_pid"], None)
        self.assertEqual(marked, {w["pid"]: w["reaper_pid"]}, report)
        self.assertEqual(self.claims(), [], "a claim outlived its claimant")
        return w

    def claims(self):
        d = os.path.join(self.run_dir, "workloads")
        return [n for n in os.listdir(d) if n.endswith(".claim")]

    def test_concurrent_runs_of_one_name(self):
        results = self.race("run", "--name", "race", "--", "sleep", "1000", self.marker)
        w = self.assert_one_winner(results)
        # Each run's reaper names its log, under this test's run directory.
        reapers = [p for p in self.marked(self.run_dir) if p != w["pid"]]
        self.assertEqual(reapers, [w["reaper_pid"]])

    def test_concurrent_restores_under_one_name(self):
        self.gs("run", "--name", "src", "--", "sleep", "1000", self.marker)
        snap = self.checkpoint("src")
        deadline = time.time() + 10
        while self.marked(self.marker) and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.marked(self.marker), {}, "the checkpointed source did not exit")
        self.assert_one_winner(self.race("restore", snap, "--name", "race"))

    def test_a_dead_claimant_does_not_hold_the_name(self):
        # A run killed while it holds the name: the next run takes it.
        env = dict(self.env, GPUSNAP_TEST_PAUSE_AT="name-claimed")
        proc = subprocess.Popen([GPUSNAP, "run", "--name", "race", "--", "sleep", "1000", self.marker], env=env,
                                stderr=subprocess.PIPE, text=True)
        self.addCleanup(proc.stderr.close)
        self.assertIn("paused at name-claimed", proc.stderr.readline())
        busy = self.gs("run", "--name", "race", "--", "sleep", "1000", self.marker, check=False)
        self.assertEqual(busy.returncode, 1)
        self.assertRegex(busy.stderr, TAKEN)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.assertEqual(self.marked(self.marker), {})
        pid = int(self.gs("run", "--name", "race", "--", "sleep", "1000", self.marker).stdout.strip())
        [w] = self.workloads()
        self.assertEqual((w["name"], w["pid"], w["running"]), ("race", pid, True))
        self.assertEqual(set(self.marked(self.marker)), {pid, w["reaper_pid"]})
        self.assertEqual(self.claims(), [])


if __name__ == "__main__":
    unittest.main()
