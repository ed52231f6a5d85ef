"""Snapshots that travel from node to node through a registry, on the
Kubernetes test bed (tests/k8s/apiserver.py): two nodes on this machine, each
with its agent in the Kubernetes mode (its own store, run directory and
socket), the real `gpusnap webhook` called by the test bed, one registry
over HTTPS with basic auth (tests/e2e/registry.py). The pods' namespace has
opted in with its registry user's credentials in its Secret gpusnap, and
the tenancy configuration (--tenancy) gives it its repository; the agents'
own credentials, in a kubernetes.io/dockerconfigjson Secret of
gpusnap-system, hold a password the registry refuses, so a pull or push that
succeeds carried the namespace's. Both are read through the API server. The
containers are real runc containers, the pods are the test bed's: the test
plays the scheduler and the kubelet.

- a pod on node A whose annotation gpusnap.io/push-to names a reference is
  checkpointed by node A's agent, which pushes the snapshot there with the
  namespace's credentials;
- a pod created with gpusnap.io/restore-from: <that reference> becomes a
  placeholder (the webhook lets the reference through, and mounts no
  snapshot: there is none on the node yet); bound to node B and running,
  node B's agent pulls what its store lacks and restores into it: the
  counter counts on from where it was, in the placeholder's namespaces; the
  pod shows the pull and the restore going on together (the agent held once
  the snapshot's files are in, by GPUSNAP_TEST_PAUSE_AT=restore-pull-files:
  gpusnap.io/restore-progress), then the result, and its Event names the
  reference and the digest; the pull too carries the namespace's
  credentials, never the agents';
- the Secret's credentials land in a 0600 file of the agent's run directory
  and never in its log; a missing Secret, or one of another type, refuses
  the agent's start."""
import base64
import json
import os
import re
import subprocess
import sys
import threading
import time
import unittest

from harness import GPUSNAP
from registry import Registry
from test_distribution_nodes import Node, stop_nodes
from test_restore_into_container import PlaceholderCase

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../k8s"))
import apiserver  # noqa: E402  (after the path is set)

NAMESPACE = "ml"
SYSTEM = "gpusnap-system"
SECRET = "registry-pull"
STATUS = "gpusnap.io/restore-status"
PROGRESS = "gpusnap.io/restore-progress"


class Webhook:
    """`gpusnap webhook` over HTTPS, called by the test bed for every pod
    created (failurePolicy Fail: a pod it did not see is not created)."""

    SERVICE = ("gpusnap-system", "gpusnap-webhook")

    def __init__(self, case, api):
        d = os.path.join(case.tmp, "webhook")
        os.makedirs(d)
        ca = apiserver.make_ca(d, "webhook-ca")
        cert, key = apiserver.issue_certificate(d, "webhook-ca", "webhook", dns=(f"{self.SERVICE[1]}.{SYSTEM}.svc",))
        self.proc = subprocess.Popen([GPUSNAP, "webhook", "--cert", cert, "--key", key, "--listen", "127.0.0.1:0"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines, self.cond = [], threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        port = int(self.wait_line("listening on https://").rsplit(":", 1)[1].split()[0])
        api.set_service(*self.SERVICE, "127.0.0.1", port)
        with open(ca, "rb") as f:
            ca_bundle = base64.b64encode(f.read()).decode()
        api.create("mutatingwebhookconfigurations", {
            "metadata": {"name": "gpusnap"},
            "webhooks": [{"name": "pods.gpusnap.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                          "failurePolicy": "Fail", "timeoutSeconds": 10,
                          "clientConfig": {"service": {"namespace": SYSTEM, "name": self.SERVICE[1],
                                                       "path": "/mutate", "port": 443},
                                           "caBundle": ca_bundle},
                          "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                     "resources": ["pods"], "scope": "Namespaced"}]}]})

    def _read(self):
        for line in self.proc.stderr:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()

    def wait_line(self, needle, timeout=30):
        with self.cond:
            if not self.cond.wait_for(lambda: any(needle in line for line in self.lines) or self.proc.poll() is not None,
                                      timeout):
                raise TimeoutError(f"webhook never logged {needle!r}: {''.join(self.lines)}")
            return next(line for line in self.lines if needle in line)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()


class TwoKubeNodes(PlaceholderCase):
    """Nodes node-a and node-b of one test bed API server, a TLS registry
    with basic auth, its credentials in a Secret (no tests of its own)."""

    def setUp(self):
        super().setUp()
        self.api = apiserver.LocalApiServer(workdir=os.path.join(self.tmp, "apiserver"))
        self.api.start()
        self.addCleanup(self.api.stop)  # after tearDown has stopped the agents
        for name in (NAMESPACE, SYSTEM):
            self.api.ensure_namespace(name)
        self.a, self.b = Node(self, "node-a"), Node(self, "node-b")
        for node in (self.a, self.b):
            self.api.add_node(node.name)
        self.registry = Registry(os.path.join(self.tmp, "registry"), "tls-basic", users=(NAMESPACE,))
        self.registry.start()
        self.addCleanup(self.registry.close)
        self.docker_config = json.dumps({"auths": {self.registry.host: {"auth": base64.b64encode(
            f"{self.registry.username}:not-{self.registry.password}".encode()).decode()}}})
        self.api.create("secrets", self.secret(SECRET, self.docker_config), SYSTEM)
        # The namespace opts in with its own user's credentials; the
        # administrator gives it its repository.
        self.api.create("secrets", self.secret("gpusnap", self.credentials(NAMESPACE)), NAMESPACE)
        self.tenancy = os.path.join(self.tmp, "tenancy.json")
        with open(self.tenancy, "w") as f:
            json.dump({"namespaces": {NAMESPACE: {"repositories": [f"{self.registry.host}/{NAMESPACE}"]}}}, f)
        self.webhook = Webhook(self, self.api)
        self.addCleanup(self.webhook.stop)
        self.resume_files = []

    def tearDown(self):
        for path in self.resume_files:  # no agent is left paused
            open(path, "a").close()
        stop_nodes(self, (self.a, self.b))
        super().tearDown()

    def credentials(self, user):
        return json.dumps({"auths": {self.registry.host: {"auth": base64.b64encode(
            f"{user}:{self.registry.passwords[user]}".encode()).decode()}}})

    @staticmethod
    def secret(name, config, kind="kubernetes.io/dockerconfigjson"):
        return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": kind,
                "data": {".dockerconfigjson": base64.b64encode(config.encode()).decode()}}

    def agent_flags(self, node, secret=SECRET):
        return ["--kube", "--node-name", node.name, "--kubeconfig", self.api.kubeconfig,
                "--kubelet-log-dir", self.kubelet_logs, "--registry-secret", f"{SYSTEM}/{secret}",
                "--ca-file", self.registry.ca_file, "--tenancy", self.tenancy]

    def start_kube_agent(self, node, env=None):
        agent = node.start_agent(*self.agent_flags(node), env=env)
        agent.wait_line(f"kube: 0 placeholder pod(s) on node {node.name}")
        return agent

    def ref(self, repository, tag):
        return f"{self.registry.host}/{repository}:{tag}"

    @staticmethod
    def annotations(pod):
        return pod["metadata"].get("annotations", {})

    def events_of(self, pod):
        return [e for e in self.api.events(NAMESPACE) if e["involvedObject"].get("uid") == pod["metadata"]["uid"]]

    def wait_events(self, pod, reason, timeout=30):
        """The pod's Events of `reason`, once there is one (posted after the annotations)."""
        end = time.time() + timeout
        while time.time() < end:
            events = [e for e in self.events_of(pod) if e["reason"] == reason]
            if events:
                return events
            time.sleep(0.1)
        self.fail(f"no {reason} Event for {pod['metadata']['name']}: {self.events_of(pod)}")


class PlaceholderFromAReference(TwoKubeNodes):
    def test_a_pod_captured_on_node_a_is_restored_into_a_placeholder_on_node_b(self):
        # Node B's agent stops once the snapshot's files are pulled (its chunks
        # arrive as it restores), until told to go on: the pod is seen showing it.
        resume = os.path.join(self.tmp, "resume-restore-pull-files")
        self.resume_files.append(resume)
        agent_a = self.start_kube_agent(self.a)
        agent_b = self.start_kube_agent(self.b, env={"GPUSNAP_TEST_PAUSE_AT": "restore-pull-files",
                                                     "GPUSNAP_TEST_RESUME_FILE": resume})
        ref = self.ref("ml/counter", "from-node-a")

        # Node A: a pod whose container counts, and which asks to be pushed.
        source = self.start_container(self.counter_args(), pod=(NAMESPACE, "counter-0", "server"))
        pid = self.counter_in(source)
        self.api.create("pods", {"metadata": {"name": "counter-0", "annotations": {"gpusnap.io/push-to": ref}},
                                 "spec": {"containers": [{"name": "server", "image": "registry.example/counter:1"}]}},
                        NAMESPACE)
        self.api.run_pod(NAMESPACE, "counter-0", self.a.name, container_ids={"server": "containerd://" + source})
        before = self.count(pid)
        captured = self.wait_job(agent_a, self.checkpoint_via(
            agent_a, {"pod": {"namespace": NAMESPACE, "name": "counter-0", "container": "server"}}))
        self.assertEqual(captured["state"], "succeeded", f"{captured}\n{agent_a.log()}")
        self.assertEqual((captured["push"]["reference"], captured["push"]["done"]), (ref, True), captured["push"])
        digest = captured["push"]["digest"]
        self.assertTrue(self.wait_gone(pid))

        # Node B: a pod that restores from the reference, made a placeholder by the webhook.
        placeholder, init = self.start_placeholder()
        self.api.create("pods", {
            "metadata": {"name": "counter-restored", "annotations": {"gpusnap.io/restore-from": ref}},
            "spec": {"containers": [{"name": "server", "image": "registry.example/counter:1",
                                     "command": ["/counter"]}]}}, NAMESPACE)
        pod = self.api.get("pods", "counter-restored", NAMESPACE)
        self.assertEqual(pod["metadata"]["labels"], {"gpusnap.io/placeholder": "true"})
        self.assertEqual(json.loads(self.annotations(pod)["gpusnap.io/mutation"])["restore"],
                         {"container": "server", "gpus": 1, "snapshot": ref})
        container = pod["spec"]["containers"][0]
        self.assertEqual(container["command"][1:], ["__placeholder"])
        self.assertEqual([v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v],
                         ["/var/lib/gpusnap/bundle"])  # nothing of the store
        self.assertEqual(self.b.snapshot_ids(), [])  # nothing of it on node B yet

        self.api.run_pod(NAMESPACE, "counter-restored", self.b.name,
                         container_ids={"server": "containerd://" + placeholder})
        agent_b.wait_line("paused at restore-pull-files")
        pod = self.api.wait_for("pods", "counter-restored", NAMESPACE,
                                lambda p: self.annotations(p).get(PROGRESS, "").endswith("pull-files done"),
                                timeout=30)
        a = self.annotations(pod)
        self.assertEqual(a[STATUS], "restoring", a)
        self.assertRegex(a[PROGRESS], rf"^(pulling {re.escape(ref)}|pull: .*); restoring, pull-files done$")
        # Its files are in the pull's staging; it joins the store once restored.
        self.assertEqual(self.b.snapshot_ids(), [])
        self.assertEqual(self.children(init), [])
        open(resume, "w").close()
        pod = self.api.wait_for("pods", "counter-restored", NAMESPACE,
                                lambda p: self.annotations(p).get(STATUS) in ("restored", "failed"), timeout=120)
        a = self.annotations(pod)
        self.assertEqual(a[STATUS], "restored", f"{a}\n{agent_b.log()}")
        self.assertNotIn(PROGRESS, a)  # the result took its place

        status, job = agent_b.request("GET", f"/v1/jobs/{a['gpusnap.io/restore-job']}")
        self.assertEqual((status, job["state"]), (200, "succeeded"), job)
        self.assertEqual((job["pull"]["reference"], job["pull"]["digest"]), (ref, digest))
        self.assertEqual(job["snapshot"], captured["snapshot"])
        self.assertEqual(self.b.snapshot_ids(), [captured["snapshot"]])
        new_pid = job["restoredPid"]
        self.assert_restored_into(new_pid, init)
        self.assertGreaterEqual(self.count(new_pid), before)  # from where it was, not from 0
        self.wait_count(new_pid, self.count(new_pid) + 5)
        # Node A's agent restores nothing of node B's.
        self.assertEqual([j["kind"] for j in agent_a.request("GET", "/v1/jobs")[1]], ["checkpoint"])

        (event,) = self.wait_events(pod, "GpusnapRestored")
        self.assertIn(f"pulled from {ref}, {digest}", event["message"])
        self.assertEqual(event["source"]["host"], self.b.name)

    def test_the_secrets_credentials_stay_in_a_file_of_the_run_directory(self):
        agent = self.start_kube_agent(self.b)
        path = os.path.join(self.b.run_dir, "agent", "registry-auth.json")
        self.assertIn(f"registry: credentials from Secret {SYSTEM}/{SECRET}, kept in {path}", agent.log())
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        self.assertEqual(os.stat(os.path.dirname(path)).st_mode & 0o777, 0o700)
        with open(path) as f:
            self.assertEqual(json.load(f), json.loads(self.docker_config))
        for password in self.registry.passwords.values():
            self.assertNotIn(password, agent.log())
        auth = json.loads(self.docker_config)["auths"][self.registry.host]["auth"]
        self.assertNotIn(auth, agent.log())

    def test_a_missing_secret_or_one_of_another_type_refuses_the_start(self):
        self.api.create("secrets", self.secret("opaque", self.docker_config, kind="Opaque"), SYSTEM)
        for secret, why in (("missing", f"reading registry credentials from Secret {SYSTEM}/missing"),
                            ("opaque", f"Secret {SYSTEM}/opaque has type `Opaque`")):
            p = self.gs("agent", "--socket", os.path.join(self.tmp, f"{secret}.sock"), *self.agent_flags(self.b, secret),
                        check=False, env=self.b.env, timeout=60)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn(why, p.stderr)
            self.assertNotIn(self.registry.password, p.stderr)
        p = self.gs("agent", "--socket", os.path.join(self.tmp, "x.sock"), "--registry-secret", f"{SYSTEM}/{SECRET}",
                    check=False, env=self.b.env, timeout=60)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("--registry-secret needs --kube", p.stderr)


if __name__ == "__main__":
    unittest.main()
