"""Encrypted snapshots in a real registry (Debian's docker-registry on
127.0.0.1): `gpusnap push --encryption-key jwe:PUB.pem` stores no plaintext,
`pull`/`restore --decryption-key` open it, skopeo decrypts it, a second push
under the same tenant secret moves nothing, and a missing or wrong key or an
altered blob is refused with one line and the store as it was. The workload
(python holding a known secret) and CRIU are real."""
import base64
import hashlib
import json
import os
import subprocess
import urllib.request

from harness import FakeGpuCase, GpusnapCase, WorkerSteps
from test_registry import WORKER, RegistryMixin, require_registry

# The workload holds the secret in several objects of its heap, read from a
# file it then removes, so that neither its command line nor its files hold it.
HOLDER = """
import os, sys, time
with open(sys.argv[1], "rb") as f:
    kept = [bytearray(f.read()) for _ in range(8)]
os.unlink(sys.argv[1])
open(sys.argv[1] + ".ready", "w").close()
while True:
    time.sleep(0.05)
"""

# 96 MiB of random bytes in its heap: a CRIU pages image over one digest chunk.
BIG_HOLDER = """
import os, sys, time
kept = os.urandom(96 << 20)
open(sys.argv[1], "w").close()
while True:
    time.sleep(0.05)
"""


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def files_holding(directory, needle):
    """The files under `directory` whose bytes hold `needle`."""
    found = []
    for root, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                if needle in f.read():
                    found.append(os.path.join(root, name))
    return found


def alter_blob(reg, repo, manifest, layer, tag):
    """A byte of `layer`'s blob flipped, uploaded under its own digest, and
    `manifest` naming it pushed as `tag`: the digests match, only the HMAC can
    tell."""
    with open(reg.blob_path(layer["digest"]), "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 1
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    req = urllib.request.Request(f"{reg.url}/v2/{repo}/blobs/uploads/", method="POST")
    location = urllib.request.urlopen(req).headers["Location"]
    location = location if location.startswith("http") else reg.url + location
    sep = "&" if "?" in location else "?"
    urllib.request.urlopen(urllib.request.Request(f"{location}{sep}digest={digest}", data=bytes(data), method="PUT",
                                                  headers={"Content-Type": "application/octet-stream"}))
    layer["digest"] = digest
    urllib.request.urlopen(urllib.request.Request(
        f"{reg.url}/v2/{repo}/manifests/{tag}", data=json.dumps(manifest).encode(), method="PUT",
        headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"}))


class TenantKeys:
    """A tenant's key pair, another's, and the tenant secret, in files of mode 0600."""

    def make_keys(self):
        self.keys = os.path.join(self.tmp, "keys")
        os.makedirs(self.keys, mode=0o700)
        self.pub, self.priv = self.key_pair("tenant")
        self.other_pub, self.other_priv = self.key_pair("other")
        self.secret_file = self.owner_only("secret", os.urandom(32))

    def key_pair(self, name, curve=None):
        """An RSA pair, or an EC pair on `curve` (P-256, P-384, P-521)."""
        priv, pub = (os.path.join(self.keys, f"{name}{s}") for s in ("-priv.pem", "-pub.pem"))
        if curve:
            openssl("genpkey", "-algorithm", "EC", "-pkeyopt", f"ec_paramgen_curve:{curve}", "-out", priv)
        else:
            openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", priv)
        os.chmod(priv, 0o600)
        openssl("pkey", "-in", priv, "-pubout", "-out", pub)
        return pub, priv

    def owner_only(self, name, data):
        path = os.path.join(self.keys, name)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o600)
        return path

    def encryption_flags(self):
        return ["--encryption-key", f"jwe:{self.pub}", "--encryption-secret-file", self.secret_file]


class HolderCase(TenantKeys, RegistryMixin, GpusnapCase):
    """The holder of a known secret, checkpointed, and a registry to push it to."""

    def setUp(self):
        super().setUp()
        require_registry(self)
        self.reg = self.start_registry()
        self.make_keys()
        self.secret = os.urandom(64)
        self.snap = self.checkpoint_holder()
        self.ref = f"{self.reg.host}/team/holder:v1"

    def checkpoint_holder(self):
        path = os.path.join(self.tmp, "secret.bin")
        with open(path, "wb") as f:
            f.write(self.secret)
        pid = int(self.gs("run", "--name", "holder", "--", "python3", "-c", HOLDER, path).stdout.strip())
        for _ in range(200):
            if os.path.exists(path + ".ready"):
                break
            subprocess.run(["sleep", "0.05"])
        self.assertTrue(os.path.exists(path + ".ready"))
        snap = self.checkpoint("holder")
        self.assertTrue(self.wait_gone(pid))
        return snap

    def push(self, *extra, ref=None, check=True):
        p = self.gs("--json", "push", self.snap, ref or self.ref, "--plain-http", *extra, check=check)
        return json.loads(p.stdout) if check else p

    def encrypted(self, *extra, ref=None):
        return self.push(*self.encryption_flags(), *extra, ref=ref)

    def stored_files_holding(self, needle):
        return files_holding(self.reg.storage_dir, needle)

    def manifest(self, ref):
        return json.loads(self.skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{ref}").stdout)

class EncryptedPushPull(HolderCase):
    def test_plaintext_is_never_at_rest_in_the_registry(self):
        self.encrypted()
        self.assertEqual(self.stored_files_holding(self.secret), [])
        # The same snapshot pushed in the clear: the registry then holds the secret (the check can fail).
        self.push(ref=f"{self.reg.host}/team/clear:v1")
        self.assertNotEqual(self.stored_files_holding(self.secret), [])

    def test_the_manifest_is_ocicrypts_and_names_no_chunk_or_plaintext_digest(self):
        self.encrypted()
        m = self.manifest(self.ref)
        self.assertEqual(m["config"]["mediaType"], "application/vnd.gpusnap.snapshot.config.encrypted.v1")
        for d in [m["config"], *m["layers"]]:
            if d is not m["config"]:
                self.assertTrue(d["mediaType"].endswith("+encrypted"), d["mediaType"])
            self.assertIn("org.opencontainers.image.enc.keys.jwe", d["annotations"])
            pub = json.loads(__import__("base64").b64decode(d["annotations"]["org.opencontainers.image.enc.pubopts"]))
            self.assertEqual(pub["cipher"], "AES_256_CTR_HMAC_SHA256")
        clear = self.push(ref=f"{self.reg.host}/team/clear:v1")
        plain_digests = {l["digest"] for l in self.manifest(f"{self.reg.host}/team/clear:v1")["layers"]}
        self.assertFalse(plain_digests & {l["digest"] for l in m["layers"]})
        self.assertNotIn(clear["digest"], json.dumps(m))

    def test_pull_and_restore_with_the_key_and_refusals_without_it(self):
        pushed = self.encrypted()
        node_b = self.other_store("store-b")
        p = self.gs("pull", self.ref, "--plain-http", env=node_b, check=False)
        line = self.one_line_error(p)
        self.assertIn(f"`{self.ref}` is encrypted", line)
        self.assertIn("--decryption-key", line)
        self.assertEqual(self.store_is_empty(node_b), [])
        p = self.gs("pull", self.ref, "--plain-http", "--decryption-key", self.other_priv, env=node_b, check=False)
        line = self.one_line_error(p)
        self.assertIn(f"`{self.ref}` is encrypted for other recipients", line)
        self.assertEqual(self.store_is_empty(node_b), [])
        p = self.gs("restore", self.ref, "--plain-http", "--decryption-key", self.other_priv, env=node_b, check=False)
        self.assertIn("encrypted for other recipients", self.one_line_error(p))
        self.assertEqual([w for w in self.workloads() if w["running"]], [])
        # A key that others may read is refused, naming its mode, not its content.
        os.chmod(self.priv, 0o644)
        p = self.gs("pull", self.ref, "--plain-http", "--decryption-key", self.priv, env=node_b, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("mode 0644", p.stderr)
        self.assertNotIn("PRIVATE KEY", p.stderr + p.stdout)
        os.chmod(self.priv, 0o600)
        # With the key (among others): pulled, then restored, the holder alive again.
        pulled = self.gs_json("pull", self.ref, "--plain-http", "--decryption-key", self.other_priv,
                              "--decryption-key", self.priv, env=node_b)
        self.assertEqual(pulled["id"], self.snap)
        self.assertEqual(pulled["digest"], pushed["digest"])
        self.gs("inspect", "--verify", self.snap, env=node_b)
        node_c = self.other_store("store-c")
        out = self.gs_json("restore", self.ref, "--plain-http", "--decryption-key", self.priv, "--name", "copy",
                           env=node_c)
        self.assertTrue(self.alive(out["pid"]))

    def test_an_image_file_larger_than_a_digest_chunk_pulls_and_restores(self):
        # gpusnap.json lists a file over one digest chunk (64 MiB) by its chunked
        # digest, not its plain SHA-256: an 8B-class server's CRIU image has such
        # files, and their encrypted pull was once refused as "decrypts to ...".
        ready = os.path.join(self.tmp, "big.ready")
        pid = int(self.gs("run", "--name", "big", "--", "python3", "-c", BIG_HOLDER, ready).stdout.strip())
        for _ in range(400):
            if os.path.exists(ready):
                break
            subprocess.run(["sleep", "0.05"])
        self.assertTrue(os.path.exists(ready))
        snap = self.checkpoint("big")
        self.assertTrue(self.wait_gone(pid))
        image = os.path.join(self.store, "snapshots", snap)
        largest = max(os.path.getsize(os.path.join(root, n)) for root, _, names in os.walk(image) for n in names)
        self.assertGreater(largest, 64 << 20)
        ref = f"{self.reg.host}/team/big:v1"
        self.gs("push", snap, ref, "--plain-http", *self.encryption_flags())
        node_b = self.other_store("store-b")
        out = self.gs_json("restore", ref, "--plain-http", "--decryption-key", self.priv, "--name", "big-copy",
                           env=node_b)
        self.assertTrue(self.alive(out["pid"]))
        self.gs("inspect", "--verify", snap, env=node_b)

    def test_a_second_push_under_the_secret_moves_nothing_and_shares_blobs(self):
        first = self.encrypted()
        self.assertGreater(first["blobs_moved"], 0)
        again = self.encrypted()
        self.assertEqual((again["blobs_moved"], again["blobs_skipped"]), (0, again["blobs"]))
        # Another repository of the same tenant: the same blobs (the registry keeps them once).
        self.encrypted(ref=f"{self.reg.host}/team/elsewhere:v1")
        self.assertEqual({l["digest"] for l in self.manifest(self.ref)["layers"]},
                         {l["digest"] for l in self.manifest(f"{self.reg.host}/team/elsewhere:v1")["layers"]})
        # Another tenant's secret: other blobs.
        other_secret = self.owner_only("other-secret", os.urandom(32))
        self.push("--encryption-key", f"jwe:{self.pub}", "--encryption-secret-file", other_secret,
                  ref=f"{self.reg.host}/team/tenant-b:v1")
        self.assertFalse({l["digest"] for l in self.manifest(self.ref)["layers"]} &
                         {l["digest"] for l in self.manifest(f"{self.reg.host}/team/tenant-b:v1")["layers"]})
        # A secret file that others may read is refused, naming its mode.
        os.chmod(self.secret_file, 0o640)
        p = self.push("--encryption-key", f"jwe:{self.pub}", "--encryption-secret-file", self.secret_file,
                      check=False)
        self.assertIn("mode 0640", self.one_line_error(p))

    def test_an_altered_blob_is_caught_by_its_hmac(self):
        self.encrypted()
        m = self.manifest(self.ref)
        layer = max(m["layers"], key=lambda l: l["size"])
        repo = "team/holder"
        alter_blob(self.reg, repo, m, layer, "altered")
        node_b = self.other_store("store-b")
        altered = f"{self.reg.host}/{repo}:altered"
        p = self.gs("restore", altered, "--plain-http", "--decryption-key", self.priv, env=node_b, check=False)
        line = self.one_line_error(p)
        self.assertIn("does not match its HMAC", line)
        self.assertIn(layer["annotations"]["org.opencontainers.image.title"], line)
        self.store_is_empty(node_b)
        title = layer["annotations"]["org.opencontainers.image.title"]
        pulls = os.path.join(node_b["GPUSNAP_STORE"], "pulls")
        for staged in os.listdir(pulls) if os.path.isdir(pulls) else []:
            self.assertFalse(os.path.exists(os.path.join(pulls, staged, title)))
            self.assertFalse(os.path.exists(os.path.join(pulls, staged, title + ".part")))
        self.assertEqual([w for w in self.workloads() if w["running"]], [])

    def test_skopeo_decrypts_what_gpusnap_encrypted(self):
        self.encrypted()
        clear_ref = f"{self.reg.host}/team/clear:v1"
        self.push(ref=clear_ref)
        clear = self.manifest(clear_ref)
        # To an OCI layout: every layer decrypted to the bytes of the plaintext push.
        layout = os.path.join(self.tmp, "layout")
        self.skopeo("copy", "--src-tls-verify=false", "--decryption-key", self.priv, f"docker://{self.ref}",
                    f"oci:{layout}:v1")
        with open(os.path.join(layout, "index.json")) as f:
            top = json.load(f)["manifests"][0]["digest"]
        with open(os.path.join(layout, "blobs/sha256", top.split(":")[1])) as f:
            decrypted = json.load(f)

        def by_title(manifest):
            return {l["annotations"]["org.opencontainers.image.title"]: (l["mediaType"], l["digest"])
                    for l in manifest["layers"]}

        self.assertEqual(by_title(decrypted), by_title(clear))
        # The config, of gpusnap's own encrypted type, is copied as it is: the
        # copy still needs the key, which gpusnap takes.
        self.assertEqual(decrypted["config"]["mediaType"], "application/vnd.gpusnap.snapshot.config.encrypted.v1")
        second = self.start_registry(name="second")
        copy = f"{second.host}/mirror/holder:v1"
        self.skopeo("copy", "--src-tls-verify=false", "--dest-tls-verify=false", "--decryption-key", self.priv,
                    f"docker://{self.ref}", f"docker://{copy}")
        node_b = self.other_store("store-b")
        pulled = self.gs_json("pull", copy, "--plain-http", "--decryption-key", self.priv, env=node_b)
        self.assertEqual(pulled["id"], self.snap)
        self.gs("inspect", "--verify", self.snap, env=node_b)
        # A wrong key fails in skopeo too: what gpusnap wrapped is ocicrypt's JWE.
        p = self.skopeo("copy", "--src-tls-verify=false", "--decryption-key", self.other_priv,
                        f"docker://{self.ref}", f"oci:{layout}-2:v1", check=False)
        self.assertNotEqual(p.returncode, 0)


class EcRecipients(HolderCase):
    """EC recipients (ECDH-ES+A256KW), both ways with skopeo (ocicrypt)."""

    def test_skopeo_decrypts_what_gpusnap_encrypted_for_ec_keys(self):
        pub256, priv256 = self.key_pair("ec256", curve="P-256")
        pub521, priv521 = self.key_pair("ec521", curve="P-521")
        self.push("--encryption-key", f"jwe:{pub256}", "--encryption-key", f"jwe:{pub521}",
                  "--encryption-secret-file", self.secret_file)
        algs = {r["header"]["alg"] for l in self.manifest(self.ref)["layers"]
                for r in json.loads(base64.b64decode(l["annotations"]["org.opencontainers.image.enc.keys.jwe"]))[
                    "recipients"]}
        self.assertEqual(algs, {"ECDH-ES+A256KW"})
        clear_ref = f"{self.reg.host}/team/clear:v1"
        self.push(ref=clear_ref)
        for priv in (priv256, priv521):
            layout = os.path.join(self.tmp, "layout-" + os.path.basename(priv))
            self.skopeo("copy", "--src-tls-verify=false", "--decryption-key", priv, f"docker://{self.ref}",
                        f"oci:{layout}:v1")
            self.assertEqual(self.layout_layers(layout), self.layers_by_title(self.manifest(clear_ref)))
        p = self.skopeo("copy", "--src-tls-verify=false", "--decryption-key", self.priv, f"docker://{self.ref}",
                        f"oci:{self.tmp}/layout-rsa:v1", check=False)
        self.assertNotEqual(p.returncode, 0)
        # gpusnap restores it with either EC key, not with another key of the curve.
        node_b = self.other_store("store-b")
        _, stranger = self.key_pair("stranger", curve="P-256")
        p = self.gs("pull", self.ref, "--plain-http", "--decryption-key", stranger, env=node_b, check=False)
        self.assertIn("is encrypted for other recipients", self.one_line_error(p))
        self.assertEqual(self.store_is_empty(node_b), [])
        out = self.gs_json("restore", self.ref, "--plain-http", "--decryption-key", priv521, "--name", "copy",
                           env=node_b)
        self.assertTrue(self.alive(out["pid"]))

    def test_gpusnap_decrypts_what_skopeo_encrypted_for_an_ec_key(self):
        # skopeo encrypts only container images' layer types (docs/DISTRIBUTION.md):
        # the files of a push in the clear are copied to an OCI layout and
        # typed as tar layers there, skopeo encrypts that copy for an EC key
        # (its own keys, its own JWE), and the manifest it pushed is typed
        # back as gpusnap's. Every encrypted byte and wrapped key is skopeo's.
        pub, priv = self.key_pair("ec384", curve="P-384")
        clear_ref = f"{self.reg.host}/team/clear:v1"
        self.push(ref=clear_ref)
        layout = os.path.join(self.tmp, "clear-layout")
        self.skopeo("copy", "--src-tls-verify=false", f"docker://{clear_ref}", f"oci:{layout}:v1")
        file_type, tar_type = "application/vnd.gpusnap.snapshot.file.v1", "application/vnd.oci.image.layer.v1.tar"
        self.retype_layout(layout, file_type, tar_type)
        skopeo_ref = f"{self.reg.host}/team/by-skopeo"
        self.skopeo("copy", "--dest-tls-verify=false", "--encryption-key", f"jwe:{pub}", f"oci:{layout}:v1",
                    f"docker://{skopeo_ref}:tar")
        m = self.manifest(f"{skopeo_ref}:tar")
        self.assertTrue(all(l["mediaType"] == tar_type + "+encrypted" for l in m["layers"]), m)
        jwe = json.loads(base64.b64decode(m["layers"][0]["annotations"]["org.opencontainers.image.enc.keys.jwe"]))
        # skopeo 1.9 writes one recipient in the flattened serialization, its
        # algorithm and ephemeral key in the protected header.
        self.assertNotIn("recipients", jwe)
        header = json.loads(base64.urlsafe_b64decode(jwe["protected"] + "=" * (-len(jwe["protected"]) % 4)))
        self.assertEqual((header["alg"], header["epk"]["crv"]), ("ECDH-ES+A256KW", "P-384"))
        for l in m["layers"]:
            l["mediaType"] = file_type + "+encrypted"
        self.put_manifest("team/by-skopeo", "gpusnap", m)

        node_b = self.other_store("store-b")
        ref = f"{skopeo_ref}:gpusnap"
        p = self.gs("pull", ref, "--plain-http", env=node_b, check=False)
        self.assertIn(f"`{ref}` is encrypted", self.one_line_error(p))
        # Nothing published; its config being plaintext, the pull got as far
        # as its first encrypted file, and the next pull goes on from there.
        self.store_is_empty(node_b)
        pulled = self.gs_json("pull", ref, "--plain-http", "--decryption-key", priv, env=node_b)
        self.assertEqual(pulled["id"], self.snap)
        self.gs("inspect", "--verify", self.snap, env=node_b)
        out = self.gs_json("restore", self.snap, "--name", "from-skopeo", env=node_b)
        self.assertTrue(self.alive(out["pid"]))

    # --- helpers -------------------------------------------------------------
    def layers_by_title(self, manifest):
        return {l["annotations"]["org.opencontainers.image.title"]: (l["mediaType"], l["digest"])
                for l in manifest["layers"]}

    def layout_manifest_path(self, layout):
        with open(os.path.join(layout, "index.json")) as f:
            top = json.load(f)["manifests"][0]["digest"]
        return os.path.join(layout, "blobs/sha256", top.split(":")[1])

    def layout_layers(self, layout):
        with open(self.layout_manifest_path(layout)) as f:
            return self.layers_by_title(json.load(f))

    def retype_layout(self, layout, old, new):
        """The layout's manifest with its layers of type `old` typed `new`, and its index naming it."""
        with open(self.layout_manifest_path(layout)) as f:
            m = json.load(f)
        for l in m["layers"]:
            if l["mediaType"] == old:
                l["mediaType"] = new
        body = json.dumps(m).encode()
        digest = hashlib.sha256(body).hexdigest()
        with open(os.path.join(layout, "blobs/sha256", digest), "wb") as f:
            f.write(body)
        with open(os.path.join(layout, "index.json")) as f:
            index = json.load(f)
        index["manifests"][0].update({"digest": "sha256:" + digest, "size": len(body)})
        with open(os.path.join(layout, "index.json"), "w") as f:
            json.dump(index, f)

    def put_manifest(self, repo, tag, manifest):
        urllib.request.urlopen(urllib.request.Request(
            f"{self.reg.url}/v2/{repo}/manifests/{tag}", data=json.dumps(manifest).encode(), method="PUT",
            headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"}))


class EncryptedChunks(TenantKeys, RegistryMixin, WorkerSteps, FakeGpuCase):
    """gpushare chunks encrypted: unnamed in the manifest, named again by the
    pull from the decrypted chunk manifests, moved once per tenant secret."""

    def setUp(self):
        super().setUp()
        self.start_worker_registry()
        self.make_keys()

    def test_encrypted_chunks_dedupe_and_restore(self):
        self.gs("run", "--gpushare", "--name", "vmm", "--", WORKER, "--mib", "200,5", "--interval-ms", "20",
                "--device-file", self.device, env=self.gpu_env)
        self.wait_steps(3)
        first = self.gs("checkpoint", "vmm", "--leave-running", env=self.gpu_env).stdout.strip().splitlines()[-1]
        ref = f"{self.reg.host}/team/vmm"
        one = self.gs_json("push", first, ref + ":one", "--plain-http", *self.encryption_flags(), env=self.gpu_env)
        again = self.gs_json("push", first, ref + ":again", "--plain-http", *self.encryption_flags(),
                             env=self.gpu_env)
        self.assertEqual(again["blobs_moved"], 0)
        self.wait_steps(len(self.steps()) + 3)
        second = self.gs("checkpoint", "vmm", env=self.gpu_env).stdout.strip().splitlines()[-1]
        two = self.gs_json("push", second, ref + ":two", "--plain-http", *self.encryption_flags(), env=self.gpu_env)
        # The second snapshot shares chunks with the first: their encrypted blobs are the same.
        self.assertLess(two["bytes_moved"], one["bytes_moved"])
        layers = lambda tag: json.loads(self.skopeo("inspect", "--raw", "--tls-verify=false",
                                                     f"docker://{ref}:{tag}").stdout)["layers"]
        chunks = [l for l in layers("two") if l["mediaType"] == "application/vnd.gpusnap.gpushare.chunk.v1+encrypted"]
        self.assertTrue(chunks)
        self.assertFalse([l for l in chunks if "io.gpusnap.chunk.xxh3-128" in l["annotations"]])
        shared = {l["digest"] for l in layers("one")} & {l["digest"] for l in chunks}
        self.assertTrue(shared)
        node_b = dict(self.gpu_env, GPUSNAP_STORE=os.path.join(self.tmp, "store-b"))
        a = self.gs_json("pull", ref + ":one", "--plain-http", "--decryption-key", self.priv, env=node_b)
        b = self.gs_json("pull", ref + ":two", "--plain-http", "--decryption-key", self.priv, env=node_b)
        self.assertGreater(b["blobs_skipped"], 0)
        self.assertLess(b["bytes_moved"], a["bytes_moved"])
        self.gs("inspect", "--verify", second, env=node_b)
        # A flipped byte of an encrypted chunk: its HMAC refuses it, naming it, and the store keeps no chunk of it.
        m = json.loads(self.skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{ref}:two").stdout)
        chunk = next(l for l in m["layers"] if l["mediaType"].endswith("chunk.v1+encrypted") and
                     l["digest"] not in {x["digest"] for x in layers("one")})
        alter_blob(self.reg, "team/vmm", m, chunk, "altered")
        node_c = dict(self.gpu_env, GPUSNAP_STORE=os.path.join(self.tmp, "store-c"))
        p = self.gs("pull", ref + ":altered", "--plain-http", "--decryption-key", self.priv, env=node_c, check=False)
        self.assertRegex(self.one_line_error(p), r"chunk [0-9a-f]{32} does not match its HMAC")
        self.assertEqual(self.gs_json("ls", env=node_c), [])
        self.set_device_state(2)
        out = self.gs_json("restore", second, "--name", "copy", env=node_b)
        self.assertGreater(out["pid"], 0)
        self.wait_steps(len(self.steps()) + 3)


if __name__ == "__main__":
    import unittest
    unittest.main()
