"""The registry fixture (registry.py) proven with real clients: for each mode,
`skopeo copy` of a hand-built OCI image layout to docker://HOST/test/img:v1,
`skopeo inspect --raw` gives the same manifest bytes back, and the layer is
stored at blob_path(); stop() then start() (also after SIGKILL) keeps the
image on the same host.

- plain: /v2/ answers 200 with no credentials; a flipped byte in the blob
  file is what the registry serves; an upload cut by SIGKILL resumes after
  start() at the offset it had; a gpusnap-style artifact (custom config
  and layer media types) pushed over the raw HTTP API is accepted;
- tls-basic: /v2/ answers 401 `Basic`, 200 with the credentials; a wrong
  password and an untrusted CA make skopeo fail; --authfile with
  write_docker_config's file works;
- tls-token: /v2/ answers 401 `Bearer realm=<token server>,service=...`; a
  push asks the token server once, for repository:test/img:pull,push; the
  token server refuses a wrong password with 401 and skopeo fails; the
  pull-only user can pull but not push; the registry takes tokens that name
  their key by x5c alone or kid alone and refuses a foreign signer, a list
  `aud`, an expired token and one for another repository.

Skips when docker-registry or skopeo is missing (apt: docker-registry skopeo)."""
import base64
import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import registry

SKOPEO = os.environ.get("GPUSNAP_SKOPEO", shutil.which("skopeo") or "/usr/bin/skopeo")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
REF = "test/img:v1"


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def make_oci_layout(directory, tag="v1", payload=b"hello from the registry fixture\n"):
    """An OCI image layout with one gzip layer holding hello.txt; returns
    {"manifest": bytes, "layer": bytes, "layer_digest", "config_digest"}."""
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo("hello.txt")
        info.size, info.mtime, info.mode = len(payload), 0, 0o644
        t.addfile(info, io.BytesIO(payload))
    layer = gzip.compress(tar.getvalue(), mtime=0)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [sha256(tar.getvalue())]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha256(layer),
                    "size": len(layer)}]}, indent=2).encode()
    blobs = os.path.join(directory, "blobs", "sha256")
    os.makedirs(blobs)
    for data in (layer, config, manifest):
        with open(os.path.join(blobs, hashlib.sha256(data).hexdigest()), "wb") as f:
            f.write(data)
    with open(os.path.join(directory, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    with open(os.path.join(directory, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [{
            "mediaType": OCI_MANIFEST, "digest": sha256(manifest), "size": len(manifest),
            "annotations": {"org.opencontainers.image.ref.name": tag}}]}, f)
    return {"manifest": manifest, "layer": layer, "layer_digest": sha256(layer), "config_digest": sha256(config)}


def basic(user, password):
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class RegistryCase(unittest.TestCase):
    MODE = None

    def setUp(self):
        if not os.access(registry.DOCKER_REGISTRY, os.X_OK):
            self.skipTest(f"no docker-registry at {registry.DOCKER_REGISTRY} (apt: docker-registry)")
        if not os.access(SKOPEO, os.X_OK):
            self.skipTest(f"no skopeo at {SKOPEO} (apt: skopeo)")
        self.tmp = tempfile.mkdtemp(prefix="gpusnap-registry-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.reg = registry.Registry(os.path.join(self.tmp, "registry"), self.MODE)
        self.addCleanup(self.reg.close)
        self.reg.start()
        self.layout = os.path.join(self.tmp, "layout")
        self.image = make_oci_layout(self.layout)
        # skopeo reads no configuration of this machine's user.
        home = os.path.join(self.tmp, "home")
        os.makedirs(home)
        registries_conf = os.path.join(self.tmp, "registries.conf")
        open(registries_conf, "w").close()
        self.env = dict(os.environ, HOME=home, XDG_RUNTIME_DIR=home, XDG_CONFIG_HOME=home,
                        CONTAINERS_REGISTRIES_CONF=registries_conf)
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                                  urllib.request.HTTPSHandler(context=self.reg.ssl_context()))

    # --- clients --------------------------------------------------------------

    def skopeo(self, *args, check=True):
        p = registry.run_skopeo([SKOPEO, "--insecure-policy", *args], self.env)
        if check and p.returncode != 0:
            self.fail(f"skopeo {' '.join(args)} failed ({p.returncode}):\n{p.stderr}\n"
                      f"registry log:\n{registry.log_tail(self.reg.log)}")
        return p

    def tls_flags(self, prefix):
        if self.reg.mode == "plain":
            return [f"--{prefix}tls-verify=false"]
        return [f"--{prefix}cert-dir", self.reg.cert_dir]

    def cred_flags(self, prefix, user=None, password=None):
        if self.reg.mode == "plain":
            return []
        return [f"--{prefix}creds", f"{user or self.reg.username}:{password or self.reg.password}"]

    def push(self, *extra, ref=REF, check=True, **creds):
        flags = extra or self.cred_flags("dest-", **creds)
        return self.skopeo("copy", "--preserve-digests", *self.tls_flags("dest-"), *flags,
                           "oci:" + self.layout + ":v1", f"docker://{self.reg.host}/{ref}", check=check)

    def inspect_raw(self, *extra, ref=REF, check=True, **creds):
        flags = extra or self.cred_flags("", **creds)
        return self.skopeo("inspect", "--raw", *self.tls_flags(""), *flags, f"docker://{self.reg.host}/{ref}",
                           check=check)

    def http(self, method, path, headers=None, data=None):
        """(status, headers, body) of one request to the registry."""
        req = urllib.request.Request(self.reg.url + path, data=data, method=method, headers=headers or {})
        try:
            with self.opener.open(req, timeout=10) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def assert_image_there(self):
        self.assertEqual(self.inspect_raw().stdout.encode(), self.image["manifest"])



class EveryMode:
    """The checks every mode passes (a mixin, so that RegistryCase runs none)."""

    def test_push_then_inspect_gives_the_same_manifest(self):
        self.push()
        self.assert_image_there()
        with open(self.reg.blob_path(self.image["layer_digest"]), "rb") as f:
            self.assertEqual(f.read(), self.image["layer"])
        self.assertTrue(os.path.exists(self.reg.blob_path(self.image["config_digest"])))

    def test_stop_then_start_keeps_the_image(self):
        self.push()
        host = self.reg.host
        for sig in (signal.SIGTERM, signal.SIGKILL):
            self.reg.stop(sig=sig)
            self.assertFalse(self.reg.running)
            self.assertNotEqual(self.inspect_raw(check=False).returncode, 0, "answered while stopped")
            self.reg.start()
            self.assertEqual(self.reg.host, host)
            self.assert_image_there()


class PlainRegistry(EveryMode, RegistryCase):
    MODE = "plain"

    def test_v2_answers_without_credentials(self):
        status, headers, _ = self.http("GET", "/v2/")
        self.assertEqual(status, 200)
        self.assertEqual(headers.get("Docker-Distribution-API-Version"), "registry/2.0")
        self.assertTrue(self.reg.url.startswith("http://127.0.0.1:"))

    def test_flipped_byte_in_blob_path_is_what_is_served(self):
        self.push()
        path = self.reg.blob_path(self.image["layer_digest"])
        with open(path, "r+b") as f:
            f.seek(10)
            byte = f.read(1)
            f.seek(10)
            f.write(bytes([byte[0] ^ 0xFF]))
        status, _, body = self.http("GET", f"/v2/test/img/blobs/{self.image['layer_digest']}")
        self.assertEqual(status, 200)
        self.assertEqual(len(body), len(self.image["layer"]))
        self.assertNotEqual(sha256(body), self.image["layer_digest"])
        self.assertEqual(body[10], byte[0] ^ 0xFF)

    def path_of(self, location):
        """The path of a Location header, which may be absolute."""
        return location[len(self.reg.url):] if location.startswith(self.reg.url) else location

    def test_upload_resumes_after_a_kill(self):
        data = os.urandom(100000)
        status, headers, _ = self.http("POST", "/v2/test/up/blobs/uploads/")
        self.assertEqual(status, 202)
        octets = {"Content-Type": "application/octet-stream"}
        status, headers, _ = self.http("PATCH", self.path_of(headers["Location"]), octets, data[:60000])
        self.assertEqual((status, headers["Range"]), (202, "0-59999"))
        location = self.path_of(headers["Location"])
        self.reg.stop(sig=signal.SIGKILL)
        self.reg.start()
        status, headers, _ = self.http("GET", location)
        self.assertEqual((status, headers["Range"]), (204, "0-59999"))
        status, headers, _ = self.http("PATCH", location, octets, data[60000:])
        self.assertEqual((status, headers["Range"]), (202, "0-99999"))
        status, _, body = self.http("PUT", f"{self.path_of(headers['Location'])}&digest={sha256(data)}")
        self.assertEqual(status, 201, body)
        with open(self.reg.blob_path(sha256(data)), "rb") as f:
            self.assertEqual(f.read(), data)

    def test_accepts_an_artifact_manifest(self):
        """A snapshot-like artifact: its own config and layer media types, over the raw API."""
        def upload(data):
            status, headers, _ = self.http("POST", "/v2/test/snap/blobs/uploads/")
            self.assertEqual(status, 202)
            location = self.path_of(headers["Location"])
            sep = "&" if "?" in location else "?"
            status, _, _ = self.http("PUT", f"{location}{sep}digest={sha256(data)}", data=data,
                                     headers={"Content-Type": "application/octet-stream"})
            self.assertEqual(status, 201)
            return {"digest": sha256(data), "size": len(data)}

        config = upload(b'{"gpusnap":"meta"}')
        chunk = upload(os.urandom(4096))
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": dict(config, mediaType="application/vnd.gpusnap.snapshot.config.v1+json"),
            "layers": [dict(chunk, mediaType="application/vnd.gpusnap.chunk.v1")],
            "annotations": {"org.opencontainers.image.title": "snapshot"}}).encode()
        status, headers, body = self.http("PUT", "/v2/test/snap/manifests/s1", data=manifest,
                                          headers={"Content-Type": OCI_MANIFEST})
        self.assertEqual(status, 201, body)
        self.assertEqual(headers["Docker-Content-Digest"], sha256(manifest))
        status, headers, body = self.http("GET", "/v2/test/snap/manifests/s1", headers={"Accept": OCI_MANIFEST})
        self.assertEqual((status, body), (200, manifest))
        self.assertEqual(headers["Content-Type"], OCI_MANIFEST)


class TlsBasicRegistry(EveryMode, RegistryCase):
    MODE = "tls-basic"

    def test_v2_challenges_basic(self):
        self.assertTrue(self.reg.url.startswith("https://127.0.0.1:"))
        status, headers, _ = self.http("GET", "/v2/")
        self.assertEqual(status, 401)
        self.assertRegex(headers.get("WWW-Authenticate", ""), r'^Basic realm="[^"]+"')
        status, _, _ = self.http("GET", "/v2/", {"Authorization": basic(self.reg.username, self.reg.password)})
        self.assertEqual(status, 200)
        status, _, _ = self.http("GET", "/v2/", {"Authorization": basic(self.reg.username, "wrong")})
        self.assertEqual(status, 401)

    def test_wrong_password_is_refused(self):
        p = self.push(password="wrong", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(p.stderr, r"(?i)unauthorized|authentication required")
        self.assertNotEqual(self.inspect_raw(check=False).returncode, 0, "a refused push left a manifest")
        self.assertFalse(os.path.exists(self.reg.blob_path(self.image["layer_digest"])))

    def test_untrusted_ca_is_refused(self):
        p = self.skopeo("inspect", "--raw", *self.cred_flags(""), f"docker://{self.reg.host}/{REF}", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(p.stderr, r"x509|certificate")

    def test_authfile_from_write_docker_config(self):
        authfile = registry.write_docker_config(os.path.join(self.tmp, "docker", "config.json"),
                                                self.reg.host, self.reg.username, self.reg.password)
        with open(authfile) as f:
            auth = json.load(f)["auths"][self.reg.host]["auth"]
        self.assertEqual(base64.b64decode(auth).decode(), f"{self.reg.username}:{self.reg.password}")
        self.push("--dest-authfile", authfile)
        self.assertEqual(self.inspect_raw("--authfile", authfile).stdout.encode(), self.image["manifest"])


class TlsTokenRegistry(EveryMode, RegistryCase):
    MODE = "tls-token"

    def token(self, user=None, password=None, scope="repository:test/img:pull,push"):
        req = urllib.request.Request(f"{self.reg.token_url}?service={registry.SERVICE}&scope={scope}",
                                     headers={"Authorization": basic(user or self.reg.username,
                                                                     password or self.reg.password)})
        with self.opener.open(req, timeout=10) as r:
            body = json.load(r)
        self.assertEqual(body["token"], body["access_token"])
        return body["token"]

    def bearer(self, token, path="/v2/"):
        return self.http("GET", path, {"Authorization": "Bearer " + token})

    def test_v2_challenges_bearer_and_takes_the_token(self):
        status, headers, _ = self.http("GET", "/v2/")
        self.assertEqual(status, 401)
        self.assertEqual(headers.get("WWW-Authenticate"),
                         f'Bearer realm="{self.reg.token_url}",service="{registry.SERVICE}"')
        self.assertTrue(self.reg.token_url.startswith("https://127.0.0.1:"))
        self.assertEqual(self.bearer(self.token())[0], 200)
        status, headers, _ = self.bearer("not.a.token")
        self.assertEqual(status, 401)
        self.assertIn('error="invalid_token"', headers.get("WWW-Authenticate", ""))

    def test_token_server_refuses_wrong_credentials(self):
        with self.assertRaises(urllib.error.HTTPError) as cm:
            self.token(password="wrong")
        self.assertEqual(cm.exception.code, 401)
        req = urllib.request.Request(f"{self.reg.token_url}?service={registry.SERVICE}")
        with self.assertRaises(urllib.error.HTTPError) as cm:
            self.opener.open(req, timeout=10)
        self.assertEqual(cm.exception.code, 401)

        p = self.push(password="wrong", check=False)
        self.assertNotEqual(p.returncode, 0)
        log = self.reg.token_server.log
        self.assertTrue(any(r["user"] == self.reg.username and r["status"] == 401 for r in log), log)
        self.assertFalse(any(r["status"] == 200 for r in log), log)

    def test_push_takes_one_token_for_its_scope(self):
        self.push()
        # One token serves the whole push (its blob checks, uploads and the manifest).
        log = list(self.reg.token_server.log)
        self.assertEqual(log, [{"user": self.reg.username, "scopes": [("repository", "test/img", ["pull", "push"])],
                                "status": 200}])
        self.assertEqual((self.reg.token_server.token_requests, self.reg.token_server.tokens_issued), (1, 1))
        self.assert_image_there()
        self.assertEqual(self.reg.token_server.log[1]["scopes"], [("repository", "test/img", ["pull"])])

    def test_authfile_from_write_docker_config(self):
        authfile = registry.write_docker_config(os.path.join(self.tmp, "auth.json"),
                                                self.reg.host, self.reg.username, self.reg.password)
        self.push("--dest-authfile", authfile)
        self.assertEqual(self.inspect_raw("--authfile", authfile).stdout.encode(), self.image["manifest"])

    def test_reader_can_pull_but_not_push(self):
        reader = dict(user=self.reg.reader_username, password=self.reg.reader_password)
        p = self.push(check=False, **reader)
        self.assertNotEqual(p.returncode, 0)
        self.assertNotEqual(self.inspect_raw(check=False).returncode, 0, "the reader's push left a manifest")
        self.push()
        self.assertEqual(self.inspect_raw(**reader).stdout.encode(), self.image["manifest"])

    def test_registry_checks_the_token(self):
        ts = self.reg.token_server
        pull = [("repository", "test/img", ["pull"])]
        tags = "/v2/test/img/tags/list"
        self.push()
        self.assertEqual(self.bearer(ts.make_token("t", pull), tags)[0], 200)
        self.assertEqual(self.bearer(ts.make_token("t", pull, header=("x5c",)), tags)[0], 200)
        self.assertEqual(self.bearer(ts.make_token("t", pull, header=("kid",)), tags)[0], 200)

        foreign = registry.self_signed(self.tmp, "foreign-signer")
        # Each refused for its own reason, as the registry logs it.
        refused = {
            "certificate signed by unknown authority": ts.make_token("t", pull, signer=foreign),
            "token signed by untrusted key": ts.make_token("t", pull, signer=foreign, header=("kid",)),
            "unable to get token signing key": ts.make_token("t", pull, header=()),
            "cannot unmarshal array into Go struct field ClaimSet.aud":
                ts.make_token("t", pull, audience=[registry.SERVICE]),
            "token intended for another audience": ts.make_token("t", pull, audience="elsewhere"),
            "token from untrusted issuer": ts.make_token("t", pull, issuer="elsewhere"),
            "token not to be used after": ts.make_token("t", pull, lifetime=-120),
            "token not to be used before": ts.make_token("t", pull, not_before=int(time.time()) + 600),
        }
        for why, token in refused.items():
            status, headers, _ = self.bearer(token, tags)
            self.assertEqual(status, 401, why)
            self.assertIn('error="invalid_token"', headers.get("WWW-Authenticate", ""), why)
            with open(self.reg.log) as f:
                self.assertIn(why, f.read())

        other_repo = ts.make_token("t", [("repository", "test/other", ["pull"])])
        status, headers, _ = self.bearer(other_repo, tags)
        self.assertEqual(status, 401)
        self.assertIn('error="insufficient_scope"', headers["WWW-Authenticate"])
        self.assertIn('scope="repository:test/img:pull"', headers["WWW-Authenticate"])


if __name__ == "__main__":
    unittest.main()
