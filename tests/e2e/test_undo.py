"""One undo exit per story: a failure injected at each step of a checkpoint
and of a restore (GPUSNAP_TEST_FAIL_AT, a real failure's path) leaves
everything as it was. A checkpoint's source runs on with its GPU state back
(the fake driver's RUNNING) and the store holds nothing new; a restore leaves
no task of the snapshot running, and the store can restore it afterwards.
The GPU steps run on the fake libcuda; CRIU and the processes are real."""
import os
import subprocess
import time
import unittest

from harness import GPUSNAP, FakeGpuCase, GpusnapCase
from test_restore_into_container import PlaceholderCase

CHECKPOINT_STEPS = ["resolve", "begin", "gpu-suspend", "gpu-detach-0", "post-dump"]
RESTORE_STEPS = ["verify", "namespace", "criu-restore", "gpu-restore", "record"]


class UndoWithFakeDriver(FakeGpuCase):
    def setUp(self):
        super().setUp()
        self.pid = self.run_gpu_counter("gpu")

    def tasks_of_snapshot(self):
        """Live processes that map this test's device stand-in (the workload's tree)."""
        out = subprocess.run(["pgrep", "-f", self.device], capture_output=True, text=True).stdout.split()
        return [int(p) for p in out if self.alive(int(p))]

    def test_a_failed_checkpoint_step_leaves_the_source_running(self):
        for step in CHECKPOINT_STEPS:
            with self.subTest(step=step):
                env = dict(self.gpu_env, GPUSNAP_TEST_FAIL_AT=step)
                p = self.gs("checkpoint", "gpu", env=env, check=False)
                self.assertEqual(p.returncode, 1, p.stdout)
                self.assertIn(f"injected failure at {step}", p.stderr)
                self.assertNotIn(" then ", p.stderr)  # every undo succeeded
                self.assertEqual(self.device_state(), 0)  # RUNNING: restored and unlocked
                self.wait_count(self.pid, self.count(self.pid) + 5)  # every thread runs
                self.assertEqual(self.snapshots(), [])
                self.assertEqual(self.tmp_dirs(), [])
        # Nothing of the failures is left in the way of a checkpoint that works.
        snap = self.gs_json("checkpoint", "gpu", "--leave-running", env=self.gpu_env)
        self.assertEqual([s["id"] for s in self.snapshots()], [snap["id"]])
        self.wait_count(self.pid, self.count(self.pid) + 5)

    def test_a_failed_restore_step_leaves_nothing_running(self):
        snap = self.gs("checkpoint", "-q", "gpu", env=self.gpu_env).stdout.strip().splitlines()[-1]
        self.assertTrue(self.wait_gone(self.pid))
        for step in RESTORE_STEPS:
            with self.subTest(step=step):
                self.set_device_state(2)
                env = dict(self.gpu_env, GPUSNAP_TEST_FAIL_AT=step)
                p = self.gs("restore", snap, "--name", "copy", env=env, check=False)
                self.assertEqual(p.returncode, 1, p.stdout)
                self.assertIn(f"injected failure at {step}", p.stderr)
                self.assertNotIn(" then ", p.stderr)
                if step in ("gpu-restore", "record"):
                    self.assertEqual(self.device_state(), 0)  # it got as far as the GPU restore
                self.assertEqual([w["name"] for w in self.workloads() if w["running"]], [])
                left = self.tasks_of_snapshot()
                end = time.time() + 5
                while left and time.time() < end:
                    time.sleep(0.1)
                    left = self.tasks_of_snapshot()
                self.assertEqual(left, [], f"tasks of the snapshot left after a failure at {step}")
        self.set_device_state(2)
        out = self.gs_json("restore", snap, "--name", "copy", env=self.gpu_env)
        self.wait_count(out["pid"], self.count(out["pid"]) + 5)
        self.assertEqual([w["name"] for w in self.workloads() if w["running"]], ["copy"])


class RestoreHoldsTheTreeUntilRecorded(GpusnapCase):
    def test_no_restored_task_runs_before_the_restore_is_recorded(self):
        # A restore that fails at its last step must not have let the workload
        # run again: every task stays stopped until it is recorded.
        pid = self.run_counter("held")
        snap = self.checkpoint("held")
        self.assertTrue(self.wait_gone(pid))
        proc, resume = self.paused(["restore", snap], "record")
        tasks = [int(p) for p in subprocess.run(["pgrep", "-f", self.data], capture_output=True,
                                                text=True).stdout.split() if self.count(int(p)) >= 0]
        self.assertEqual(len(tasks), 1, tasks)
        at_dump = self.count(tasks[0])
        time.sleep(1)
        with open(f"/proc/{tasks[0]}/stat") as f:
            self.assertEqual(f.read().rsplit(")", 1)[1].split()[0], "T")  # stopped
        self.assertEqual(self.count(tasks[0]), at_dump)
        open(resume, "w").close()
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, err)
        self.assertEqual(int(out.strip().splitlines()[-1]), tasks[0])
        self.wait_count(tasks[0], at_dump + 3)


    def test_a_tree_left_stopped_after_the_let_go_fails_the_restore_and_goes(self):
        # A task still stopped when the restore would return (here one the hook
        # stops again after the SIGCONT) fails the restore through its undo.
        pid = self.run_counter("left")
        snap = self.checkpoint("left")
        self.assertTrue(self.wait_gone(pid))
        p = self.gs("restore", snap, env=dict(self.env, GPUSNAP_TEST_STOP_AFTER_LET_GO="1"), check=False)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertRegex(p.stderr, rf"restore of `{snap}` failed: the restored tree does not run: pid \d+ "
                                   r"\(stopped\).* 2000 ms after it was let go")
        self.assertNotIn(" then ", p.stderr)
        self.assertEqual([w["name"] for w in self.workloads() if w["running"]], [])
        left, end = self.tasks_of(self.data), time.time() + 5
        while left and time.time() < end:
            time.sleep(0.1)
            left = self.tasks_of(self.data)
        self.assertEqual(left, [], "tasks of the failed restore left")
        new = self.restore(snap)
        self.wait_count(new, self.count(new) + 3)

    def tasks_of(self, data):
        return [int(p) for p in subprocess.run(["pgrep", "-f", data], capture_output=True, text=True).stdout.split()
                if self.alive(int(p))]


class ConcurrentCheckpoints(GpusnapCase):
    def test_a_second_checkpoint_of_a_tree_is_refused_while_one_runs(self):
        pid = self.run_counter("busy")
        env = dict(self.env, GPUSNAP_TEST_PAUSE_AT="dump")
        first = subprocess.Popen([GPUSNAP, "checkpoint", "busy"], env=env, stderr=subprocess.PIPE, text=True)
        self.addCleanup(first.stderr.close)
        line, deadline = "", time.time() + 30
        while time.time() < deadline and "paused at dump" not in line:
            line = first.stderr.readline()
        self.assertIn("paused at dump", line)
        p = self.gs("checkpoint", "busy", check=False)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn(f"a checkpoint of pid {pid} is already running", p.stderr)
        first.kill()
        first.wait()
        self.wait_count(pid, self.count(pid) + 3)
        # The lock went with its holder.
        snap = self.checkpoint("busy", "--leave-running")
        self.assertEqual([s["id"] for s in self.snapshots()], [snap])


class UndoIntoPlaceholder(PlaceholderCase):
    def test_a_restore_failing_after_criu_leaves_the_placeholder_idle(self):
        agent = self.start_agent()
        placeholder, init = self.start_placeholder()
        snapshot, _ = self.checkpoint_counter(agent)
        for step, hook, error in (("criu-restore", {"GPUSNAP_TEST_FAIL_AT": "criu-restore"}, "injected failure at"),
                                  ("record", {"GPUSNAP_TEST_FAIL_AT": "record"}, "injected failure at"),
                                  ("let-go", {"GPUSNAP_TEST_STOP_AFTER_LET_GO": "1"}, "the restored tree does not run")):
            with self.subTest(step=step):
                p = self.gs("restore", snapshot, "--into-container", placeholder, env=dict(self.env, **hook),
                            check=False)
                self.assertEqual(p.returncode, 1, p.stdout)
                self.assertIn(error, p.stderr)
                end = time.time() + 5
                while self.children(init) and time.time() < end:
                    time.sleep(0.1)
                self.assertEqual(self.children(init), [], f"restored tasks left in the placeholder at {step}")
        # Idle again: a restore into it works.
        new_pid = self.restore(snapshot, "--into-container", placeholder)
        self.assert_restored_into(new_pid, init)
        self.wait_count(new_pid, self.count(new_pid) + 3)


if __name__ == "__main__":
    unittest.main()
