"""Suspend, resume and swap in place through the agent (docs/GPUSHARE.md,
docs/AGENT.md), and the agent's speed options. Two vmm_workers under the real
shim against the fake libcuda stand for two models sharing one GPU: each
checks every byte of its device memory at every step, so a step logged after
a resume proves its memory came back whole. The agent is SIGKILLed at
chosen steps of a swap; the restarted agent must leave each workload running
or suspended, never between."""
import json
import os
import time
import unittest

import test_agent
from harness import FakeGpuCase, WorkerSteps, require_built
from test_standby import metric
from test_gpushare_fake import FAKE_DIR, SHIM, WORKER, WORKER_ARGS

# Workload b's memory differs in shape from a's (40 and 3 MiB, 32 MiB zero),
# so no chunk of one is a chunk of the other.
WORKER_B_ARGS = ["--mib", "40,3,1", "--zero-mib", "32", "--interval-ms", "20", "--full-every", "1"]


class InPlaceCase(WorkerSteps, test_agent.AgentCase, FakeGpuCase):
    def setUp(self):
        super().setUp()
        require_built(self, (os.path.join(FAKE_DIR, "libcuda.so.1"), "fake_cuda"), (WORKER, "wl_vmm_worker"),
                      (SHIM, "gpusnap_gpushare"))
        self.env = dict(self.gpu_env)  # the workers and the agent load the fake
        self.pids = {}

    def start_workers(self):
        for name, args in (("a", WORKER_ARGS), ("b", WORKER_B_ARGS)):
            self.pids[name] = int(self.gs("run", "--gpushare", "--name", name, "--", WORKER, *args, "--device-file",
                                          self.device).stdout.strip())
            self.watch(name)
            self.wait_steps(3)

    def watch(self, name):
        """The worker whose steps steps() and wait_steps() read."""
        self.output = os.path.join(self.run_dir, "logs", f"{name}.log")

    def job(self, agent, method, path, body=None):
        status, reply = agent.request(method, path, body)
        self.assertEqual(status, 202, reply)
        return self.wait_job(agent, reply["job"])

    def workload_states(self, agent):
        status, workloads = agent.request("GET", "/v1/workloads")
        self.assertEqual(status, 200, workloads)
        return {w["name"]: w["state"] for w in workloads}

    def shim(self, name):
        return self.gs_json("gpushare", "state", name)["pids"][0]

    def assert_running(self, name):
        """Its shim runs and its steps go on, each one checking all of its memory."""
        self.assertEqual(self.shim(name)["state"], "running")
        self.watch(name)
        self.wait_steps(len(self.steps()) + 5)
        self.assert_steps_unbroken()

    def assert_suspended(self, name):
        """Its process lives, all its device memory released, and it does no step."""
        st = self.shim(name)
        self.assertEqual(st["state"], "released", st)
        self.assertEqual(st["released_bytes"], st["bytes"], st)
        self.assertTrue(self.alive(self.pids[name]))
        self.watch(name)
        before = len(self.steps())
        time.sleep(0.3)
        self.assertLessEqual(len(self.steps()), before + 1)
        with open(f"/proc/{self.pids[name]}/maps") as f:
            self.assertNotIn("memfd:", f.read())  # the fake's device memory


class InPlaceThroughTheAgent(InPlaceCase):
    def test_suspend_then_swap_there_and_back_each_resumed_workload_going_on_with_its_memory(self):
        agent = self.start_agent(env=self.env)
        self.start_workers()
        job = self.job(agent, "POST", "/v1/workloads/b/suspend")
        self.assertEqual((job["state"], job["kind"], job["workloads"]), ("succeeded", "suspend", ["b"]), job)
        self.assertEqual(self.workload_states(agent), {"a": "running", "b": "suspended"})
        self.assert_suspended("b")
        status, reply = agent.request("POST", "/v1/workloads/b/suspend")
        self.assertEqual(status, 409, reply)
        self.assertIn("workload `b` is suspended already", reply["error"])

        for out, inn in (("a", "b"), ("b", "a")):
            job = self.job(agent, "POST", "/v1/workloads/swap", {"suspend": out, "resume": inn})
            self.assertEqual((job["state"], job["kind"], job["workloads"], job["restoredName"]),
                             ("succeeded", "swap", [out, inn], inn), job)
            for phase in ("suspend", "resume", "resume.resume-preload", "resume.gpushare-load", "total"):
                self.assertIn(phase, job["timings"])
            self.assertEqual(self.workload_states(agent), {out: "suspended", inn: "running"})
            self.assert_suspended(out)
            self.assert_running(inn)
            # The memory came through the preload: made and filled by the agent, adopted whole.
            last = self.shim(inn)["last"]
            self.assertEqual(last["adopted_bytes"], self.shim(inn)["bytes"], last)
        ps = {w["name"]: (w["state"], w["suspended"]) for w in self.gs_json("ps")}
        self.assertEqual(ps, {"a": ("running", False), "b": ("suspended", True)})
        kinds = [j["kind"] for j in agent.request("GET", "/v1/jobs")[1]]
        self.assertEqual(sorted(kinds), ["suspend", "swap", "swap"])

    def settled_tier(self, agent):
        """The pinned tier's chunks, hits and misses once nothing waits to enter it."""
        end = time.time() + 30
        while True:
            _, text = agent.request("GET", "/metrics")
            if metric(text, "gpusnap_agent_pinned_tier_admissions_pending") == 0 or time.time() > end:
                break
            time.sleep(0.05)
        self.assertEqual(metric(text, "gpusnap_agent_pinned_tier_admissions_pending"), 0, text)
        return {k: metric(text, f"gpusnap_agent_pinned_tier_{k}") for k in ("chunks", "hits_total", "misses_total")}

    def test_a_suspended_workloads_chunks_are_pinned_ahead_of_its_resume(self):
        agent = self.start_agent("--pinned-cache", "1GiB", env=self.env)
        self.start_workers()
        self.assertEqual(self.settled_tier(agent), {"chunks": 0, "hits_total": 0, "misses_total": 0})
        job = self.job(agent, "POST", "/v1/workloads/b/suspend")
        self.assertEqual(job["state"], "succeeded", job)
        # b's chunks enter the tier on its own thread once the suspend is done.
        pinned = self.settled_tier(agent)
        self.assertGreater(pinned["chunks"], 0, pinned)
        job = self.job(agent, "POST", "/v1/workloads/swap", {"suspend": "a", "resume": "b"})
        self.assertEqual(job["state"], "succeeded", job)
        self.assert_running("b")
        swapped = self.settled_tier(agent)
        self.assertGreaterEqual(swapped["hits_total"], pinned["chunks"], swapped)
        self.assertEqual(swapped["misses_total"], 0, swapped)
        # a's chunks, stored by the swap's suspend, likewise: the swap back finds them all there.
        self.assertGreater(swapped["chunks"], pinned["chunks"], swapped)
        job = self.job(agent, "POST", "/v1/workloads/swap", {"suspend": "b", "resume": "a"})
        self.assertEqual(job["state"], "succeeded", job)
        self.assert_running("a")
        back = self.settled_tier(agent)
        self.assertGreater(back["hits_total"], swapped["hits_total"], back)
        self.assertEqual(back["misses_total"], 0, back)

    def test_refusals_name_the_problem_and_change_nothing(self):
        agent = self.start_agent(env=self.env)
        self.start_workers()
        for path, body, status, needle in (
                ("/v1/workloads/swap", {"suspend": "a", "resume": "a"}, 400, "name the same workload `a`"),
                ("/v1/workloads/swap", {"suspend": "a"}, 400, "`resume` is required"),
                ("/v1/workloads/swap", {"suspend": "a", "resume": "nope"}, 404, "nope"),
                ("/v1/workloads/swap", {"suspend": "a", "resume": "b"}, 409, "workload `b` is running, not suspended"),
                ("/v1/workloads/a/resume", None, 409, "workload `a` is running, not suspended"),
                ("/v1/workloads/a/suspend", {"now": True}, 400, "unknown field `now`"),
                ("/v1/workloads/nope/suspend", None, 404, "nope")):
            got, reply = agent.request("POST", path, body)
            self.assertEqual(got, status, (path, body, reply))
            self.assertIn(needle, reply["error"])
        self.assertEqual(self.workload_states(agent), {"a": "running", "b": "running"})
        self.assert_running("a")
        self.assert_running("b")

    def test_a_swap_whose_resume_fails_resumes_the_first_again_and_says_so(self):
        agent = self.start_agent(env=self.env)
        self.start_workers()
        self.gs("gpushare", "suspend", "b")  # the CLI's door: the same story, the same record
        self.assertEqual(self.workload_states(agent), {"a": "running", "b": "suspended"})
        # One byte of a chunk of b's changed, its size kept: the check before
        # the swap passes, b's load finds the digest wrong (a's memory was
        # never stored: every chunk there is b's).
        chunks = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(self.store, "chunks")) for f in fs]
        self.assertTrue(chunks)
        with open(chunks[0], "r+b") as f:
            f.seek(4096)
            byte = f.read(1)
            f.seek(4096)
            f.write(bytes([byte[0] ^ 0xFF]))
        job = self.job(agent, "POST", "/v1/workloads/swap", {"suspend": "a", "resume": "b"})
        self.assertEqual(job["state"], "failed", job)
        self.assertIn("swap of `a` for `b` undone, `a` resumed again: resuming `b`", job["error"])
        self.assertIn(os.path.basename(chunks[0]), job["error"])
        self.assertEqual(self.workload_states(agent), {"a": "running", "b": "suspended"})
        self.assert_running("a")
        # b's failed load freed what it had loaded and adopted: suspended, whole.
        self.assert_suspended("b")

    def test_the_cli_suspends_and_resumes_a_workload_by_name(self):
        self.start_workers()
        out = self.gs_json("gpushare", "suspend", "a")
        self.assertEqual(out["pids"][0]["state"], "released")
        self.assertEqual({w["name"]: w["state"] for w in self.workloads()}["a"], "suspended")
        self.assert_suspended("a")
        p = self.gs("gpushare", "suspend", "a", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("workload `a` is suspended already", p.stderr)
        swapped = self.gs_json("gpushare", "swap", "b", "a")
        self.assertEqual((swapped["suspended"]["state"], swapped["resumed"]["state"]), ("suspended", "running"))
        self.assert_running("a")
        self.assert_suspended("b")
        self.gs("gpushare", "resume", "b")
        self.assert_running("b")
        # Nothing is left under suspended/: the chunks are the collector's again.
        self.assertEqual(os.listdir(os.path.join(self.store, "suspended")), [])


class AgentKilledMidSwap(InPlaceCase):
    """The agent SIGKILLed at a step of the swap of a (running) for b
    (suspended); the restarted agent makes both whole."""

    def killed_at(self, step):
        agent = self.start_agent(env=dict(self.env, GPUSNAP_TEST_PAUSE_AT=step))
        self.start_workers()
        self.gs("gpushare", "suspend", "b")  # not through the paused agent
        status, reply = agent.request("POST", "/v1/workloads/swap", {"suspend": "a", "resume": "b"})
        self.assertEqual(status, 202, reply)
        agent.wait_line(f"paused at {step}")
        # What the journal held when it died: the swap, naming both workloads.
        with open(os.path.join(self.store, "agent", "jobs", reply["job"] + ".json")) as f:
            self.assertEqual(json.load(f)["workloads"], ["a", "b"])
        agent.kill()
        agent = self.start_agent(env=self.env)
        status, job = agent.request("GET", f"/v1/jobs/{reply['job']}")
        self.assertEqual((status, job["state"]), (200, "failed"), job)
        return agent, job

    def test_killed_with_the_first_quiesced_before_its_release(self):
        agent, job = self.killed_at("gpushare-quiesced")
        self.assertIn("`a` is running now; `b` is suspended now", job["error"])
        self.assertEqual(self.workload_states(agent), {"a": "running", "b": "suspended"})
        self.assert_running("a")
        self.assert_suspended("b")

    def test_killed_between_the_suspend_and_the_resume(self):
        agent, job = self.killed_at("swap-suspended")
        self.assertIn("`a` is suspended now; `b` is suspended now", job["error"])
        self.assertEqual(self.workload_states(agent), {"a": "suspended", "b": "suspended"})
        self.assert_suspended("a")
        self.assert_suspended("b")
        # Both recoverable: each resumes with its memory.
        self.assertEqual(self.job(agent, "POST", "/v1/workloads/b/resume")["state"], "succeeded")
        self.assert_running("b")
        self.assertEqual(self.job(agent, "POST", "/v1/workloads/a/resume")["state"], "succeeded")
        self.assert_running("a")

    def test_killed_with_the_second_holding_adopted_memory_before_its_load(self):
        agent, job = self.killed_at("resume-adopted")
        self.assertIn("`a` is suspended now; `b` is running now", job["error"])
        self.assertEqual(self.workload_states(agent), {"a": "suspended", "b": "running"})
        self.assert_suspended("a")
        self.assert_running("b")


class AgentHugePages(test_agent.AgentCase):
    def test_the_agents_restores_set_huge_pages_always_while_criu_restores(self):
        thp = os.path.join(self.tmp, "thp-enabled")  # stands for /sys/kernel/mm/transparent_hugepage/enabled
        with open(thp, "w") as f:
            f.write("always [madvise] never\n")
        resume = os.path.join(self.tmp, "resume-huge-pages")
        agent = self.start_agent("--huge-pages", env=dict(self.env, GPUSNAP_THP_FILE=thp,
                                                          GPUSNAP_TEST_PAUSE_AT="huge-pages",
                                                          GPUSNAP_TEST_RESUME_FILE=resume))
        pid = self.run_counter("hp")
        snap = self.checkpoint("hp")
        self.assertTrue(self.wait_gone(pid))
        status, reply = agent.request("POST", "/v1/restores", {"snapshot": snap})
        self.assertEqual(status, 202, reply)
        agent.wait_line("paused at huge-pages")
        with open(thp) as f:
            self.assertEqual(f.read().strip(), "always")
        open(resume, "w").close()
        job = self.wait_job(agent, reply["job"])
        self.assertEqual(job["state"], "succeeded", job)
        with open(thp) as f:
            self.assertEqual(f.read().strip(), "madvise")
        self.wait_count(job["restoredPid"], self.count(job["restoredPid"]) + 3)


if __name__ == "__main__":
    unittest.main()
