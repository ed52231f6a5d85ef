"""Signed snapshots through a real registry (Debian's docker-registry) and
skopeo: gpusnap's sigstore signatures verified by skopeo, skopeo's by
gpusnap (each skipped by a skopeo built without sigstore, as Debian's), the
same both ways with openssl and the registry's API apart from either, and
a pull under a trust policy that refuses, with one line and the
store as it was, an unsigned snapshot, a signature by another key, a
signature of another digest and one naming another repository
(docs/DISTRIBUTION.md, "Signed snapshots")."""
import base64
import hashlib
import json
import os
import subprocess
import urllib.request

import registry
from harness import GpusnapCase
from test_registry import RegistryMixin, require_registry

PASSPHRASE = "a test passphrase"


def openssl(*args, data=None):
    return subprocess.run(["openssl", *args], input=data, capture_output=True, check=True).stdout


# PyNaCl is Debian's (python3-nacl), for Debian's python: the python running
# the tests may be another, without it.
DEBIAN_PYTHON = "/usr/bin/python3"
SECRETBOX = ("import nacl.secret, sys; key, nonce, data = (bytes.fromhex(a) for a in sys.argv[1:4]); "
             "sys.stdout.write(nacl.secret.SecretBox(key).encrypt(data, nonce).ciphertext.hex())")


def secretbox(key, nonce, data):
    """NaCl's secretbox of `data`, as cosign seals its keys."""
    return bytes.fromhex(subprocess.run([DEBIAN_PYTHON, "-c", SECRETBOX, key.hex(), nonce.hex(), data.hex()],
                                        capture_output=True, text=True, check=True).stdout)


def have_nacl():
    return subprocess.run([DEBIAN_PYTHON, "-c", "import nacl.secret"], capture_output=True).returncode == 0


def make_key_pair(directory, name, cosign_format):
    """An ECDSA P-256 key pair: NAME.key (cosign's encrypted format, or a
    plain PKCS#8 PEM), NAME.pub; both paths. cosign's format is made here
    with hashlib's scrypt and PyNaCl's secretbox, apart from gpusnap's code."""
    pem = openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
    pub = os.path.join(directory, name + ".pub")
    with open(pub, "wb") as f:
        f.write(openssl("pkey", "-pubout", data=pem))
    key = os.path.join(directory, name + ".key")
    if cosign_format:
        der = openssl("pkcs8", "-topk8", "-nocrypt", "-outform", "DER", data=pem)
        salt, nonce = os.urandom(32), os.urandom(24)
        secret = hashlib.scrypt(PASSPHRASE.encode(), salt=salt, n=32768, r=8, p=1, maxmem=64 << 20, dklen=32)
        sealed = secretbox(secret, nonce, der)
        body = json.dumps({"kdf": {"name": "scrypt", "params": {"N": 32768, "r": 8, "p": 1},
                                   "salt": base64.b64encode(salt).decode()},
                           "cipher": {"name": "nacl/secretbox", "nonce": base64.b64encode(nonce).decode()},
                           "ciphertext": base64.b64encode(sealed).decode()})
        b64 = base64.b64encode(body.encode()).decode()
        pem = ("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n" +
               "".join(b64[i:i + 64] + "\n" for i in range(0, len(b64), 64)) +
               "-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n").encode()
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return key, pub


class SignedSnapshots(RegistryMixin, GpusnapCase):
    def setUp(self):
        super().setUp()
        require_registry(self)
        if not have_nacl():
            self.skipTest(f"no python3-nacl for {DEBIAN_PYTHON} (cosign-format keys are made with it)")
        self.reg = self.start_registry()
        self.run_counter("cnt")
        self.snap = self.checkpoint("cnt")
        self.ref = f"{self.reg.host}/team/counter:v1"
        self.key, self.pub = make_key_pair(self.tmp, "cosign", cosign_format=True)
        self.other_key, self.other_pub = make_key_pair(self.tmp, "other", cosign_format=False)
        self.passphrase = os.path.join(self.tmp, "passphrase")
        fd = os.open(self.passphrase, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(PASSPHRASE + "\n")
        # skopeo reads and writes sigstore attachments only where registries.d says so.
        self.registries_d = os.path.join(self.tmp, "registries.d")
        os.makedirs(self.registries_d)
        with open(os.path.join(self.registries_d, "test.yaml"), "w") as f:
            f.write(f"docker:\n  {self.reg.host}:\n    use-sigstore-attachments: true\n")
        self.node_b = self.other_store("store-b")

    def policy(self, name, pub):
        """A policy: signatures by `pub` for the test's registry, nothing else."""
        path = os.path.join(self.tmp, name + ".json")
        with open(path, "w") as f:
            json.dump({"default": [{"type": "reject"}],
                       "transports": {"docker": {self.reg.host: [{"type": "sigstoreSigned", "keyPath": pub}]},
                                      "dir": {"": [{"type": "insecureAcceptAnything"}]}}}, f)
        return path

    def skopeo_trusting(self, policy, *args):
        """skopeo ARGS under `policy` (None: any image) with the tests' registries.d; its result, checked by the caller."""
        flags = ["--policy", policy] if policy else ["--insecure-policy"]
        return self.skopeo(*args, check=False, flags=[*flags, "--registries.d", self.registries_d])

    def push(self, ref, *extra):
        return json.loads(self.gs("--json", "push", self.snap, ref, "--plain-http", *extra).stdout)

    def push_signed(self, ref):
        return self.push(ref, "--sign-by-sigstore-private-key", self.key, "--sign-passphrase-file", self.passphrase)

    def refused(self, ref, policy, says):
        p = self.gs("pull", ref, "--plain-http", "--policy", policy, check=False, env=self.node_b)
        line = self.one_line_error(p)
        self.assertIn(ref, line)
        self.assertIn(says, line)
        self.assertEqual(self.store_is_empty(self.node_b), [])
        return line

    def skip_if_skopeo_has_no_sigstore(self, p):
        # Debian's skopeo 1.9.3 is built without sigstore ("Debian-local change: sigstore disabled"):
        # it neither signs nor verifies sigstore signatures, though it copies their attachments.
        if p.returncode != 0 and "sigstore disabled" in p.stderr:
            self.skipTest("this skopeo is built with sigstore disabled (Debian's 1.9.3): " + p.stderr.strip()[-80:])

    # The registry's own API, for the signatures made and read apart from gpusnap and skopeo.
    def api(self, method, path, body=None, headers=None):
        req = urllib.request.Request(self.reg.url + path, data=body, method=method, headers=headers or {})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read(), r.headers

    def put_blob(self, repo, data):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        _, headers = self.api("POST", f"/v2/{repo}/blobs/uploads/")
        location = headers["Location"]
        location = location if location.startswith("http") else self.reg.url + location
        sep = "&" if "?" in location else "?"
        req = urllib.request.Request(f"{location}{sep}digest={digest}", data=data, method="PUT",
                                     headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(req, timeout=30).read()
        return {"digest": digest, "size": len(data)}

    def test_openssl_verifies_gpusnaps_sigstore_signature(self):
        # Independent of skopeo (Debian's cannot verify sigstore signatures): the attachment read
        # through the registry's API, its payload checked as cosign defines it, the signature by
        # openssl against the public key, and against another key refused.
        digest = self.push_signed(self.ref)["digest"]
        body, _ = self.api("GET", f"/v2/team/counter/manifests/sha256-{digest[7:]}.sig",
                           headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
        attachment = json.loads(body)
        self.assertEqual(len(attachment["layers"]), 1, attachment)
        layer = attachment["layers"][0]
        self.assertEqual(layer["mediaType"], "application/vnd.dev.cosign.simplesigning.v1+json")
        payload, _ = self.api("GET", f"/v2/team/counter/blobs/{layer['digest']}")
        self.assertEqual("sha256:" + hashlib.sha256(payload).hexdigest(), layer["digest"])
        critical = json.loads(payload)["critical"]
        self.assertEqual(critical, {"identity": {"docker-reference": self.ref},
                                    "image": {"docker-manifest-digest": digest},
                                    "type": "cosign container image signature"})
        files = {"payload": payload, "sig": base64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"])}
        for name, data in files.items():
            with open(os.path.join(self.tmp, name), "wb") as f:
                f.write(data)
        verify = ["openssl", "dgst", "-sha256", "-signature", os.path.join(self.tmp, "sig"),
                  os.path.join(self.tmp, "payload")]
        ok = subprocess.run(verify[:3] + ["-verify", self.pub] + verify[3:], capture_output=True, text=True)
        self.assertEqual((ok.returncode, ok.stdout.strip()), (0, "Verified OK"), ok.stderr)
        other = subprocess.run(verify[:3] + ["-verify", self.other_pub] + verify[3:], capture_output=True, text=True)
        self.assertNotEqual(other.returncode, 0)

    def test_gpusnap_verifies_a_signature_made_by_openssl_and_restores(self):
        # Independent of gpusnap's signer: a cosign payload written here, signed by openssl, put in
        # the registry as the sigstore attachment through its API; the restore under a policy
        # trusting the key succeeds, and the same attachment signed by another key is refused.
        ref = f"{self.reg.host}/team/counter:by-openssl"
        digest = self.push(ref)["digest"]
        payload = json.dumps({"critical": {"identity": {"docker-reference": ref},
                                           "image": {"docker-manifest-digest": digest},
                                           "type": "cosign container image signature"},
                              "optional": {"creator": "openssl, by hand"}}).encode()

        def attach(key):
            pem = open(key, "rb").read()
            key_file = os.path.join(self.tmp, "signing.pem")
            with open(key_file, "wb") as f:
                f.write(pem)
            sig = openssl("dgst", "-sha256", "-sign", key_file, data=payload)
            os.unlink(key_file)
            config = self.put_blob("team/counter", json.dumps({"architecture": "", "os": ""}).encode())
            layer = self.put_blob("team/counter", payload)
            manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
                        "layers": [{"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json", **layer,
                                    "annotations": {"dev.cosignproject.cosign/signature":
                                                    base64.b64encode(sig).decode()}}]}
            self.api("PUT", f"/v2/team/counter/manifests/sha256-{digest[7:]}.sig", json.dumps(manifest).encode(),
                     {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})

        # The other key is a plain PKCS#8 PEM, which openssl signs with as it is.
        attach(self.other_key)
        self.refused(ref, self.policy("p", self.pub), "no key the policy trusts")
        plain_key, plain_pub = make_key_pair(self.tmp, "plain", cosign_format=False)
        attach(plain_key)
        out = self.gs_json("restore", ref, "--plain-http", "--policy", self.policy("plain", plain_pub), "--name", "copy",
                           env=self.node_b)
        self.wait_count(out["pid"], self.count(out["pid"]) + 2)

    def test_skopeo_verifies_gpusnaps_signature(self):
        digest = self.push_signed(self.ref)["digest"]
        # gpusnap pulls it under a policy trusting the key.
        pulled = self.gs_json("pull", self.ref, "--plain-http", "--policy", self.policy("p", self.pub), env=self.node_b)
        self.assertEqual(pulled["id"], self.snap)
        self.assertEqual(pulled["digest"], digest)
        out = os.path.join(self.tmp, "copied")
        p = self.skopeo_trusting(self.policy("trusts-cosign", self.pub), "copy", "--src-tls-verify=false",
                                 f"docker://{self.ref}", f"dir:{out}")
        self.skip_if_skopeo_has_no_sigstore(p)
        self.assertEqual(p.returncode, 0, p.stderr)
        p = self.skopeo_trusting(self.policy("trusts-other", self.other_pub), "copy", "--src-tls-verify=false",
                                 f"docker://{self.ref}", f"dir:{out}-2")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("signature", p.stderr.lower())

    def test_gpusnap_verifies_skopeos_signature_and_restores(self):
        self.push(f"{self.reg.host}/team/counter:unsigned")
        signed = f"{self.reg.host}/team/counter:by-skopeo"
        p = self.skopeo_trusting(None, "copy", "--src-tls-verify=false", "--dest-tls-verify=false",
                                 "--sign-by-sigstore-private-key", self.key, "--sign-passphrase-file", self.passphrase,
                                 f"docker://{self.reg.host}/team/counter:unsigned", f"docker://{signed}")
        self.skip_if_skopeo_has_no_sigstore(p)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = self.gs_json("restore", signed, "--plain-http", "--policy", self.policy("p", self.pub), "--name", "copy",
                           env=self.node_b)
        self.wait_count(out["pid"], self.count(out["pid"]) + 2)

    def test_an_unsigned_snapshot_and_one_by_another_key_are_refused(self):
        self.push(self.ref)
        self.refused(self.ref, self.policy("p", self.pub), "no signature")
        signed_by_other = f"{self.reg.host}/team/counter:other"
        self.push(signed_by_other, "--sign-by-sigstore-private-key", self.other_key)
        self.refused(signed_by_other, self.policy("p", self.pub), "no key the policy trusts")

    def test_a_signature_of_another_digest_or_naming_another_repository_is_refused(self):
        first = self.push_signed(self.ref)["digest"]
        # The tag moves to other bytes, and the old signature is put beside them.
        self.run_counter("cnt2")
        self.snap = self.checkpoint("cnt2")
        second = self.push(self.ref)["digest"]
        self.assertNotEqual(first, second)
        copy = self.skopeo_trusting(None, "copy", "--src-tls-verify=false", "--dest-tls-verify=false",
                                    f"docker://{self.reg.host}/team/counter:sha256-{first[7:]}.sig",
                                    f"docker://{self.reg.host}/team/counter:sha256-{second[7:]}.sig")
        self.assertEqual(copy.returncode, 0, copy.stderr)
        self.refused(self.ref, self.policy("p", self.pub), f"another digest, {first}")
        # A signed snapshot copied, signature and all, into another repository.
        elsewhere = f"{self.reg.host}/evil/counter:v1"
        signed = f"{self.reg.host}/team/counter:signed"
        self.push_signed(signed)
        copy = self.skopeo_trusting(None, "copy", "--src-tls-verify=false", "--dest-tls-verify=false",
                                    f"docker://{signed}", f"docker://{elsewhere}")
        self.assertEqual(copy.returncode, 0, copy.stderr)
        self.refused(elsewhere, self.policy("p", self.pub), f"a signature for `{signed}`")

    def test_a_policy_that_rejects_and_a_key_file_others_may_read(self):
        self.push(self.ref)
        reject = os.path.join(self.tmp, "reject.json")
        with open(reject, "w") as f:
            json.dump({"default": [{"type": "reject"}]}, f)
        self.refused(self.ref, reject, "rejects everything")
        os.chmod(self.key, 0o644)
        p = self.gs("push", self.snap, self.ref, "--plain-http", "--sign-by-sigstore-private-key", self.key,
                    "--sign-passphrase-file", self.passphrase, check=False)
        line = self.one_line_error(p)
        self.assertIn("mode 0644", line)
        self.assertNotIn("BEGIN", p.stderr)


if __name__ == "__main__":
    import unittest
    unittest.main()
