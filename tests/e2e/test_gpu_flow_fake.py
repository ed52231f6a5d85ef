"""The GPU steps of `gpusnap checkpoint` and `restore` on a GPU-less machine:
the production code path with the fake libcuda (tests/fakes/libcuda, loaded
through the same dlopen) and a stand-in for the driver's /proc directory. The
workload maps a file named /dev/nvidia-*, as a CUDA process maps the device,
so gpusnap takes it for a GPU process; CRIU and the processes are real."""
import os
import subprocess
import time
import unittest

from harness import WORKLOADS, FakeGpuCase


class GpuFlowWithFakeDriver(FakeGpuCase):
    def setUp(self):
        super().setUp()
        self.pid = self.run_gpu_counter("gpu")

    def calls(self):
        """(function, pid) of every checkpoint-API call the fake saw, in order."""
        out = []
        with open(self.log) as f:
            for line in f:
                fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
                if fields.get("fn", "").startswith("cuCheckpointProcess") and fields.get("rc") == "0":
                    out.append((fields["fn"].replace("cuCheckpointProcess", ""), int(fields["pid"])))
        return out

    def test_leave_running_suspends_then_resumes_the_gpu_process(self):
        snap = self.gs_json("checkpoint", "gpu", "--leave-running", env=self.gpu_env)
        pid = self.pid
        steps = [fn for fn, p in self.calls() if p == pid and fn != "GetState"]
        # Lock and checkpoint before the dump; restore and unlock after it.
        self.assertEqual(steps, ["GetRestoreThreadId", "Lock", "Checkpoint", "Restore", "Unlock"])
        self.wait_count(pid, self.count(pid) + 10)  # every thread runs again
        meta = self.gs_json("inspect", snap["id"])
        gpu = meta["gpu"]
        self.assertEqual(gpu["driver_version"], "580.159.04")
        self.assertEqual(gpu["ns_pids"], [2])
        # The restore thread is recorded as the namespace sees it, not by its host tid.
        with open(self.log) as f:
            host_tid = [int(l.split("tid=")[-1]) for l in f if "GetRestoreThreadId" in l][0]
        with open(f"/proc/{pid}/task/{host_tid}/status") as f:
            ns_tid = int([l for l in f if l.startswith("NSpid:")][0].split()[-1])
        self.assertEqual(gpu["restore_tids"], [ns_tid])
        self.assertNotEqual(ns_tid, host_tid)
        self.assertIn("gpu-checkpoint", snap["timings_s"])
        self.assert_no_fail_in_logs()

    def test_checkpoint_then_restore_brings_the_gpu_process_back(self):
        snap = self.gs("checkpoint", "-q", "gpu", env=self.gpu_env).stdout.strip().splitlines()[-1]
        self.assertTrue(self.wait_gone(self.pid))
        self.assertEqual(self.device_state(), 2)  # CHECKPOINTED, as the dump saw it
        out = self.gs_json("restore", snap, env=self.gpu_env)
        new_pid = out["pid"]
        first = self.count(new_pid)
        self.wait_count(new_pid, first + 10)  # all threads run again
        self.assertEqual(self.device_state(), 0)
        steps = [fn for fn, p in self.calls() if p == new_pid and fn != "GetState"]
        # No query of the stopped process: its restore thread came from the snapshot.
        self.assertEqual(steps, ["Restore", "Unlock"])
        self.assertIn("gpu-restore", out["timings_s"])
        # The digests were checked while CRIU ran; its tasks were left stopped
        # till then, and the counter's children (no GPU) went on after.
        self.assertIn("verify-digests", out["timings_s"])
        self.assert_no_fail_in_logs()

    def test_a_flipped_bit_is_found_while_criu_restores_and_nothing_runs(self):
        snap = self.gs("checkpoint", "-q", "gpu", env=self.gpu_env).stdout.strip().splitlines()[-1]
        self.assertTrue(self.wait_gone(self.pid))
        pages = os.path.join(self.store, "snapshots", snap, "checkpoint", "pages-1.img")
        with open(pages, "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0x01]))
        p = self.gs("restore", snap, "--name", "copy", check=False, env=self.gpu_env)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("refusing to restore", p.stderr)
        self.assertIn("checkpoint/pages-1.img", p.stderr)
        self.assertIn("does not match its digest", p.stderr)
        self.assertEqual([w["name"] for w in self.workloads() if w["running"]], [])
        # No task of it is left, stopped or not.
        # (This test's counter by its own device stand-in: other tests may run counters at the same time.)
        out = subprocess.run(["pgrep", "-f", self.device], capture_output=True, text=True)
        left = [pid for pid in out.stdout.split() if self.alive(int(pid))]
        end = time.time() + 5
        while left and time.time() < end:
            time.sleep(0.1)
            left = [pid for pid in left if self.alive(int(pid))]
        self.assertEqual(left, [])

    def test_gpu_restore_that_never_returns_is_cut_off(self):
        snap = self.gs("checkpoint", "-q", "gpu", env=self.gpu_env).stdout.strip().splitlines()[-1]
        env = dict(self.gpu_env, FAKE_CUDA_HANG_MS="cuCheckpointProcessRestore:600000")
        start = time.time()
        p = self.gs("restore", snap, "--timeout", "3", env=env, check=False, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("the GPU restore did not finish within 3 s", p.stderr)
        self.assertLess(time.time() - start, 30)
        # The half-restored tree does not run on.
        self.assertEqual([w for w in self.workloads() if w["running"]], [])
        self.assertEqual(subprocess.run(["pgrep", "-f", self.device], capture_output=True).stdout, b"")

    def test_failed_gpu_checkpoint_leaves_the_source_running(self):
        env = dict(self.gpu_env, FAKE_CUDA_FAIL="cuCheckpointProcessCheckpoint:*:999")
        p = self.gs("checkpoint", "gpu", env=env, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(f"checkpoint pid {self.pid}", p.stderr)
        self.assertIn("(999)", p.stderr)
        self.wait_count(self.pid, self.count(self.pid) + 10)
        self.assertEqual(self.snapshots(), [])
        self.assertEqual(self.tmp_dirs(), [])
        self.assertEqual(self.device_state(), 0)  # unlocked again: RUNNING
        self.assert_no_fail_in_logs()

    def test_restore_on_another_driver_major_is_refused_before_anything(self):
        snap = self.gs("checkpoint", "-q", "gpu", "--leave-running", env=self.gpu_env).stdout.strip().splitlines()[-1]
        self.set_driver("999.10")
        before = self.workloads()
        p = self.gs("restore", snap, "--name", "copy", env=self.gpu_env, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("driver 580.159.04, this machine has 999.10", p.stderr)
        self.assertEqual(self.workloads(), before)

    def test_gpu_options_on_a_cpu_snapshot_are_refused(self):
        cpu = self.run_counter("cpu")
        snap = self.checkpoint("cpu", "--leave-running")
        p = self.gs("restore", snap, "--name", "copy", "--gpus", "1", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("holds no GPU state", p.stderr)
        self.assertTrue(self.alive(cpu))


if __name__ == "__main__":
    unittest.main()
