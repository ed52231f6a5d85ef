"""The fake libcuda's device memory (tests/fakes/libcuda): vmm_worker driving it
the way cudart does (everything through cuGetProcAddress_v2), and direct calls
through ctypes for the answers a shim relies on. Runs on machines without a
GPU; only the checkpoint and restore under the real CRIU needs root."""
import ctypes
import os
import re
import shutil
import signal
import subprocess
import tempfile
import unittest

from harness import FakeGpuCase, WorkerSteps

FAKE_DIR = os.environ.get("GPUSNAP_FAKE_CUDA_DIR", os.path.join(os.path.dirname(__file__), "../../build/fakes"))
WORKLOADS = os.environ.get("GPUSNAP_WORKLOADS", os.path.join(os.path.dirname(__file__), "../../build/workloads"))
WORKER = os.path.join(WORKLOADS, "vmm_worker")
MIB = 1 << 20
INVALID_VALUE, INVALID_CONTEXT, NOT_FOUND = 1, 201, 500


def fake_library():
    return os.path.join(FAKE_DIR, "libcuda.so.1")


class VmmWorker(unittest.TestCase):
    def setUp(self):
        if not os.path.exists(fake_library()):
            self.skipTest(f"no fake libcuda in {FAKE_DIR} (build target fake_cuda)")
        if not os.path.exists(WORKER):
            self.skipTest(f"no {WORKER} (build target wl_vmm_worker)")
        self.tmp = tempfile.mkdtemp(prefix="gpusnap-fake-vmm-")
        self.log = os.path.join(self.tmp, "calls.log")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_CUDA_")}
        self.env = dict(env, LD_LIBRARY_PATH=FAKE_DIR, FAKE_CUDA_LOG=self.log)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_worker(self, *args, **knobs):
        env = dict(self.env, **{f"FAKE_CUDA_{k}": str(v) for k, v in knobs.items()})
        return subprocess.run([WORKER, *args], capture_output=True, text=True, env=env, timeout=120)

    def start_worker(self, *args, **knobs):
        env = dict(self.env, **{f"FAKE_CUDA_{k}": str(v) for k, v in knobs.items()})
        p = subprocess.Popen([WORKER, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.addCleanup(lambda: (p.poll() is None and p.kill(), p.wait(), p.stdout.close()))
        return p

    def read_until(self, p, pattern):
        """Lines of p's output up to and including the first matching `pattern`."""
        lines = []
        for line in p.stdout:
            lines.append(line)
            if re.search(pattern, line):
                return lines
        self.fail(f"{pattern!r} never came:\n{''.join(lines)}")

    def calls(self, fn=None):
        out = []
        if os.path.exists(self.log):
            with open(self.log) as f:
                for line in f:
                    c = dict(w.split("=", 1) for w in line.split())
                    if fn is None or c["fn"] == fn:
                        out.append(c)
        return out

    def test_five_good_steps_through_cuGetProcAddress(self):
        p = self.run_worker("--steps", "5", "--interval-ms", "10", "--full-every", "1")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        steps = [re.fullmatch(r"step (\d+) counter (\d+) sum (\d+)", l) for l in p.stdout.splitlines()]
        self.assertTrue(all(steps), p.stdout)
        self.assertEqual([(int(m[1]), int(m[2])) for m in steps], [(i, i) for i in range(1, 6)])
        sums = [int(m[3]) for m in steps]
        # Four patterned buffers: each step adds 1 to each one's first word.
        self.assertEqual([b - a for a, b in zip(sums, sums[1:])], [4] * 4)
        fetched = {c["symbol"] for c in self.calls("cuGetProcAddress_v2")}
        self.assertLessEqual({"cuInit", "cuMemAlloc", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuLaunchKernel"}, fetched)
        self.assertEqual(len(self.calls("cuLaunchKernel")), 5)
        allocs = [int(c["size"]) for c in self.calls("cuMemAlloc_v2")]
        self.assertEqual(allocs[:5], [70 * MIB, 130 * MIB, 3 * MIB, 1 * MIB, 64 * MIB])
        self.assertTrue(all(c["rc"] == "0" for c in self.calls()), "a call failed")

    def test_injected_alloc_failure_is_reported(self):
        p = self.run_worker("--steps", "5", FAIL="cuMemAlloc_v2:*:2")
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("CUDA error cuMemAlloc_v2 2", p.stdout)
        self.assertNotIn("step", p.stdout)

    def test_vmm_probe(self):
        p = self.run_worker("--vmm-probe")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(p.stdout.strip(), "vmm-probe ok")
        self.assertEqual(len(self.calls("cuMemMap")), 3)
        # The copy from unmapped memory answered, it did not crash.
        failed = [c for c in self.calls("cuMemcpyDtoH_v2") if c["rc"] != "0"]
        self.assertEqual([c["rc"] for c in failed], ["1", "1"])

    def test_injected_vmm_failures_are_reported(self):
        for fn in ["cuMemCreate", "cuMemMap", "cuMemcpyDtoHAsync_v2", "cuMemcpyHtoDAsync_v2"]:
            with self.subTest(fn=fn):
                p = self.run_worker("--vmm-probe", FAIL=f"{fn}:*:2")
                self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
                self.assertEqual(p.stdout.strip(), f"CUDA error {fn} 2")

    def test_sigterm_exits_zero(self):
        p = self.start_worker("--interval-ms", "10")
        self.read_until(p, r"^step 3 ")
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=30), 0)

    def test_failure_armed_while_running(self):
        fail_file = os.path.join(self.tmp, "fail")
        p = self.start_worker("--interval-ms", "10", FAIL_FILE=fail_file)
        self.read_until(p, r"^step 2 ")
        with open(fail_file, "w") as f:
            f.write("cuLaunchKernel:*:999\n")
        self.read_until(p, r"^CUDA error cuLaunchKernel 999$")
        self.assertEqual(p.wait(timeout=30), 1)

    def test_corrupted_device_memory_is_a_mismatch(self):
        p = self.start_worker("--interval-ms", "10", "--full-every", "1")
        self.read_until(p, r"^step 2 ")
        three_mib = [c for c in self.calls("cuMemAlloc_v2") if c["size"] == str(3 * MIB)][0]
        try:
            with open(f"/proc/{p.pid}/mem", "r+b", buffering=0) as mem:
                mem.seek(int(three_mib["ptr"], 16) + 2 * MIB + 12)
                mem.write(b"\xde\xad\xbe\xef")
        except OSError as e:
            self.skipTest(f"cannot write another process's memory here: {e}")
        lines = self.read_until(p, r"^MISMATCH ")
        self.assertRegex(lines[-1], rf"buffer 2 \({3 * MIB} bytes\) offset {2 * MIB + 12} ")
        self.assertEqual(p.wait(timeout=30), 1)


class WorkerUnderCriu(WorkerSteps, FakeGpuCase):
    """The fake's device memory is ordinary memory to CRIU: plain anonymous
    mappings (cuMemAlloc_v2) and shared memfd mappings (cuMemCreate + cuMemMap)
    come back at the same addresses with the same contents."""

    def setUp(self):
        super().setUp()
        if not os.path.exists(fake_library()) or not os.path.exists(WORKER):
            self.skipTest("needs the fake libcuda and vmm_worker (build targets fake_cuda, wl_vmm_worker)")
        self.output = os.path.join(self.run_dir, "logs", "vmm.log")

    def checkpoint_and_restore(self, alloc):
        env = dict(self.env, LD_LIBRARY_PATH=FAKE_DIR)
        # Small buffers, each checked whole at every step.
        self.gs("run", "--name", "vmm", "--", WORKER, "--alloc", alloc, "--mib", "5,3,1", "--zero-mib", "4",
                "--interval-ms", "20", "--full-every", "1", env=env)
        self.wait_steps(3)
        snapshot = self.checkpoint("vmm")
        before = len(self.steps())
        self.restore(snapshot)
        self.wait_steps(before + 5)
        steps = self.steps()
        self.assertEqual(steps, list(range(1, len(steps) + 1)), "steps lost or repeated across the restore")

    def test_plain_allocations_survive_checkpoint_and_restore(self):
        self.checkpoint_and_restore("plain")

    def test_vmm_mappings_survive_checkpoint_and_restore(self):
        self.checkpoint_and_restore("vmm")

    def test_as_a_gpu_process_through_the_checkpoint_api(self):
        # The device stand-in makes gpusnap take it for a GPU process and drive
        # the fake's checkpoint API around the dump (see test_gpu_flow_fake).
        gpu_env = self.gpu_env
        device = self.device
        self.gs("run", "--name", "vmm", "--", WORKER, "--alloc", "vmm", "--mib", "5,3,1", "--zero-mib", "4",
                "--interval-ms", "20", "--full-every", "1", "--device-file", device, env=gpu_env)
        self.wait_steps(3)
        snapshot = self.gs("checkpoint", "-q", "vmm", env=gpu_env).stdout.strip().splitlines()[-1]
        self.assertIsNotNone(self.gs_json("inspect", snapshot).get("gpu"), "not taken for a GPU process")
        before = len(self.steps())
        self.gs("restore", snapshot, env=gpu_env)
        self.wait_steps(before + 5)
        steps = self.steps()
        self.assertEqual(steps, list(range(1, len(steps) + 1)), "steps lost or repeated across the restore")


class FakeDriverDirect(unittest.TestCase):
    """The fake loaded into this process: the answers a shim builds on."""

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(fake_library()):
            raise unittest.SkipTest(f"no fake libcuda in {FAKE_DIR}")
        for k in [k for k in os.environ if k.startswith("FAKE_CUDA_")]:
            del os.environ[k]
        cls.cu = ctypes.CDLL(fake_library())
        assert cls.cu.cuInit(0) == 0

    def proc(self, name, version=12080):
        pfn, status = ctypes.c_void_p(), ctypes.c_int(-1)
        rc = self.cu.cuGetProcAddress_v2(name.encode(), ctypes.byref(pfn), version, ctypes.c_uint64(0),
                                         ctypes.byref(status))
        return rc, pfn.value, status.value

    def address(self, symbol):
        return ctypes.cast(getattr(self.cu, symbol), ctypes.c_void_p).value

    def test_proc_address_picks_the_v2_abi(self):
        self.assertEqual(self.proc("cuMemAlloc"), (0, self.address("cuMemAlloc_v2"), 0))
        self.assertEqual(self.proc("cuStreamDestroy")[1], self.address("cuStreamDestroy_v2"))
        self.assertEqual(self.proc("cuLaunchKernel")[1], self.address("cuLaunchKernel"))
        self.assertEqual(self.proc("cuGetProcAddress")[1], self.address("cuGetProcAddress_v2"))
        self.assertEqual(self.proc("cuGetProcAddress", version=11080)[1], self.address("cuGetProcAddress"))

    def test_unknown_symbol(self):
        self.assertEqual(self.proc("cuNoSuchFunction"), (NOT_FOUND, None, 1))

    def test_context_is_per_thread_and_required_for_ctx_get_device(self):
        dev = ctypes.c_int(-1)
        self.assertEqual(self.cu.cuCtxSetCurrent(None), 0)
        self.assertEqual(self.cu.cuCtxGetDevice(ctypes.byref(dev)), INVALID_CONTEXT)
        ctx = ctypes.c_void_p()
        self.assertEqual(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), 0)
        self.assertTrue(ctx.value)
        self.assertEqual(self.cu.cuCtxSetCurrent(ctx), 0)
        self.assertEqual(self.cu.cuCtxGetDevice(ctypes.byref(dev)), 0)
        self.assertEqual(dev.value, 0)
        self.assertEqual(self.cu.cuCtxSetCurrent(None), 0)

    def test_copies_check_the_range_instead_of_crashing(self):
        ptr = ctypes.c_uint64()
        buf = ctypes.create_string_buffer(16)
        self.assertEqual(self.cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(4096)), 0)
        self.assertEqual(self.cu.cuMemcpyDtoH_v2(buf, ptr, ctypes.c_size_t(16)), 0)
        # Past the end of the allocation.
        self.assertEqual(self.cu.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(ptr.value + 4090), ctypes.c_size_t(16)),
                         INVALID_VALUE)
        self.assertEqual(self.cu.cuMemFree_v2(ptr), 0)
        self.assertEqual(self.cu.cuMemcpyDtoH_v2(buf, ptr, ctypes.c_size_t(16)), INVALID_VALUE)
        self.assertEqual(self.cu.cuMemFree_v2(ptr), INVALID_VALUE)

    def test_mem_get_info_counts_allocations(self):
        free0, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.assertEqual(self.cu.cuMemGetInfo_v2(ctypes.byref(free0), ctypes.byref(total)), 0)
        self.assertEqual(total.value, 16 << 30)
        ptr = ctypes.c_uint64()
        self.assertEqual(self.cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(4 * MIB)), 0)
        self.assertEqual(ptr.value % (2 * MIB), 0)
        free1 = ctypes.c_size_t()
        self.cu.cuMemGetInfo_v2(ctypes.byref(free1), ctypes.byref(total))
        self.assertEqual(free0.value - free1.value, 4 * MIB)
        self.assertEqual(self.cu.cuMemFree_v2(ptr), 0)


if __name__ == "__main__":
    unittest.main()
