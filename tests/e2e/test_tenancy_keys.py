"""A namespace's keys (docs/SECURITY.md, "A namespace's keys") on the
Kubernetes test bed (tests/k8s/apiserver.py, driven with kubectl), with the
agent in its Kubernetes mode, real runc containers, real CRIU and a real
registry (HTTPS, a user per namespace):

- a pod's gpusnap.io/push-to is encrypted for the recipients of its
  namespace's Secret `gpusnap` (EC keys here), under its tenant secret: the
  registry holds none of the snapshot's plaintext; its placeholder restores the
  reference with its namespace's private key;
- another namespace allowed to pull from that repository and to restore the
  first's snapshots is refused before CRIU, the store as it was, the
  placeholder idle: it has no key of its own that opens the artifact, and the
  agent's own --decryption-key (which does) serves the API's callers only;
  once the administrator names a key file for it in the tenancy
  configuration, it restores;
- the namespace's secret makes the blobs: the same snapshot pushed again
  under its keys moves none;
- requireEncryption refuses a namespace's push-to in the clear before
  anything is dumped;
- the agent's own --encryption-key serves a request's pushTo (the
  administrator's), never a pod's push-to;
- no key, secret or PEM line is in the agent's log, its job records, or the
  files it writes for the registry client."""
import base64
import glob
import json
import os
import secrets
import unittest

from registry import write_docker_config
from test_registry_encryption import TenantKeys, files_holding
from test_tenancy_kube import TenancyCase


class NamespaceKeysCase(TenantKeys, TenancyCase):
    def setUp(self):
        super().setUp()
        self.keys = os.path.join(self.tmp, "keys")
        os.makedirs(self.keys, mode=0o700)
        self.shared = self.repository("shared")

    def namespace_secret(self, ns, **files):
        """Secret `gpusnap` of `ns` made again, as docs/KUBERNETES.md shows:
        its registry user's docker config and the key files given."""
        config = write_docker_config(os.path.join(self.keys, f"{ns}-docker", "config.json"), self.registry.host, ns,
                                     self.registry.passwords[ns])
        self.kubectl("delete", "secret", "gpusnap", "-n", ns)
        args = ["create", "secret", "generic", "gpusnap", "-n", ns, "--type=kubernetes.io/dockerconfigjson",
                f"--from-file=.dockerconfigjson={config}"]
        args += [f"--from-file={key}={path}" for key, path in files.items()]
        self.kubectl(*args)

    def manifest(self, repository, tag):
        """The manifest under a tag, read from the registry's storage."""
        v2 = os.path.join(self.registry.storage_dir, "docker/registry/v2")
        with open(os.path.join(v2, "repositories", repository, "_manifests/tags", tag, "current/link")) as f:
            digest = f.read().strip()
        with open(self.registry.blob_path(digest)) as f:
            return json.load(f)

    def snapshot_ids(self):
        d = os.path.join(self.store, "snapshots")
        return sorted(n for n in os.listdir(d) if not n.startswith(".")) if os.path.isdir(d) else []

    def what_the_agent_wrote(self, agent):
        """The agent's log, its job records and the files it keeps for the
        registry client, as one text (at least one of each)."""
        records = glob.glob(os.path.join(self.store, "agent", "jobs", "*.json"))
        kept = glob.glob(os.path.join(self.run_dir, "agent", "namespaces", "*.json"))
        self.assertTrue(records and kept, (records, kept))
        text = agent.log().encode()
        for path in records + kept:
            with open(path, "rb") as f:
                text += f.read()
        return text

    def assert_no_key_material(self, text, private_keys, secret_files):
        for path in private_keys:
            with open(path, "rb") as f:
                lines = [l for l in f.read().splitlines() if l and not l.startswith(b"-----")]
            self.assertTrue(lines)
            for line in lines:
                self.assertNotIn(line, text)
        for path in secret_files:
            with open(path, "rb") as f:
                secret = f.read()
            self.assertNotIn(secret, text)
            self.assertNotIn(base64.b64encode(secret), text)
        self.assertNotIn(b"PRIVATE KEY", text)


class EncryptedPerNamespace(NamespaceKeysCase):
    def test_a_namespace_pushes_for_its_recipients_restores_with_its_key_and_no_other_namespace_can(self):
        a_pub, a_priv = self.key_pair("team-a", curve="P-384")
        a_secret = self.owner_only("team-a.secret", secrets.token_hex(32).encode())
        self.namespace_secret("team-a", **{"decryption-key.pem": a_priv, "encryption-recipients.pem": a_pub,
                                           "encryption-secret": a_secret})
        b_pub, b_priv = self.key_pair("team-b")
        self.namespace_secret("team-b", **{"decryption-key.pem": b_priv})
        self.set_tenancy({"team-a": {"repositories": [self.shared]},
                          "team-b": {"repositories": [self.shared], "restoreFrom": ["team-a"]}})
        # The agent's own key opens team-a's artifacts: it must not serve team-b.
        agent = self.start_kube_agent("--decryption-key", a_priv)

        ref = self.repository("shared/counter:v1")
        self.source_pod("team-a", "counter-0", {"gpusnap.io/push-to": ref})
        job = self.capture(agent, "team-a", "counter-0")
        self.assertEqual((job["push"]["reference"], job["push"]["done"]), (ref, True), job["push"])
        snapshot = job["snapshot"]
        self.assertIn(f"pushed `{snapshot}` to {ref}", agent.log())
        self.assertIn("encrypted for 1 recipient(s)", agent.log())
        # Encrypted the ocicrypt way, for an EC key; none of gpusnap.json's bytes at rest.
        m = self.manifest("shared/counter", "v1")
        self.assertEqual(m["config"]["mediaType"], "application/vnd.gpusnap.snapshot.config.encrypted.v1")
        self.assertTrue(all(l["mediaType"].endswith("+encrypted") for l in m["layers"]), m)
        jwe = json.loads(base64.b64decode(m["config"]["annotations"]["org.opencontainers.image.enc.keys.jwe"]))
        self.assertEqual([r["header"]["alg"] for r in jwe["recipients"]], ["ECDH-ES+A256KW"])
        with open(os.path.join(self.store, "snapshots", snapshot, "gpusnap.json"), "rb") as f:
            self.assertEqual(files_holding(self.registry.storage_dir, f.read()), [])
        status, _ = agent.request("DELETE", f"/v1/snapshots/{snapshot}")
        self.assertEqual(status, 200)

        # team-b may pull from the repository and restore team-a's snapshots,
        # but holds no key that opens them: refused before CRIU, nothing kept.
        init = self.placeholder("team-b", "other", ref)
        self.assert_refused_and_idle(agent, "team-b", "other", init, f"`{ref}` is encrypted for other recipients",
                                     "none of the 1 decryption keys of namespace `team-b` opens it")
        self.assertEqual(self.snapshot_ids(), [])
        pulls = os.path.join(self.store, "pulls")
        self.assertEqual(os.listdir(pulls) if os.path.isdir(pulls) else [], [])

        # team-a's placeholder restores it with its own key.
        init_a = self.placeholder("team-a", "own", ref)
        self.assert_restored(agent, "team-a", "own", init_a)

        self.assert_no_key_material(self.what_the_agent_wrote(agent), [a_priv, b_priv], [a_secret])

    def test_a_key_file_the_administrator_names_for_a_namespace_opens_for_it(self):
        a_pub, a_priv = self.key_pair("team-a", curve="P-256")
        a_secret = self.owner_only("team-a.secret", os.urandom(32))
        self.namespace_secret("team-a", **{"encryption-recipients.pem": a_pub, "encryption-secret": a_secret})
        self.set_tenancy({"team-a": {"repositories": [self.shared]},
                          "team-b": {"repositories": [self.shared], "restoreFrom": ["team-a"]}})
        agent = self.start_kube_agent()
        ref = self.repository("shared/counter:v1")
        self.source_pod("team-a", "counter-0", {"gpusnap.io/push-to": ref})
        snapshot = self.capture(agent, "team-a", "counter-0")["snapshot"]
        self.assertEqual(agent.request("DELETE", f"/v1/snapshots/{snapshot}")[0], 200)
        # team-b opted in without keys: the refusal says whose keys it lacks.
        init = self.placeholder("team-b", "lent", ref)
        self.assert_refused_and_idle(agent, "team-b", "lent", init, f"`{ref}` is encrypted: give namespace `team-b` "
                                     "a decryption key (`decryption-key.pem` in its Secret `gpusnap`, or "
                                     "decryptionKeys in the administrator's tenancy configuration)")
        # The administrator lends it team-a's key (the configuration is read
        # again at each use): then it restores.
        self.set_tenancy({"team-a": {"repositories": [self.shared]},
                          "team-b": {"repositories": [self.shared], "restoreFrom": ["team-a"],
                                     "decryptionKeys": [a_priv]}})
        self.retry("team-b", "lent")
        self.assert_restored(agent, "team-b", "lent", init)
        self.assert_no_key_material(self.what_the_agent_wrote(agent), [a_priv], [a_secret])

    def test_a_second_capture_pushes_again_under_the_namespaces_secret_and_shares_blobs(self):
        a_pub, a_priv = self.key_pair("team-a")
        a_secret = self.owner_only("team-a.secret", secrets.token_bytes(48))
        self.namespace_secret("team-a", **{"encryption-recipients.pem": a_pub, "encryption-secret": a_secret})
        self.set_tenancy({"team-a": {"repositories": [self.shared]}})
        agent = self.start_kube_agent()
        ref = self.repository("shared/counter:v1")
        self.source_pod("team-a", "counter-0", {"gpusnap.io/push-to": ref})
        first = self.capture(agent, "team-a", "counter-0")
        # The same snapshot pushed again under the namespace's keys (by the
        # CLI, as its owner might): every blob is one the agent pushed, so
        # none moves; the agent derived them from the namespace's secret.
        second_ref = self.repository("shared/counter:again")
        out = self.gs_json("push", first["snapshot"], second_ref, "--ca-file", self.registry.ca_file,
                           "--registry-config", os.path.join(self.keys, "team-a-docker", "config.json"),
                           "--encryption-key", f"jwe:{a_pub}", "--encryption-secret-file", a_secret)
        self.assertEqual(out["blobs_moved"], 0, out)
        layers = lambda repo, tag: {l["digest"] for l in self.manifest(repo, tag)["layers"]}
        self.assertEqual(layers("shared/counter", "v1"), layers("shared/counter", "again"))
        self.assert_no_key_material(self.what_the_agent_wrote(agent), [a_priv], [a_secret])


class TheAgentsOwnKeys(NamespaceKeysCase):
    def test_the_agents_recipients_serve_the_apis_pushes_and_no_namespaces(self):
        pub, priv = self.key_pair("admin")
        secret = self.owner_only("admin.secret", os.urandom(32))
        self.set_tenancy({"team-a": {"repositories": [self.shared]}})
        agent = self.start_kube_agent("--encryption-key", f"jwe:{pub}", "--encryption-secret-file", secret)
        # The administrator's push (the request's pushTo): encrypted for the agent's recipient.
        self.source_pod("team-a", "by-api")
        status, reply = self.checkpoint(agent, {"pod": {"namespace": "team-a", "name": "by-api", "container": "server"},
                                                "pushTo": self.repository("admin/counter:v1")})
        self.assertEqual(status, 202, reply)
        job = self.wait_job(agent, reply["job"])
        self.assertEqual((job["state"], job["push"]["done"]), ("succeeded", True), job)
        m = self.manifest("admin/counter", "v1")
        self.assertTrue(all(l["mediaType"].endswith("+encrypted") for l in m["layers"]), m)
        # team-a's pod's own push-to: team-a has no recipients, so in the clear, never for the agent's.
        self.source_pod("team-a", "by-pod", {"gpusnap.io/push-to": self.repository("shared/counter:v1")})
        self.capture(agent, "team-a", "by-pod")
        m = self.manifest("shared/counter", "v1")
        self.assertFalse([l for l in m["layers"] if l["mediaType"].endswith("+encrypted")], m)
        self.assert_no_key_material(self.what_the_agent_wrote(agent), [priv], [secret])


class RequiredEncryption(NamespaceKeysCase):
    def test_a_namespace_that_must_encrypt_cannot_push_in_the_clear(self):
        self.set_tenancy({"team-b": {"repositories": [self.shared], "requireEncryption": True}})
        agent = self.start_kube_agent()
        ref = self.repository("shared/clear:v1")
        _, pid = self.source_pod("team-b", "pusher", {"gpusnap.io/push-to": ref})
        status, reply = self.checkpoint(agent, {"pod": {"namespace": "team-b", "name": "pusher", "container": "server"}})
        self.assertEqual(status, 403, reply)
        self.assertIn(f"pod team-b/pusher: annotation gpusnap.io/push-to `{ref}` refused: namespace `team-b` must "
                      "encrypt what it pushes (requireEncryption)", reply["error"])
        self.warnings("team-b", "pusher", "GpusnapPushRefused")
        self.wait_count(pid, self.count(pid) + 3)  # not dumped
        self.assertEqual((self.snapshot_ids(), self.served()), ([], []))

        # With recipients (here the administrator's files), it pushes encrypted.
        pub, _ = self.key_pair("team-b", curve="P-256")
        secret = self.owner_only("team-b.secret", os.urandom(32))
        self.set_tenancy({"team-b": {"repositories": [self.shared], "requireEncryption": True,
                                     "encryptionRecipients": [pub], "encryptionSecretFile": secret}})
        job = self.capture(agent, "team-b", "pusher")
        self.assertTrue(job["push"]["done"], job)
        self.assertTrue(all(l["mediaType"].endswith("+encrypted") for l in self.manifest("shared/clear", "v1")["layers"]))

    def test_recipients_without_a_secret_are_refused_naming_what_is_missing(self):
        pub, _ = self.key_pair("team-a", curve="P-256")
        self.namespace_secret("team-a", **{"encryption-recipients.pem": pub})
        self.set_tenancy({"team-a": {"repositories": [self.shared]}})
        agent = self.start_kube_agent()
        ref = self.repository("shared/x:v1")
        _, pid = self.source_pod("team-a", "pusher", {"gpusnap.io/push-to": ref})
        status, reply = self.checkpoint(agent, {"pod": {"namespace": "team-a", "name": "pusher", "container": "server"}})
        self.assertEqual(status, 400, reply)  # the namespace's keys are bad input, not a permission
        self.assertIn("namespace `team-a` has encryption recipients but no encryption secret", reply["error"])
        self.wait_count(pid, self.count(pid) + 3)
        self.assertEqual((self.snapshot_ids(), self.served()), ([], []))


if __name__ == "__main__":
    unittest.main()
