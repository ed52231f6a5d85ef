"""The agent's Kubernetes mode (`gpusnap agent --kube`) against the test bed
API server (tests/k8s/apiserver.py), over TLS with its kubeconfig: a
placeholder pod on the agent's node, whose container is a real runc
container running `gpusnap __placeholder`, gets the snapshot named by
gpusnap.io/restore-from restored into it, and the result recorded on the pod
(annotations and an Event).

- restored: the counter runs on in the container's pid namespace and cgroups,
  restore-status=restored, restore-job names the agent's job, a
  GpusnapRestored Event;
- a snapshot that does not exist: restore-status=failed with the reason, a
  GpusnapRestoreFailed Event, the placeholder idle, no retry;
- a second agent does not restore again; an agent killed during the restore
  leaves `restoring`, and the next one records what became of it; removing
  restore-status asks for a new attempt;
- the API server going away and coming back, and a resourceVersion it no
  longer has (410), are survived: pods created meanwhile are restored.

The pods' namespace has opted in (its Secret gpusnap, docs/KUBERNETES.md),
and the counters are containers of its pods (the kubelet's log links name
them): their snapshots are its own, which is all its placeholders may restore
(test_tenancy_kube.py tests the refusals)."""
import base64
import json
import os
import re
import socket
import sys
import threading
import time
import unittest

from test_restore_into_container import PlaceholderCase

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../k8s"))
import apiserver  # noqa: E402  (after the path is set)

NODE = "gpu-node-e2e"
NAMESPACE = "ml"
STATUS = "gpusnap.io/restore-status"


class TcpProxy:
    """A TCP relay to the API server that can be cut (listener and every
    connection closed, as when the server goes away) and resumed on the same port."""

    def __init__(self, target_port):
        self.target = ("127.0.0.1", target_port)
        self.port = 0
        self.conns = set()
        self.lock = threading.Lock()
        self.listener = None
        self.resume()

    def resume(self):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(16)
        self.port = s.getsockname()[1]
        self.listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _shut(*socks, close=False):
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            if close:
                s.close()

    def _pipe(self, src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        self._shut(src, dst)
        src.close()

    def cut(self):
        self._shut(self.listener, close=True)  # ends the accept() blocked on it, so the port is free
        with self.lock:
            conns, self.conns = self.conns, set()
        self._shut(*conns, close=True)


class KubeAgentCase(PlaceholderCase):
    def setUp(self):
        super().setUp()
        # A short history, so that a watch resuming after a few dozen changes gets 410.
        self.api = apiserver.LocalApiServer(workdir=os.path.join(self.tmp, "apiserver"), history=64)
        self.api.start()
        self.addCleanup(self.api.stop)  # after tearDown has stopped the agents
        self.api.add_node(NODE)
        self.api.ensure_namespace(NAMESPACE)
        # The namespace opts in, without registry credentials.
        self.api.create("secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gpusnap"},
                                    "type": "Opaque"}, NAMESPACE)

    def start_kube_agent(self, kubeconfig=None, env=None):
        return self.start_agent("--kube", "--node-name", NODE, "--kubeconfig", kubeconfig or self.api.kubeconfig,
                                "--kubelet-log-dir", self.kubelet_logs, env=env)

    def checkpoint_counter(self, agent, data=None, pod=None):
        """PlaceholderCase's counter, in a container of a pod of NAMESPACE:
        its snapshot is the namespace's."""
        return super().checkpoint_counter(agent, data, pod=pod or (NAMESPACE, "counter-source", "server"))

    def create_placeholder_pod(self, name, snapshot, container_id):
        """A pod as the webhook leaves a restore-from pod, bound to the agent's node
        and reported running with `container_id` as its placeholder container."""
        mutation = {"restore": {"container": "server", "gpus": 1, "snapshot": snapshot}}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": NAMESPACE,
                            "labels": {"gpusnap.io/placeholder": "true"},
                            "annotations": {"gpusnap.io/restore-from": snapshot,
                                            "gpusnap.io/mutation": json.dumps(mutation)}},
               "spec": {"containers": [{"name": "server", "image": "registry.example/counter:1",
                                        "command": ["/gpusnap/bin/gpusnap", "__placeholder"]}]}}
        self.api.create("pods", pod, NAMESPACE)
        return self.api.run_pod(NAMESPACE, name, NODE, container_ids={"server": "containerd://" + container_id})

    def wait_status(self, name, want=("restored", "failed"), timeout=120):
        def done(pod):
            return pod is not None and pod["metadata"].get("annotations", {}).get(STATUS) in want
        try:
            return self.api.wait_for("pods", name, NAMESPACE, done, timeout=timeout)
        except TimeoutError as e:
            self.fail(f"{e}\nagent log:\n{''.join(a.log() for a in self.agents)}")

    @staticmethod
    def annotations(pod):
        return pod["metadata"].get("annotations", {})

    def events_of(self, pod):
        return [e for e in self.api.events(NAMESPACE) if e["involvedObject"].get("uid") == pod["metadata"]["uid"]]

    def wait_events(self, pod, reason, count=1, timeout=30):
        """The pod's Events once `count` of them have `reason` (the agent posts them after the annotations)."""
        end = time.time() + timeout
        while time.time() < end:
            events = self.events_of(pod)
            if len([e for e in events if e["reason"] == reason]) >= count:
                return events
            time.sleep(0.1)
        self.fail(f"no {reason} Event for {pod['metadata']['name']}: {self.events_of(pod)}")

    def patches_of(self, name):
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
        return [r for r in self.api.requests if r["method"] == "PATCH" and r["path"] == path]

    def assert_restored(self, agent, pod, init, count_before=None):
        a = self.annotations(pod)
        self.assertEqual(a[STATUS], "restored", a)
        self.assertNotIn("gpusnap.io/restore-error", a)
        status, job = agent.request("GET", f"/v1/jobs/{a['gpusnap.io/restore-job']}")
        self.assertEqual((status, job["state"], job["kind"]), (200, "succeeded", "restore"), job)
        new_pid = job["restoredPid"]
        self.assert_restored_into(new_pid, init)
        if count_before is not None:
            self.assertGreaterEqual(self.count(new_pid), count_before)  # from where it was, not from 0
        self.wait_count(new_pid, self.count(new_pid) + 5)
        (event,) = self.wait_events(pod, "GpusnapRestored")
        self.assertEqual((event["reason"], event["type"]), ("GpusnapRestored", "Normal"), event)
        self.assertIn(job["id"], event["message"])
        self.assertEqual(event["involvedObject"]["fieldPath"], "spec.containers{server}")
        self.assertEqual(event["source"]["host"], NODE)
        return job


class PlaceholderRestores(KubeAgentCase):
    def test_placeholder_pod_restored_and_recorded(self):
        agent = self.start_kube_agent()
        agent.wait_line("kube: 0 placeholder pod(s) on node " + NODE)
        placeholder, init = self.start_placeholder()
        snapshot, count_before = self.checkpoint_counter(agent)

        self.create_placeholder_pod("counter-0", snapshot, placeholder)
        pod = self.wait_status("counter-0")
        job = self.assert_restored(agent, pod, init, count_before)
        self.assertEqual(job["restoredName"], "counter-0-" + pod["metadata"]["uid"][:8])
        # A job of the agent like any other: listed, and counted.
        self.assertEqual([j["kind"] for j in agent.request("GET", "/v1/jobs")[1]], ["restore", "checkpoint"])
        metrics = agent.request("GET", "/metrics")[1]
        self.assertIn('gpusnap_operations_total{kind="restore",result="succeeded"} 1', metrics)
        # The claim (with the pod's resourceVersion), the job's id, the result.
        self.assertEqual(len(self.patches_of("counter-0")), 3)
        self.assert_no_fail_in_logs()

    def test_missing_snapshot_recorded_as_failed_and_not_retried(self):
        agent = self.start_kube_agent()
        placeholder, init = self.start_placeholder()
        self.create_placeholder_pod("lost-0", "no-such-snapshot", placeholder)
        pod = self.wait_status("lost-0")
        a = self.annotations(pod)
        self.assertEqual(a[STATUS], "failed", a)
        self.assertIn("no-such-snapshot", a["gpusnap.io/restore-error"])
        (event,) = self.wait_events(pod, "GpusnapRestoreFailed")
        self.assertEqual((event["reason"], event["type"]), ("GpusnapRestoreFailed", "Warning"), event)
        self.assertIn("no-such-snapshot", event["message"])
        # The placeholder runs on, idle; nothing is tried again.
        time.sleep(3)
        self.assertEqual(self.container_init(placeholder), (init, "running"))
        self.assertEqual(self.children(init), [])
        self.assertEqual(len(self.patches_of("lost-0")), 2)  # the claim, the result
        self.assertEqual(len(self.events_of(pod)), 1)
        self.assertEqual(self.annotations(self.api.get("pods", "lost-0", NAMESPACE))[STATUS], "failed")
        self.assertIn("restore of `no-such-snapshot` refused", agent.log())

    def test_two_pods_from_one_snapshot(self):
        # The second restore waits for the first (one job per snapshot at a time), then runs.
        agent = self.start_kube_agent()
        first, first_init = self.start_placeholder()
        second, second_init = self.start_placeholder()
        snapshot, _ = self.checkpoint_counter(agent)
        self.create_placeholder_pod("replica-0", snapshot, first)
        self.create_placeholder_pod("replica-1", snapshot, second)
        self.assert_restored(agent, self.wait_status("replica-0"), first_init)
        self.assert_restored(agent, self.wait_status("replica-1"), second_init)
        self.assertEqual(len(agent.request("GET", "/v1/jobs")[1]), 3)

    def test_pods_of_other_nodes_and_pods_not_running_are_left_alone(self):
        agent = self.start_kube_agent()
        placeholder, init = self.start_placeholder()
        snapshot, _ = self.checkpoint_counter(agent)
        self.api.add_node("other-node")
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "elsewhere", "labels": {"gpusnap.io/placeholder": "true"},
                            "annotations": {"gpusnap.io/restore-from": snapshot}},
               "spec": {"containers": [{"name": "server", "image": "x"}]}}
        self.api.create("pods", pod, NAMESPACE)
        self.api.run_pod(NAMESPACE, "elsewhere", "other-node", container_ids={"server": "containerd://" + placeholder})
        waiting = dict(pod, metadata=dict(pod["metadata"], name="waiting"))
        self.api.create("pods", waiting, NAMESPACE)
        self.api.bind_pod(NAMESPACE, "waiting", NODE)  # scheduled here, its container not started yet
        time.sleep(3)
        for name in ("elsewhere", "waiting"):
            self.assertNotIn(STATUS, self.annotations(self.api.get("pods", name, NAMESPACE)))
            self.assertEqual(self.patches_of(name), [])
        self.assertEqual(self.children(init), [])
        # Once its container runs, the waiting pod is restored.
        self.api.run_pod(NAMESPACE, "waiting", NODE, container_ids={"server": "containerd://" + placeholder})
        self.assert_restored(agent, self.wait_status("waiting"), init)


class AgentRestarts(KubeAgentCase):
    def test_second_agent_does_not_restore_again(self):
        agent = self.start_kube_agent()
        placeholder, init = self.start_placeholder()
        snapshot, _ = self.checkpoint_counter(agent)
        self.create_placeholder_pod("counter-0", snapshot, placeholder)
        job = self.assert_restored(agent, self.wait_status("counter-0"), init)
        agent.stop()

        agent = self.start_kube_agent()
        agent.wait_line("kube: 1 placeholder pod(s) on node " + NODE)
        time.sleep(2)
        self.assertEqual([j["kind"] for j in agent.request("GET", "/v1/jobs")[1]], ["restore", "checkpoint"])
        pod = self.api.get("pods", "counter-0", NAMESPACE)
        self.assertEqual(self.annotations(pod)["gpusnap.io/restore-job"], job["id"])
        self.assertEqual(len(self.events_of(pod)), 1)
        self.assertEqual(self.children(init), [job["restoredPid"]])
        self.wait_count(job["restoredPid"], self.count(job["restoredPid"]) + 3)

    def test_agent_killed_during_the_restore_then_a_new_attempt(self):
        agent = self.start_kube_agent(env=dict(self.env, GPUSNAP_TEST_PAUSE_AT="restore-namespace"))
        placeholder, init = self.start_placeholder()
        snapshot, _ = self.checkpoint_counter(agent)
        self.create_placeholder_pod("counter-0", snapshot, placeholder)
        agent.wait_line("paused at restore-namespace")
        pod = self.wait_status("counter-0", want=("restoring",))
        self.api.wait_for("pods", "counter-0", NAMESPACE,
                          lambda p: "gpusnap.io/restore-job" in self.annotations(p))
        agent.kill()

        # The next agent finds the claim, and the job its journal says was cut short.
        agent = self.start_kube_agent()
        pod = self.wait_status("counter-0")
        a = self.annotations(pod)
        self.assertEqual(a[STATUS], "failed", a)
        self.assertIn("the agent stopped after phase `namespace`", a["gpusnap.io/restore-error"])
        (event,) = self.wait_events(pod, "GpusnapRestoreFailed")
        self.assertEqual(self.children(init), [])  # the placeholder is idle again

        # Removing restore-status asks for a new attempt (docs/KUBERNETES.md).
        self.api.patch("pods", "counter-0", {"metadata": {"annotations": {STATUS: None}}}, NAMESPACE)
        pod = self.wait_status("counter-0")
        self.assertEqual(self.annotations(pod)[STATUS], "restored", self.annotations(pod))
        events = self.wait_events(pod, "GpusnapRestored")
        self.assertEqual([e["reason"] for e in events], ["GpusnapRestoreFailed", "GpusnapRestored"])
        self.wait_count(self.children(init)[0], 3)


class ApiServerOutages(KubeAgentCase):
    def kubeconfig_through(self, proxy):
        with open(self.api.kubeconfig) as f:
            config = json.load(f)
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
        path = os.path.join(self.tmp, "kubeconfig-proxied")
        with open(path, "w") as f:
            json.dump(config, f)
        return path

    def test_outage_and_expired_resource_version_are_survived(self):
        proxy = TcpProxy(self.api.port)
        self.addCleanup(proxy.cut)
        agent = self.start_kube_agent(self.kubeconfig_through(proxy))
        agent.wait_line("kube: 0 placeholder pod(s)")
        first, first_init = self.start_placeholder()
        second, second_init = self.start_placeholder()
        snapshot, _ = self.checkpoint_counter(agent)
        data2 = os.path.join(self.data, "second")
        os.makedirs(data2)
        self.addCleanup(lambda: os.path.exists(shm := "/dev/shm/gpusnap-counter" + data2.replace("/", "_"))
                        and os.unlink(shm))
        snapshot2, _ = self.checkpoint_counter(agent, data2)

        # Away, then back: the watch resumes from where it was.
        proxy.cut()
        self.create_placeholder_pod("during-outage", snapshot, first)
        agent.wait_line("kube: watching placeholder pods:")
        time.sleep(1)
        proxy.resume()
        self.assert_restored(agent, self.wait_status("during-outage"), first_init)
        self.assertNotIn("too old", agent.log())

        # Away while more changes happen than the server keeps: 410, then a new list.
        broken = agent.log().count("kube: watching placeholder pods:")
        proxy.cut()
        agent.wait_line("kube: watching placeholder pods:", times=broken + 1)
        self.create_placeholder_pod("after-expiry", snapshot2, second)
        for i in range(80):
            self.api.patch("nodes", NODE, {"metadata": {"labels": {"churn": str(i)}}})
        proxy.resume()
        agent.wait_line("is too old for the API server: listing again")
        self.assert_restored(agent, self.wait_status("after-expiry"), second_init)
        agent.wait_line("kube: 2 placeholder pod(s) on node " + NODE)
        self.assertEqual(len(self.events_of(self.api.get("pods", "during-outage", NAMESPACE))), 1)

    def test_wrong_ca_is_refused_and_logged(self):
        with open(self.api.kubeconfig) as f:
            config = json.load(f)
        other = os.path.join(self.tmp, "other-ca")
        os.makedirs(other)
        with open(apiserver.make_ca(other, "other"), "rb") as f:
            config["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(f.read()).decode()
        path = os.path.join(self.tmp, "kubeconfig-wrong-ca")
        with open(path, "w") as f:
            json.dump(config, f)
        agent = self.start_kube_agent(path)
        line = agent.wait_line("kube: listing placeholder pods:")
        self.assertRegex(line, re.compile("SSL|certificate", re.I))
        self.assertEqual([r for r in self.api.requests if r["path"].startswith("/api/v1/pods")], [])


class Flags(KubeAgentCase):
    def test_kube_needs_a_node_name(self):
        env = {k: v for k, v in self.env.items() if k != "NODE_NAME"}
        p = self.gs("agent", "--socket", os.path.join(self.tmp, "a.sock"), "--kube", "--kubeconfig",
                    self.api.kubeconfig, check=False, env=env, timeout=30)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--kube needs this node's name", p.stderr)

    def test_node_name_from_the_environment(self):
        agent = self.start_agent("--kube", "--kubeconfig", self.api.kubeconfig, env=dict(self.env, NODE_NAME=NODE))
        agent.wait_line(f"kube: restoring into the placeholder pods of node {NODE}")

    def test_bad_kubeconfig_is_refused_at_start(self):
        path = os.path.join(self.tmp, "kubeconfig-cert")
        with open(path, "w") as f:
            f.write("apiVersion: v1\ncurrent-context: a\ncontexts:\n- name: a\n  context: {cluster: c, user: u}\n")
        p = self.gs("agent", "--socket", os.path.join(self.tmp, "a.sock"), "--kube", "--node-name", NODE,
                    "--kubeconfig", path, check=False, timeout=30)
        self.assertEqual(p.returncode, 1)
        self.assertIn("flow collections", p.stderr)
        p = self.gs("agent", "--socket", os.path.join(self.tmp, "b.sock"), "--kubeconfig", path, check=False,
                    timeout=30)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--kubeconfig is for --kube", p.stderr)


if __name__ == "__main__":
    unittest.main()
