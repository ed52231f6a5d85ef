"""The gpushare shim end to end without a GPU: vmm_worker (which reaches the
driver as cudart does, through cuGetProcAddress_v2) runs under
`gpusnap run --gpushare` against the fake libcuda, so the real shim, its
control socket, the chunk store, CRIU and gpusnap's checkpoint/restore steps
all run as in production; only the driver underneath is the CPU fake."""
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import time
import unittest

from harness import GPUSNAP, FakeGpuCase, WorkerSteps, require_built

BUILD = os.path.dirname(GPUSNAP)
FAKE_DIR = os.environ.get("GPUSNAP_FAKE_CUDA_DIR", os.path.join(BUILD, "fakes"))
WORKLOADS = os.environ.get("GPUSNAP_WORKLOADS", os.path.join(BUILD, "workloads"))
WORKER = os.path.join(WORKLOADS, "vmm_worker")
SHIM = os.path.join(BUILD, "libgpusnap_gpushare.so")
MIB = 1 << 20
# 70 MiB (two chunks, the second short), 5 MiB, 1 MiB (below the VMM
# threshold: stays with the driver), and 64 MiB that stay zero.
WORKER_ARGS = ["--mib", "70,5,1", "--zero-mib", "64", "--interval-ms", "20", "--full-every", "1"]
DEVICE_BYTES = (70 + 6 + 64) * MIB  # as the shim maps them: 5 MiB rounds up to 6


class GpushareFake(WorkerSteps, FakeGpuCase):
    def setUp(self):
        super().setUp()
        require_built(self, (os.path.join(FAKE_DIR, "libcuda.so.1"), "fake_cuda"), (WORKER, "wl_vmm_worker"),
                      (SHIM, "gpusnap_gpushare"))
        self.fail_file = os.path.join(self.tmp, "fail")
        open(self.fail_file, "w").close()
        # The worker loads the fake too (it is the process the driver serves).
        self.env = dict(self.gpu_env, FAKE_CUDA_FAIL_FILE=self.fail_file)
        self.output = os.path.join(self.run_dir, "logs", "vmm.log")

    # --- the worker -----------------------------------------------------------
    def start(self, gpushare=True):
        flag = ["--gpushare"] if gpushare else []
        pid = int(self.gs("run", *flag, "--name", "vmm", "--", WORKER, *WORKER_ARGS, "--device-file", self.device)
                  .stdout.strip())
        self.wait_steps(3)
        return pid

    def assert_goes_on(self, more=5):
        self.wait_steps(len(self.steps()) + more)
        self.assert_steps_unbroken()

    def shim_state(self, pid):
        return self.gs_json("gpushare", "state", str(pid))["pids"][0]

    def chunk_files(self):
        root = os.path.join(self.store, "chunks")
        return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)

    def arm(self, spec):
        with open(self.fail_file, "w") as f:
            f.write(spec)

    # --- in place -------------------------------------------------------------
    def test_suspend_frees_device_memory_holds_work_and_resume_gives_it_back(self):
        pid = self.start()
        st = self.shim_state(pid)
        self.assertEqual((st["state"], st["allocations"], st["bytes"]), ("running", 3, DEVICE_BYTES))
        out = self.gs_json("gpushare", "suspend", str(pid))
        st = out["pids"][0]
        self.assertEqual((st["state"], st["released_bytes"]), ("released", DEVICE_BYTES))
        self.assertIn("gpushare-release", out["timings_s"])
        # The worker is alive but cannot get GPU work in: its steps stop.
        frozen = len(self.steps())
        time.sleep(0.5)
        self.assertTrue(self.alive(pid))
        self.assertLessEqual(len(self.steps()), frozen + 1)
        self.assertGreaterEqual(self.shim_state(pid)["held_calls"], 1)
        # The device memory went back to the driver: no memfd mapping of it is left.
        with open(f"/proc/{pid}/maps") as f:
            self.assertNotIn("memfd:", f.read())
        # Three non-zero chunks: 70 MiB in two, 6 MiB in one; the zero buffer costs nothing.
        self.assertEqual(len(self.chunk_files()), 3)
        st = self.gs_json("gpushare", "resume", str(pid))["pids"][0]
        self.assertEqual((st["state"], st["released_bytes"]), ("running", 0))
        self.assert_goes_on()

    def test_a_failed_release_leaves_the_process_running(self):
        pid = self.start()
        self.arm("cuMemcpyDtoHAsync_v2:*:2\n")
        p = self.gs("gpushare", "suspend", str(pid), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(p.stderr, r"release: saving device memory: cuMemcpyDtoHAsync: CUDA_ERROR\w* \(2\)")
        self.assertIn("every process was resumed", p.stderr)
        self.arm("")
        self.assertEqual(self.shim_state(pid)["state"], "running")
        self.assert_goes_on()

    def test_resume_without_suspend_and_a_process_without_the_shim(self):
        pid = self.start()
        self.assertEqual(self.gs_json("gpushare", "resume", str(pid))["pids"][0]["state"], "running")
        p = self.gs("gpushare", "state", str(os.getpid()), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(f"pid {os.getpid()} does not load the gpushare shim", p.stderr)
        p = self.gs("gpushare", "state", "999999999", check=False)
        self.assertIn("no process with pid 999999999", p.stderr)

    def test_run_without_the_shim_says_where_it_looked_and_starts_nothing(self):
        env = dict(self.env, GPUSNAP_GPUSHARE_LIB="/nonexistent/libgpusnap_gpushare.so")
        p = self.gs("run", "--gpushare", "--name", "x", "--", "true", env=env, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("GPUSNAP_GPUSHARE_LIB `/nonexistent/libgpusnap_gpushare.so`: No such file or directory", p.stderr)
        self.assertEqual(self.workloads(), [])

    # --- the control socket ---------------------------------------------------
    def control_socket(self, pid):
        return self.shim_state(pid)["socket"][1:]  # abstract: the client puts the NUL in front

    def ask(self, pid, payload, uid=None):
        code = ("import os, socket, sys\n"
                "if len(sys.argv) > 3: os.setuid(int(sys.argv[3]))\n"
                "s = socket.socket(socket.AF_UNIX); s.connect(b'\\0' + sys.argv[1].encode())\n"
                "s.sendall(sys.argv[2].encode()); print(s.makefile().readline(), end='')\n")
        args = ["python3", "-c", code, self.control_socket(pid), payload] + ([str(uid)] if uid is not None else [])
        return json.loads(subprocess.run(args, capture_output=True, text=True, timeout=30, check=True).stdout)

    def test_control_socket_refuses_bad_requests_and_other_users(self):
        pid = self.start()
        self.assertEqual(self.ask(pid, '{"cmd":"state"}\n')["state"], "running")
        bad = self.ask(pid, '{"cmd":"dump"}\n')
        self.assertFalse(bad["ok"])
        self.assertIn("unknown control command `dump`", bad["error"])
        self.assertIn("absolute path", self.ask(pid, '{"cmd":"release","chunk_store":"x","manifest":"/m"}\n')["error"])
        self.assertIn("not quiesced", self.ask(pid, f'{{"cmd":"release","chunk_store":"{self.store}",'
                                                f'"manifest":"{self.tmp}/m"}}\n')["error"])
        nobody = self.ask(pid, '{"cmd":"quiesce"}\n', uid=65534)
        self.assertFalse(nobody["ok"])
        self.assertIn("permission denied", nobody["error"])
        self.assertEqual(self.ask(pid, '{"cmd":"state"}\n')["state"], "running")
        self.assert_goes_on()

    # --- checkpoint and restore -----------------------------------------------
    def test_checkpoint_and_restore_through_the_chunk_store(self):
        self.start()
        snap = self.checkpoint("vmm")
        meta = self.gs_json("inspect", snap)
        share = meta["gpu"]["gpushare"]
        self.assertEqual(share["chunk_store"], self.store)
        self.assertEqual(share["shim"], os.path.realpath(SHIM))
        self.assertEqual(len(share["control_sockets"]), 1)
        self.assertIn("gpu/2.chunks", meta["files"])
        # The device memory is in the chunk store, not in CRIU's images.
        self.assertLess(meta["total_bytes"], 40 * MIB)
        self.assertEqual(len(self.chunk_files()), 3)
        before = len(self.steps())
        self.restore(snap)
        self.wait_steps(before + 5)
        self.assert_steps_unbroken()
        # A second cycle stores only the chunks that changed (the counters' first words).
        snap2 = self.checkpoint("vmm")
        self.assertEqual(len(self.chunk_files()), 5)
        self.restore(snap2)
        self.assert_goes_on()

    def restore_json(self, snap, env=None):
        out = json.loads(self.gs("--json", "restore", snap, env=env).stdout)
        self.wait_steps(len(self.steps()) + 3)
        return out

    def test_restore_makes_and_fills_the_memory_while_criu_runs_and_the_process_adopts_it(self):
        self.start()
        snap = self.checkpoint("vmm")
        restored = self.restore_json(snap)
        self.assertIn("gpushare-preload", restored["timings_s"])
        self.assertIn("gpushare-adopt", restored["timings_s"])
        # The three allocations of 2 MiB and more (70, 6 and 64 MiB) came filled
        # from gpusnap; the worker checks every byte of them at every step.
        last = self.shim_state(restored["pid"])["last"]
        self.assertEqual(last["adopted"], 3, last)
        self.assertEqual(last["adopted_bytes"], DEVICE_BYTES, last)
        self.assert_goes_on()
        # And a second cycle from what was adopted.
        snap2 = self.checkpoint("vmm")
        self.assertEqual(self.shim_state(self.restore_json(snap2)["pid"])["last"]["adopted"], 3)
        self.assert_goes_on()

    def test_without_preload_or_when_it_fails_the_process_loads_its_memory_itself(self):
        self.start()
        snap = self.checkpoint("vmm")
        restored = self.restore_json(snap, env=dict(self.env, GPUSNAP_GPUSHARE_PRELOAD="0"))
        self.assertNotIn("gpushare-preload", restored["timings_s"])
        self.assertEqual(self.shim_state(restored["pid"])["last"]["adopted"], 0)
        self.assert_goes_on()
        snap2 = self.checkpoint("vmm")
        # Only gpusnap exports here: its preload fails, and the worker loads all.
        self.arm("cuMemExportToShareableHandle:*:2\n")
        p = self.gs("restore", snap2)
        self.arm("")
        self.assertIn("gpushare-preload: ", p.stderr)
        self.assertIn("cuMemExportToShareableHandle", p.stderr)
        pid = int(p.stdout.strip().splitlines()[-1])
        self.wait_steps(len(self.steps()) + 3)
        last = self.shim_state(pid)["last"]
        self.assertEqual((last["adopted"], last["bytes"]), (0, DEVICE_BYTES), last)
        self.assert_goes_on()

    def test_leave_running_brings_the_memory_back_to_the_source(self):
        pid = self.start()
        self.checkpoint("vmm", "--leave-running")
        self.assertEqual(self.shim_state(pid)["state"], "running")
        self.assert_goes_on()

    # --- unchanged chunks ------------------------------------------------------
    def start_idle(self):
        """The worker with 130 MiB (chunks of 64, 64 and 2 MiB) and 64 MiB that
        stay zero, taking a step (which adds 1 to the first word of the 130
        MiB: its first chunk) only when asked: between two, its memory is as
        an idle server's."""
        pid = int(self.gs("run", "--gpushare", "--name", "vmm", "--", WORKER, "--mib", "130", "--zero-mib", "64",
                          "--full-every", "1", "--step-on-signal", "--device-file", self.device).stdout.strip())
        self.wait_steps(1)
        return pid

    def step(self, pid):
        at = len(self.steps())
        os.kill(pid, signal.SIGUSR1)
        self.wait_steps(at + 1)

    def checkpoint_copies(self, *extra):
        """A checkpoint of the worker: its id, the chunks its release copied off
        the device and those it found unchanged since they were stored."""
        out = self.gs_json("checkpoint", "vmm", *extra)
        t = out["timings_s"]
        self.assertIn("gpushare-fingerprint", t)
        return out["id"], int(t["gpushare-chunks-copied"]), int(t["gpushare-chunks-unchanged"])

    def test_unchanged_chunks_are_not_copied_and_a_changed_or_collected_one_is(self):
        pid = self.start_idle()
        snap1, copied, unchanged = self.checkpoint_copies("--leave-running")
        self.assertEqual((copied, unchanged), (4, 0))  # the first release has nothing recorded
        self.assertEqual(len(self.chunk_files()), 3)   # the zero chunk is no file
        # Nothing changed on the device: the release copies nothing.
        snap2, copied, unchanged = self.checkpoint_copies("--leave-running")
        self.assertEqual((copied, unchanged), (0, 4))
        self.assertEqual(len(self.chunk_files()), 3)
        with open(self.manifest(snap1), "rb") as a, open(self.manifest(snap2), "rb") as b:
            self.assertEqual(a.read(), b.read())
        # One step changes the first word of the first chunk, no other: that
        # chunk alone is copied and stored again.
        self.step(pid)
        snap3, copied, unchanged = self.checkpoint_copies("--leave-running")
        self.assertEqual((copied, unchanged), (1, 3))
        self.assertEqual(len(self.chunk_files()), 4)
        # Every chunk file collected: a chunk unchanged on the device but gone
        # from the store is stored again; the zero chunk stays as it was.
        for snap in (snap1, snap2, snap3):
            self.gs("rm", snap)
        self.assertEqual(self.chunk_files(), [])
        snap4, copied, unchanged = self.checkpoint_copies()
        self.assertEqual((copied, unchanged), (3, 1))
        self.assertEqual(len(self.chunk_files()), 3)
        # The restore has the changed word: the restored worker's next step
        # finds its counter at 2 in device memory (it checks every byte).
        restored = self.gs_json("restore", snap4)["pid"]
        self.step(restored)
        self.assertEqual(self.steps(), [1, 2, 3])

    def test_a_byte_changed_anywhere_in_a_chunk_is_found(self):
        # A byte written into the device memory behind the process's back, deep
        # inside the second chunk: the release finds that chunk changed.
        pid = self.start_idle()
        self.checkpoint_copies("--leave-running")
        base = self.shim_allocation(pid, 130 * MIB)
        at = base + 64 * MIB + 12345 * 8 + 5
        with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
            mem.seek(at)
            old = mem.read(1)
            mem.seek(at)
            mem.write(bytes([old[0] ^ 0x10]))
        _, copied, unchanged = self.checkpoint_copies("--leave-running")
        self.assertEqual((copied, unchanged), (1, 3))
        self.assertEqual(len(self.chunk_files()), 4)
        # Put back, the chunk differs from what the last release stored: it is
        # copied again, and its bytes are the first release's chunk, stored
        # already. The worker's own checks of every byte pass again.
        with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
            mem.seek(at)
            mem.write(old)
        _, copied, unchanged = self.checkpoint_copies("--leave-running")
        self.assertEqual((copied, unchanged), (1, 3))
        self.assertEqual(len(self.chunk_files()), 4)
        self.step(pid)
        self.assertEqual(self.steps(), [1, 2])

    def test_leave_running_keeps_the_memory_of_the_source(self):
        # By default gpusnap holds an fd of each allocation through the
        # release, and the source adopts its own memory after the dump
        # instead of loading it from the chunks.
        pid = self.start_idle()
        # GPUSNAP_GPUSHARE_KEEP=0: no hold, the source loads it all back from the chunks.
        loaded = self.gs_json("checkpoint", "vmm", "--leave-running", env=dict(self.env, GPUSNAP_GPUSHARE_KEEP="0"))
        self.assertNotIn("gpushare-hold", loaded["timings_s"])
        last = self.shim_state(pid)["last"]
        self.assertEqual((last.get("adopted", 0), last["bytes"]), (0, 194 * MIB), last)
        self.step(pid)
        self.assertEqual(self.steps(), [1, 2])
        self.gs("rm", loaded["id"])
        out = self.gs_json("checkpoint", "vmm", "--leave-running")
        self.assertIn("gpushare-hold", out["timings_s"])
        self.assertIn("gpushare-adopt", out["timings_s"])
        last = self.shim_state(pid)["last"]
        # Both allocations (130 and 64 MiB) adopted; the load filled nothing.
        self.assertEqual((last["adopted"], last["adopted_bytes"], last["bytes"]), (2, 194 * MIB, 0), last)
        # The worker checks every byte at its next step; a later release finds
        # the chunks it did not change unchanged.
        self.step(pid)
        _, copied, unchanged = self.checkpoint_copies("--leave-running")
        self.assertEqual((copied, unchanged), (1, 3))
        self.step(pid)
        self.assertEqual(self.steps(), [1, 2, 3, 4])
        # And the snapshot it took restores (the source ended first; the
        # fake keeps the driver's state in the device stand-in, which the
        # source left running).
        self.gs("kill", "vmm")
        end = time.time() + 10
        while self.alive(pid) and time.time() < end:
            time.sleep(0.05)
        self.set_device_state(2)
        restored = self.gs_json("restore", out["id"])["pid"]
        self.step(restored)
        self.assertEqual(self.steps(), [1, 2, 3, 4, 3])

    def shim_allocation(self, pid, size):
        """The address of the shim's allocation of `size` bytes in `pid`: the
        memfd the fake driver maps for it."""
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                span, rest = line.split(" ", 1)
                lo, hi = (int(x, 16) for x in span.split("-"))
                if "memfd:" in rest and hi - lo == size:
                    return lo
        self.fail(f"no mapping of {size} bytes in pid {pid}")

    def test_a_failed_release_fails_the_checkpoint_and_the_source_runs_on(self):
        pid = self.start()
        self.arm("cuMemcpyDtoHAsync_v2:*:2\n")
        p = self.gs("checkpoint", "vmm", check=False)
        self.arm("")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("releasing the device memory of the GPU processes", p.stderr)
        self.assertEqual(self.snapshots(), [])
        self.assertEqual(self.shim_state(pid)["state"], "running")
        self.assert_goes_on()

    def test_a_failure_at_each_gpushare_step_is_undone(self):
        # The undo of each story (tests/e2e/test_undo.py) through the shim: the
        # released memory comes back to the source; a restore that fails after
        # the load leaves no process, and the next one works.
        pid = self.start()
        for step in ("gpushare-release", "gpu-suspend", "post-dump"):
            with self.subTest(step=step):
                p = self.gs("checkpoint", "vmm", env=dict(self.env, GPUSNAP_TEST_FAIL_AT=step), check=False)
                self.assertEqual(p.returncode, 1, p.stdout)
                self.assertIn(f"injected failure at {step}", p.stderr)
                self.assertNotIn(" then ", p.stderr)
                self.assertEqual(self.snapshots(), [])
                self.assertEqual(self.shim_state(pid)["state"], "running")
                self.assert_goes_on()
        snap = self.checkpoint("vmm")
        for step in ("gpushare-load", "record"):
            with self.subTest(step=step):
                self.set_device_state(2)
                p = self.gs("restore", snap, env=dict(self.env, GPUSNAP_TEST_FAIL_AT=step), check=False)
                self.assertEqual(p.returncode, 1, p.stdout)
                self.assertIn(f"injected failure at {step}", p.stderr)
                end = time.time() + 5
                while self.workers() and time.time() < end:
                    time.sleep(0.1)
                self.assertEqual(self.workers(), [])
        # Loaded, the work stays held until the restore is recorded.
        self.set_device_state(2)
        at_dump = len(self.steps())
        proc, resume = self.paused(["restore", snap], "record", self.gpu_env)
        time.sleep(1)
        self.assertEqual(len(self.steps()), at_dump)
        open(resume, "w").close()
        _, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, err)
        self.assert_goes_on()

    def test_restore_refuses_a_missing_chunk_before_anything_starts(self):
        self.start()
        snap = self.checkpoint("vmm")
        os.unlink(self.chunk_files()[0])
        p = self.gs("restore", snap, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("refusing to restore", p.stderr)
        self.assertIn("chunks/", p.stderr)
        self.assertEqual([w for w in self.workloads() if w["running"]], [])

    def test_a_flipped_bit_in_a_chunk_fails_the_restore_and_nothing_runs(self):
        self.start()
        snap = self.checkpoint("vmm")
        chunk = self.chunk_files()[0]
        with open(chunk, "r+b") as f:
            f.seek(12345)
            b = f.read(1)
            f.seek(12345)
            f.write(bytes([b[0] ^ 1]))
        p = self.gs("restore", snap, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("does not match its digest", p.stderr)
        end = time.time() + 10
        while time.time() < end and [w for w in self.workloads() if w["running"]]:
            time.sleep(0.1)
        self.assertEqual([w for w in self.workloads() if w["running"]], [])

    # --- garbage collection of the chunk store --------------------------------
    def manifest(self, snap):
        return os.path.join(self.store, "snapshots", snap, "gpu", "2.chunks")

    def two_snapshots(self):
        """Two snapshots of the worker, a restore between them: 5 chunks, one
        named by both (the second piece of the 70 MiB buffer)."""
        self.start()
        snap1 = self.checkpoint("vmm")
        first = set(self.chunk_files())
        self.restore(snap1)
        self.wait_steps(len(self.steps()) + 3)
        snap2 = self.checkpoint("vmm")
        self.assertEqual(len(self.chunk_files()), 5)
        return snap1, snap2, first

    def test_rm_keeps_shared_chunks_and_the_last_rm_empties_the_chunk_store(self):
        snap1, snap2, first = self.two_snapshots()
        both = set(self.chunk_files())
        out = self.gs_json("rm", snap1)
        self.assertEqual((out["chunks_removed"], out["warnings"]), (2, []))
        left = set(self.chunk_files())
        self.assertEqual(len(left), 3)
        self.assertLessEqual(both - first, left)  # the second snapshot's own chunks
        self.assertEqual(len(left & first), 1)    # and the one it shares with the first
        before = len(self.steps())
        self.restore(snap2)
        self.wait_steps(before + 5)
        self.assert_steps_unbroken()
        self.assertEqual(self.gs_json("rm", snap2)["chunks_removed"], 3)
        self.assertEqual(os.listdir(os.path.join(self.store, "chunks")), [])
        self.assert_goes_on()  # the restored worker has its memory on the device

    def test_gc_dry_run_lists_orphans_and_gc_removes_them(self):
        self.start()
        snap = self.checkpoint("vmm")
        chunks = self.chunk_files()
        # Orphans as a crash leaves them: a snapshot gone without its chunks,
        # and the temporary of a chunk write interrupted two hours ago.
        shutil.rmtree(os.path.join(self.store, "snapshots", snap))
        tmp = chunks[0] + ".tmp-999-00000000deadbeef"
        with open(tmp, "wb") as f:
            f.write(b"x" * 1000)
        os.utime(tmp, (time.time() - 7200, time.time() - 7200))
        orphans = sorted(chunks + [tmp])
        out = self.gs_json("gc", "--dry-run")
        self.assertTrue(out["dry_run"])
        self.assertEqual(sorted(i["path"] for i in out["removed"]), orphans)
        self.assertEqual(out["removed_bytes"], 76 * MIB + 1000)  # 64 + 6 + 6 MiB of chunks
        self.assertEqual({i["reason"] for i in out["removed"]}, {"unreferenced", "stale temporary"})
        text = self.gs("gc", "--dry-run").stdout
        self.assertIn(f"would remove {tmp} (1000 B, stale temporary)", text)
        self.assertIn("would remove 4 file(s), 76.0 MiB", text)
        self.assertEqual(self.chunk_files(), orphans)  # nothing deleted
        self.assertEqual(len(self.gs_json("gc")["removed"]), 4)
        self.assertEqual(self.chunk_files(), [])

    def set_chunk_cache(self, value):
        with open(os.path.join(self.store, "config.json"), "w") as f:
            json.dump({"chunk_cache_bytes": value}, f)

    def test_gc_keep_unused_evicts_the_least_recently_used_orphans(self):
        # snap1, snap2 and snap3 share one chunk. snap1 is restored after snap2
        # is written, so its own chunks are used later than snap2's. Once both
        # are removed, a limit that keeps two of their four orphans keeps
        # snap1's, and snap3 still restores.
        # The store keeps what no snapshot names (up to 1 TiB): `rm` deletes none of it.
        os.makedirs(self.store, exist_ok=True)
        self.set_chunk_cache(1 << 40)
        # snap1 and snap2 share one chunk (the 70 MiB buffer's 6 MiB tail);
        # each has two of its own: 64 MiB and 6 MiB.
        snap1, snap2, first = self.two_snapshots()
        second = set(self.chunk_files()) - first
        mtimes = lambda paths: {p: os.stat(p).st_mtime_ns for p in paths}
        before = mtimes(first)
        # A restore of snap1, after snap2 was written, uses its chunks again:
        # snap1's are now the more recently used, though written first.
        self.restore(snap1)
        # Longer than two_snapshots waits, so that snap3's counters (and chunks) differ from snap2's.
        self.wait_steps(len(self.steps()) + 15)
        after = mtimes(first)
        self.assertTrue(all(after[p] > before[p] for p in first), (before, after))
        self.assertLess(max(mtimes(second).values()), min(after.values()))
        # snap3 also names the shared chunk.
        snap3 = self.checkpoint("vmm")
        self.assertEqual(len(self.chunk_files()), 7)
        for snap in (snap1, snap2):
            out = self.gs_json("rm", snap)
            self.assertEqual((out["chunks_removed"], out["warnings"]), (0, []))
        self.assertEqual(out["chunks_cached"], 4)
        self.assertEqual(out["chunk_bytes_cached"], 140 * MIB)
        self.assertEqual(len(self.chunk_files()), 7)
        # What no snapshot names now: snap1's two own chunks and snap2's.
        orphans = {i["path"] for i in self.gs_json("gc", "--dry-run", "--keep-unused", "0")["removed"]}
        self.assertEqual(len(orphans), 4)
        self.assertLessEqual(second, orphans)
        snap1_own = orphans - second
        self.assertEqual(len(first - snap1_own), 1)  # the shared chunk, which snap3 names
        # 70 MiB kept: snap2's chunks, the least recently used, go; snap1's stay.
        dry = self.gs_json("gc", "--dry-run", "--keep-unused", "70M")
        self.assertEqual(sorted(i["path"] for i in dry["removed"]), sorted(second))
        self.assertEqual({i["reason"] for i in dry["removed"]}, {"unreferenced, least recently used"})
        self.assertEqual((dry["removed_bytes"], dry["cached_chunks"], dry["cached_bytes"], dry["keep_unused_bytes"]),
                         (70 * MIB, 2, 70 * MIB, 70 * MIB))
        self.assertEqual(len(self.chunk_files()), 7)  # nothing deleted
        text = self.gs("gc", "--dry-run", "--keep-unused", "70M").stdout
        self.assertIn("would remove 2 file(s), 70.0 MiB", text)
        self.assertIn("would keep 2 unreferenced chunk(s), 70.0 MiB, within the limit of 70.0 MiB", text)
        out = self.gs_json("gc", "--keep-unused", "70M")
        self.assertEqual(sorted(i["path"] for i in out["removed"]), sorted(second))
        left = set(self.chunk_files())
        self.assertEqual(len(left), 5)
        self.assertFalse(second & left)
        self.assertLessEqual(first, left)
        # The remaining snapshot restores with all its chunks: the worker checks
        # all its memory at every step, and goes on from snap3's last step (the
        # log has repeated steps since snap1 was restored after snap2).
        logged = self.steps()
        self.restore(snap3)
        self.wait_steps(len(logged) + 5)
        resumed = self.steps()[len(logged):]
        self.assertEqual(resumed, list(range(logged[-1] + 1, logged[-1] + 1 + len(resumed))))
        # Without a limit (the store's set to 0), every orphan goes.
        self.set_chunk_cache(0)
        self.assertEqual(len(self.gs_json("gc")["removed"]), 2)
        self.assertEqual(len(self.chunk_files()), 3)
        self.wait_steps(len(self.steps()) + 5)  # and no MISMATCH

    def test_a_malformed_store_config_makes_rm_keep_the_chunks_and_gc_refuse(self):
        snap1, snap2, _ = self.two_snapshots()
        before = self.chunk_files()
        config = os.path.join(self.store, "config.json")
        self.set_chunk_cache("lots")
        p = self.gs("rm", snap1)
        self.assertIn("are not collected yet", p.stderr)
        self.assertIn(f"store settings `{config}`: member `chunk_cache_bytes` is \"lots\"", p.stderr)
        self.assertEqual(self.chunk_files(), before)
        p = self.gs("gc", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("garbage collection refused, nothing deleted", p.stderr)
        self.assertEqual(self.chunk_files(), before)
        # A limit given on the command line does not need the file.
        self.assertEqual(len(self.gs_json("gc", "--keep-unused", "0")["removed"]), 2)

    def test_a_corrupt_manifest_makes_gc_refuse_and_delete_nothing(self):
        snap1, snap2, _ = self.two_snapshots()
        before = self.chunk_files()
        with open(self.manifest(snap2), "r+b") as f:
            f.write(b"JUNK")
        # The removal itself goes through; the collection after it does not.
        p = self.gs("rm", snap1)
        self.assertIn("are not collected yet", p.stderr)
        self.assertIn(f"snapshot `{snap2}`: `{self.manifest(snap2)}` is not a chunk manifest", p.stderr)
        self.assertEqual([s["id"] for s in self.snapshots()], [snap2])
        self.assertEqual(self.chunk_files(), before)
        for args in (["gc"], ["gc", "--dry-run"]):
            p = self.gs(*args, check=False)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("garbage collection refused, nothing deleted", p.stderr)
            self.assertIn(self.manifest(snap2), p.stderr)
        self.assertEqual(self.chunk_files(), before)

    def test_gc_does_not_run_while_a_checkpoint_writes_chunks(self):
        self.start()
        # The checkpoint stops with its chunks written and its manifest not
        # yet published: it holds the chunk store lock shared.
        proc, _ = self.paused(["checkpoint", "vmm"], "post-dump", self.gpu_env)
        chunks = self.chunk_files()
        self.assertEqual(len(chunks), 3)
        p = self.gs("gc", "--wait-s", "1", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(f"the chunk store lock `{self.store}/chunks.lock` is held by a checkpoint", p.stderr)
        self.assertIn("waited 1000 ms", p.stderr)
        self.assertEqual(self.chunk_files(), chunks)
        # Once its writer is gone, the unfinished snapshot and its chunks are garbage.
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.assertEqual(len(self.gs_json("gc")["removed"]), 3)
        self.assertEqual(self.chunk_files(), [])
        self.assertEqual(self.tmp_dirs(), [])

    def test_gc_does_not_take_the_chunks_of_a_restore_still_loading(self):
        self.start()
        snap = self.checkpoint("vmm")
        chunks = self.chunk_files()
        # The restore stops before its load, holding the chunk store lock shared.
        proc, _ = self.paused(["restore", snap], "gpushare-load", self.gpu_env)
        # Its snapshot removed meanwhile: its chunks stay while it loads.
        self.gs("rm", snap, "--no-agent", check=False)
        p = self.gs("gc", "--wait-s", "1", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("a restore reading them", p.stderr)
        self.assertEqual(self.chunk_files(), chunks)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # The restorer died before the tree was whole: its reaper ends it.
        end = time.time() + 10
        while time.time() < end and self.workers():
            time.sleep(0.1)
        self.assertEqual(self.workers(), [])
        self.gs("gc")
        self.assertEqual(self.chunk_files(), [])

    def workers(self):
        """Live processes of this test's worker (named by its device file)."""
        out = subprocess.run(["pgrep", "-f", self.device], capture_output=True, text=True).stdout.split()
        return [p for p in out if self.alive(int(p))]


SCRATCH_WORKER = os.path.join(WORKLOADS, "scratch_worker")
KEEP_MIB, SCRATCH_MIB = 70, 130  # 64 + 6 MiB of chunks; 64 + 64 + 2 MiB marked scratch


class GpushareScratchFake(FakeGpuCase):
    """Memory the workload marks scratch (gpusnap/gpushare_scratch.h), as a
    server marks its KV-cache pool: released without a copy, no chunk of it
    stored, and back at the same address reading zero. scratch_worker checks
    both of its buffers in full every step and refills the scratch one when
    it finds it zeroed."""

    def setUp(self):
        super().setUp()
        require_built(self, (os.path.join(FAKE_DIR, "libcuda.so.1"), "fake_cuda"),
                      (SCRATCH_WORKER, "wl_scratch_worker"), (SHIM, "gpusnap_gpushare"))
        self.env = self.gpu_env
        self.output = os.path.join(self.run_dir, "logs", "scr.log")

    def text(self):
        with open(self.output) as f:
            text = f.read()
        self.assertNotRegex(text, r"MISMATCH|CUDA error|no gpusnap_gpushare", text[-2000:])
        return text

    def steps(self):
        return [int(m[1]) for m in re.finditer(r"^step (\d+) gen \d+$", self.text(), re.M)]

    def zeroed(self):
        """(address, gpusnap_gpushare_loads()) each time the worker found its scratch buffer zeroed."""
        return [(int(m[1], 16), int(m[2]))
                for m in re.finditer(r"^scratch zeroed at step \d+ 0x([0-9a-f]+) loads (\d+)$", self.text(), re.M)]

    def wait_for(self, what, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            if os.path.exists(self.output) and what():
                return
            time.sleep(0.05)
        self.fail(f"scratch_worker: {what.__doc__ or what}:\n{self.logs()}")

    def start(self):
        pid = int(self.gs("run", "--gpushare", "--name", "scr", "--", SCRATCH_WORKER, "--keep-mib", str(KEEP_MIB),
                          "--scratch-mib", str(SCRATCH_MIB), "--device-file", self.device).stdout.strip())
        self.wait_for(lambda: len(self.steps()) >= 3)
        m = re.search(r"^marked (-?\d+) keep 0x([0-9a-f]+) scratch 0x([0-9a-f]+)$", self.text(), re.M)
        self.assertIsNotNone(m, self.text())
        self.assertEqual(m[1], "0")
        self.scratch = int(m[3], 16)
        return pid

    def chunk_bytes(self):
        root = os.path.join(self.store, "chunks")
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)

    def assert_back_zeroed_and_working(self, times):
        """The scratch buffer came back `times` times in all, at its address and all zero; it works after."""
        self.wait_for(lambda: len(self.zeroed()) >= times)
        # Each time at its own address, and each time after one more load.
        self.assertEqual(self.zeroed(), [(self.scratch, n + 1) for n in range(times)])
        at = len(self.steps())
        # The worker wrote a new generation into it and reads it back every step.
        self.wait_for(lambda: len(self.steps()) >= at + 5)
        self.assertEqual(len(self.zeroed()), times)
        self.assertRegex(self.text(), rf"step \d+ gen {times}\n")

    def test_bad_marks_fail_with_their_errno(self):
        self.start()
        m = re.search(r"^bad-mark small (-?\d+) bogus (-?\d+) empty (-?\d+)$", self.text(), re.M)
        self.assertIsNotNone(m, self.text())
        # 1 MiB stays with the driver and an address of nothing is nobody's: ENOENT; 0 bytes: EINVAL.
        self.assertEqual([int(m[i]) for i in (1, 2, 3)], [errno.ENOENT, errno.ENOENT, errno.EINVAL])

    def test_checkpoint_stores_no_chunk_of_scratch_and_restore_gives_it_back_zeroed(self):
        pid = self.start()
        st = self.gs_json("gpushare", "state", str(pid))["pids"][0]
        self.assertEqual((st["bytes"], st["scratch_bytes"]), ((KEEP_MIB + SCRATCH_MIB) * MIB, SCRATCH_MIB * MIB))
        snap = self.checkpoint("scr")
        # Only the kept buffer is in the store: its two chunks, 70 MiB.
        self.assertEqual(self.chunk_bytes(), KEEP_MIB * MIB)
        manifest = os.path.join(self.store, "snapshots", snap, "gpu", "2.chunks")
        with open(manifest, "rb") as f:
            self.assertEqual(f.read(8), b"GPCK\x03\x00\x00\x00")  # version 3: it has scratch chunks
        restored = json.loads(self.gs("--json", "restore", snap).stdout)
        self.assert_back_zeroed_and_working(1)
        # gpusnap made and zeroed the scratch memory beside CRIU, the process adopted it.
        last = self.gs_json("gpushare", "state", str(restored["pid"]))["pids"][0]["last"]
        self.assertEqual(last["adopted_bytes"], (KEEP_MIB + SCRATCH_MIB) * MIB, last)
        # The mark holds in the restored process: a second cycle stores nothing more
        # of the scratch buffer (the kept one has not changed: no new chunk at all).
        snap2 = self.checkpoint("scr")
        self.assertEqual(self.chunk_bytes(), KEEP_MIB * MIB)
        # Without the preload the process zeroes it itself.
        self.gs("restore", snap2, env=dict(self.env, GPUSNAP_GPUSHARE_PRELOAD="0"))
        self.assert_back_zeroed_and_working(2)
        # The collection counts no chunk for scratch entries: removing both snapshots empties the store.
        self.gs("rm", snap)
        self.assertEqual(self.chunk_bytes(), KEEP_MIB * MIB)
        self.gs("rm", snap2)
        self.assertEqual(self.chunk_bytes(), 0)

    def test_suspend_and_resume_in_place_zero_the_scratch_memory(self):
        pid = self.start()
        st = self.gs_json("gpushare", "suspend", str(pid))["pids"][0]
        self.assertEqual(st["released_bytes"], (KEEP_MIB + SCRATCH_MIB) * MIB)
        self.assertEqual((st["last"]["chunks_scratch"], st["last"]["scratch_bytes"]), (3, SCRATCH_MIB * MIB))
        self.assertEqual(self.chunk_bytes(), KEEP_MIB * MIB)
        self.gs_json("gpushare", "resume", str(pid))
        self.assert_back_zeroed_and_working(1)

    def test_leave_running_zeroes_the_source_scratch_memory_too(self):
        self.start()
        self.checkpoint("scr", "--leave-running")
        self.assert_back_zeroed_and_working(1)
        self.assertEqual(self.chunk_bytes(), KEEP_MIB * MIB)


if __name__ == "__main__":
    unittest.main()
