"""Standby restores and their wake (docs/STANDBY.md) on real CRIU with the
fake libcuda: `gpusnap restore --standby` restores all but the GPU and
leaves every task stopped; `gpusnap wake` checks the snapshot, its chunks,
the GPUs and their free memory before it touches anything, then takes the
GPU step and lets the tree go. A refusal leaves the standby wakeable."""
import json
import os
import shutil
import subprocess
import time
import unittest

import test_agent
from harness import GPUSNAP, FakeGpuCase, WorkerSteps, require_built, task_states

# The gpushare worker and its shape, as test_gpushare_fake.py runs it: 70, 6
# (5 rounded up) and 64 MiB through the shim (in the manifest), 1 MiB left to
# the driver (not in it).
from test_gpushare_fake import FAKE_DIR, MIB, SHIM, WORKER, WORKER_ARGS  # noqa: E402
from test_gpushare_fake import DEVICE_BYTES as MANIFEST_BYTES  # noqa: E402


class StandbyCase(WorkerSteps, FakeGpuCase):
    def setUp(self):
        super().setUp()
        require_built(self, (os.path.join(FAKE_DIR, "libcuda.so.1"), "fake_cuda"), (WORKER, "wl_vmm_worker"),
                      (SHIM, "gpusnap_gpushare"))
        # The worker loads the fake too (it is the process the driver serves).
        self.env = dict(self.gpu_env)
        self.output = os.path.join(self.run_dir, "logs", "vmm.log")

    def start_worker(self):
        pid = int(self.gs("run", "--gpushare", "--name", "vmm", "--", WORKER, *WORKER_ARGS, "--device-file",
                          self.device).stdout.strip())
        self.wait_steps(3)
        return pid

    def worker_snapshot(self):
        """A snapshot of the worker, which the checkpoint ends; the steps it had logged."""
        pid = self.start_worker()
        snap = self.checkpoint("vmm")
        self.assertTrue(self.wait_gone(pid))
        return snap, len(self.steps())

    def standby(self, snap, name, env=None):
        p = self.gs("--json", "restore", snap, "--standby", "--name", name, env=env)
        return json.loads(p.stdout)

    def wake(self, name, *extra, env=None, check=True):
        return self.gs("--json", "wake", name, *extra, env=env, check=check)

    def state(self, name):
        return {w["name"]: w["state"] for w in self.workloads()}.get(name)

    def shim_state(self, pid):
        return self.gs_json("gpushare", "state", str(pid))["pids"][0]

    def chunk_files(self):
        root = os.path.join(self.store, "chunks")
        return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)

    def assert_waits(self, pid, steps):
        """The standby's tree is there, every task stopped, and the worker ran no step."""
        self.assertTrue(self.alive(pid))
        self.assertEqual(set(task_states(pid).values()), {"T"}, task_states(pid))
        time.sleep(0.5)
        self.assertEqual(len(self.steps()), steps)
        # No device memory of the shim is mapped: it went to the chunk store at the dump.
        with open(f"/proc/{pid}/maps") as f:
            self.assertNotIn("memfd:", f.read())
        self.assertEqual(self.device_state(), 2)  # the driver's state: CHECKPOINTED


class Standby(StandbyCase):
    def test_standby_holds_no_gpu_and_wake_brings_the_worker_back_with_its_memory(self):
        snap, steps = self.worker_snapshot()
        restored = self.standby(snap, "sb")
        pid = restored["pid"]
        self.assertEqual((restored["state"], restored["standby"]), ("standby", True))
        # No GPU step, no preload: the driver was never asked for anything.
        self.assertNotIn("gpu-restore", restored["timings_s"])
        self.assertNotIn("gpushare-preload", restored["timings_s"])
        self.assert_waits(pid, steps)
        [w] = [w for w in self.workloads() if w["name"] == "sb"]
        self.assertEqual((w["state"], w["restored_from"]), ("standby", snap))
        self.assertRegex(self.gs("ps").stdout, r"(?m)^sb\s+%d\s+standby\s" % pid)

        woken = json.loads(self.wake("sb").stdout)
        self.assert_runs(pid)
        self.assertEqual((woken["pid"], woken["state"], woken["standby"]), (pid, "running", False))
        for phase in ("check", "gpu-restore", "gpushare-preload", "gpushare-adopt", "gpushare-load",
                      "gpushare-resume", "total"):
            self.assertIn(phase, woken["timings_s"])
        self.assertEqual(self.state("sb"), "running")
        # The worker goes on from its last step, checking every byte of its device memory at each.
        self.wait_steps(steps + 5)
        self.assert_steps_unbroken()
        last = self.shim_state(pid)["last"]
        self.assertEqual((last["adopted"], last["adopted_bytes"]), (3, MANIFEST_BYTES), last)
        # A woken standby is a workload as any: checkpointed and restored again.
        self.checkpoint("sb")
        self.assertTrue(self.wait_gone(pid))

    def test_a_wake_short_of_device_memory_is_refused_and_the_standby_waits_on(self):
        snap, steps = self.worker_snapshot()
        pid = self.standby(snap, "sb")["pid"]
        p = self.wake("sb", env=dict(self.env, FAKE_CUDA_MEM_BYTES=str(100 * MIB)), check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("refusing to wake `sb`: GPU 0 has 100.0 MiB free; the wake needs 140.0 MiB of device memory",
                      p.stderr)
        self.assertNotIn("torn down", p.stderr)
        self.assertEqual(self.state("sb"), "standby")
        self.assert_waits(pid, steps)
        # Still wakeable, where the memory is.
        self.wake("sb")
        self.wait_steps(steps + 5)
        self.assert_steps_unbroken()

    def test_a_wake_after_the_snapshot_was_removed_is_refused_naming_it(self):
        snap, steps = self.worker_snapshot()
        pid = self.standby(snap, "sb")["pid"]
        self.gs("rm", snap)
        p = self.wake("sb", check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(f"refusing to wake `sb`: its snapshot `{snap}` is no longer in the store `{self.store}`",
                      p.stderr)
        self.assertEqual(self.state("sb"), "standby")
        self.assert_waits(pid, steps)
        # And it can be ended.
        self.assertEqual(self.gs("kill", "sb").stdout.strip(), "sb")
        self.assertTrue(self.wait_gone(pid))
        self.assertEqual(self.state("sb"), "exited")
        p = self.wake("sb", check=False)
        self.assertIn("workload `sb` has exited: there is no standby to wake", p.stderr)

    def test_a_wake_with_a_chunk_missing_is_refused_naming_it(self):
        snap, steps = self.worker_snapshot()
        pid = self.standby(snap, "sb")["pid"]
        chunk = self.chunk_files()[0]
        kept = os.path.join(self.tmp, "kept-chunk")
        shutil.move(chunk, kept)
        p = self.wake("sb", check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(f"refusing to wake `sb`: chunk `{chunk}`", p.stderr)
        self.assertIn("No such file or directory", p.stderr)
        self.assertEqual(self.state("sb"), "standby")
        self.assert_waits(pid, steps)
        shutil.move(kept, chunk)
        self.wake("sb")
        self.wait_steps(steps + 5)
        self.assert_steps_unbroken()

    def test_a_failure_after_the_gpu_is_touched_ends_the_standby_and_says_so(self):
        snap, steps = self.worker_snapshot()
        for step in ("gpu-restore", "gpushare-load", "wake-record"):
            with self.subTest(step=step):
                self.set_device_state(2)
                pid = self.standby(snap, "sb")["pid"]
                p = self.wake("sb", env=dict(self.env, GPUSNAP_TEST_FAIL_AT=step), check=False)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn(f"injected failure at {step}; the standby was torn down and its record removed",
                              p.stderr)
                self.assertNotIn(" then ", p.stderr)
                self.assertTrue(self.wait_gone(pid))
                self.assertIsNone(self.state("sb"))
        # Before the GPU is touched, an injected failure is a refusal like any.
        self.set_device_state(2)
        pid = self.standby(snap, "sb")["pid"]
        p = self.wake("sb", env=dict(self.env, GPUSNAP_TEST_FAIL_AT="wake-check"), check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertNotIn("torn down", p.stderr)
        self.assert_waits(pid, steps)
        self.wake("sb")
        self.wait_steps(steps + 5)

    def test_refusals_of_standby_and_wake(self):
        snap, _ = self.worker_snapshot()
        for args, needle in (
                (["--gpus", "0"], "a standby's GPUs are chosen when it is woken: give --gpu-map or --gpus to "
                                  "`gpusnap wake`"),
                (["--gpu-map", "0=0"], "a standby's GPUs are chosen when it is woken")):
            p = self.gs("restore", snap, "--standby", *args, check=False)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn(needle, p.stderr)
        self.assertEqual([w for w in self.workloads() if w["running"]], [])
        # Waking what is no standby.
        p = self.wake("nope", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("no workload named `nope`", p.stderr)
        self.restore(snap, "--name", "live")
        p = self.wake("live", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("workload `live` is running, not a standby", p.stderr)
        self.assertEqual(self.state("live"), "running")
        # Usage errors: one line, exit 2.
        for args, needle in ((["wake"], "name"), (["wake", "x", "--gpus", "0", "--gpu-map", "0=0"], "--gpu")):
            p = self.gs(*args, check=False)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
            self.assertIn(needle, p.stderr)
        for args in (["wake", "--help"], ["restore", "--help"]):
            out = self.gs(*args).stdout
            self.assertIn("--standby" if args[0] == "restore" else "--gpu-map", out)


class PlainDriverStandby(FakeGpuCase):
    """A GPU process without gpushare: the driver's own checkpoint."""

    def test_the_counter_does_not_count_while_standby_and_counts_on_after_wake(self):
        pid = self.run_gpu_counter("gpu")
        snap = self.gs("checkpoint", "-q", "gpu", env=self.gpu_env).stdout.strip().splitlines()[-1]
        self.assertTrue(self.wait_gone(pid))
        restored = json.loads(self.gs("--json", "restore", snap, "--standby", env=self.gpu_env).stdout)
        new = restored["pid"]
        at_dump = self.count(new)
        self.assertGreaterEqual(at_dump, 3)
        time.sleep(0.6)
        self.assertEqual(self.count(new), at_dump)
        self.assertEqual(set(task_states(new).values()), {"T"})
        self.assertEqual(self.device_state(), 2)
        with open(self.log) as f:
            self.assertNotIn(f"pid={new} ", f.read())  # the driver was not asked about it
        self.assertEqual({w["name"]: w["state"] for w in self.workloads()}, {"gpu": "standby"})
        woken = json.loads(self.gs("--json", "wake", "gpu", env=self.gpu_env).stdout)
        self.assert_runs(new)
        self.assertIn("gpu-restore", woken["timings_s"])
        self.assertNotIn("gpushare-load", woken["timings_s"])
        self.wait_count(new, at_dump + 10)
        self.assertEqual(self.device_state(), 0)
        self.assertEqual({w["name"]: w["state"] for w in self.workloads()}, {"gpu": "running"})

    def test_two_standbys_of_one_snapshot_are_woken_one_after_the_other(self):
        pid = self.run_gpu_counter("gpu")
        snap = self.gs("checkpoint", "-q", "gpu", env=self.gpu_env).stdout.strip().splitlines()[-1]
        self.assertTrue(self.wait_gone(pid))
        a = json.loads(self.gs("--json", "restore", snap, "--standby", "--name", "a", env=self.gpu_env).stdout)["pid"]
        b = json.loads(self.gs("--json", "restore", snap, "--standby", "--name", "b", env=self.gpu_env).stdout)["pid"]
        at_dump = self.count(a)
        self.assertEqual(self.count(b), at_dump)
        states = lambda: {w["name"]: w["state"] for w in self.workloads()}
        self.assertEqual(states(), {"a": "standby", "b": "standby", "gpu": "exited"})
        self.gs("wake", "a", env=self.gpu_env)
        self.assert_runs(a)
        self.wait_count(a, at_dump + 10)
        self.assertEqual(self.count(b), at_dump)
        self.assertEqual(set(task_states(b).values()), {"T"})
        self.assertEqual(states(), {"a": "running", "b": "standby", "gpu": "exited"})
        # The fake keeps the driver's state in the device stand-in both map:
        # b's is CHECKPOINTED again, as b's own would be on a real driver.
        self.set_device_state(2)
        self.gs("wake", "b", env=self.gpu_env)
        self.wait_count(b, at_dump + 10)
        self.assertEqual(states(), {"a": "running", "b": "running", "gpu": "exited"})
        self.assertTrue(self.alive(a))
        self.assert_no_fail_in_logs()

    def test_a_wake_whose_tree_stays_stopped_fails_and_ends_the_standby(self):
        pid = self.run_gpu_counter("gpu")
        snap = self.gs("checkpoint", "-q", "gpu", env=self.gpu_env).stdout.strip().splitlines()[-1]
        self.assertTrue(self.wait_gone(pid))
        new = json.loads(self.gs("--json", "restore", snap, "--standby", env=self.gpu_env).stdout)["pid"]
        p = self.gs("wake", "gpu", env=dict(self.gpu_env, GPUSNAP_TEST_STOP_AFTER_LET_GO="1"), check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, rf"wake of `gpu` failed: the restored tree does not run: pid {new} \(stopped\)")
        self.assertIn("after it was let go; the standby was torn down and its record removed", p.stderr)
        self.assertTrue(self.wait_gone(new))
        self.assertEqual([w for w in self.workloads() if w["running"]], [])

    def test_a_cpu_only_snapshot_is_refused_as_a_standby(self):
        self.run_counter("cpu")
        snap = self.checkpoint("cpu")
        p = self.gs("restore", snap, "--standby", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(f"snapshot `{snap}` holds no GPU state: a standby would have nothing to wake onto", p.stderr)
        self.assertEqual([w for w in self.workloads() if w["running"]], [])


class AgentStandby(StandbyCase, test_agent.AgentCase):
    def test_standby_and_wake_through_the_agent(self):
        agent = self.start_agent(env=self.env)
        snap, steps = self.worker_snapshot()
        status, reply = agent.request("POST", "/v1/restores", {"snapshot": snap, "name": "sb", "standby": True})
        self.assertEqual(status, 202, reply)
        job = self.wait_job(agent, reply["job"])
        self.assertEqual(job["state"], "succeeded", job)
        pid = job["restoredPid"]
        self.assertEqual(self.state("sb"), "standby")
        self.assert_waits(pid, steps)
        _, metrics = agent.request("GET", "/metrics")
        self.assertIn("gpusnap_standby_workloads 1\n", metrics)
        # Without --pinned-cache: no tier, nothing pinned, no warm.
        self.assertNotIn("gpusnap_agent_pinned_tier", metrics)
        self.assertNotIn("pin", job["timings"])
        status, reply = agent.request("POST", f"/v1/snapshots/{snap}/warm")
        self.assertEqual(status, 409, reply)
        self.assertIn("--pinned-cache", reply["error"])
        # Refusals: no such workload, a bad body, the restore of a standby into a GPU map.
        status, reply = agent.request("POST", "/v1/workloads/nope/wake", {})
        self.assertEqual(status, 404, reply)
        status, reply = agent.request("POST", "/v1/workloads/sb/wake", {"gpus": [0], "gpuMap": {"0": "0"}})
        self.assertEqual(status, 400, reply)
        status, reply = agent.request("POST", "/v1/restores", {"snapshot": snap, "standby": True, "gpuMap": {"0": "0"}})
        self.assertEqual(status, 400, reply)
        self.assertIn("a standby's GPUs are chosen when it is woken", reply["error"])

        status, reply = agent.request("POST", "/v1/workloads/sb/wake", {"gpus": [0]})
        self.assertEqual(status, 202, reply)
        job = self.wait_job(agent, reply["job"])
        self.assert_runs(pid)
        self.assertEqual((job["state"], job["kind"], job["restoredPid"], job["restoredName"], job["snapshot"]),
                         ("succeeded", "wake", pid, "sb", snap), job)
        # Every phase of the wake, its preload's too (not only those its progress named).
        for phase in ("check", "gpu-restore", "gpushare-load", "gpushare-preload", "gpushare-preload-fill", "total"):
            self.assertIn(phase, job["timings"])
        self.wait_steps(steps + 5)
        self.assert_steps_unbroken()
        self.assertEqual(self.state("sb"), "running")
        status, reply = agent.request("POST", "/v1/workloads/sb/wake", {})
        self.assertEqual(status, 409, reply)
        self.assertIn("is running, not a standby", reply["error"])
        _, metrics = agent.request("GET", "/metrics")
        self.assertIn("gpusnap_standby_workloads 0\n", metrics)
        self.assertIn('gpusnap_operations_total{kind="wake",result="succeeded"} 1\n', metrics)
        self.assertIn('gpusnap_operation_duration_seconds_count{kind="wake",phase="total"} 1\n', metrics)

    def test_the_cli_restores_a_standby_and_wakes_it_through_the_agent(self):
        agent = self.start_agent(env=self.env)
        env = dict(self.env, GPUSNAP_AGENT_SOCKET=agent.socket)
        snap, steps = self.worker_snapshot()
        restored = self.standby(snap, "sb", env=env)
        self.assertIn("job", restored)
        self.assertEqual(self.state("sb"), "standby")
        woken = json.loads(self.wake("sb", env=env).stdout)
        self.assertIn("job", woken)
        self.assertEqual((woken["pid"], woken["state"]), (restored["pid"], "running"))
        kinds = [j["kind"] for j in agent.request("GET", "/v1/jobs")[1]]
        self.assertEqual(kinds[:2], ["wake", "restore"])
        self.wait_steps(steps + 5)
        self.assert_steps_unbroken()



def metric(text, name):
    """The value of the sample `name` (with its labels) in a scrape; None if absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[-1]))
    return None


class AgentPinnedTier(StandbyCase, test_agent.AgentCase):
    """The agent's pinned chunk tier (docs/GPUSHARE.md, "The pinned tier"):
    the standby's chunks pinned when the agent makes it, a snapshot's on
    `gpusnap warm`, and a wake by the agent filled from it first."""

    def stored_chunks(self):
        """The snapshot's stored chunks (the worker's zero 64 MiB are not): their count and bytes."""
        files = self.chunk_files()
        return len(files), sum(os.path.getsize(f) for f in files)

    def tier(self, agent):
        _, text = agent.request("GET", "/metrics")
        names = {"capacity": 'gpusnap_agent_pinned_tier_bytes{kind="capacity"}',
                 "used": 'gpusnap_agent_pinned_tier_bytes{kind="used"}',
                 "chunks": "gpusnap_agent_pinned_tier_chunks", "hits": "gpusnap_agent_pinned_tier_hits_total",
                 "misses": "gpusnap_agent_pinned_tier_misses_total",
                 "evictions": "gpusnap_agent_pinned_tier_evictions_total"}
        return {k: metric(text, n) for k, n in names.items()}

    def standby_via(self, agent, snap, name):
        status, reply = agent.request("POST", "/v1/restores", {"snapshot": snap, "name": name, "standby": True})
        self.assertEqual(status, 202, reply)
        job = self.wait_job(agent, reply["job"])
        self.assertEqual(job["state"], "succeeded", job)
        return job

    def wake_via(self, agent, name):
        status, reply = agent.request("POST", f"/v1/workloads/{name}/wake", {"gpus": [0]})
        self.assertEqual(status, 202, reply)
        job = self.wait_job(agent, reply["job"])
        self.assertEqual(job["state"], "succeeded", job)
        return job

    def assert_woken_whole(self, pid, steps):
        """The worker goes on, checking every byte of its device memory at each step."""
        self.assert_runs(pid)
        self.wait_steps(steps + 5)
        self.assert_steps_unbroken()
        last = self.shim_state(pid)["last"]
        self.assertEqual((last["adopted"], last["adopted_bytes"]), (3, MANIFEST_BYTES), last)

    def test_a_tier_smaller_than_the_snapshot_still_wakes_it_partly_from_the_store(self):
        slot = 64 * MIB
        agent = self.start_agent("--pinned-cache", "128MiB", env=self.env)
        snap, steps = self.worker_snapshot()
        stored, _ = self.stored_chunks()
        self.assertGreaterEqual(stored, 3)  # more chunks than the tier's two slots
        self.assertEqual(self.tier(agent), {"capacity": 2 * slot, "used": 0, "chunks": 0, "hits": 0, "misses": 0,
                                            "evictions": 0})
        job = self.standby_via(agent, snap, "sb")
        self.assertIn("pin", job["timings"])
        # As many as fit: the admission never evicts what it pinned itself.
        self.assertEqual(self.tier(agent), {"capacity": 2 * slot, "used": 2 * slot, "chunks": 2, "hits": 0,
                                            "misses": 0, "evictions": 0})
        self.assertIn(f"{stored - 2} left out (the tier is full)", agent.log())
        pid = job["restoredPid"]
        self.assert_waits(pid, steps)

        self.wake_via(agent, "sb")
        self.assert_woken_whole(pid, steps)
        t = self.tier(agent)
        self.assertEqual((t["hits"], t["misses"]), (2, stored - 2), t)
        # What the wake read from the store is kept as recently used: it takes
        # the slots of the chunks the wake used before it, least recent first.
        end = time.time() + 20
        while self.tier(agent)["evictions"] != stored - 2 and time.time() < end:
            time.sleep(0.1)
        t = self.tier(agent)
        self.assertEqual((t["chunks"], t["used"], t["evictions"]), (2, 2 * slot, stored - 2), t)

    def test_two_standbys_of_one_snapshot_pin_it_once(self):
        agent = self.start_agent("--pinned-cache", "1GiB", env=self.env)
        snap, steps = self.worker_snapshot()
        stored, _ = self.stored_chunks()
        pid = self.standby_via(agent, snap, "sb1")["restoredPid"]
        self.assertEqual(self.tier(agent)["chunks"], stored)
        # The worker's control socket has one name: the second standby comes once the first is gone.
        self.gs("kill", "sb1")
        self.assertTrue(self.wait_gone(pid))
        self.standby_via(agent, snap, "sb2")
        t = self.tier(agent)
        self.assertEqual((t["chunks"], t["used"], t["evictions"]), (stored, stored * 64 * MIB, 0), t)
        self.assertIn(f"pinned 0 chunks of `{snap}` (0 B), {stored} there already", agent.log())

    def test_warm_pins_a_snapshot_a_later_wake_copies_it_and_the_driver_is_loaded_once(self):
        agent = self.start_agent("--pinned-cache", "1GiB", env=self.env)
        env = dict(self.env, GPUSNAP_AGENT_SOCKET=agent.socket)
        snap, steps = self.worker_snapshot()
        stored, stored_bytes = self.stored_chunks()
        # A standby made in this process: the agent pins nothing of it.
        pid = self.standby(snap, "sb")["pid"]  # self.env names a socket no agent listens on
        self.assertEqual(self.tier(agent)["chunks"], 0)
        # Refusals: no such snapshot, a malformed id.
        status, reply = agent.request("POST", "/v1/snapshots/nope/warm")
        self.assertEqual(status, 404, reply)
        status, reply = agent.request("POST", "/v1/snapshots/bad~id/warm")
        self.assertEqual(status, 400, reply)

        warmed = json.loads(self.gs("--json", "warm", snap, env=env).stdout)
        self.assertEqual((warmed["snapshot"], warmed["pinned_bytes"], warmed["chunk_bytes"]),
                         (snap, stored_bytes, stored_bytes), warmed)
        job = agent.request("GET", f"/v1/jobs/{warmed['job']}")[1]
        self.assertEqual((job["kind"], job["state"], job["bytesDone"]), ("warm", "succeeded", stored_bytes), job)
        self.assertEqual(self.tier(agent)["chunks"], stored)

        # A second warm job finds every chunk there already.
        again = json.loads(self.gs("--json", "warm", snap, env=env).stdout)
        self.assertEqual(again["pinned_bytes"], stored_bytes, again)
        self.assertIn(f"pinned 0 chunks of `{snap}` (0 B), {stored} there already", agent.log())
        self.wake_via(agent, "sb")
        self.assert_woken_whole(pid, steps)
        t = self.tier(agent)
        self.assertEqual((t["hits"], t["misses"], t["chunks"]), (stored, 0, stored), t)

        # A second GPU job: the woken worker checkpointed through the agent.
        job = self.wait_job(agent, self.checkpoint_via(agent, {"pid": pid}))
        self.assertEqual(job["state"], "succeeded", job)
        self.assertTrue(self.wait_gone(pid))
        # Four jobs (two warms, a wake, a checkpoint), one cuInit in the agent: at its start.
        with open(self.log) as f:
            inits = [line for line in f if " fn=cuInit " in line and f" self={agent.proc.pid}" in line]
        self.assertEqual(len(inits), 1, inits)
        self.assertIn(" count=1 ", inits[0] + " ")

    def test_a_pinned_cache_smaller_than_a_chunk_is_refused(self):
        p = self.gs("agent", "--socket", os.path.join(self.tmp, "refused.sock"), "--pinned-cache", "1M", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--pinned-cache 1M holds not one chunk", p.stderr)
        p = self.gs("agent", "--socket", os.path.join(self.tmp, "refused.sock"), "--pinned-cache", "lots", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("lots", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "refused.sock")))


if __name__ == "__main__":
    unittest.main()
