"""A pull from a hostile registry (hostile_registry.py, in front of the real
docker-registry of registry.py, on 127.0.0.1) can neither hold it nor
mislead it: each fails with one line that names what happened, and leaves
the store as it was; what is legitimate but unusual still works.

- a relative `Location` is resolved against the request and followed;
- a redirect from https down to http is refused, naming both URLs;
- an endless error body behind a redirect is read only up to a bound;
- a server that accepts and never answers is a stall naming --registry-timeout;
- a manifest over 16 MiB is refused naming the limit and its size;
- a blob dripped slowly is stopped by --registry-min-rate;
- a snapshot in the store is "already present" only for the manifests it was
  pulled from or pushed as: another manifest of the same gpusnap.json (the
  store's copy of which may hold other bytes) is refused.

Skips when docker-registry or skopeo is missing (apt: docker-registry skopeo)."""
import json
import os
import time
import unittest
import urllib.request

import registry
from harness import GpusnapCase
from hostile_registry import HostileRegistry, endless_body, hold, is_blob, is_manifest
from test_registry import RegistryMixin, require_registry


class HostilePull(RegistryMixin, GpusnapCase):
    def setUp(self):
        super().setUp()
        require_registry(self)
        self.reg = self.start_registry()
        pid = self.run_counter("cnt")
        self.snap = self.checkpoint("cnt")
        self.assertTrue(self.wait_gone(pid))
        self.gs("push", self.snap, f"{self.reg.host}/team/counter:v1", "--plain-http")
        self.node_b = self.other_store("node-b")

    def hostile(self, misbehave, ca=None):
        h = HostileRegistry(self.reg.host, misbehave, ca)
        self.addCleanup(h.close)
        return h

    def pull(self, h, *flags):
        """gpusnap pull through `h`: the process and the seconds it took."""
        start = time.monotonic()
        access = ["--plain-http"] if h.scheme == "http" else ["--ca-file", self.ca.cert]
        p = self.gs("pull", f"{h.host}/team/counter:v1", *access, *flags, env=self.node_b, check=False, timeout=120)
        return p, time.monotonic() - start

    def refused(self, h, *flags, within=30):
        p, took = self.pull(h, *flags)
        line = self.one_line_error(p)
        self.assertLess(took, within, line)
        self.store_is_empty(self.node_b)
        return line

    def test_a_relative_location_is_followed(self):
        def misbehave(handler):
            if handler.path.startswith("/moved/"):
                h.forward(handler, handler.path[len("/moved"):])
                return True
            if is_blob(handler):
                handler.send_response(307)
                handler.send_header("Location", "/moved" + handler.path)
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return True
            return False
        h = self.hostile(misbehave)
        p, _ = self.pull(h)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(any(path.startswith("/moved/v2/team/counter/blobs/") for path in h.paths), h.paths)
        self.assertEqual(len(self.gs_json("ls", env=self.node_b)), 1)

    def test_an_endless_error_body_behind_a_redirect_is_read_only_so_far(self):
        def misbehave(handler):
            if is_blob(handler):
                handler.send_response(307)
                handler.send_header("Location", f"http://{h.host}/endless")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return True
            return handler.path == "/endless" and endless_body(handler, h)
        h = self.hostile(misbehave)
        self.assertIn("HTTP 500", self.refused(h))

    def test_a_redirect_from_https_down_to_http_is_refused(self):
        self.ca = registry.CertAuthority(os.path.join(self.tmp, "ca"))
        plain = self.hostile(lambda handler: False)

        def misbehave(handler):
            if is_blob(handler):
                handler.send_response(307)
                handler.send_header("Location", f"http://{plain.host}{handler.path}")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return True
            return False
        h = self.hostile(misbehave, ca=self.ca)
        line = self.refused(h)
        self.assertIn(f"`https://{h.host}/v2/team/counter/blobs/sha256:", line)
        self.assertIn(f"`http://{plain.host}/v2/team/counter/blobs/sha256:", line)
        self.assertFalse(any("/blobs/" in path for path in plain.paths), plain.paths)

    def test_a_server_that_never_answers_is_a_stall_naming_the_timeout(self):
        h = self.hostile(lambda handler: is_manifest(handler) and hold(handler, h))
        line = self.refused(h, "--registry-timeout", "2")
        self.assertIn("stalled", line)
        self.assertIn("--registry-timeout", line)
        self.assertNotIn("went away", line)

    def test_a_manifest_over_the_limit_names_the_limit_and_its_size(self):
        size = 17 << 20

        def misbehave(handler):
            if not is_manifest(handler):
                return False
            handler.send_response(200)
            handler.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
            handler.send_header("Content-Length", str(size))
            handler.end_headers()
            handler.wfile.write(b" " * size)
            return True
        h = self.hostile(misbehave)
        line = self.refused(h)
        self.assertIn("16 MiB", line)
        self.assertIn(str(size), line)

    def test_a_dripped_blob_is_stopped_by_the_minimum_rate(self):
        def misbehave(handler):
            if not is_blob(handler):
                return False
            handler.send_response(200)
            handler.send_header("Content-Type", "application/octet-stream")
            handler.send_header("Content-Length", "1000000")
            handler.end_headers()
            while not h.closing.is_set():
                handler.wfile.write(b"x")
                handler.wfile.flush()
                time.sleep(0.5)
            return True
        h = self.hostile(misbehave)
        line = self.refused(h, "--registry-timeout", "3", "--registry-min-rate", "100", within=40)
        self.assertIn("--registry-min-rate", line)


    def test_already_present_only_for_the_manifest_it_came_from(self):
        ref = f"{self.reg.host}/team/counter"
        # The store that pushed it has it, as that manifest.
        again = self.gs_json("pull", f"{ref}:v1", "--plain-http")
        self.assertTrue(again["already_present"])
        pulled = self.gs_json("pull", f"{ref}:v1", "--plain-http", env=self.node_b)
        self.assertFalse(pulled["already_present"])
        self.assertTrue(self.gs_json("pull", f"{ref}:v1", "--plain-http", env=self.node_b)["already_present"])
        # Another manifest of the same gpusnap.json and blobs (an annotation more).
        get = urllib.request.Request(f"{self.reg.url}/v2/team/counter/manifests/v1",
                                     headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
        with urllib.request.urlopen(get, timeout=30) as answer:
            media_type = answer.headers["Content-Type"]
            manifest = json.loads(answer.read())
        manifest.setdefault("annotations", {})["org.example.copy"] = "2"
        put = urllib.request.Request(f"{self.reg.url}/v2/team/counter/manifests/v2", method="PUT",
                                     data=json.dumps(manifest).encode(), headers={"Content-Type": media_type})
        urllib.request.urlopen(put, timeout=30).close()
        # node-b's copy holds other bytes than its gpusnap.json lists, as a pull
        # that published unchecked bytes left it: the other manifest must not
        # take it for itself.
        snap_dir = os.path.join(self.node_b["GPUSNAP_STORE"], "snapshots", pulled["id"])
        image = next(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(snap_dir, "checkpoint")) for f in fs
                     if f.endswith(".img"))
        with open(image, "r+b") as f:
            f.write(b"\0" * 8)
        line = self.one_line_error(self.gs("pull", f"{ref}:v2", "--plain-http", env=self.node_b, check=False))
        self.assertIn(f"the store already has a snapshot `{pulled['id']}`", line)
        self.assertIn(f"`{ref}:v2`", line)
        self.assertNotIn("already in the store", line)


if __name__ == "__main__":
    unittest.main()
