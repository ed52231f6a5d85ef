"""`gpusnap webhook` over real HTTPS: AdmissionReviews in, JSONPatches out,
each patch applied with the real `kubectl patch --local --type=json`; 400 for a
malformed review, 413 for a huge one, and a rotated certificate served from
the next connection on.

kubectl is Debian's (scripts/fetch-kubectl.sh, run here if build/tools/kubectl
is missing); without one the whole file exits 77 (skipped)."""
import base64
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "../.."))
GPUSNAP = os.environ.get("GPUSNAP_BIN", os.path.join(REPO, "build/gpusnap"))
FIXTURES = os.path.join(REPO, "tests/k8s/fixtures")
SHIM = "/gpusnap/lib/libgpusnap_gpushare.so"


def find_kubectl():
    """Debian's kubectl next to the build, fetched once if missing."""
    path = os.environ.get("GPUSNAP_KUBECTL") or os.path.join(os.path.dirname(os.path.abspath(GPUSNAP)), "tools/kubectl")

    def works():
        return os.access(path, os.X_OK) and subprocess.run(
            [path, "version", "--client"], capture_output=True).returncode == 0

    if not works() and "GPUSNAP_KUBECTL" not in os.environ:
        p = subprocess.run([os.path.join(REPO, "scripts/fetch-kubectl.sh"), path], capture_output=True, text=True)
        sys.stderr.write(p.stdout + p.stderr)
    return path if works() else None


KUBECTL = find_kubectl()
if KUBECTL is None:
    print("SKIP: no working kubectl (set GPUSNAP_KUBECTL, or let scripts/fetch-kubectl.sh fetch Debian's); "
          "the patches cannot be checked with the real kubectl", file=sys.stderr)
    sys.exit(77)


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


class Pki:
    """A CA and server certificates it signs, for 127.0.0.1 and localhost."""

    def __init__(self, d):
        self.d = d
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=gpusnap-test-ca", cwd=d)
        self.ca = os.path.join(d, "ca.pem")

    def issue(self, name):
        """Writes NAME.pem and NAME.key; returns their paths."""
        with open(os.path.join(self.d, name + ".ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", name + ".key",
                "-out", name + ".csr", "-subj", "/CN=gpusnap-webhook", cwd=self.d)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "2", "-extfile", name + ".ext", "-out", name + ".pem", cwd=self.d)
        return os.path.join(self.d, name + ".pem"), os.path.join(self.d, name + ".key")


def fingerprint_of_file(pem_path):
    with open(pem_path) as f:
        return hashlib.sha256(ssl.PEM_cert_to_DER_cert(f.read())).hexdigest()


def review(pod, uid=None, operation="CREATE"):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid or str(uuid.uuid4()),
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "namespace": pod.get("metadata", {}).get("namespace", "default"),
                        "operation": operation, "object": pod, "oldObject": None, "dryRun": False}}


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return json.load(f)


class WebhookCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpusnap-webhook-")
        self.cv = threading.Condition()
        self.cert, self.key = self.make_certificate()
        self.start(self.cert, self.key, "--max-body-bytes", str(1 << 20))

    def make_certificate(self):
        """Sets self.ca and returns (cert, key) paths for the webhook."""
        self.pki = Pki(self.tmp)
        self.ca = self.pki.ca
        cert, key = self.pki.issue("first")
        shutil.copy(cert, os.path.join(self.tmp, "tls.crt"))
        shutil.copy(key, os.path.join(self.tmp, "tls.key"))
        return os.path.join(self.tmp, "tls.crt"), os.path.join(self.tmp, "tls.key")

    def tearDown(self):
        rc = self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.assertEqual(rc, 0, "gpusnap webhook did not stop cleanly on SIGTERM:\n" + "\n".join(self.lines))

    def start(self, cert, key, *extra):
        self.lines = []
        self.proc = subprocess.Popen([GPUSNAP, "webhook", "--cert", cert, "--key", key, "--listen", "127.0.0.1:0", *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.reader = threading.Thread(target=self._read_log, daemon=True)
        self.reader.start()
        line = self.wait_log("listening on https://")
        self.port = int(line.rsplit(":", 1)[1].split()[0])

    def stop(self):
        """SIGTERM; returns the exit status (None if it had to be killed)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = None
        self.reader.join(timeout=10)
        self.proc.stderr.close()
        return rc

    def _read_log(self):
        for line in self.proc.stderr:
            with self.cv:
                self.lines.append(line.rstrip("\n"))
                self.cv.notify_all()

    def wait_log(self, text, timeout=10):
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    self.fail(f"no log line with {text!r}; log:\n" + "\n".join(self.lines))
                self.cv.wait(left)

    # --- talking to the webhook ------------------------------------------
    server_name = None  # the name the certificate is checked against (None: 127.0.0.1)

    def connect(self):
        ctx = ssl.create_default_context(cafile=self.ca)
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx, timeout=20)
        if self.server_name:  # as a client of the Service would, connecting by address
            raw = socket.create_connection(("127.0.0.1", self.port), timeout=20)
            conn.sock = ctx.wrap_socket(raw, server_hostname=self.server_name)
        else:
            conn.connect()
        return conn

    def request(self, method, path, body=None):
        conn = self.connect()
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def admit(self, pod, uid=None):
        """POSTs a review; checks the envelope; returns (response, patch list)."""
        rv = review(pod, uid)
        status, body = self.request("POST", "/mutate", json.dumps(rv))
        self.assertEqual(status, 200, body)
        out = json.loads(body)
        self.assertEqual(out["apiVersion"], "admission.k8s.io/v1")
        self.assertEqual(out["kind"], "AdmissionReview")
        resp = out["response"]
        self.assertEqual(resp["uid"], rv["request"]["uid"])
        self.assertIs(resp["allowed"], True)
        patch = []
        if "patch" in resp:
            self.assertEqual(resp["patchType"], "JSONPatch")
            patch = json.loads(base64.b64decode(resp["patch"], validate=True))
        return resp, patch

    def kubectl_patch(self, pod, patch):
        """The pod after `patch`, as the real kubectl applies it."""
        path = os.path.join(self.tmp, "pod.json")
        with open(path, "w") as f:
            json.dump(pod, f)
        p = subprocess.run([KUBECTL, "patch", "--local", "--type=json", "-f", path, "-p", json.dumps(patch),
                            "-o", "json"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, f"kubectl patch failed: {p.stderr}\npatch: {json.dumps(patch, indent=1)}")
        return json.loads(p.stdout)

    def admit_and_apply(self, pod):
        resp, patch = self.admit(pod)
        self.assertTrue(patch, resp)
        out = self.kubectl_patch(pod, patch)
        again, patch2 = self.admit(out)
        self.assertEqual(patch2, [], "a second pass over the wire added operations")
        return resp, out


def container(pod, name):
    for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        if c["name"] == name:
            return c
    raise AssertionError(f"no container {name}")


def env(c, name):
    return next((e for e in c.get("env", []) if e["name"] == name), None)


def mount(c, path):
    return next((m for m in c.get("volumeMounts", []) if m["mountPath"] == path), None)


class Admission(WebhookCase):
    def test_healthz(self):
        self.assertEqual(self.request("GET", "/healthz"), (200, b"ok\n"))

    def test_gpushare_patch_applies_with_kubectl(self):
        pod = fixture("gpushare-vllm.json")
        resp, out = self.admit_and_apply(pod)
        c = container(out, "vllm")
        self.assertEqual(env(c, "LD_PRELOAD"), {"name": "LD_PRELOAD", "value": SHIM})
        self.assertEqual(env(c, "GPUSNAP_POD_UID")["valueFrom"], {"fieldRef": {"fieldPath": "metadata.uid"}})
        self.assertEqual(mount(c, "/gpusnap")["readOnly"], True)
        self.assertEqual(mount(c, "/gpusnap-store")["subPathExpr"], "$(GPUSNAP_POD_UID)")
        self.assertIn("gpusnap.io/mutation", out["metadata"]["annotations"])
        # What the API server added stays as it was.
        for key in ("tolerations", "dnsPolicy", "priority", "enableServiceLinks"):
            self.assertEqual(out["spec"][key], pod["spec"][key])
        self.assertEqual(out["spec"]["volumes"][:2], pod["spec"]["volumes"])
        self.assertNotIn("warnings", resp)

    def test_mixed_pod_skips_value_from_with_warning(self):
        pod = fixture("gpushare-mixed.json")
        resp, out = self.admit_and_apply(pod)
        self.assertEqual(len(resp["warnings"]), 1)
        self.assertIn("evaluator", resp["warnings"][0])
        self.assertEqual(container(out, "evaluator"), container(pod, "evaluator"))
        self.assertEqual(container(out, "metrics"), container(pod, "metrics"))
        self.assertEqual(env(container(out, "trainer"), "LD_PRELOAD")["value"],
                         "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2:" + SHIM)
        self.assertEqual(env(container(out, "warmup"), "LD_PRELOAD")["value"], SHIM)

    def test_restore_placeholder_applies_with_kubectl(self):
        pod = fixture("restore-placeholder.json")
        _, out = self.admit_and_apply(pod)
        c = container(out, "vllm")
        self.assertEqual(c["image"], pod["spec"]["containers"][0]["image"])
        self.assertEqual(c["command"], ["/gpusnap/bin/gpusnap", "__placeholder"])
        self.assertNotIn("args", c)
        self.assertEqual(c["resources"]["limits"]["nvidia.com/gpu"], "2")
        self.assertEqual(out["metadata"]["labels"]["gpusnap.io/placeholder"], "true")
        self.assertEqual(mount(c, "/gpusnap")["readOnly"], True)

    def test_no_placeholder_gets_a_host_path_of_the_store(self):
        # The agent reads the store and hands CRIU the images: no snapshot (and
        # nothing else of the store) is mounted into a pod, by id or by
        # reference, with gpushare or without; the only host paths are the
        # bundle and the pod's own chunk store, under its uid.
        for restore_from in ("vllm-20250101-abc123", "registry.example:5000/ml/vllm:warm"):
            for gpushare in (False, True):
                pod = fixture("restore-placeholder.json")
                pod["metadata"]["annotations"]["gpusnap.io/restore-from"] = restore_from
                if gpushare:
                    pod["metadata"]["annotations"]["gpusnap.io/gpushare"] = "true"
                _, out = self.admit_and_apply(pod)
                host_paths = {v["hostPath"]["path"] for v in out["spec"].get("volumes", []) if "hostPath" in v}
                want = {"/var/lib/gpusnap/bundle"} | ({"/var/lib/gpusnap/pods"} if gpushare else set())
                self.assertEqual(host_paths, want, (restore_from, gpushare))
                c = container(out, "vllm")
                self.assertIsNone(mount(c, "/gpusnap-snapshot"))
                if gpushare:
                    self.assertEqual(mount(c, "/gpusnap-store")["subPathExpr"], "$(GPUSNAP_POD_UID)")

    def test_a_pods_own_uid_variable_cannot_pick_another_chunk_store(self):
        # GPUSNAP_POD_UID names the subdirectory of the node's chunk stores the
        # pod mounts: another pod's uid, or "" (all of them), is replaced by the
        # pod's own uid from the downward API.
        for value in ("3f0b7c1e-0000-4000-8000-000000000000", ""):
            pod = fixture("gpushare-vllm.json")
            c = container(pod, "vllm")
            c["env"] = c.get("env", []) + [{"name": "GPUSNAP_POD_UID", "value": value}]
            _, out = self.admit_and_apply(pod)
            defined = [e for e in container(out, "vllm")["env"] if e["name"] == "GPUSNAP_POD_UID"]
            self.assertEqual(defined, [{"name": "GPUSNAP_POD_UID",
                                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}], value)

    def test_unannotated_pod_gets_no_patch(self):
        pod = fixture("gpushare-vllm.json")
        del pod["metadata"]["annotations"]["gpusnap.io/gpushare"]
        resp, patch = self.admit(pod)
        self.assertEqual(patch, [])
        self.assertNotIn("patchType", resp)

    def test_bad_annotation_admits_unchanged_with_warning(self):
        pod = fixture("restore-placeholder.json")
        pod["metadata"]["annotations"]["gpusnap.io/restore-from"] = "../../etc"
        resp, patch = self.admit(pod)
        self.assertEqual(patch, [])
        self.assertIn("admitted unchanged", resp["warnings"][0])

    def test_one_log_line_per_review(self):
        uid = "log-" + str(uuid.uuid4())
        self.admit(fixture("gpushare-vllm.json"), uid=uid)
        line = self.wait_log(f"uid={uid}")
        self.assertIn("pod=inference/vllm-7d9f8c6b5-*", line)
        self.assertIn("gpushare: vllm", line)
        self.assertEqual(sum(uid in l for l in self.lines), 1)

    def test_malformed_review_is_400(self):
        for body in (b"{not json", b"[]", json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
                     json.dumps(dict(review(fixture("gpushare-vllm.json")), apiVersion="v1")).encode()):
            status, text = self.request("POST", "/mutate", body)
            self.assertEqual(status, 400, body)
            self.assertIn(b"malformed AdmissionReview", text)

    def test_huge_body_is_413(self):
        pod = fixture("gpushare-vllm.json")
        pod["metadata"]["annotations"]["padding"] = "x" * (2 << 20)  # over --max-body-bytes (1 MiB)
        status, _ = self.request("POST", "/mutate", json.dumps(review(pod)))
        self.assertEqual(status, 413)
        self.wait_log("HTTP 413")
        self.assertEqual(self.request("GET", "/healthz")[0], 200)  # and it still serves

    def test_silent_client_dropped_after_timeout(self):
        self.assertEqual(self.stop(), 0)
        self.start(self.cert, self.key, "--timeout", "1")
        with socket.create_connection(("127.0.0.1", self.port), timeout=15) as silent:
            started = time.monotonic()
            self.assertEqual(self.request("GET", "/healthz")[0], 200)  # others are served meanwhile
            self.assertEqual(silent.recv(1), b"")  # closed by the server, no handshake
            self.assertLess(time.monotonic() - started, 8)


class Certificates(WebhookCase):
    def served_fingerprint(self):
        conn = self.connect()
        try:
            return hashlib.sha256(conn.sock.getpeercert(binary_form=True)).hexdigest()
        finally:
            conn.close()

    def replace(self, cert, key):
        """Replaces the files as a person or a script would: new files renamed over the old."""
        for src, dst in ((key, self.key), (cert, self.cert)):
            shutil.copy(src, dst + ".new")
            os.replace(dst + ".new", dst)

    def test_rotated_certificate_served_from_next_connection(self):
        first = fingerprint_of_file(self.cert)
        self.assertEqual(self.served_fingerprint(), first)
        cert2, key2 = self.pki.issue("second")
        self.replace(cert2, key2)
        self.assertEqual(self.served_fingerprint(), fingerprint_of_file(cert2))
        self.wait_log("certificate reloaded")
        self.admit(fixture("gpushare-vllm.json"))  # and reviews go on

    def test_half_rotated_pair_keeps_the_previous_certificate(self):
        first = fingerprint_of_file(self.cert)
        cert2, key2 = self.pki.issue("second")
        shutil.copy(cert2, self.cert + ".new")
        os.replace(self.cert + ".new", self.cert)  # the key is still the old one
        self.assertEqual(self.served_fingerprint(), first)
        self.wait_log("certificate not reloaded")
        shutil.copy(key2, self.key + ".new")
        os.replace(self.key + ".new", self.key)
        self.assertEqual(self.served_fingerprint(), fingerprint_of_file(cert2))

    def test_secret_volume_symlink_swap(self):
        # A Secret volume: tls.crt -> ..data/tls.crt, ..data -> ..<timestamp>; an update swaps ..data.
        vol = os.path.join(self.tmp, "secret")
        os.makedirs(os.path.join(vol, "..v1"))
        for name, src in (("tls.crt", self.cert), ("tls.key", self.key)):
            shutil.copy(src, os.path.join(vol, "..v1", name))
            os.symlink(os.path.join("..data", name), os.path.join(vol, name))
        os.symlink("..v1", os.path.join(vol, "..data"))
        self.assertEqual(self.stop(), 0)
        self.start(os.path.join(vol, "tls.crt"), os.path.join(vol, "tls.key"))
        self.assertEqual(self.served_fingerprint(), fingerprint_of_file(self.cert))

        cert2, key2 = self.pki.issue("second")
        os.makedirs(os.path.join(vol, "..v2"))
        shutil.copy(cert2, os.path.join(vol, "..v2", "tls.crt"))
        shutil.copy(key2, os.path.join(vol, "..v2", "tls.key"))
        os.symlink("..v2", os.path.join(vol, "..data_tmp"))
        os.replace(os.path.join(vol, "..data_tmp"), os.path.join(vol, "..data"))
        self.assertEqual(self.served_fingerprint(), fingerprint_of_file(cert2))


if __name__ == "__main__":
    unittest.main()
