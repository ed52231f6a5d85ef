"""`gpusnap cuda` against the fake libcuda (tests/fakes/libcuda), loaded by the
binary's own dlopen("libcuda.so.1") through LD_LIBRARY_PATH. Runs on machines
without a GPU; needs no root."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

GPUSNAP = os.environ.get("GPUSNAP_BIN", os.path.join(os.path.dirname(__file__), "../../build/gpusnap"))
FAKE_DIR = os.environ.get("GPUSNAP_FAKE_CUDA_DIR", os.path.join(os.path.dirname(__file__), "../../build/fakes"))
ACTIONS = ["state", "restore-tid", "lock", "checkpoint", "restore", "unlock", "suspend", "resume", "gpus"]
UUID0 = "GPU-5afec0da-0000-0000-0000-000000000000"
UUID1 = "GPU-5afec0da-0000-0000-0000-000000000001"


class CudaFake(unittest.TestCase):
    def setUp(self):
        if not os.path.exists(os.path.join(FAKE_DIR, "libcuda.so.1")):
            self.skipTest(f"no fake libcuda in {FAKE_DIR} (build target fake_cuda)")
        self.tmp = tempfile.mkdtemp(prefix="gpusnap-cuda-fake-")
        self.log = os.path.join(self.tmp, "calls.log")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_CUDA_")}
        self.env = dict(env, LD_LIBRARY_PATH=FAKE_DIR, FAKE_CUDA_LOG=self.log,
                        FAKE_CUDA_STATE_FILE=os.path.join(self.tmp, "states"))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def gs(self, *args, rc=0, **knobs):
        env = dict(self.env, **{f"FAKE_CUDA_{k}": str(v) for k, v in knobs.items()})
        p = subprocess.run([GPUSNAP, *args], capture_output=True, text=True, env=env, timeout=60)
        if rc is not None:
            self.assertEqual(p.returncode, rc, f"gpusnap {' '.join(args)}:\n{p.stdout}{p.stderr}")
        return p

    def calls(self, fn=None):
        """The fake's log: one dict per call."""
        out = []
        if not os.path.exists(self.log):
            return out
        with open(self.log) as f:
            for line in f:
                c = dict(w.split("=", 1) for w in line.split())
                if fn is None or c["fn"] == fn:
                    out.append(c)
        return out

    def clear_log(self):
        if os.path.exists(self.log):
            os.unlink(self.log)

    def states(self, *pids):
        out = self.gs("cuda", "state", *map(str, pids)).stdout.split()
        return dict(zip(out[0::2], out[1::2]))

    # --- tests ----------------------------------------------------------------
    def test_help_lists_every_action_with_one_line(self):
        out = self.gs("cuda", "--help").stdout
        for action in ACTIONS:
            lines = [l for l in out.splitlines() if l.strip().startswith(action + " ")]
            self.assertEqual(len(lines), 1, f"{action} not listed once:\n{out}")
            self.assertGreater(len(lines[0].split()), 2, f"{action} has no description")

    def test_lock_two_pids_in_one_process_with_one_cuinit(self):
        p = self.gs("cuda", "lock", "111", "222")
        self.assertEqual(p.stdout.splitlines(), ["111 LOCKED", "222 LOCKED"])
        self.assertEqual(len(self.calls("cuInit")), 1)
        locks = self.calls("cuCheckpointProcessLock")
        self.assertEqual(sorted(c["pid"] for c in locks), ["111", "222"])
        self.assertTrue(all(c["rc"] == "0" and c["timeout_ms"] == "10000" for c in locks))
        self.assertEqual(self.states(111, 222), {"111": "LOCKED", "222": "LOCKED"})

    def test_timeout_reaches_the_driver(self):
        self.gs("cuda", "lock", "--timeout-ms", "1234", "5")
        self.assertEqual(self.calls("cuCheckpointProcessLock")[0]["timeout_ms"], "1234")

    def test_suspend_then_resume_keeps_the_order_and_runs_pids_concurrently(self):
        pids = ["301", "302", "303"]
        self.gs("cuda", "suspend", *pids, DELAY_MS=200)
        locks, ckpts = self.calls("cuCheckpointProcessLock"), self.calls("cuCheckpointProcessCheckpoint")
        self.assertEqual(len(locks), 3)
        self.assertEqual(len(ckpts), 3)
        self.assertLess(max(int(c["t"]) for c in locks), min(int(c["start"]) for c in ckpts))
        # Concurrent: every lock began before the first one ended.
        self.assertLess(max(int(c["start"]) for c in locks), min(int(c["t"]) for c in locks))
        self.assertEqual(set(self.states(*pids).values()), {"CHECKPOINTED"})
        self.clear_log()
        self.gs("cuda", "resume", *pids, DELAY_MS=200)
        restores, unlocks = self.calls("cuCheckpointProcessRestore"), self.calls("cuCheckpointProcessUnlock")
        self.assertEqual(len(restores), 3)
        self.assertEqual(len(unlocks), 3)
        self.assertLess(max(int(c["t"]) for c in restores), min(int(c["start"]) for c in unlocks))
        self.assertEqual(len(self.calls("cuInit")), 1)
        self.assertEqual(set(self.states(*pids).values()), {"RUNNING"})

    def test_failed_lock_unlocks_the_pid_already_locked(self):
        p = self.gs("cuda", "lock", "111", "222", "--timeout-ms", "500", rc=1,
                    FAIL="cuCheckpointProcessLock:222:600")
        self.assertIn("lock pid 222: CUDA_ERROR_NOT_READY (600): not locked within 500 ms", p.stderr)
        self.assertIn("rolled back: unlocked pid 111", p.stderr)
        self.assertIn("111 RUNNING (rolled back)", p.stdout)
        self.assertEqual([c["pid"] for c in self.calls("cuCheckpointProcessUnlock")], ["111"])
        self.assertEqual(self.states(111, 222), {"111": "RUNNING", "222": "RUNNING"})

    def test_failed_restore_unlocks_nothing(self):
        self.gs("cuda", "suspend", "111", "222")
        self.clear_log()
        p = self.gs("cuda", "resume", "111", "222", rc=1, FAIL="cuCheckpointProcessRestore:111:801")
        self.assertIn("restore pid 111: CUDA_ERROR_NOT_SUPPORTED (801)", p.stderr)
        self.assertIn("did not unlock any pid", p.stderr)
        self.assertEqual(self.calls("cuCheckpointProcessUnlock"), [])
        self.assertEqual(self.states(111, 222), {"111": "CHECKPOINTED", "222": "LOCKED"})

    def test_an_action_that_does_not_fit_names_the_state(self):
        p = self.gs("cuda", "checkpoint", "4711", rc=1)
        self.assertIn("checkpoint pid 4711: process is RUNNING; lock it first", p.stderr)
        self.assertEqual(self.calls("cuCheckpointProcessCheckpoint"), [])

    def test_driver_errors_are_named(self):
        self.gs("cuda", "lock", "4711")
        p = self.gs("cuda", "checkpoint", "4711", rc=1, FAIL="cuCheckpointProcessCheckpoint:4711:801")
        self.assertIn("gpusnap: error: checkpoint pid 4711: CUDA_ERROR_NOT_SUPPORTED (801)", p.stderr)

    def test_gpu_map_becomes_uuid_pairs(self):
        self.gs("cuda", "suspend", "7", GPUS=2)
        self.gs("cuda", "resume", "7", "--gpu-map", f"0=1,{UUID1}=0", GPUS=2)
        restore = self.calls("cuCheckpointProcessRestore")
        self.assertEqual(len(restore), 1)
        self.assertEqual(restore[0]["pairs"], f"{UUID0}>{UUID1},{UUID1}>{UUID0}")
        self.assertEqual(self.states(7)["7"], "RUNNING")

    def test_a_gpu_map_that_is_not_a_permutation_is_refused_before_any_restore(self):
        self.gs("cuda", "suspend", "8", GPUS=2)
        p = self.gs("cuda", "restore", "8", "--gpu-map", "0=1", rc=1, GPUS=2)
        self.assertIn("target GPU 1 would receive both GPU 0 and GPU 1", p.stderr)
        p = self.gs("cuda", "restore", "8", "--gpu-map", "0=5", rc=1, GPUS=2)
        self.assertIn("no target GPU `5`", p.stderr)
        self.assertEqual(self.calls("cuCheckpointProcessRestore"), [])
        self.assertEqual(self.states(8)["8"], "CHECKPOINTED")

    def test_json_report(self):
        p = self.gs("--json", "cuda", "suspend", "11", "12")
        j = json.loads(p.stdout)
        self.assertTrue(j["ok"])
        self.assertEqual(j["action"], "suspend")
        self.assertEqual(j["driver"], "13.0 (13000)")
        self.assertEqual([x["state"] for x in j["pids"]], ["CHECKPOINTED", "CHECKPOINTED"])
        for phase in ("state", "lock", "checkpoint", "total"):
            self.assertIn(phase, j["timings_s"])
        p = self.gs("cuda", "--json", "unlock", "11", "12", rc=1)
        j = json.loads(p.stdout)
        self.assertFalse(j["ok"])
        self.assertEqual(j["code"], "FailedPrecondition")
        self.assertIn("unlock pid 11: process is CHECKPOINTED; restore it first", j["error"])

    def test_restore_tid_and_gpus(self):
        self.assertEqual(self.gs("cuda", "restore-tid", "40").stdout.split(), ["40", "RUNNING", "restore-tid", "41"])
        out = self.gs("cuda", "gpus", GPUS=2).stdout.splitlines()
        self.assertEqual(len(out), 2)
        self.assertTrue(out[1].startswith(f"1 {UUID1} Fake NVIDIA H200 #1"), out[1])
        self.assertIn("compute capability 9.0", out[1])
        j = json.loads(self.gs("--json", "cuda", "gpus").stdout)
        self.assertEqual(j["gpus"][0]["uuid"], UUID0)

    def test_old_driver_is_refused(self):
        p = self.gs("cuda", "state", "1", rc=1, DRIVER_VERSION=12040)
        self.assertIn("CUDA driver 12.4 (12040) is too old", p.stderr)
        self.assertEqual(self.calls("cuInit"), [])

    def test_gpu_map_needs_r580(self):
        self.gs("cuda", "suspend", "9", GPUS=2)
        p = self.gs("cuda", "resume", "9", "--gpu-map", "0=1,1=0", rc=1, GPUS=2, DRIVER_VERSION=12080)
        self.assertIn("needs CUDA driver 13.0 (13000) (r580); this one is 12.8 (12080)", p.stderr)

    def test_missing_symbol_is_named(self):
        env = dict(self.env, LD_LIBRARY_PATH=os.path.join(FAKE_DIR, "no-lock"))
        p = subprocess.run([GPUSNAP, "cuda", "state", "1"], capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("lacks cuCheckpointProcessLock (required)", p.stderr)

    def test_missing_driver_is_an_error(self):
        p = self.gs("cuda", "--libcuda", os.path.join(self.tmp, "libcuda.so.1"), "state", "1", rc=1)
        self.assertIn("cannot load the CUDA driver", p.stderr)

    def test_bad_pid_lists(self):
        p = self.gs("cuda", "lock", "5", "5", rc=1)
        self.assertIn("pid 5 is given twice", p.stderr)
        p = self.gs("cuda", "lock", "0", rc=1)
        self.assertIn("`0` is not a pid", p.stderr)
        self.assertEqual(self.calls("cuCheckpointProcessLock"), [])
        self.assertNotEqual(self.gs("cuda", "lock", rc=None).returncode, 0)  # no pid at all


if __name__ == "__main__":
    unittest.main()
