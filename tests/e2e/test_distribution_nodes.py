"""Snapshots that travel from node to node through a registry, through the
node agents. Two "nodes" on this machine, each with its own store, run
directory, agent state and socket, and one real registry
(tests/e2e/registry.py): plain HTTP, and HTTPS with bearer tokens and a
docker config.json.

- a counter captured on node A and pushed is restored on node B from its
  reference, and counts on from where it was; B's store holds it after;
- bad references are refused (400), a reference the registry lacks fails
  the job and leaves B's store as it was;
- node A's agent captures with pushTo: the job pushes once the snapshot is
  published and reports the manifest's digest; node B's agent restores from
  the reference and the counter counts on; two restores of one reference
  started together on B download each blob once (the registry's log says
  so; one pull finds the snapshot that the other brought);
- a push the registry refuses fails the job, the snapshot kept in A's store."""
import collections
import hashlib
import json
import os
import re
import time
import unittest

import test_agent as base
from harness import WORKLOADS, end_workloads
from registry import Registry, write_docker_config

BLOB_GET = re.compile(r'"GET /v2/(?P<repo>[^ ]+)/blobs/(?P<digest>sha256:[0-9a-f]{64}) HTTP/[0-9.]+" (?P<code>\d{3})')


class Node:
    """A node of the test: its directories and the environment its
    commands and its agent run in."""

    def __init__(self, case, name):
        self.case, self.name = case, name
        self.dir = os.path.join(case.tmp, name)
        self.store = os.path.join(self.dir, "store")
        self.run_dir = os.path.join(self.dir, "run")
        self.socket = os.path.join(self.dir, "agent-run", "agent.sock")
        # Commands of this node find no agent unless asked (--agent).
        self.env = dict(case.env, GPUSNAP_STORE=self.store, GPUSNAP_RUN_DIR=self.run_dir,
                        GPUSNAP_AGENT_SOCKET=os.path.join(self.dir, "no-agent", "agent.sock"))
        self.agent = None

    def gs(self, *args, check=True):
        return self.case.gs(*args, check=check, env=self.env)

    def start_agent(self, *args, env=None):
        self.agent = self.case.start_agent(*args, env=dict(self.env, **(env or {})), socket_path=self.socket)
        return self.agent

    def workloads(self):
        p = self.gs("--json", "ps", check=False)
        return json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else []

    def snapshot_ids(self):
        d = os.path.join(self.store, "snapshots")
        return sorted(n for n in os.listdir(d) if not n.startswith(".")) if os.path.isdir(d) else []

    def stop_workloads(self):
        end_workloads(self.workloads, self.case.wait_gone)


def stop_nodes(case, nodes):
    """Stops the case's agents, then what is still running on each node."""
    for agent in case.agents:
        agent.stop()
    case.agents = []
    for node in nodes:
        node.stop_workloads()


class TwoNodes(base.AgentCase):
    """Nodes A and B and a registry in MODE (no tests of its own)."""

    MODE = "plain"

    def setUp(self):
        super().setUp()
        self.registry = Registry(os.path.join(self.tmp, "registry"), self.MODE)
        self.registry.start()
        self.addCleanup(self.registry.close)
        self.a, self.b = Node(self, "node-a"), Node(self, "node-b")
        self.docker_config = None
        if self.MODE != "plain":
            self.docker_config = write_docker_config(os.path.join(self.tmp, "docker", "config.json"),
                                                     self.registry.host, self.registry.username,
                                                     self.registry.password)

    def tearDown(self):
        stop_nodes(self, (self.a, self.b))
        super().tearDown()

    def registry_flags(self):
        """The flags that let a command or an agent reach the registry."""
        if self.MODE == "plain":
            return ["--plain-http"]
        return ["--registry-config", self.docker_config, "--ca-file", self.registry.ca_file]

    def ref(self, repository, tag):
        return f"{self.registry.host}/{repository}:{tag}"

    def counter_on(self, node, name):
        pid = int(node.gs("run", "--name", name, "--", os.path.join(WORKLOADS, "counter"), self.data,
                          "0").stdout.strip())
        self.wait_count(pid, 3)
        return pid

    def restore_via(self, agent, body):
        status, reply = agent.request("POST", "/v1/restores", body)
        self.assertEqual(status, 202, reply)
        return reply["job"]

    def blob_gets(self):
        """The registry's answered blob downloads: [(digest, HTTP code)]."""
        with open(self.registry.log, errors="replace") as f:
            return [(m["digest"], m["code"]) for m in BLOB_GET.finditer(f.read())]

    @staticmethod
    def blobs_of(node, snapshot):
        """The snapshot's blobs as a registry holds them: gpusnap.json (the
        config) and every file it lists (dump.log and stats-dump stay
        home), as a Counter of digests, a digest counted once for each file
        that has it."""
        root = os.path.join(node.store, "snapshots", snapshot)
        with open(os.path.join(root, "gpusnap.json"), "rb") as f:
            config = f.read()
        blobs = collections.Counter(["sha256:" + hashlib.sha256(config).hexdigest()])
        for path in json.loads(config)["files"]:
            with open(os.path.join(root, path), "rb") as f:
                blobs["sha256:" + hashlib.sha256(f.read()).hexdigest()] += 1
        return blobs

    def assert_counts_on(self, pid, before):
        self.assertGreaterEqual(self.count(pid), before)  # from where it was, not from 0
        self.wait_count(pid, self.count(pid) + 5)


class RestoreOfAReference(TwoNodes):
    def captured_and_pushed(self, name, ref):
        """A counter on node A, captured there and pushed with the CLI: its
        snapshot id, the count it had reached, the manifest's digest."""
        pid = self.counter_on(self.a, name)
        before = self.count(pid)
        snapshot = self.a.gs("checkpoint", name).stdout.strip().splitlines()[-1]
        self.assertTrue(self.wait_gone(pid))
        digest = self.a.gs("push", snapshot, ref, *self.registry_flags()).stdout.strip().splitlines()[-1]
        self.assertRegex(digest, r"^sha256:[0-9a-f]{64}$")
        return snapshot, before, digest

    def test_restored_on_node_b_from_its_reference(self):
        ref = self.ref("ml/counter", "v1")
        snapshot, before, digest = self.captured_and_pushed("travel", ref)
        agent = self.b.start_agent(*self.registry_flags())
        self.assertEqual(self.b.snapshot_ids(), [])

        job = self.wait_job(agent, self.restore_via(agent, {"snapshot": ref, "name": "moved"}))
        self.assertEqual(job["state"], "succeeded", f"{job}\n{agent.log()}")
        self.assert_counts_on(job["restoredPid"], before)
        self.assertEqual((job["snapshot"], job["restoredName"]), (snapshot, "moved"))
        self.assertEqual(job["target"], f"reference {ref}")
        pull = job["pull"]
        self.assertEqual((pull["reference"], pull["digest"], pull["done"], pull["alreadyPresent"]),
                         (ref, digest, True, False), pull)
        self.assertEqual(pull["blobsMoved"], pull["blobs"])
        self.assertEqual(pull["bytesMoved"], pull["bytesTotal"])
        self.assertGreater(pull["bytesMoved"], 0)
        self.assertNotIn("progress", pull)
        # One restore story for every door: the files first, the rest pulled while it restores.
        for phase in ("pull-files", "pull", "verify", "criu-restore", "total"):
            self.assertIn(phase, job["timings"])
        self.assertEqual(self.b.snapshot_ids(), [snapshot])
        self.assertIn(f"pulled {ref} ({digest}) as `{snapshot}`", agent.log())
        self.assertEqual([w["name"] for w in self.b.workloads() if w["running"]], ["moved"])

        # Once in B's store, a second restore downloads nothing.
        gets = len(self.blob_gets())
        job = self.wait_job(agent, self.restore_via(agent, {"snapshot": ref, "name": "again"}))
        self.assertEqual(job["state"], "succeeded", f"{job}\n{agent.log()}")
        self.assertEqual((job["pull"]["alreadyPresent"], job["pull"]["bytesMoved"]), (True, 0), job["pull"])
        self.assertEqual(len(self.blob_gets()), gets)
        self.assert_counts_on(job["restoredPid"], before)

        # The CLI of node B goes through its agent, with the agent's registry settings.
        p = self.b.gs("restore", "--agent", agent.socket, ref, "--name", "via-cli")
        self.assertIn("[restore] pull done", p.stderr)
        self.assert_counts_on(int(p.stdout.strip().splitlines()[-1]), before)
        self.assertEqual(agent.request("GET", "/v1/jobs")[1][0]["restoredName"], "via-cli")
        self.assert_no_fail_in_logs()

    def test_bad_and_unknown_references(self):
        agent = self.b.start_agent(*self.registry_flags())
        for bad, why in ((f"{self.registry.host}/Upper/x:v1", "repository component `Upper`"),
                         (f"http://{self.registry.host}/x:v1", "no scheme"),
                         ("host:99999/x", "port 99999 is out of range")):
            status, reply = agent.request("POST", "/v1/restores", {"snapshot": bad})
            self.assertEqual(status, 400, reply)
            self.assertIn(why, reply["error"])
        self.assertEqual(agent.request("GET", "/v1/jobs"), (200, []))

        ref = self.ref("ml/nothing", "v1")
        job = self.wait_job(agent, self.restore_via(agent, {"snapshot": ref}))
        self.assertEqual(job["state"], "failed", job)
        self.assertIn(ref, job["error"])
        self.assertIn("has no `v1` in `ml/nothing`", job["error"])
        self.assertNotIn("snapshot", job)
        self.assertEqual(self.b.snapshot_ids(), [])
        self.assertIn('gpusnap_operations_total{kind="restore",result="failed"} 1',
                      agent.request("GET", "/metrics")[1])


class CaptureAndPushThenRestoreElsewhere(TwoNodes):
    def capture_with_push(self, agent, name, ref):
        """A counter on node A captured by A's agent with pushTo: the job,
        and the count the counter had reached."""
        pid = self.counter_on(self.a, name)
        before = self.count(pid)
        job = self.wait_job(agent, self.checkpoint_via(agent, {"pid": pid, "pushTo": ref}))
        self.assertTrue(self.wait_gone(pid))
        return job, before

    def test_pushed_by_node_a_restored_by_node_b(self):
        a = self.a.start_agent(*self.registry_flags())
        b = self.b.start_agent(*self.registry_flags())
        ref = self.ref("ml/counter", "warm")
        job, before = self.capture_with_push(a, "pushed", ref)
        self.assertEqual(job["state"], "succeeded", f"{job}\n{a.log()}")
        push = job["push"]
        self.assertEqual((push["reference"], push["done"]), (ref, True), push)
        self.assertRegex(push["digest"], r"^sha256:[0-9a-f]{64}$")
        # A registry that had none of them: every blob went up once (files
        # of equal content are one blob; its repeats count as found there).
        blobs = self.blobs_of(self.a, job["snapshot"])
        self.assertEqual(push["blobs"], sum(blobs.values()))
        self.assertEqual(push["blobsMoved"] + push["blobsSkipped"], push["blobs"])
        self.assertEqual(push["blobsMoved"], len(blobs))
        self.assertEqual(job["phase"], "push")
        for phase in ("dump", "publish", "push-verify", "push"):
            self.assertIn(phase, job["timings"])
        self.assertIn(f"pushed `{job['snapshot']}` to {ref} ({push['digest']})", a.log())

        restored = self.wait_job(b, self.restore_via(b, {"snapshot": ref}))
        self.assertEqual(restored["state"], "succeeded", f"{restored}\n{b.log()}")
        self.assertEqual(restored["pull"]["digest"], push["digest"])
        self.assertEqual((restored["snapshot"], restored["restoredName"]), (job["snapshot"], "pushed"))
        self.assert_counts_on(restored["restoredPid"], before)
        self.assertEqual(self.b.snapshot_ids(), [job["snapshot"]])

        # A second capture of the same tree, pushed to another tag: only what
        # the registry lacks goes up.
        moved = restored["restoredPid"]
        status, again = b.request("POST", "/v1/checkpoints",
                                  {"pid": moved, "leaveRunning": True, "pushTo": self.ref("ml/counter", "later")})
        self.assertEqual(status, 202, again)
        again = self.wait_job(b, again["job"])
        self.assertEqual(again["state"], "succeeded", f"{again}\n{b.log()}")
        self.assertGreater(again["push"]["blobsSkipped"], 0, again["push"])
        self.wait_count(moved, self.count(moved) + 3)

    def test_two_restores_of_one_reference_download_each_blob_once(self):
        a = self.a.start_agent(*self.registry_flags())
        ref = self.ref("ml/counter", "twice")
        job, before = self.capture_with_push(a, "twice", ref)
        self.assertEqual(job["state"], "succeeded", f"{job}\n{a.log()}")
        gets_before = len(self.blob_gets())

        b = self.b.start_agent(*self.registry_flags())
        first = self.restore_via(b, {"snapshot": ref, "name": "one"})
        second = self.restore_via(b, {"snapshot": ref, "name": "two"})
        jobs = [self.wait_job(b, first), self.wait_job(b, second)]
        for j in jobs:
            self.assertEqual(j["state"], "succeeded", f"{j}\n{b.log()}")
            self.assert_counts_on(j["restoredPid"], before)
        self.assertEqual(sorted(w["name"] for w in self.b.workloads() if w["running"]), ["one", "two"])
        # One pull brought it; the other found it in the store.
        pulls = sorted((j["pull"] for j in jobs), key=lambda p: p["alreadyPresent"])
        self.assertEqual([p["alreadyPresent"] for p in pulls], [False, True], pulls)
        self.assertEqual(pulls[0]["bytesMoved"], pulls[0]["bytesTotal"])
        self.assertEqual(pulls[1]["bytesMoved"], 0)
        # And the registry served what one pull takes: each blob the snapshot
        # has once (a blob two of its files share, once for each).
        gets = self.blob_gets()[gets_before:]
        self.assertEqual(collections.Counter(d for d, _ in gets), self.blobs_of(self.a, job["snapshot"]))
        self.assertEqual({code for _, code in gets}, {"200"})

    def test_a_refused_push_fails_the_job_and_keeps_the_snapshot(self):
        if self.MODE == "plain":
            # Plain HTTP to a registry that speaks no HTTP at all: nothing listens there.
            flags = ["--plain-http"]
            ref = f"127.0.0.1:{base.free_port()}/ml/counter:lost"
        else:
            flags = ["--ca-file", self.registry.ca_file, "--registry-config", write_docker_config(
                os.path.join(self.tmp, "reader", "config.json"), self.registry.host,
                self.registry.reader_username, self.registry.reader_password)]  # may pull, not push
            ref = self.ref("ml/counter", "refused")
        a = self.a.start_agent(*flags)
        job, _ = self.capture_with_push(a, "refused", ref)
        self.assertEqual(job["state"], "failed", job)
        self.assertIn(f"snapshot `{job['snapshot']}` is in the store; pushing it to `{ref}` failed", job["error"])
        self.assertEqual(self.a.snapshot_ids(), [job["snapshot"]])
        self.assertFalse(job["push"]["done"], job["push"])
        self.assertNotIn("digest", job["push"])
        if self.MODE != "plain":
            self.assertNotIn(self.registry.reader_password, a.log() + job["error"])


class CaptureAndPushThenRestoreElsewhereOverTls(CaptureAndPushThenRestoreElsewhere):
    MODE = "tls-token"


class RestoreOfAReferenceOverTls(RestoreOfAReference):
    """The same through HTTPS with bearer tokens, the credentials in a
    docker config.json and the registry's CA given."""

    MODE = "tls-token"

    def test_without_credentials_the_pull_is_refused(self):
        ref = self.ref("ml/counter", "locked")
        self.captured_and_pushed("locked", ref)
        agent = self.b.start_agent("--ca-file", self.registry.ca_file,
                                   "--registry-config", write_docker_config(
                                       os.path.join(self.tmp, "wrong", "config.json"), self.registry.host,
                                       self.registry.username, "not-the-password"))
        job = self.wait_job(agent, self.restore_via(agent, {"snapshot": ref}))
        self.assertEqual(job["state"], "failed", job)
        self.assertRegex(job["error"], re.compile("401|unauthori|credential", re.I))
        self.assertEqual(self.b.snapshot_ids(), [])
        self.assertNotIn("not-the-password", agent.log() + job["error"])


if __name__ == "__main__":
    unittest.main()
