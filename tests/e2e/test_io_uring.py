"""io_uring, which CRIU cannot checkpoint: a tree holding a ring is refused
before anything is frozen, naming the process; under the gpushare shim a
program that probes for io_uring as libuv does (PyTorch's TCPStore, torchrun's
rendezvous) is refused a ring, runs on without, and checkpoints and restores.
Real CRIU, the real shim, tests/workloads/ring_probe."""
import os
import re
import time
import unittest

from harness import GPUSNAP, WORKLOADS, GpusnapCase, require_built

PROBE = os.path.join(WORKLOADS, "ring_probe")
SHIM = os.path.join(os.path.dirname(GPUSNAP), "libgpusnap_gpushare.so")


class IoUring(GpusnapCase):
    def setUp(self):
        super().setUp()
        require_built(self, (PROBE, "wl_ring_probe"), (SHIM, "gpusnap_gpushare"))
        self.output = os.path.join(self.run_dir, "logs", "ring.log")

    def start(self, *flags):
        pid = int(self.gs("run", *flags, "--name", "ring", "--", PROBE).stdout.strip())
        self.wait_steps(3)
        return pid

    def text(self):
        with open(self.output) as f:
            return f.read()

    def steps(self):
        return [int(s) for s in re.findall(r"^step (\d+)$", self.text(), re.M)]

    def wait_steps(self, at_least, timeout=20):
        end = time.time() + timeout
        while time.time() < end:
            if os.path.exists(self.output) and len(self.steps()) >= at_least:
                return
            time.sleep(0.05)
        self.fail(f"ring_probe did not reach {at_least} steps:\n{self.logs()}")

    def test_a_tree_holding_a_ring_is_refused_naming_it_and_runs_on(self):
        pid = self.start()
        if "io_uring: refused" in self.text():
            self.skipTest(f"this kernel gives no io_uring ({self.text().splitlines()[0]})")
        self.assertRegex(self.text(), r"(?m)^io_uring: fd \d+$")
        p = self.gs("checkpoint", "ring", check=False)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertIn(f"pid {pid} (`{PROBE}`) holds an io_uring instance (fd ", p.stderr)
        self.assertIn("CRIU cannot checkpoint", p.stderr)
        self.assertIn("gpusnap run --gpushare", p.stderr)
        self.assertEqual(self.snapshots(), [])
        self.assertEqual(self.tmp_dirs(), [])
        # Nothing was frozen: it goes on counting.
        n = len(self.steps())
        self.wait_steps(n + 5)
        self.assertTrue(self.alive(pid))

    def test_under_the_shim_the_ring_is_refused_and_the_process_checkpoints(self):
        pid = self.start("--gpushare")
        self.assertIn("io_uring: refused (Function not implemented)", self.text())
        snap = self.checkpoint("ring")
        self.assertTrue(self.wait_gone(pid))
        n = len(self.steps())
        restored = self.restore(snap)
        self.wait_steps(n + 5)
        steps = self.steps()
        self.assertEqual(steps, list(range(len(steps))), "steps lost or repeated across the restore")
        self.assertTrue(self.alive(restored))


if __name__ == "__main__":
    unittest.main()
