"""Processes that share device memory, under the gpushare shim, without a GPU:
share_pair (a parent and a child writing and checking words of one buffer
every step) shares through CUDA IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle,
which the shim serves itself) or through an exported VMM fd passed over a unix
socket (what NCCL does). The fake libcuda backs VMM memory with memfds, so the
child's mapping really is the parent's memory. In-place suspend and resume,
checkpoint and restore into a new pid namespace, and a failed release in one
of the two: the sharing works after each."""
import os
import re
import time
import unittest

from harness import FakeGpuCase, WorkerSteps, require_built
from test_gpushare_fake import FAKE_DIR, SHIM, WORKLOADS

PAIR = os.path.join(WORKLOADS, "share_pair")


class SharingFake(WorkerSteps, FakeGpuCase):
    share = "ipc"

    def setUp(self):
        super().setUp()
        require_built(self, (os.path.join(FAKE_DIR, "libcuda.so.1"), "fake_cuda"), (PAIR, "wl_share_pair"),
                      (SHIM, "gpusnap_gpushare"))
        self.fail_file = os.path.join(self.tmp, "fail")
        open(self.fail_file, "w").close()
        # The shim's own test hook: "release <pid>" in this file fails that
        # process's release after its memory is freed (as the GPU test does).
        self.inject = os.path.join(self.tmp, "inject")
        self.env = dict(self.gpu_env, FAKE_CUDA_FAIL_FILE=self.fail_file, GPUSNAP_GPUSHARE_TEST_FAIL=self.inject)
        self.output = os.path.join(self.run_dir, "logs", "pair.log")
        # The child maps a stand-in of its own: the fake keeps each process's
        # checkpoint state in the device file it maps.
        self.device2 = self.device + "-child"
        with open(self.device2, "wb") as f:
            f.write(b"\0" * 4096)
        self.addCleanup(os.unlink, self.device2)

    def start(self):
        pid = int(self.gs("run", "--gpushare", "--name", "pair", "--", PAIR, "--share", self.share, "--mib", "70",
                          "--interval-ms", "20", "--device-file", self.device,
                          "--importer-device-file", self.device2).stdout.strip())
        self.wait_steps(3)
        return pid, self.child_of(pid)

    @staticmethod
    def child_of(pid):
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
        assert len(children) == 1, children
        return children[0]

    @staticmethod
    def ns_pid(pid):
        with open(f"/proc/{pid}/status") as f:
            return int(re.search(r"^NSpid:.*\s(\d+)$", f.read(), re.M)[1])

    def state(self, *pids):
        return self.gs_json("gpushare", "state", *map(str, pids))["pids"]

    def assert_goes_on(self, more=5):
        self.wait_steps(len(self.steps()) + more)
        self.assert_steps_unbroken()
        with open(self.output) as f:
            sums = set(re.findall(r"sum (\d+)$", f.read(), re.M)) - {"0"}
        # The child read the whole 70 MiB pattern at its first step and after
        # every pause, always the same.
        self.assertEqual(len(sums), 1, sums)

    def arm(self, spec):
        with open(self.fail_file, "w") as f:
            f.write(spec)

    def test_suspend_in_place_then_resume_and_the_sharing_works(self):
        parent, child = self.start()
        states = self.state(parent, child)
        self.assertEqual(len(states[0]["exports"]), 1)
        self.assertEqual(len(states[1]["imports"]), 1)
        out = self.gs_json("gpushare", "suspend", str(parent), str(child))
        self.assertEqual([p["state"] for p in out["pids"]], ["released", "released"])
        # Neither maps the memory any more: no memfd is left in either.
        for pid in (parent, child):
            with open(f"/proc/{pid}/maps") as f:
                self.assertNotIn("memfd:fake-cuda-vmm", f.read())
        time.sleep(1.2)  # a pause the child notices: it checks the whole pattern next
        out = self.gs_json("gpushare", "resume", str(parent), str(child))
        self.assertEqual([p["state"] for p in out["pids"]], ["running", "running"])
        self.assertIn("gpushare-remap", out["timings_s"])
        self.assert_goes_on()

    def test_a_slow_drain_is_tried_again_in_longer_attempts(self):
        # Every cuCtxSynchronize of the pair takes 300 ms: the first attempts
        # of 200 ms give up (the shim says it timed out), gpusnap resumes both
        # and tries again, longer, and the fifth (400 ms) gets there.
        self.env = dict(self.env, FAKE_CUDA_HANG_MS="cuCtxSynchronize:300")
        parent, child = self.start()
        out = self.gs_json("gpushare", "suspend", str(parent), str(child))
        self.assertEqual([p["state"] for p in out["pids"]], ["released", "released"])
        self.assertGreaterEqual(out["timings_s"]["gpushare-quiesce-retries"], 4)
        self.gs_json("gpushare", "resume", str(parent), str(child))
        self.assert_goes_on(3)
        # Within a timeout too short for any attempt to get there, it fails and both run on.
        p = self.gs("gpushare", "suspend", "--timeout-ms", "250", str(parent), str(child), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("did not finish within", p.stderr)
        self.assertEqual([s["state"] for s in self.state(parent, child)], ["running", "running"])
        self.assert_goes_on(3)

    def test_checkpoint_and_restore_into_a_new_namespace(self):
        self.start()
        snap = self.checkpoint("pair")
        meta = self.gs_json("inspect", snap)
        self.assertIn("gpu/2.chunks", meta["files"])
        self.assertIn("gpu/3.shares", meta["files"])  # the child's import, from pid 2
        self.assertEqual(len(meta["gpu"]["gpushare"]["control_sockets"]), 2)
        self.restore(snap)
        self.assert_goes_on()
        # Twice: the restored pair shares again, so it can be taken again.
        snap2 = self.checkpoint("pair")
        self.restore(snap2)
        self.assert_goes_on()

    def test_a_failed_release_in_one_process_resumes_both(self):
        parent, child = self.start()
        # The child's release fails after it dropped its mapping of the
        # parent's memory; the parent's succeeds.
        with open(self.inject, "w") as f:
            f.write(f"release {self.ns_pid(child)}\n")  # the pid the process sees
        p = self.gs("gpushare", "suspend", str(parent), str(child), check=False)
        os.unlink(self.inject)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("release: failure injected", p.stderr)
        self.assertEqual([s["state"] for s in self.state(parent, child)], ["running", "running"])
        time.sleep(1.2)
        self.assert_goes_on()
        # A driver call failing in the release of one of them: the same.
        self.arm(f"cuMemRelease:{self.ns_pid(child)}:2\n")
        p = self.gs("gpushare", "suspend", str(parent), str(child), check=False)
        self.arm("")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("cuMemRelease", p.stderr)
        self.assertEqual([s["state"] for s in self.state(parent, child)], ["running", "running"])
        self.assert_goes_on()
        # And nothing left behind stops the next checkpoint.
        self.restore(self.checkpoint("pair"))
        self.assert_goes_on()


class SharingFdFake(SharingFake):
    share = "fd"


if __name__ == "__main__":
    unittest.main()
