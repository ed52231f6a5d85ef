"""The Kubernetes path through the test bed (tests/k8s/apiserver.py), with the
real kubectl and the real `gpusnap webhook`: `kubectl apply` of deploy/'s
MutatingWebhookConfiguration (rendered with the caBundle of
deploy/webhook-cert.sh), then `kubectl create` of the fixture pods.

- an annotated pod comes back with the shim, the store and LD_PRELOAD; a pod
  without the annotation comes back unchanged (the matchConditions keep it
  from the webhook); the fixtures carry exactly what the server adds;
- webhook down: the pod is created unchanged (failurePolicy Ignore), and a
  Fail copy of the configuration rejects it; a wrong caBundle or a
  certificate for another Service name fails TLS verification and Ignore
  admits unchanged; a webhook slower than timeoutSeconds is cut off;
- `kubectl get pods -w` sees an annotation made by `kubectl annotate`; a
  restore-from pod becomes a placeholder that a watch like the agent's
  (label and spec.nodeName) sees once it is bound to the node;
- a namespace opts in as docs/KUBERNETES.md shows (`kubectl create secret
  docker-registry gpusnap`, or `generic` without credentials), and the
  Secret reaches the server as the agent reads it.

`TestBedContract` checks the server itself as the agent uses it: bearer
token, CA, list+watch with selectors, merge and JSON patches, Events,
Status objects. Exits 77 (skipped) without kubectl, as test_webhook does."""
import base64
import http.client
import http.server
import json
import os
import queue
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import unittest

import test_webhook as tw
import test_webhook_deploy as twd

sys.path.insert(0, os.path.join(tw.REPO, "tests/k8s"))
import apiserver  # noqa: E402  (after the path is set)

SERVICE = ("gpusnap-system", "gpusnap-webhook")
BUNDLE_HOST_PATH = "/var/lib/gpusnap/bundle"
STORE_HOST_PATH = "/var/lib/gpusnap/pods"


class FakeWebhook:
    """An HTTPS server standing in for a webhook that misbehaves: `answer(review)` returns
    (status, body) or None to never answer (until stop)."""

    def __init__(self, directory, host_name, answer):
        apiserver.make_ca(directory, "fake-ca")
        cert, key = apiserver.issue_certificate(directory, "fake-ca", "fake", dns=(host_name,))
        with open(os.path.join(directory, "fake-ca.crt"), "rb") as f:
            self.ca_bundle = base64.b64encode(f.read()).decode()
        self.released = threading.Event()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                out = answer(review)
                if out is None:
                    fake.released.wait(60)
                    return
                status, body = out
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def allow(review, **response):
    return 200, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "response": dict({"uid": review["request"]["uid"], "allowed": True}, **response)}


def json_patch(ops):
    return {"patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(ops).encode()).decode()}


def is_token_volume(volume):
    return volume["name"].startswith("kube-api-access-")


def as_written_by_a_user(fixture):
    """A fixture pod without what kube-apiserver adds before admission (the inverse of its
    defaults and of the ServiceAccount, Priority and DefaultTolerationSeconds plugins)."""
    pod = json.loads(json.dumps(fixture))
    del pod["metadata"]["creationTimestamp"], pod["status"]
    spec = pod["spec"]
    for k in ("restartPolicy", "terminationGracePeriodSeconds", "dnsPolicy", "serviceAccountName", "serviceAccount",
              "securityContext", "schedulerName", "priority", "enableServiceLinks", "preemptionPolicy"):
        if k != "restartPolicy" or spec[k] == "Always":
            spec.pop(k, None)
    spec["tolerations"] = [t for t in spec["tolerations"] if not t["key"].startswith("node.kubernetes.io/")]
    spec["volumes"] = [v for v in spec["volumes"] if not is_token_volume(v)]
    for c in spec.get("initContainers", []) + spec["containers"]:
        c["volumeMounts"] = [m for m in c.get("volumeMounts", []) if "kube-api-access" not in m["name"]]
        for k in ("terminationMessagePath", "terminationMessagePolicy", "imagePullPolicy"):
            del c[k]
        if "readinessProbe" in c:
            c["readinessProbe"] = {"httpGet": {"path": c["readinessProbe"]["httpGet"]["path"],
                                               "port": c["readinessProbe"]["httpGet"]["port"]}}
        res = c.pop("resources")
        limits = res.get("limits", {})
        requests = {k: v for k, v in res.get("requests", {}).items() if limits.get(k) != v}  # defaulted
        if limits:
            c["resources"] = {"limits": limits}
        if requests:
            c.setdefault("resources", {})["requests"] = requests
        for k in [k for k, v in c.items() if v == []]:
            del c[k]
    pod["spec"] = {k: v for k, v in spec.items() if v != []}
    return pod


def without_gpusnap_annotations(pod):
    for key in ("gpusnap.io/gpushare", "gpusnap.io/restore-from"):
        pod["metadata"].get("annotations", {}).pop(key, None)
    return pod


class KubectlOnTestBed(twd.OverlayCertificate, tw.WebhookCase):
    """The real webhook (deploy/webhook-cert.sh's certificate) behind a test bed API server,
    with deploy/'s MutatingWebhookConfiguration applied and the namespace `inference`."""

    def setUp(self):
        super().setUp()
        self.api = apiserver.LocalApiServer(workdir=os.path.join(self.tmp, "apiserver"))
        try:
            self.api.set_service(*SERVICE, "127.0.0.1", self.port)
            self.api.start()
            self.mwc = twd.find(self.overlay, "MutatingWebhookConfiguration")
            self.kubectl("create", "namespace", "inference")
            self.apply(self.mwc)
        except BaseException:
            self.tearDown()  # unittest skips tearDown when setUp fails: stop the webhook
            raise

    def tearDown(self):
        self.api.stop()
        super().tearDown()

    # --- kubectl --------------------------------------------------------------
    def kubectl(self, *args, check=True, timeout=60):
        p = subprocess.run([tw.KUBECTL, *args], capture_output=True, text=True, env=self.api.kubectl_env(),
                           timeout=timeout)
        if check and p.returncode != 0:
            self.fail(f"kubectl {' '.join(args)} failed ({p.returncode}): {p.stderr}")
        return p

    def write(self, name, obj):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            json.dump(obj, f)
        return path

    def apply(self, mwc):
        p = self.kubectl("apply", "-f", self.write("mwc.json", mwc))
        self.assertIn("mutatingwebhookconfiguration.admissionregistration.k8s.io/gpusnap", p.stdout)

    def configure(self, **changes):
        """Applies deploy/'s configuration with webhook fields changed (kubectl apply: a strategic merge patch)."""
        mwc = json.loads(json.dumps(self.mwc))
        for k, v in changes.items():
            if k == "clientConfig":
                mwc["webhooks"][0]["clientConfig"].update(v)
            else:
                mwc["webhooks"][0][k] = v
        self.apply(mwc)
        stored = self.api.get("mutatingwebhookconfigurations", "gpusnap")
        for k, v in changes.items():
            if k != "clientConfig":
                self.assertEqual(stored["webhooks"][0][k], v)

    def create(self, pod, check=True):
        """kubectl create -o json; returns (pod or None, kubectl's stderr)."""
        p = self.kubectl("create", "-o", "json", "-f", self.write("pod.json", pod), check=check)
        return (json.loads(p.stdout) if p.returncode == 0 else None), p.stderr

    def calls(self, outcome=None):
        return [c for c in self.api.admission_calls if outcome is None or c["outcome"] == outcome]

    def assert_unchanged(self, created, sent):
        """`created` is `sent` as the server stores it, with no gpusnap mutation."""
        self.assertEqual(created["spec"], sent["spec"])
        self.assertEqual(created["metadata"].get("annotations"), sent["metadata"].get("annotations"))
        self.assertEqual(created["metadata"].get("labels"), sent["metadata"].get("labels"))

    def fake(self, answer, timeout=None, policy="Ignore"):
        """A FakeWebhook answering `answer`, configured in place of the real one."""
        host = "fake.gpusnap-system.svc"
        d = os.path.join(self.tmp, "fake")
        os.makedirs(d)
        hook = FakeWebhook(d, host, answer)
        self.addCleanup(hook.stop)
        self.api.set_service("gpusnap-system", "fake", "127.0.0.1", hook.port)
        service = dict(self.mwc["webhooks"][0]["clientConfig"]["service"], name="fake")
        changes = {"clientConfig": {"service": service, "caBundle": hook.ca_bundle}, "failurePolicy": policy}
        if timeout:
            changes["timeoutSeconds"] = timeout
        self.configure(**changes)
        return hook

    # --- a watch through kubectl ---------------------------------------------------
    def watch(self, *args):
        """Starts `kubectl get pods -w -o json --output-watch-events ARGS`; returns a queue of events.
        Returns once the server serves the watch, so nothing done next is missed."""
        before = self.api.request_count
        proc = subprocess.Popen([tw.KUBECTL, "get", "pods", "-w", "-o", "json", "--output-watch-events", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.api.kubectl_env())
        self.addCleanup(proc.stderr.close)
        self.addCleanup(proc.stdout.close)
        self.addCleanup(proc.wait, 10)
        self.addCleanup(proc.kill)
        events = queue.Queue()

        def read():
            decoder, buf = json.JSONDecoder(), ""
            for line in proc.stdout:
                buf += line
                try:
                    obj, end = decoder.raw_decode(buf.strip())
                except ValueError:
                    continue
                events.put(obj)
                buf = buf.strip()[end:]
        threading.Thread(target=read, daemon=True).start()
        self.api.wait_for_request(lambda r: r.get("watching"), after=before)
        return events

    def next_event(self, events, predicate, timeout=15):
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            try:
                ev = events.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            seen.append((ev["type"], ev["object"]["metadata"].get("resourceVersion")))
            if predicate(ev):
                return ev
        self.fail(f"no such watch event; saw {seen}")


def volume_with_host_path(pod, path):
    return next(v for v in pod["spec"]["volumes"] if (v.get("hostPath") or {}).get("path") == path)


class Admission(KubectlOnTestBed):
    def test_annotated_pod_gets_shim_store_and_ld_preload(self):
        sent = tw.fixture("gpushare-vllm.json")
        pod, _ = self.create(sent)
        self.assertTrue(pod["metadata"]["name"].startswith("vllm-7d9f8c6b5-"))
        self.assertTrue(pod["metadata"]["uid"])
        self.assertEqual(pod["status"]["phase"], "Pending")
        c = tw.container(pod, "vllm")
        self.assertEqual(tw.env(c, "LD_PRELOAD"), {"name": "LD_PRELOAD", "value": tw.SHIM})
        self.assertEqual(tw.env(c, "GPUSNAP_CHUNK_STORE")["value"], "/gpusnap-store")
        # The server defaults the fieldRef's apiVersion after the patch, as kube-apiserver does.
        self.assertEqual(tw.env(c, "GPUSNAP_POD_UID")["valueFrom"],
                         {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}})
        bundle, store = tw.mount(c, "/gpusnap"), tw.mount(c, "/gpusnap-store")
        self.assertIs(bundle["readOnly"], True)
        self.assertEqual(store["subPathExpr"], "$(GPUSNAP_POD_UID)")
        self.assertEqual(volume_with_host_path(pod, BUNDLE_HOST_PATH)["name"], bundle["name"])
        self.assertEqual(volume_with_host_path(pod, STORE_HOST_PATH)["name"], store["name"])
        self.assertEqual(json.loads(pod["metadata"]["annotations"]["gpusnap.io/mutation"]), {"gpushare": ["vllm"]})
        self.assertEqual(pod["spec"]["volumes"][:2], sent["spec"]["volumes"])  # the server's own are kept
        (call,) = self.calls()
        self.assertEqual((call["webhook"], call["outcome"]), ("pods.gpusnap.io", "patched"))
        self.wait_log(f"uid={call['uid']}")  # the review reached the real webhook
        stored = json.loads(self.kubectl("get", "pod", "-n", "inference", pod["metadata"]["name"], "-o",
                                         "json").stdout)
        self.assertEqual(stored, pod)

    def test_unannotated_pod_comes_back_unchanged(self):
        sent = without_gpusnap_annotations(tw.fixture("gpushare-vllm.json"))
        pod, _ = self.create(sent)
        self.assert_unchanged(pod, sent)
        self.assertEqual(self.calls(), [])  # the matchConditions keep it from the webhook

    def test_fixtures_are_what_a_webhook_receives(self):
        # Each fixture, as a user would write it, reaches a webhook as the fixture itself.
        reviews = []
        self.fake(lambda review: reviews.append(review) or allow(review))
        self.kubectl("create", "namespace", "ml")
        for name in ("gpushare-vllm.json", "gpushare-mixed.json", "restore-placeholder.json"):
            with self.subTest(fixture=name):
                fixture = tw.fixture(name)
                self.create(as_written_by_a_user(fixture))
                req = reviews[-1]["request"]
                self.assertEqual((req["operation"], req["namespace"], req.get("name")),
                                 ("CREATE", fixture["metadata"]["namespace"], fixture["metadata"].get("name")))
                self.assertEqual(req["resource"], {"group": "", "version": "v1", "resource": "pods"})
                self.assertIs(req["dryRun"], False)
                token = next(v["name"] for v in req["object"]["spec"]["volumes"] if is_token_volume(v))
                mine = next(v["name"] for v in fixture["spec"]["volumes"] if is_token_volume(v))
                self.assertEqual(req["object"], json.loads(json.dumps(fixture).replace(mine, token)))

    def test_warnings_reach_kubectl(self):
        self.kubectl("create", "namespace", "ml")
        pod, stderr = self.create(tw.fixture("gpushare-mixed.json"))
        self.assertRegex(stderr, r"Warning: .*evaluator.*valueFrom")
        self.assertEqual(tw.env(tw.container(pod, "trainer"), "LD_PRELOAD")["value"],
                         "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2:" + tw.SHIM)

    def test_restore_from_pod_becomes_a_placeholder_the_agent_sees(self):
        sent = tw.fixture("restore-placeholder.json")
        pod, _ = self.create(sent)
        labels = pod["metadata"]["labels"]
        self.assertEqual(labels["gpusnap.io/placeholder"], "true")
        c = tw.container(pod, "vllm")
        self.assertEqual(c["image"], sent["spec"]["containers"][0]["image"])
        self.assertEqual(c["command"], ["/gpusnap/bin/gpusnap", "__placeholder"])
        self.assertEqual(c["resources"], {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2"}})
        listed = self.kubectl("get", "pods", "-A", "-l", "gpusnap.io/placeholder=true", "-o", "name").stdout
        self.assertEqual(listed.split(), ["pod/vllm-restored"])

        # The agent's watch: placeholders on its node. The pod appears once it is bound there.
        events = self.watch("-A", "-l", "gpusnap.io/placeholder=true", "--field-selector", "spec.nodeName=node-a")
        self.api.run_pod("inference", "vllm-restored", "node-b")  # another node: not seen
        self.kubectl("delete", "pod", "-n", "inference", "vllm-restored")
        self.create(sent)
        self.api.run_pod("inference", "vllm-restored", "node-a",
                         container_ids={"vllm": "containerd://" + "ab" * 32})
        ev = self.next_event(events, lambda e: True)
        self.assertEqual((ev["type"], ev["object"]["spec"]["nodeName"]), ("ADDED", "node-a"))  # the binding
        ev = self.next_event(events, lambda e: True)
        self.assertEqual(ev["type"], "MODIFIED")  # the kubelet's status
        self.assertEqual(ev["object"]["status"]["containerStatuses"][0]["containerID"], "containerd://" + "ab" * 32)
        self.kubectl("annotate", "pod", "-n", "inference", "vllm-restored", "gpusnap.io/restored=ok")
        ev = self.next_event(events, lambda e: e["type"] == "MODIFIED")
        self.assertEqual(ev["object"]["metadata"]["annotations"]["gpusnap.io/restored"], "ok")

    def test_a_namespace_opts_in_with_the_documented_commands(self):
        # kubectl sends these as protobuf; the agent reads them back as JSON.
        self.kubectl("create", "secret", "docker-registry", "gpusnap", "-n", "inference",
                     "--docker-server=registry.example:5000", "--docker-username=inference",
                     "--docker-password=pw-of-inference")
        self.kubectl("create", "namespace", "batch")
        self.kubectl("create", "secret", "generic", "gpusnap", "-n", "batch")
        with_credentials = self.api.get("secrets", "gpusnap", "inference")
        self.assertEqual(with_credentials["type"], "kubernetes.io/dockerconfigjson")
        config = json.loads(base64.b64decode(with_credentials["data"][".dockerconfigjson"]))
        auth = config["auths"]["registry.example:5000"]
        self.assertEqual(base64.b64decode(auth["auth"]).decode(), "inference:pw-of-inference")
        without = self.api.get("secrets", "gpusnap", "batch")
        self.assertEqual(without["type"], "Opaque")
        self.assertNotIn(".dockerconfigjson", without.get("data") or {})

    def test_watch_sees_annotation_patch(self):
        pod, _ = self.create(without_gpusnap_annotations(tw.fixture("gpushare-vllm.json")))
        name = pod["metadata"]["name"]
        events = self.watch("-n", "inference")
        first = self.next_event(events, lambda e: True)
        self.assertEqual((first["type"], first["object"]["metadata"]["name"]), ("ADDED", name))
        self.kubectl("annotate", "pod", "-n", "inference", name, "gpusnap.io/note=checkpointed")
        ev = self.next_event(events, lambda e: e["type"] == "MODIFIED")
        self.assertEqual(ev["object"]["metadata"]["annotations"]["gpusnap.io/note"], "checkpointed")
        self.assertGreater(int(ev["object"]["metadata"]["resourceVersion"]),
                           int(first["object"]["metadata"]["resourceVersion"]))


class Failures(KubectlOnTestBed):
    def test_webhook_down_pod_still_created(self):
        self.assertEqual(self.stop(), 0)
        sent = tw.fixture("gpushare-vllm.json")
        pod, _ = self.create(sent)
        self.assert_unchanged(pod, sent)
        (call,) = self.calls("error")
        self.assertEqual(call["policy"], "Ignore")
        self.assertIn("connection refused", call["error"].lower())
        self.assertIn('Post "https://gpusnap-webhook.gpusnap-system.svc:443/mutate?timeout=5s"', call["error"])

    def test_fail_policy_rejects_when_webhook_down(self):
        self.configure(failurePolicy="Fail")
        self.assertEqual(self.stop(), 0)
        pod, stderr = self.create(tw.fixture("restore-placeholder.json"), check=False)
        self.assertIsNone(pod)
        self.assertIn('Error from server (InternalError): error when creating', stderr)
        self.assertIn('Internal error occurred: failed calling webhook "pods.gpusnap.io"', stderr)
        self.assertIsNone(self.api.get("pods", "vllm-restored", "inference"))

    def test_wrong_ca_bundle_fails_tls_and_ignore_admits(self):
        other = os.path.join(self.tmp, "other-ca")
        os.makedirs(other)
        with open(apiserver.make_ca(other, "other"), "rb") as f:
            self.configure(clientConfig={"caBundle": base64.b64encode(f.read()).decode()})
        sent = tw.fixture("gpushare-vllm.json")
        pod, _ = self.create(sent)
        self.assert_unchanged(pod, sent)
        (call,) = self.calls("error")
        self.assertIn("tls: failed to verify certificate", call["error"])

    def test_certificate_for_another_service_name_fails(self):
        # The same webhook and CA, called as another Service: the name in the certificate does not match.
        self.api.set_service("gpusnap-system", "impostor", "127.0.0.1", self.port)
        self.configure(clientConfig={"service": dict(self.mwc["webhooks"][0]["clientConfig"]["service"],
                                                     name="impostor")})
        sent = tw.fixture("gpushare-vllm.json")
        pod, _ = self.create(sent)
        self.assert_unchanged(pod, sent)
        (call,) = self.calls("error")
        self.assertIn("impostor.gpusnap-system.svc", call["error"])
        self.assertIn("tls: failed to verify certificate", call["error"])

    def test_unknown_service_fails_the_call(self):
        self.api.remove_service(*SERVICE)
        self.configure(failurePolicy="Fail")
        _, stderr = self.create(tw.fixture("gpushare-vllm.json"), check=False)
        self.assertIn('service "gpusnap-webhook" not found', stderr)

    def test_slow_webhook_is_cut_off_at_timeout_seconds(self):
        self.fake(lambda review: None, timeout=1)
        sent = tw.fixture("gpushare-vllm.json")
        started = time.monotonic()
        pod, _ = self.create(sent)
        self.assertLess(time.monotonic() - started, 8)
        self.assert_unchanged(pod, sent)
        (call,) = self.calls("error")
        self.assertIn("context deadline exceeded", call["error"])
        self.assertGreaterEqual(call["seconds"], 1.0)
        self.assertLess(call["seconds"], 3.0)

    def test_slow_webhook_with_fail_policy_rejects(self):
        self.fake(lambda review: None, timeout=1, policy="Fail")
        _, stderr = self.create(tw.fixture("gpushare-vllm.json"), check=False)
        self.assertIn("context deadline exceeded", stderr)

    def test_answer_for_another_uid_is_a_failed_call(self):
        self.fake(lambda review: allow({"request": {"uid": "someone-else"}}), policy="Fail")
        _, stderr = self.create(tw.fixture("gpushare-vllm.json"), check=False)
        self.assertIn("expected response.uid=", stderr)

    def test_patch_that_does_not_apply_rejects_whatever_the_policy(self):
        self.fake(lambda review: allow(review, **json_patch([{"op": "remove", "path": "/spec/nope"}])))
        _, stderr = self.create(tw.fixture("gpushare-vllm.json"), check=False)
        self.assertIn("Internal error occurred: JSON patch", stderr)
        self.assertEqual(self.calls("bad patch")[0]["webhook"], "pods.gpusnap.io")

    def test_patched_pod_is_validated(self):
        mount = {"name": "missing", "mountPath": "/x"}
        self.fake(lambda review: allow(review, **json_patch([{"op": "add", "path": "/spec/containers/0/volumeMounts/-",
                                                              "value": mount}])))
        _, stderr = self.create(tw.fixture("gpushare-vllm.json"), check=False)
        self.assertIn('spec.containers[0].volumeMounts[2].name: Not found: "missing"', stderr)

    def test_denial_reaches_kubectl(self):
        self.fake(lambda review: allow(review, allowed=False, status={"code": 403, "message": "no GPUs today"}))
        _, stderr = self.create(tw.fixture("gpushare-vllm.json"), check=False)
        self.assertIn('admission webhook "pods.gpusnap.io" denied the request: no GPUs today', stderr)


class TestBedContract(unittest.TestCase):
    """The server as gpusnap's agent uses it: HTTPS verified with the CA, a bearer token,
    list+watch of the placeholders on a node, annotation patches, Events."""

    def setUp(self):
        self.api = apiserver.LocalApiServer().start()
        self.addCleanup(self.api.stop)
        self.api.ensure_namespace("inference")
        self.selector = "fieldSelector=spec.nodeName%3Dnode-a&labelSelector=gpusnap.io%2Fplaceholder%3Dtrue"

    def connect(self, timeout=10):
        ctx = ssl.create_default_context(cafile=self.api.ca_file)
        return http.client.HTTPSConnection(self.api.host, self.api.port, context=ctx, timeout=timeout)

    def call(self, method, path, body=None, content_type="application/json", token=None):
        conn = self.connect()
        headers = {"Authorization": f"Bearer {token or self.api.token}", "Accept": "application/json",
                   "Content-Type": content_type}
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        r = conn.getresponse()
        out = (r.status, json.loads(r.read()))
        conn.close()
        return out

    def placeholder(self, name, labels=None):
        return self.api.create("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": "inference",
            "labels": {"gpusnap.io/placeholder": "true"} if labels is None else labels},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}})

    def test_token_and_ca_required(self):
        status, body = self.call("GET", "/api/v1/pods", token="wrong")
        self.assertEqual((status, body["reason"]), (401, "Unauthorized"))
        conn = http.client.HTTPSConnection(self.api.host, self.api.port, context=ssl.create_default_context(),
                                           timeout=10)
        with self.assertRaises(ssl.SSLCertVerificationError):
            conn.request("GET", "/version")
        conn.close()

    def test_list_then_watch_placeholders_on_a_node(self):
        self.placeholder("p1")
        self.placeholder("other", labels={})
        self.api.bind_pod("inference", "p1", "node-a")
        self.api.bind_pod("inference", "other", "node-a")
        status, listed = self.call("GET", f"/api/v1/pods?{self.selector}")
        self.assertEqual(status, 200)
        self.assertEqual(listed["kind"], "PodList")
        self.assertEqual([p["metadata"]["name"] for p in listed["items"]], ["p1"])
        rv = listed["metadata"]["resourceVersion"]

        conn = self.connect()
        conn.request("GET", f"/api/v1/pods?{self.selector}&watch=true&resourceVersion={rv}&allowWatchBookmarks=true",
                     headers={"Authorization": f"Bearer {self.api.token}"})
        r = conn.getresponse()
        self.assertEqual((r.status, r.getheader("Transfer-Encoding")), (200, "chunked"))

        def next_event():
            return json.loads(r.readline())

        self.placeholder("p2")
        self.api.bind_pod("inference", "p2", "node-a")  # now it matches: ADDED
        ev = next_event()
        self.assertEqual((ev["type"], ev["object"]["metadata"]["name"]), ("ADDED", "p2"))
        status, patched = self.call("PATCH", "/api/v1/namespaces/inference/pods/p2",
                                    {"metadata": {"annotations": {"gpusnap.io/restore": "running"}}},
                                    "application/merge-patch+json")
        self.assertEqual(status, 200)
        ev = next_event()
        self.assertEqual(ev["type"], "MODIFIED")
        self.assertEqual(ev["object"]["metadata"]["annotations"], {"gpusnap.io/restore": "running"})
        self.assertEqual(ev["object"]["metadata"]["resourceVersion"], patched["metadata"]["resourceVersion"])
        self.call("PATCH", "/api/v1/namespaces/inference/pods/p2",
                  [{"op": "remove", "path": "/metadata/labels/gpusnap.io~1placeholder"}], "application/json-patch+json")
        ev = next_event()  # no longer selected: DELETED for this watch
        self.assertEqual((ev["type"], ev["object"]["metadata"]["name"]), ("DELETED", "p2"))
        self.api.delete("pods", "p1", "inference")
        self.assertEqual(next_event()["type"], "DELETED")
        conn.close()

    def test_watch_from_a_forgotten_version_is_gone(self):
        api = apiserver.LocalApiServer(history=2).start()
        self.addCleanup(api.stop)
        for n in range(4):
            api.create("events", {"metadata": {"name": f"e{n}"}, "involvedObject": {"kind": "Pod", "name": "x"}})
        ctx = ssl.create_default_context(cafile=api.ca_file)
        conn = http.client.HTTPSConnection(api.host, api.port, context=ctx, timeout=10)
        conn.request("GET", "/api/v1/events?watch=true&resourceVersion=1", headers={"Authorization":
                                                                                    f"Bearer {api.token}"})
        ev = json.loads(conn.getresponse().readline())
        conn.close()
        self.assertEqual((ev["type"], ev["object"]["code"], ev["object"]["reason"]), ("ERROR", 410, "Expired"))

    def test_events_created_and_listed_by_involved_object(self):
        pod = self.placeholder("p1")
        event = {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "p1.", "namespace": "inference"},
                 "involvedObject": {"kind": "Pod", "namespace": "inference", "name": "p1",
                                    "uid": pod["metadata"]["uid"]},
                 "reason": "Restored", "message": "restored snapshot s1 in 1.2 s", "type": "Normal",
                 "source": {"component": "gpusnap-agent", "host": "node-a"}, "count": 1}
        status, created = self.call("POST", "/api/v1/namespaces/inference/events", event)
        self.assertEqual(status, 201)
        self.assertTrue(created["metadata"]["name"].startswith("p1."))
        status, listed = self.call("GET", "/api/v1/namespaces/inference/events?fieldSelector=involvedObject.name%3Dp1"
                                          "%2Creason%3DRestored")
        self.assertEqual([e["message"] for e in listed["items"]], [event["message"]])
        self.assertEqual(self.api.events("inference")[0]["source"]["component"], "gpusnap-agent")

    def test_status_objects(self):
        self.placeholder("p1")
        status, body = self.call("GET", "/api/v1/namespaces/inference/pods/nope")
        self.assertEqual((status, body["reason"], body["message"]), (404, "NotFound", 'pods "nope" not found'))
        status, body = self.call("POST", "/api/v1/namespaces/inference/pods",
                                 {"metadata": {"name": "p1"}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
        self.assertEqual((status, body["reason"]), (409, "AlreadyExists"))
        pod = self.api.get("pods", "p1", "inference")
        pod["metadata"]["resourceVersion"] = "1"
        status, body = self.call("PUT", "/api/v1/namespaces/inference/pods/p1", pod)
        self.assertEqual((status, body["reason"]), (409, "Conflict"))
        status, body = self.call("GET", "/api/v1/pods?fieldSelector=spec.nope%3Dx")
        self.assertEqual((status, body["message"]), (400, "field label not supported: spec.nope"))
        status, body = self.call("POST", "/api/v1/namespaces/absent/pods",
                                 {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
        self.assertEqual((status, body["message"]), (404, 'namespaces "absent" not found'))

    def test_scheduler_and_kubelet_helpers(self):
        self.placeholder("p1")
        pod = self.api.run_pod("inference", "p1", "node-a", container_ids={"main": "containerd://" + "0" * 64})
        self.assertEqual(pod["spec"]["nodeName"], "node-a")
        self.assertEqual(pod["status"]["phase"], "Running")
        self.assertEqual(pod["status"]["containerStatuses"][0]["containerID"], "containerd://" + "0" * 64)
        self.assertEqual(self.api.list("pods", "inference", field_selector="status.phase=Running",
                                       label_selector="gpusnap.io/placeholder")[0]["metadata"]["name"], "p1")
        with self.assertRaises(apiserver.ApiError) as e:
            self.api.bind_pod("inference", "p1", "node-b")
        self.assertEqual(e.exception.code, 409)


if __name__ == "__main__":
    unittest.main()
