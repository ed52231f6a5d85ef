"""Real runc containers through the agent: found by their container id, or by
their pod's kubelet log link, through /proc and cgroups only; checkpointed and
restored into a fresh namespace.

The container's root file system is assembled from bind mounts of the host's
own /usr, the workload and the CRIU bundle at the same paths, so the files the
dumped tree maps are the same files when it is restored on the host."""
import json
import os
import re
import shutil
import subprocess
import time
import uuid

import test_agent as base
from harness import WORKLOADS

RUNC = shutil.which("runc") or "/usr/sbin/runc"
CRIU_BUNDLE = os.environ.get("GPUSNAP_CRIU", os.path.join(os.path.dirname(__file__), "../../build/criu-bundle"))


def bind(path, writable=False):
    return {"destination": path, "type": "bind", "source": path,
            "options": ["rbind", "rw" if writable else "ro"]}


class RuncCase(base.AgentCase):
    """runc containers for a test: started, found, and deleted at its end."""

    def setUp(self):
        super().setUp()
        if not os.access(RUNC, os.X_OK):
            self.skipTest("runc is not installed (scripts/debian-packages.txt lists it)")
        self.cgroup_top = "gpusnap-e2e-" + uuid.uuid4().hex[:8]
        self.pod_uid = str(uuid.uuid4())
        self.kubelet_logs = os.path.join(self.tmp, "kubelet-logs")
        os.makedirs(self.kubelet_logs)
        self.containers = []

    def tearDown(self):
        for cid in self.containers:
            subprocess.run([RUNC, "delete", "--force", cid], capture_output=True)
        # The cgroup directories above the containers', which runc leaves.
        for root, _, _ in os.walk("/sys/fs/cgroup"):
            top = os.path.join(root, self.cgroup_top)
            if os.path.isdir(top):
                for d in (os.path.join(top, f"pod{self.pod_uid}"), top):
                    try:
                        os.rmdir(d)
                    except OSError:
                        pass
        super().tearDown()

    def start_container(self, args, pod=None, extra_binds=(), process=None, seccomp=None):
        """Starts a container with a kubelet-style id; returns the id.
        extra_binds: more host directories, bound read-only at the same paths.
        process: keys of the OCI config's `process` that replace the defaults
        (root, CAP_KILL and CAP_SYS_ADMIN, no_new_privs); seccomp: the
        config's `linux.seccomp` (default: none)."""
        cid = uuid.uuid4().hex + uuid.uuid4().hex
        bundle = os.path.join(self.tmp, "bundle-" + cid[:8])
        rootfs = os.path.join(bundle, "rootfs")
        os.makedirs(os.path.join(rootfs, "tmp"))
        for link in ("bin", "lib", "lib64", "sbin"):
            os.symlink(f"usr/{link}", os.path.join(rootfs, link))
        config = {
            "ociVersion": "1.0.2",
            "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": args, "cwd": "/",
                        "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
                        "capabilities": {k: ["CAP_KILL", "CAP_SYS_ADMIN"] for k in
                                         ("bounding", "effective", "permitted")},
                        "noNewPrivileges": True},
            "root": {"path": "rootfs", "readonly": False},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
                bind("/dev/shm", writable=True),
                bind("/usr"),
                bind(os.path.abspath(WORKLOADS)),
                bind(os.path.abspath(CRIU_BUNDLE)),
                bind(self.data, writable=True),
                *(bind(path) for path in extra_binds),
            ],
            "linux": {
                # Only pid and mount namespaces: the tree shares the host's
                # network, so it can be restored into a fresh namespace here.
                "namespaces": [{"type": "pid"}, {"type": "mount"}],
                "cgroupsPath": f"/{self.cgroup_top}/pod{self.pod_uid}/{cid}",
            },
        }
        config["process"].update(process or {})
        if seccomp:
            config["linux"]["seccomp"] = seccomp
        with open(os.path.join(bundle, "config.json"), "w") as f:
            json.dump(config, f)
        # Pipes for the container's stdio, as a runtime's shim gives: files
        # opened outside the container's mounts could not be dumped from inside.
        p = subprocess.Popen([RUNC, "run", "--detach", "--bundle", bundle, cid], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.addCleanup(p.stdin.close)
        self.addCleanup(p.stdout.close)
        if p.wait(timeout=60) != 0:
            self.fail(f"runc run failed: {p.stdout.read().decode(errors='replace')}")
        self.containers.append(cid)
        if pod:
            namespace, name, container = pod
            target = os.path.join(self.tmp, f"{cid[:8]}.log")
            open(target, "w").close()
            os.symlink(target, os.path.join(self.kubelet_logs, f"{name}_{namespace}_{container}-{cid}.log"))
        return cid

    def container_init(self, cid):
        state = json.loads(subprocess.run([RUNC, "state", cid], capture_output=True, text=True, check=True).stdout)
        return state["pid"], state["status"]

    def counter_in(self, cid):
        init, _ = self.container_init(cid)
        # The container's shell forks the counter after runc has returned.
        end = time.time() + 10
        while True:
            with open(f"/proc/{init}/task/{init}/children") as f:
                children = [int(c) for c in f.read().split()]
            if children or time.time() > end:
                break
            time.sleep(0.05)
        self.assertEqual(len(children), 1, children)
        self.wait_count(children[0], 3)
        return children[0]

    @staticmethod
    def criu_log(job):
        """The CRIU log a failed job's error names, as evidence."""
        m = re.search(r"\(CRIU log: ([^)]+)\)", job.get("error", ""))
        if not m or not os.path.exists(m.group(1)):
            return ""
        with open(m.group(1), errors="replace") as f:
            return f.read()[-6000:]

    def counter_args(self, data=None):
        # The counter leads its own session: a tree whose session is led by
        # the container's init is dumped as a shell job, which a restore into
        # a fresh namespace does not take back yet (docs/AGENT.md, limits).
        # Its output goes to a file: the runc pipe its stdout would be has no
        # reader once restored, and its next line (every 20 counts) would end
        # it with SIGPIPE.
        # `data` (default: the test's data directory, bound into every
        # container) holds its files.
        data = data or self.data
        log = os.path.join(data, "counter.log")
        return ["/bin/sh", "-c", f"setsid {os.path.abspath(WORKLOADS)}/counter {data} 0 >{log} 2>&1 & wait"]


class RuncContainers(RuncCase):
    def test_container_checkpointed_and_restored_by_id(self):
        agent = self.start_agent()
        cid = self.start_container(self.counter_args())
        pid = self.counter_in(cid)

        status, procs = agent.request("GET", "/v1/processes?all=true")
        self.assertEqual(status, 200)
        mine = {p["pid"]: p for p in procs if p["container"] == cid}
        init, _ = self.container_init(cid)
        self.assertTrue(mine[init]["containerInit"])
        self.assertIn(pid, mine)
        self.assertEqual(mine[pid]["podUid"], self.pod_uid)

        job = self.wait_job(agent, self.checkpoint_via(agent, {"container": cid[:12]}))
        self.assertEqual(job["state"], "succeeded", f"{job}\n{agent.log()}")
        self.assertIn(cid, job["target"])
        self.assertTrue(self.wait_gone(pid))
        self.assertTrue(self.wait_gone(init))  # its init had nothing left to wait for

        status, reply = agent.request("POST", "/v1/restores", {"snapshot": job["snapshot"], "name": "from-runc"})
        self.assertEqual(status, 202, reply)
        restored = self.wait_job(agent, reply["job"])
        self.assertEqual(restored["state"], "succeeded", f"{restored}\n{self.criu_log(restored)}")
        new_pid = restored["restoredPid"]
        self.wait_count(new_pid, self.count(new_pid) + 5)
        self.assertEqual(restored["restoredName"], "from-runc")
        self.assert_no_fail_in_logs()

    def test_container_found_by_pod_and_left_running(self):
        agent = self.start_agent("--kubelet-log-dir", self.kubelet_logs)
        cid = self.start_container(self.counter_args(), pod=("ml", "server-0", "model"))
        pid = self.counter_in(cid)
        pod = {"namespace": "ml", "name": "server-0", "container": "model"}
        status, procs = agent.request("GET", "/v1/processes?all=true")
        self.assertEqual(status, 200)
        self.assertEqual([p["pod"] for p in procs if p["pid"] == pid], [pod])
        job = self.wait_job(agent, self.checkpoint_via(agent, {"pod": pod, "leaveRunning": True}))
        self.assertEqual(job["state"], "succeeded", f"{job}\n{agent.log()}")
        self.assertIn(cid, job["target"])
        self.wait_count(pid, self.count(pid) + 5)
        self.assertEqual(self.container_init(cid)[1], "running")
        status, reply = agent.request("POST", "/v1/checkpoints",
                                      {"pod": dict(pod, container="other"), "leaveRunning": True})
        self.assertEqual(status, 404, reply)
        self.assertIn("server-0", reply["error"])

    def test_sigkill_during_a_container_checkpoint(self):
        # The agent holds the container's init stopped and CRIU holds the tree
        # frozen when the agent dies: CRIU resumes the tree, the restarted
        # agent lets the init go, and the container runs on.
        agent = self.start_agent(env=dict(self.env, GPUSNAP_TEST_PAUSE_AT="post-dump"))
        cid = self.start_container(self.counter_args())
        pid = self.counter_in(cid)
        init, _ = self.container_init(cid)
        job_id = self.checkpoint_via(agent, {"container": cid})
        agent.wait_line("paused at post-dump")
        agent.kill()
        self.wait_count(pid, self.count(pid) + 5)

        agent = self.start_agent()
        status, job = agent.request("GET", f"/v1/jobs/{job_id}")
        self.assertEqual((status, job["state"]), (200, "failed"), job)
        self.assertIn("after phase `dump`", job["error"])
        self.assertIn("resumed 1 stopped processes", agent.log())
        with open(f"/proc/{init}/stat") as f:
            self.assertNotEqual(f.read().rsplit(")", 1)[1].split()[0], "T")
        self.assertEqual(self.store_entries(), [])
        self.wait_count(pid, self.count(pid) + 5)
        # The container is whole: checkpointing it again works.
        job = self.wait_job(agent, self.checkpoint_via(agent, {"container": cid, "leaveRunning": True}))
        self.assertEqual(job["state"], "succeeded", job)

    def test_container_whose_init_is_the_workload_is_refused(self):
        agent = self.start_agent()
        cid = self.start_container(["/bin/sleep", "1000"])
        status, reply = agent.request("POST", "/v1/checkpoints", {"container": cid})
        self.assertEqual(status, 409, reply)
        self.assertIn("only process", reply["error"])
        self.assertEqual(self.container_init(cid)[1], "running")
        self.assertEqual(agent.request("GET", "/v1/jobs"), (200, []))


if __name__ == "__main__":
    import unittest
    unittest.main()
