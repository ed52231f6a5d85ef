"""The node agent (`gpusnap agent`) over real HTTP: on its unix socket and on
TCP with a bearer token, driving the real CRIU on real processes; bad input
refused without changing anything; SIGKILL of the agent in the middle of a
checkpoint or a restore, then a restart that leaves the workload running and
the store whole."""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import unittest

from harness import GPUSNAP, WORKLOADS, FakeGpuCase, GpusnapCase, StderrLines, free_port, read_meta, write_meta



def wait_for_job(case, agent, job_id, timeout=120):
    """Polls GET /v1/jobs/ID until the job is no longer running: the job."""
    end = time.time() + timeout
    while time.time() < end:
        status, job = agent.request("GET", f"/v1/jobs/{job_id}")
        case.assertEqual(status, 200, job)
        if job["state"] != "running":
            return job
        time.sleep(0.1)
    case.fail(f"job {job_id} still running: {job}\n{agent.log()}")

class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=30):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


class Agent:
    """One `gpusnap agent` process this test started; its stderr is collected."""

    def __init__(self, case, extra_args=(), env=None, socket_path=None):
        self.case = case
        self.socket = socket_path or os.path.join(case.tmp, "agent-run", "agent.sock")
        self.args = [GPUSNAP, "agent", "--socket", self.socket, *extra_args]
        self.proc = subprocess.Popen(self.args, env=env or case.env, stderr=subprocess.PIPE, text=True)
        self.stderr = StderrLines(self.proc)
        self.wait_line("listening on")

    def wait_line(self, needle, timeout=60, times=1):
        found = self.stderr.wait(needle, timeout, times)
        if found:
            return found[-1]
        if self.proc.poll() is not None:
            self.case.fail(f"agent exited ({self.proc.returncode}) before `{needle}`:\n{self.log()}")
        self.case.fail(f"agent never logged `{needle}`:\n{self.log()}")

    def log(self):
        return self.stderr.text()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.stderr.join()
        self.proc.stderr.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def request(self, method, path, body=None, headers=None, conn=None):
        conn = conn or UnixHTTPConnection(self.socket)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read().decode()
        conn.close()
        ctype = resp.getheader("Content-Type", "")
        return resp.status, (json.loads(data) if ctype.startswith("application/json") else data)


class AgentCase(GpusnapCase):
    def setUp(self):
        super().setUp()
        self.agents = []

    def tearDown(self):
        # Agents first: a job still running must not race the workloads' teardown.
        for agent in self.agents:
            agent.stop()
        super().tearDown()

    def start_agent(self, *args, env=None, socket_path=None):
        agent = Agent(self, args, env, socket_path)
        self.agents.append(agent)
        return agent

    def wait_job(self, agent, job_id, timeout=120):
        return wait_for_job(self, agent, job_id, timeout)

    def checkpoint_via(self, agent, body):
        status, reply = agent.request("POST", "/v1/checkpoints", body)
        self.assertEqual(status, 202, reply)
        return reply["job"]

    def store_entries(self):
        d = os.path.join(self.store, "snapshots")
        return sorted(os.listdir(d)) if os.path.isdir(d) else []


class AgentApi(AgentCase):
    def test_checkpoint_restore_list_inspect_delete(self):
        agent = self.start_agent()
        pid = self.run_counter("api")
        job_id = self.checkpoint_via(agent, {"pid": pid})
        job = self.wait_job(agent, job_id)
        self.assertEqual(job["state"], "succeeded", job)
        self.assertEqual(job["kind"], "checkpoint")
        for phase in ("resolve", "dump", "publish", "total"):
            self.assertIn(phase, job["timings"])
        self.assertGreater(job["bytesDone"], 0)
        self.assertEqual(job["bytesDone"], job["bytesTotal"])
        snap = job["snapshot"]
        self.assertTrue(self.wait_gone(pid))  # not leaveRunning: the source is gone

        status, snaps = agent.request("GET", "/v1/snapshots")
        self.assertEqual(status, 200)
        self.assertEqual([s["id"] for s in snaps], [snap])
        self.assertEqual(snaps[0]["source"]["name"], "api")
        status, meta = agent.request("GET", f"/v1/snapshots/{snap}")
        self.assertEqual(status, 200)
        self.assertEqual(meta["id"], snap)
        self.assertEqual(meta["total_bytes"], job["bytesTotal"])

        status, reply = agent.request("POST", "/v1/restores", {"snapshot": snap, "target": "new"})
        self.assertEqual(status, 202, reply)
        job = self.wait_job(agent, reply["job"])
        self.assertEqual(job["state"], "succeeded", job)
        self.assertEqual(job["bytesTotal"], meta["total_bytes"])
        self.assertIn("criu-restore", job["timings"])
        restored = job["restoredPid"]
        self.wait_count(restored, self.count(restored) + 5)
        self.assertEqual([w["pid"] for w in self.workloads() if w["running"]], [restored])

        status, metrics = agent.request("GET", "/metrics")
        self.assertEqual(status, 200)
        self.assertIn('gpusnap_operations_total{kind="checkpoint",result="succeeded"} 1\n', metrics)
        self.assertIn('gpusnap_operations_total{kind="restore",result="succeeded"} 1\n', metrics)
        self.assertIn('gpusnap_operation_duration_seconds_count{kind="checkpoint",phase="dump"} 1\n', metrics)
        self.assertIn('gpusnap_operation_duration_seconds_count{kind="restore",phase="total"} 1\n', metrics)
        self.assertIn(f'gpusnap_operation_bytes_total{{kind="checkpoint"}} {job["bytesTotal"]}\n', metrics)
        self.assertIn("gpusnap_jobs_in_flight 0\n", metrics)

        status, reply = agent.request("DELETE", f"/v1/snapshots/{snap}")
        self.assertEqual(status, 200, reply)
        self.assertEqual(agent.request("GET", f"/v1/snapshots/{snap}")[0], 404)
        self.assertEqual(agent.request("DELETE", f"/v1/snapshots/{snap}")[0], 404)
        self.assertEqual(self.store_entries(), [])
        self.assert_no_fail_in_logs()

    def test_leave_running_and_jobs_list(self):
        agent = self.start_agent()
        pid = self.run_counter("keep")
        job = self.wait_job(agent, self.checkpoint_via(agent, {"pid": pid, "leaveRunning": True,
                                                              "snapshotId": "keep-1"}))
        self.assertEqual(job["state"], "succeeded", job)
        self.assertEqual(job["snapshot"], "keep-1")
        # Every phase of the capture, the source's pause too (not only those its progress named).
        self.assertIn("paused", job["timings"])
        self.wait_count(pid, self.count(pid) + 5)
        # The id is taken now: a second capture under it is refused up front.
        status, reply = agent.request("POST", "/v1/checkpoints", {"pid": pid, "snapshotId": "keep-1"})
        self.assertEqual(status, 409, reply)
        self.assertIn("keep-1", reply["error"])
        status, jobs = agent.request("GET", "/v1/jobs")
        self.assertEqual(status, 200)
        self.assertEqual([j["id"] for j in jobs], [job["id"]])

    def test_cli_through_the_agent(self):
        agent = self.start_agent()
        pid = self.run_counter("viacli")
        p = self.gs("checkpoint", "--agent", agent.socket, "viacli", "--id", "via-1")
        self.assertEqual(p.stdout.strip().splitlines()[-1], "via-1")
        self.assertIn("[checkpoint] dump done", p.stderr)
        self.assertTrue(self.wait_gone(pid))
        self.assertEqual([j["snapshot"] for j in agent.request("GET", "/v1/jobs")[1]], ["via-1"])
        restored = int(self.gs("restore", "--agent", agent.socket, "via-1", "--name", "back").stdout.split()[-1])
        self.wait_count(restored, self.count(restored) + 5)
        # The agent's refusals come back as one line and exit status 1.
        p = self.gs("checkpoint", "--agent", agent.socket, "1", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("the agent refused (HTTP 403): pid 1", p.stderr)
        p = self.gs("checkpoint", "--agent", agent.socket, "back", "--store", self.tmp, check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("is not the store of the agent", p.stderr)
        p = self.gs("checkpoint", "--agent", agent.socket, "back", "--verbose", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--verbose does not apply with --agent", p.stderr)
        p = self.gs("restore", "--agent", os.path.join(self.tmp, "no.sock"), "via-1", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("cannot reach the agent", p.stderr)

    def test_health_processes_and_unknown_paths(self):
        agent = self.start_agent()
        status, health = agent.request("GET", "/healthz")
        self.assertEqual((status, health["ok"]), (200, True))
        status, procs = agent.request("GET", "/v1/processes")
        self.assertEqual(status, 200)
        self.assertIsInstance(procs, list)
        for p in procs:
            self.assertTrue(p["gpu"], p)
        self.assertEqual(agent.request("GET", "/v1/processes?all=maybe")[0], 400)
        self.assertEqual(agent.request("GET", "/v1/jobs/job-0000000000000000")[0], 404)
        self.assertEqual(agent.request("GET", "/v1/snapshots/no-such-snapshot")[0], 404)
        self.assertEqual(agent.request("DELETE", "/v1/snapshots/no-such-snapshot")[0], 404)
        status, reply = agent.request("GET", "/v1/nothing-here")
        self.assertEqual(status, 404)
        self.assertIn("no endpoint", reply["error"])
        status, reply = agent.request("POST", "/v1/restores", {"snapshot": "no-such-snapshot"})
        self.assertEqual(status, 404, reply)

    def test_socket_is_for_root_only(self):
        agent = self.start_agent()
        st = os.stat(agent.socket)
        self.assertEqual(st.st_mode & 0o777, 0o600)
        self.assertEqual(os.stat(os.path.dirname(agent.socket)).st_mode & 0o777, 0o700)

    def test_bad_input_is_refused_and_changes_nothing(self):
        agent = self.start_agent()
        pid = self.run_counter("bad")
        missing = 4194000
        while os.path.exists(f"/proc/{missing}"):
            missing -= 1
        reaper = [w["reaper_pid"] for w in self.workloads() if w["name"] == "bad"][0]
        refusals = [
            ("POST", "/v1/checkpoints", "{\"pid\": ", 400, "malformed JSON"),
            ("POST", "/v1/checkpoints", "", 400, "empty body"),
            ("POST", "/v1/checkpoints", "[1, 2]", 400, "expected a JSON object"),
            ("POST", "/v1/checkpoints", {"pid": pid, "leave_running": True}, 400, "unknown field `leave_running`"),
            ("POST", "/v1/checkpoints", {"pid": str(pid)}, 400, "must be an integer"),
            ("POST", "/v1/checkpoints", {"pid": pid, "leaveRunning": "yes"}, 400, "must be a boolean"),
            ("POST", "/v1/checkpoints", {"pid": pid, "snapshotId": "../../etc"}, 400, "not a snapshot id"),
            ("POST", "/v1/checkpoints", {"pid": pid, "snapshotId": "a/b"}, 400, "not a snapshot id"),
            ("POST", "/v1/checkpoints", {"container": "../" + "a" * 20}, 400, "not a container id"),
            ("POST", "/v1/checkpoints", {"pid": pid, "container": "a" * 64}, 400, "exactly one"),
            ("POST", "/v1/checkpoints", {"pid": 1}, 403, "pid 1"),
            ("POST", "/v1/checkpoints", {"pid": agent.proc.pid}, 403, "this agent"),
            ("POST", "/v1/checkpoints", {"pid": missing}, 404, f"no process with pid {missing}"),
            ("POST", "/v1/checkpoints", {"pid": reaper}, 409, "init of its pid namespace"),
            ("POST", "/v1/checkpoints", {"container": "ab" * 32}, 404, "no running process is in container"),
            ("POST", "/v1/checkpoints", {"pod": {"namespace": "ns", "name": "p", "container": "c"}}, 404, "pod"),
            ("POST", "/v1/restores", {"snapshot": ".x"}, 400, "invalid snapshot id `.x`"),
            # With a `/` it is taken for a registry reference, and refused as one.
            ("POST", "/v1/restores", {"snapshot": "../x"}, 400, "invalid registry reference `../x`"),
            ("POST", "/v1/restores", {"snapshot": "x", "target": "old"}, 400, "`target`"),
            ("POST", "/v1/restores", {"snapshot": "x", "gpuMap": [0]}, 400, "`gpuMap` must be an object"),
            ("POST", "/v1/restores", {"snapshot": "x", "target": {"container": "a" * 64}}, 404,
             "no running process is in container"),
            ("GET", "/v1/snapshots/../../etc/passwd", None, 400, "not a snapshot id"),
            ("GET", "/v1/snapshots/a%2Fb", None, 400, "not a snapshot id"),
            ("DELETE", "/v1/snapshots/..", None, 400, "not a snapshot id"),
            ("GET", "/v1/jobs/../../x", None, 400, "not a job id"),
            ("POST", "/v1/checkpoints", json.dumps({"pid": pid, "pad": "x" * (1 << 20)}), 413, "too large"),
        ]
        for method, path, body, want, needle in refusals:
            with self.subTest(path=path, body=str(body)[:80]):
                status, reply = agent.request(method, path, body)
                self.assertEqual(status, want, reply)
                self.assertIn(needle, reply["error"])
        self.assertRegex(agent.log(), r"unix POST /v1/checkpoints from uid 0 \(gid 0, pid \d+ `[^`]*`\): "
                                      r"HTTP 403: pid 1 is the node's init")
        # Nothing happened: no job, no snapshot, no temporary, the workload counts on.
        self.assertEqual(agent.request("GET", "/v1/jobs"), (200, []))
        self.assertEqual(self.store_entries(), [])
        self.wait_count(pid, self.count(pid) + 5)
        self.assertEqual(agent.request("GET", "/healthz")[0], 200)

    def test_sigterm_stops_cleanly(self):
        agent = self.start_agent()
        agent.proc.send_signal(signal.SIGTERM)
        self.assertEqual(agent.proc.wait(timeout=60), 0, agent.log())
        self.assertFalse(os.path.exists(agent.socket))
        self.assertIn("stopping", agent.log())
        # A new agent takes over the same state directory and socket path.
        self.assertEqual(self.start_agent().request("GET", "/healthz")[0], 200)

    def test_second_agent_on_the_same_state_is_refused(self):
        self.start_agent()
        other = os.path.join(self.tmp, "other.sock")
        p = subprocess.run([GPUSNAP, "agent", "--socket", other], env=self.env, capture_output=True, text=True,
                           timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("another agent holds", p.stderr)

    def test_listing_a_thousand_snapshots(self):
        # The snapshots' own gpusnap.json files are the catalog.
        agent = self.start_agent()
        pid = self.run_counter("many")
        job = self.wait_job(agent, self.checkpoint_via(agent, {"pid": pid, "leaveRunning": True,
                                                              "snapshotId": "many-0000"}))
        self.assertEqual(job["state"], "succeeded", job)
        snapdir = os.path.join(self.store, "snapshots")
        src = os.path.join(snapdir, "many-0000")
        meta = read_meta(os.path.join(src, "gpusnap.json"))
        for i in range(1, 1000):
            sid = f"many-{i:04d}"
            dst = os.path.join(snapdir, sid)
            shutil.copytree(src, dst, copy_function=os.link, ignore=shutil.ignore_patterns("gpusnap.json"))
            meta["id"] = sid
            write_meta(os.path.join(dst, "gpusnap.json"), meta)
        status, snaps = agent.request("GET", "/v1/snapshots")
        self.assertEqual(status, 200)
        self.assertEqual(sorted(s["id"] for s in snaps), [f"many-{i:04d}" for i in range(1000)])


class AgentGpuWithFakeDriver(AgentCase, FakeGpuCase):
    """The GPU steps through the agent on a GPU-less machine, as
    test_gpu_flow_fake does for the CLI: the fake libcuda through the same
    dlopen, a workload that maps a /dev/nvidia-* stand-in; CRIU is real."""

    def test_gpu_process_listed_checkpointed_and_restored(self):
        pid = int(self.gs("run", "--name", "gpu", "--", os.path.join(WORKLOADS, "counter"), self.data, "0",
                          self.device).stdout.strip())
        self.wait_count(pid, 3)
        plain = self.run_counter("cpu")
        agent = self.start_agent(env=self.gpu_env)
        status, procs = agent.request("GET", "/v1/processes")
        self.assertEqual(status, 200)
        listed = {p["pid"]: p for p in procs}
        self.assertTrue(listed[pid]["gpu"], procs)
        self.assertIsNone(listed[pid]["container"])
        self.assertNotIn(plain, listed)

        # The fake driver keeps a process's GPU state in the device stand-in,
        # so the source goes before its copy comes back.
        job = self.wait_job(agent, self.checkpoint_via(agent, {"pid": pid}))
        self.assertEqual(job["state"], "succeeded", job)
        self.assertIn("gpu-suspend", job["timings"])
        self.assertTrue(self.wait_gone(pid))
        status, snaps = agent.request("GET", "/v1/snapshots")
        self.assertEqual([s["gpus"] for s in snaps], [1])

        status, reply = agent.request("POST", "/v1/restores", {"snapshot": job["snapshot"], "name": "gpu-copy",
                                                               "gpuMap": {"0": "0"}})
        self.assertEqual(status, 202, reply)
        restored = self.wait_job(agent, reply["job"])
        self.assertEqual(restored["state"], "succeeded", restored)
        self.assertIn("gpu-restore", restored["timings"])
        self.wait_count(restored["restoredPid"], self.count(restored["restoredPid"]) + 5)
        metrics = agent.request("GET", "/metrics")[1]
        self.assertIn('gpusnap_operation_duration_seconds_count{kind="checkpoint",phase="gpu-suspend"} 1\n', metrics)


class AgentTcp(AgentCase):
    def setUp(self):
        super().setUp()
        self.token = "t0k3n-" + os.urandom(16).hex()
        self.token_file = os.path.join(self.tmp, "token")
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, (self.token + "\n").encode())
        os.close(fd)
        self.port = free_port()

    def tcp(self, agent, method, path, body=None, token=None):
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return agent.request(method, path, body, headers, http.client.HTTPConnection("127.0.0.1", self.port, timeout=30))

    def test_token_is_required(self):
        agent = self.start_agent("--listen", f"127.0.0.1:{self.port}", "--token-file", self.token_file)
        pid = self.run_counter("tcp")
        wrong = [None, "", "nope", self.token[:-1], self.token + "x", self.token.upper()]
        for token in wrong:
            with self.subTest(token=token):
                status, reply = self.tcp(agent, "GET", "/v1/snapshots", token=token)
                self.assertEqual(status, 401, reply)
                self.assertEqual(self.tcp(agent, "GET", "/metrics", token=token)[0], 401)
                status, reply = self.tcp(agent, "POST", "/v1/checkpoints", {"pid": pid}, token=token)
                self.assertEqual(status, 401, reply)
        self.assertEqual(agent.request("GET", "/v1/jobs"), (200, []))  # nothing started
        # A raw header with another scheme is refused too.
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        self.assertEqual(agent.request("GET", "/v1/jobs", headers={"Authorization": self.token}, conn=conn)[0], 401)
        # Probes need no token and learn nothing but "ok".
        self.assertEqual(self.tcp(agent, "GET", "/healthz")[0], 200)

        status, reply = self.tcp(agent, "POST", "/v1/checkpoints", {"pid": pid, "leaveRunning": True},
                                 token=self.token)
        self.assertEqual(status, 202, reply)
        end = time.time() + 120
        while time.time() < end:
            status, job = self.tcp(agent, "GET", f"/v1/jobs/{reply['job']}", token=self.token)
            self.assertEqual(status, 200)
            if job["state"] != "running":
                break
            time.sleep(0.1)
        self.assertEqual(job["state"], "succeeded", job)
        status, snaps = self.tcp(agent, "GET", "/v1/snapshots", token=self.token)
        self.assertEqual([s["id"] for s in snaps], [job["snapshot"]])
        self.assertEqual(self.tcp(agent, "GET", "/v1/jobs/job-ffffffffffffffff", token=self.token)[0], 404)

    def test_unsafe_token_setups_are_refused(self):
        def refused(args, needle):
            p = subprocess.run([GPUSNAP, "agent", "--socket", os.path.join(self.tmp, "x.sock"), *args],
                               env=self.env, capture_output=True, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(needle, p.stderr)

        refused(["--listen", f"127.0.0.1:{self.port}"], "--listen needs --token-file")
        os.chmod(self.token_file, 0o644)
        refused(["--listen", f"127.0.0.1:{self.port}", "--token-file", self.token_file], "may be read by others")
        os.chmod(self.token_file, 0o600)
        with open(self.token_file, "w") as f:
            f.write("short\n")
        refused(["--listen", f"127.0.0.1:{self.port}", "--token-file", self.token_file], "at least 16")


class AgentCrash(AgentCase):
    """SIGKILL of the agent at a phase, then a restart."""

    def paused_agent(self, phase):
        return self.start_agent(env=dict(self.env, GPUSNAP_TEST_PAUSE_AT=phase))

    def assert_interrupted(self, agent, job_id, phase):
        status, job = agent.request("GET", f"/v1/jobs/{job_id}")
        self.assertEqual(status, 200)
        self.assertEqual(job["state"], "failed", job)
        self.assertIn(f"after phase `{phase}`", job["error"])
        self.assertIn("restarted", job["error"])
        return job

    def test_second_capture_is_409_then_sigkill_before_the_dump(self):
        first = self.run_counter("c1")
        second = self.run_counter("c2")
        agent = self.paused_agent("dump")
        job1 = self.checkpoint_via(agent, {"pid": first})
        agent.wait_line("paused at dump")
        status, reply = agent.request("POST", "/v1/checkpoints", {"pid": first, "leaveRunning": True})
        self.assertEqual(status, 409, reply)
        self.assertEqual(reply["job"], job1)
        self.assertIn(job1, reply["error"])
        # Another tree is not held up by the first.
        job2 = self.checkpoint_via(agent, {"pid": second})
        agent.wait_line("paused at dump", times=2)
        status, running = agent.request("GET", "/v1/jobs")
        self.assertEqual(sorted(j["id"] for j in running if j["state"] == "running"), sorted([job1, job2]))
        self.assertIn("gpusnap_jobs_in_flight 2\n", agent.request("GET", "/metrics")[1])
        agent.kill()

        agent = self.start_agent()
        for job_id in (job1, job2):
            self.assert_interrupted(agent, job_id, "resolve")
            self.assertIn("no snapshot was published", agent.request("GET", f"/v1/jobs/{job_id}")[1]["error"])
        for pid in (first, second):
            self.wait_count(pid, self.count(pid) + 5)
        self.assertEqual(self.store_entries(), [])
        # The tree is free again.
        job = self.wait_job(agent, self.checkpoint_via(agent, {"pid": first, "leaveRunning": True}))
        self.assertEqual(job["state"], "succeeded", job)

    def test_restart_resumes_a_source_left_stopped(self):
        # What a dead agent may leave: its job's source tree stopped.
        pid = self.run_counter("stopped")
        agent = self.paused_agent("dump")
        job_id = self.checkpoint_via(agent, {"pid": pid})
        agent.wait_line("paused at dump")
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            tree = [pid] + [int(c) for c in f.read().split()]
        for p in tree:
            os.kill(p, signal.SIGSTOP)
        agent.kill()
        self.assertEqual(self.state(pid), "T")

        agent = self.start_agent()
        self.assert_interrupted(agent, job_id, "resolve")
        self.assertIn(f"resumed {len(tree)} stopped processes", agent.log())
        for p in tree:
            self.assertNotEqual(self.state(p), "T")
        self.wait_count(pid, self.count(pid) + 5)
        self.assert_no_fail_in_logs()

    @staticmethod
    def state(pid):
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    def test_sigkill_while_criu_holds_the_tree_frozen(self):
        pid = self.run_counter("frozen")
        agent = self.paused_agent("post-dump")
        job_id = self.checkpoint_via(agent, {"pid": pid})
        agent.wait_line("paused at post-dump")
        self.assertEqual(len(self.tmp_dirs()), 1)
        agent.kill()
        self.wait_count(pid, self.count(pid) + 5)  # CRIU resumed it when its caller died

        agent = self.start_agent()
        self.assert_interrupted(agent, job_id, "dump")
        self.assertIn("removed 1 unfinished snapshot", agent.log())
        self.assertEqual(self.store_entries(), [])  # the temporary is gone, nothing published
        self.wait_count(pid, self.count(pid) + 5)
        self.assert_no_fail_in_logs()

    def test_sigkill_after_the_snapshot_is_published(self):
        pid = self.run_counter("pub")
        agent = self.paused_agent("published")
        job_id = self.checkpoint_via(agent, {"pid": pid, "snapshotId": "pub-1"})
        agent.wait_line("paused at published")
        agent.kill()
        self.wait_count(pid, self.count(pid) + 5)  # CRIU was never told to kill it

        agent = self.start_agent()
        job = self.assert_interrupted(agent, job_id, "publish")
        self.assertIn("`pub-1` had been published whole", job["error"])
        self.assertEqual(self.store_entries(), ["pub-1"])
        self.gs("inspect", "--verify", "pub-1")

    def test_sigkill_during_a_restore(self):
        pid = self.run_counter("rest")
        agent = self.start_agent()
        job = self.wait_job(agent, self.checkpoint_via(agent, {"pid": pid}))
        self.assertEqual(job["state"], "succeeded", job)
        snap = job["snapshot"]
        self.assertTrue(self.wait_gone(pid))
        agent.stop()

        agent = self.paused_agent("restore-namespace")
        status, reply = agent.request("POST", "/v1/restores", {"snapshot": snap})
        self.assertEqual(status, 202, reply)
        agent.wait_line("paused at restore-namespace")
        # While it runs, the snapshot it reads cannot be deleted.
        status, refused = agent.request("DELETE", f"/v1/snapshots/{snap}")
        self.assertEqual(status, 409, refused)
        agent.kill()

        agent = self.start_agent()
        self.assert_interrupted(agent, reply["job"], "namespace")
        self.assertEqual(self.store_entries(), [snap])
        self.gs("inspect", "--verify", snap)
        self.assertEqual([w for w in self.workloads() if w["running"]], [])
        # The snapshot is whole: restoring it again works, and the workload runs.
        job = self.wait_job(agent, agent.request("POST", "/v1/restores", {"snapshot": snap})[1]["job"])
        self.assertEqual(job["state"], "succeeded", job)
        restored = job["restoredPid"]
        self.wait_count(restored, self.count(restored) + 5)
        self.assert_no_fail_in_logs()


if __name__ == "__main__":
    unittest.main()
