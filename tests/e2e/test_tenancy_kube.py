"""Tenants are namespaces (docs/SECURITY.md): the attacks on the documented
Kubernetes path, each refused, on the test bed API server
(tests/k8s/apiserver.py) with the agent in its Kubernetes mode, real runc
containers, real CRIU, and a real registry (tests/e2e/registry.py, HTTPS with
bearer tokens) whose token server has one user per namespace and one of the
agent's own, and logs which user asked for access to which repository.

- a snapshot records the namespace and pod it was taken from, under its
  metadata digest;
- a placeholder of namespace team-b cannot restore team-a's snapshot, by id
  or by a reference it may pull from: failed, naming both namespaces, a
  Warning Event, the placeholder idle, the snapshot whole; once the
  administrator's configuration (--tenancy, read again at each use) lets
  team-b restore team-a's, it can;
- a snapshot taken outside Kubernetes (the CLI) is restored into no pod
  unless the configuration sets restoreUnowned;
- a gpusnap.io/push-to or gpusnap.io/restore-from naming a repository the
  namespace may not use is refused before anything is dumped or pulled, and
  the registry gets no request for it;
- a namespace without its Secret gpusnap has not opted in: its placeholders
  and its pods' checkpoints are refused before anything is pulled or dumped;
- each namespace's pulls and pushes carry its own Secret's credentials (the
  token server's log names the user behind every token), never the agent's
  own unless the configuration lends them (agentCredentials).

The Secrets are made with the kubectl commands docs/KUBERNETES.md shows."""
import base64
import json
import os
import shutil
import subprocess
import sys
import time
import unittest

from registry import Registry, write_docker_config
from test_restore_into_container import PlaceholderCase
from test_webhook import KUBECTL

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../k8s"))
import apiserver  # noqa: E402  (after the path is set)

NODE = "gpu-node-tenancy"
STATUS = "gpusnap.io/restore-status"
ERROR = "gpusnap.io/restore-error"


class TenancyCase(PlaceholderCase):
    """One node's agent (--kube --tenancy FILE), namespaces team-a and team-b
    opted in with their registry users' credentials, team-c not opted in."""

    def setUp(self):
        super().setUp()
        self.api = apiserver.LocalApiServer(workdir=os.path.join(self.tmp, "apiserver"))
        self.api.start()
        self.addCleanup(self.api.stop)  # after tearDown has stopped the agent
        self.api.add_node(NODE)
        for ns in ("team-a", "team-b", "team-c"):
            self.api.ensure_namespace(ns)
        self.registry = Registry(os.path.join(self.tmp, "registry"), "tls-token", users=("team-a", "team-b"))
        self.registry.start()
        self.addCleanup(self.registry.close)
        for ns in ("team-a", "team-b"):
            self.kubectl("create", "secret", "docker-registry", "gpusnap", "-n", ns,
                         f"--docker-server={self.registry.host}", f"--docker-username={ns}",
                         f"--docker-password={self.registry.passwords[ns]}")
        # The agent's own: the registry's first user, which no tenant is given.
        self.agent_config = write_docker_config(os.path.join(self.tmp, "agent-docker", "config.json"),
                                                self.registry.host, self.registry.username, self.registry.password)
        self.tenancy_file = os.path.join(self.tmp, "tenancy.json")
        self.set_tenancy({})

    def kubectl(self, *args):
        p = subprocess.run([KUBECTL, *args], env=self.api.kubectl_env(), capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout

    def set_tenancy(self, namespaces):
        """The administrator's configuration, replaced whole (as a ConfigMap's file is)."""
        tmp = self.tenancy_file + ".new"
        with open(tmp, "w") as f:
            json.dump({"namespaces": namespaces}, f)
        os.replace(tmp, self.tenancy_file)

    def repository(self, path):
        return f"{self.registry.host}/{path}"

    def start_kube_agent(self, *extra):
        agent = self.start_agent("--kube", "--node-name", NODE, "--kubeconfig", self.api.kubeconfig,
                                 "--kubelet-log-dir", self.kubelet_logs, "--tenancy", self.tenancy_file,
                                 "--ca-file", self.registry.ca_file, "--registry-config", self.agent_config, *extra)
        agent.wait_line(f"kube: 0 placeholder pod(s) on node {NODE}")
        return agent

    # --- pods -------------------------------------------------------------------
    def source_pod(self, ns, name, annotations=None, data=None):
        """A pod of `ns` whose container (a runc container, named by the
        kubelet's log link) counts: (its container id, the counter's pid)."""
        cid = self.start_container(self.counter_args(data), pod=(ns, name, "server"))
        pid = self.counter_in(cid)
        self.api.create("pods", {"metadata": {"name": name, "annotations": annotations or {}},
                                 "spec": {"containers": [{"name": "server", "image": "registry.example/counter:1"}]}},
                        ns)
        self.api.run_pod(ns, name, NODE, container_ids={"server": "containerd://" + cid})
        self.wait_count(pid, self.count(pid) + 1)
        return cid, pid

    def checkpoint(self, agent, body):
        return agent.request("POST", "/v1/checkpoints", dict(body, leaveRunning=False))

    def capture(self, agent, ns, name):
        status, reply = self.checkpoint(agent, {"pod": {"namespace": ns, "name": name, "container": "server"}})
        self.assertEqual(status, 202, reply)
        job = self.wait_job(agent, reply["job"])
        self.assertEqual(job["state"], "succeeded", f"{job}\n{agent.log()}")
        return job

    def placeholder(self, ns, name, restore_from):
        """A placeholder pod of `ns`, as the webhook leaves it, running in a
        runc container on the agent's node: the container's init."""
        cid, init = self.start_placeholder()
        mutation = {"restore": {"container": "server", "gpus": 1, "snapshot": restore_from}}
        self.api.create("pods", {
            "metadata": {"name": name, "labels": {"gpusnap.io/placeholder": "true"},
                         "annotations": {"gpusnap.io/restore-from": restore_from,
                                         "gpusnap.io/mutation": json.dumps(mutation)}},
            "spec": {"containers": [{"name": "server", "image": "registry.example/counter:1",
                                     "command": ["/gpusnap/bin/gpusnap", "__placeholder"]}]}}, ns)
        self.api.run_pod(ns, name, NODE, container_ids={"server": "containerd://" + cid})
        return init

    def wait_status(self, agent, ns, name):
        def done(pod):
            return pod is not None and pod["metadata"].get("annotations", {}).get(STATUS) in ("restored", "failed")
        try:
            return self.api.wait_for("pods", name, ns, done, timeout=120)["metadata"]["annotations"]
        except TimeoutError as e:
            self.fail(f"{e}\nagent log:\n{agent.log()}")

    def retry(self, ns, name):
        self.api.patch("pods", name, {"metadata": {"annotations": {STATUS: None}}}, ns)

    def warnings(self, ns, name, reason, count=1, timeout=30):
        """The Warning Events of `reason` on pod ns/name, once there are `count`."""
        end = time.time() + timeout
        while True:
            events = [e for e in self.api.events(ns)
                      if e["involvedObject"].get("name") == name and e["reason"] == reason]
            if len(events) >= count or time.time() > end:
                self.assertEqual(len(events), count, self.api.events(ns))
                self.assertEqual({e["type"] for e in events}, {"Warning"})
                return events
            time.sleep(0.1)

    def assert_refused_and_idle(self, agent, ns, name, init, *needles):
        a = self.wait_status(agent, ns, name)
        self.assertEqual(a[STATUS], "failed", f"{a}\n{agent.log()}")
        for needle in needles:
            self.assertIn(needle, a[ERROR])
        (event,) = self.warnings(ns, name, "GpusnapRestoreFailed")
        for needle in needles:
            self.assertIn(needle, event["message"])
        self.assertEqual(self.children(init), [])  # the placeholder is idle
        return a

    def assert_restored(self, agent, ns, name, init):
        a = self.wait_status(agent, ns, name)
        self.assertEqual(a[STATUS], "restored", f"{a}\n{agent.log()}")
        status, job = agent.request("GET", f"/v1/jobs/{a['gpusnap.io/restore-job']}")
        self.assertEqual(job["state"], "succeeded", job)
        self.assert_restored_into(job["restoredPid"], init)
        self.wait_count(job["restoredPid"], self.count(job["restoredPid"]) + 3)

    def meta(self, snapshot):
        with open(os.path.join(self.store, "snapshots", snapshot, "gpusnap.json")) as f:
            return json.load(f)

    def tokens(self, after=0):
        """The token server's log from entry `after` on: {"user" (None for
        none), "scopes", "status"}."""
        return self.registry.token_server.requests()[after:]

    def served(self):
        """What the registry was asked by others than this test's harness, refused requests too."""
        return [r for r in self.registry.served() if not r["agent"].startswith("Python-urllib")]


class Ownership(TenancyCase):
    def test_another_namespaces_snapshot_by_id_is_refused_until_the_administrator_allows_it(self):
        agent = self.start_kube_agent()
        self.source_pod("team-a", "counter-0")
        snapshot = self.capture(agent, "team-a", "counter-0")["snapshot"]
        # Recorded under the metadata's digest.
        meta = self.meta(snapshot)
        self.assertEqual(meta["owner"], {"namespace": "team-a", "pod": "counter-0"})
        self.assertEqual(meta["schema_version"], "1.7")

        init = self.placeholder("team-b", "thief", snapshot)
        self.assert_refused_and_idle(agent, "team-b", "thief", init, f"may not restore snapshot `{snapshot}`",
                                     "belongs to namespace `team-a`", "namespace `team-b`")
        self.gs("inspect", "--verify", snapshot)  # whole

        # The administrator lets team-b restore team-a's: the file is read again.
        self.set_tenancy({"team-b": {"restoreFrom": ["team-a"]}})
        self.retry("team-b", "thief")
        self.assert_restored(agent, "team-b", "thief", init)

    def test_a_changed_owner_fails_the_metadata_digest(self):
        agent = self.start_kube_agent()
        self.source_pod("team-a", "counter-0")
        snapshot = self.capture(agent, "team-a", "counter-0")["snapshot"]
        copy = os.path.join(self.tmp, "copied-store")
        shutil.copytree(os.path.join(self.store, "snapshots", snapshot), os.path.join(copy, "snapshots", snapshot))
        path = os.path.join(copy, "snapshots", snapshot, "gpusnap.json")
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(text.replace('"namespace": "team-a"', '"namespace": "team-b"'))
        p = self.gs("inspect", "--store", copy, snapshot, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("does not match its digest", p.stderr)

    def test_a_snapshot_taken_outside_kubernetes_only_with_restore_unowned(self):
        agent = self.start_kube_agent()
        cid = self.start_container(self.counter_args())
        self.counter_in(cid)
        snapshot = self.gs("checkpoint", cid).stdout.strip()  # the CLI, as root, in-process
        self.assertNotIn("owner", self.meta(snapshot))

        init = self.placeholder("team-a", "from-the-cli", snapshot)
        self.assert_refused_and_idle(agent, "team-a", "from-the-cli", init, "belongs to no namespace",
                                     "namespace `team-a`", "restoreUnowned")
        self.set_tenancy({"team-a": {"restoreUnowned": True}})
        self.retry("team-a", "from-the-cli")
        self.assert_restored(agent, "team-a", "from-the-cli", init)


class Registries(TenancyCase):
    def test_a_push_to_or_restore_from_another_namespaces_repository_is_refused_before_anything(self):
        self.set_tenancy({"team-a": {"repositories": [self.repository("team-a")]},
                          "team-b": {"repositories": [self.repository("team-b")]}})
        agent = self.start_kube_agent()
        stolen = self.repository("team-a/vllm:warm")
        cid, pid = self.source_pod("team-b", "pusher", {"gpusnap.io/push-to": stolen})
        for target in ({"pod": {"namespace": "team-b", "name": "pusher", "container": "server"}}, {"container": cid}):
            status, reply = self.checkpoint(agent, target)
            self.assertEqual(status, 403, reply)
            self.assertIn(f"pod team-b/pusher: annotation gpusnap.io/push-to `{stolen}` refused: namespace `team-b` "
                          f"may not use repository `{self.repository('team-a/vllm')}`", reply["error"])
        self.warnings("team-b", "pusher", "GpusnapPushRefused", count=2)
        # Nothing dumped, nothing pushed: the counter counts on, the store and
        # the registry have nothing of it.
        self.wait_count(pid, self.count(pid) + 3)
        self.assertFalse(os.path.isdir(os.path.join(self.store, "snapshots")) and
                         [n for n in os.listdir(os.path.join(self.store, "snapshots")) if not n.startswith(".")])
        self.assertEqual((self.served(), self.tokens()), ([], []))

        init = self.placeholder("team-b", "puller", stolen)
        self.assert_refused_and_idle(agent, "team-b", "puller", init,
                                     f"gpusnap.io/restore-from `{stolen}` refused",
                                     "namespace `team-b` may not use repository")
        self.assertEqual((self.served(), self.tokens()), ([], []))

    def test_each_namespace_pulls_and_pushes_with_its_own_credentials(self):
        shared = self.repository("shared")
        self.set_tenancy({"team-a": {"repositories": [shared]}, "team-b": {"repositories": [shared]}})
        agent = self.start_kube_agent()
        ref = self.repository("shared/counter:v1")
        self.source_pod("team-a", "counter-0", {"gpusnap.io/push-to": ref})
        job = self.capture(agent, "team-a", "counter-0")
        self.assertEqual((job["push"]["reference"], job["push"]["done"]), (ref, True), job["push"])
        pushed = self.tokens()
        self.assertTrue(pushed)
        self.assertEqual({(r["user"], r["status"]) for r in pushed}, {("team-a", 200)}, pushed)
        # Off the node: team-b's restore must pull it.
        status, _ = agent.request("DELETE", f"/v1/snapshots/{job['snapshot']}")
        self.assertEqual(status, 200)

        # team-b may pull from the repository, with its own credentials; the
        # snapshot it brings is team-a's, which it may not restore.
        init = self.placeholder("team-b", "thief", ref)
        self.assert_refused_and_idle(agent, "team-b", "thief", init, f"may not restore snapshot `{job['snapshot']}`",
                                     "belongs to namespace `team-a`", "namespace `team-b`")
        pulled = self.tokens(len(pushed))
        self.assertTrue(pulled)
        self.assertEqual({(r["user"], r["status"]) for r in pulled}, {("team-b", 200)}, pulled)
        self.assertEqual(self.snapshot_ids(), [])  # a refused pull joins no store

        self.set_tenancy({"team-a": {"repositories": [shared]},
                          "team-b": {"repositories": [shared], "restoreFrom": ["team-a"]}})
        self.retry("team-b", "thief")
        self.assert_restored(agent, "team-b", "thief", init)
        after = self.tokens(len(pushed))
        self.assertEqual({(r["user"], r["status"]) for r in after}, {("team-b", 200)}, after)
        # The namespaces' credentials in files of the agent's run directory, for root only, and never in its log.
        path = os.path.join(self.run_dir, "agent", "namespaces", "team-b.json")
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        self.assertEqual(os.stat(os.path.dirname(path)).st_mode & 0o777, 0o700)
        for password in self.registry.passwords.values():
            self.assertNotIn(password, agent.log())

    def test_the_agents_own_credentials_serve_a_namespace_only_where_lent(self):
        # team-b opts in without credentials: its pulls are anonymous, which
        # this registry refuses, unless the administrator lends the agent's.
        self.kubectl("delete", "secret", "gpusnap", "-n", "team-b")
        self.kubectl("create", "secret", "generic", "gpusnap", "-n", "team-b")
        self.set_tenancy({"team-b": {"repositories": [self.repository("team-b")]}})
        agent = self.start_kube_agent()
        ref = self.repository("team-b/nothing:v1")
        init = self.placeholder("team-b", "anonymous", ref)
        a = self.assert_refused_and_idle(agent, "team-b", "anonymous", init, ref)
        anonymous = self.tokens()
        self.assertTrue(anonymous, a)
        self.assertEqual({(r["user"], r["status"]) for r in anonymous}, {(None, 401)}, anonymous)

        self.set_tenancy({"team-b": {"repositories": [self.repository("team-b")], "agentCredentials": True}})
        self.retry("team-b", "anonymous")
        self.wait_status(agent, "team-b", "anonymous")  # failed again: the registry has no such snapshot
        lent = self.tokens(len(anonymous))
        self.assertTrue(lent)
        self.assertEqual({(r["user"], r["status"]) for r in lent}, {(self.registry.username, 200)}, lent)

    def snapshot_ids(self):
        d = os.path.join(self.store, "snapshots")
        return sorted(n for n in os.listdir(d) if not n.startswith(".")) if os.path.isdir(d) else []


class OptIn(TenancyCase):
    def test_a_namespace_without_its_secret_is_refused_before_anything_is_pulled_or_dumped(self):
        self.set_tenancy({"team-c": {"repositories": [self.repository("team-c")]}})
        agent = self.start_kube_agent()
        ref = self.repository("team-c/counter:v1")
        init = self.placeholder("team-c", "restored", ref)
        self.assert_refused_and_idle(agent, "team-c", "restored", init,
                                     "namespace `team-c` has not opted in to gpusnap: it has no Secret `gpusnap`")
        self.assertEqual((self.served(), self.tokens()), ([], []))

        cid, pid = self.source_pod("team-c", "counter-0")
        for target in ({"pod": {"namespace": "team-c", "name": "counter-0", "container": "server"}},
                       {"container": cid}):
            status, reply = self.checkpoint(agent, target)
            self.assertEqual(status, 403, reply)
            self.assertIn("pod team-c/counter-0: namespace `team-c` has not opted in to gpusnap", reply["error"])
        self.wait_count(pid, self.count(pid) + 3)  # not dumped
        self.assertEqual(agent.request("GET", "/v1/jobs")[1], [])

        # Opted in, with no credentials (docs/KUBERNETES.md): the agent takes it.
        self.kubectl("create", "secret", "generic", "gpusnap", "-n", "team-c")
        job = self.capture(agent, "team-c", "counter-0")
        self.assertEqual(self.meta(job["snapshot"])["owner"], {"namespace": "team-c", "pod": "counter-0"})


class TheAdministratorsFile(TenancyCase):
    def test_a_bad_file_refuses_the_start_and_one_gone_bad_refuses_what_needs_it(self):
        self.set_tenancy({"team-a": {"restoreFrom": ["Team_B"]}})
        p = self.gs("agent", "--socket", os.path.join(self.tmp, "bad.sock"), "--kube", "--node-name", NODE,
                    "--kubeconfig", self.api.kubeconfig, "--tenancy", self.tenancy_file, check=False, timeout=60)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(f"tenancy configuration `{self.tenancy_file}`: `namespaces.team-a.restoreFrom[0]` is "
                      "\"Team_B\", not a namespace name or \"*\"", p.stderr)
        p = self.gs("agent", "--socket", os.path.join(self.tmp, "nokube.sock"), "--tenancy", self.tenancy_file,
                    check=False, timeout=60)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("--tenancy is for --kube", p.stderr)

        # Good at the start, bad later: what needs it is refused (fail closed), and the log says why once.
        self.set_tenancy({})
        agent = self.start_kube_agent()
        with open(self.tenancy_file, "w") as f:
            f.write('{"namespaces": {"team-a": {"restoreUnowned": "yes"}}}')
        init = self.placeholder("team-a", "while-bad", "some-snapshot")
        self.assert_refused_and_idle(agent, "team-a", "while-bad", init,
                                     "`namespaces.team-a.restoreUnowned` is \"yes\", not true or false")
        self.assertEqual(agent.log().count("what needs it is refused until it is fixed"), 1, agent.log())


if __name__ == "__main__":
    unittest.main()
