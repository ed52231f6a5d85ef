"""Pulls through a mirror (docs/DISTRIBUTION.md, "Mirrors"): a second real
registry (Debian's docker-registry) filled with `skopeo copy` from the
primary and named in a containers-registries.conf. A pull by digest is
served by the mirror with the primary stopped; a tag is resolved at the
primary under `pull-from-mirror = "digest-only"` and its blobs still come
from the mirror; a mirror that is down or lacks the snapshot gives way to
the primary; a mirror that serves other bytes (a manifest swapped in its
storage, a flipped byte in a blob) is refused with one line and the store
as it was; a signature is verified for the reference the user named while
the bytes come from the mirror, and a mirror that resolves the tag to
unsigned bytes is refused; the agent pulls through the mirrors of its
--registries-conf."""
import json
import os

import test_agent as base
from harness import GpusnapCase
from test_registry import RegistryMixin, require_registry
from test_registry_trust import make_key_pair


def blob_gets(reg, since=0):
    """The blob downloads `reg` answered gpusnap (not skopeo, which fills
    the mirror) after its first `since` requests."""
    return [r for r in reg.served()[since:] if r["method"] == "GET" and "/blobs/" in r["uri"] and r["status"] == 200
            and not r["agent"].startswith("skopeo")]


class Mirrored:
    """A primary and a mirror registry, a counter's snapshot pushed to the
    primary and copied to the mirror, and a registries.conf naming it."""

    def set_up_mirror(self):
        require_registry(self)
        self.primary = self.start_registry(name="primary")
        self.mirror = self.start_registry(name="mirror")
        self.ref = f"{self.primary.host}/team/counter:v1"
        # The mirror keeps the team's repositories under another name: the
        # path after the prefix is appended to its location.
        self.mirrored = f"{self.mirror.host}/team-cache/counter:v1"
        pid = self.run_counter("cnt")
        self.snap = self.checkpoint("cnt")
        self.assertTrue(self.wait_gone(pid))
        self.node_b = self.other_store("store-b")

    def push(self, snap, ref, *extra):
        return json.loads(self.gs("--json", "push", snap, ref, "--plain-http", *extra).stdout)["digest"]

    def copy_to_mirror(self, tag, mirror_tag=None):
        self.skopeo("copy", "--src-tls-verify=false", "--dest-tls-verify=false",
                    f"docker://{self.primary.host}/team/counter:{tag}",
                    f"docker://{self.mirror.host}/team-cache/counter:{mirror_tag or tag}")

    def registries_conf(self, pull_from_mirror="digest-only", name="registries.conf"):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(f'unqualified-search-registries = ["docker.io"]\n\n'
                    f'[[registry]]\nprefix = "{self.primary.host}/team"\nlocation = "{self.primary.host}/team"\n\n'
                    f'[[registry.mirror]]\nlocation = "{self.mirror.host}/team-cache"\n'
                    f'pull-from-mirror = "{pull_from_mirror}"\n')
        return path

    def pull(self, ref, conf, *extra, check=True):
        return self.gs("pull", ref, "--plain-http", "--registries-conf", conf, *extra, env=self.node_b, check=check)

    def refused(self, p, *says):
        line = self.one_line_error(p)
        for s in says:
            self.assertIn(s, line)
        self.assertEqual(self.store_is_empty(self.node_b), [])
        return line


class MirrorPulls(Mirrored, RegistryMixin, GpusnapCase):
    def setUp(self):
        super().setUp()
        self.set_up_mirror()
        self.digest = self.push(self.snap, self.ref)
        self.copy_to_mirror("v1")

    def test_a_pull_by_digest_is_served_by_the_mirror_with_the_primary_stopped(self):
        conf = self.registries_conf()
        self.primary.stop()
        by_digest = f"{self.primary.host}/team/counter@{self.digest}"
        p = self.pull(by_digest, conf)
        self.assertEqual(p.stdout.strip().splitlines()[-1], self.snap)
        self.assertIn(f"mirror `{self.mirror.host}/team-cache/counter` serves `{by_digest}`", p.stderr)
        self.assertGreater(len(blob_gets(self.mirror)), 2)
        # What came from the mirror restores, and counts on.
        out = self.gs_json("restore", self.snap, "--name", "copy", env=self.node_b)
        self.wait_count(out["pid"], self.count(out["pid"]) + 2)
        # A tag is resolved at the primary alone under digest-only: stopped, it fails.
        node_c = self.other_store("store-c")
        p = self.gs("pull", self.ref, "--plain-http", "--registries-conf", conf, env=node_c, check=False)
        self.assertIn(f"registry `{self.primary.host}` is unreachable", self.one_line_error(p))
        self.store_is_empty(node_c)

    def test_a_tag_is_resolved_at_the_primary_and_its_blobs_come_from_the_mirror(self):
        conf = self.registries_conf()
        primary_before, mirror_before = len(self.primary.served()), len(self.mirror.served())
        pulled = json.loads(self.pull(self.ref, conf, "--json").stdout)
        self.assertEqual((pulled["id"], pulled["digest"]), (self.snap, self.digest))
        asked = [(r["method"], r["uri"]) for r in self.primary.served()[primary_before:] if r["uri"] != "/v2/"]
        self.assertEqual(asked, [("GET", "/v2/team/counter/manifests/v1")])
        self.assertEqual(len(blob_gets(self.mirror, mirror_before)), pulled["blobs_moved"])
        # Without the configuration the mirror is never asked.
        node_c = self.other_store("store-c")
        mirror_before = len(self.mirror.served())
        empty = os.path.join(self.tmp, "empty.conf")
        open(empty, "w").close()
        self.gs("pull", self.ref, "--plain-http", "--registries-conf", empty, env=node_c)
        self.assertEqual(self.mirror.served()[mirror_before:], [])

    def test_a_mirror_that_is_down_or_lacks_the_snapshot_gives_way_to_the_primary(self):
        conf = self.registries_conf()
        by_digest = f"{self.primary.host}/team/counter@{self.digest}"
        self.mirror.stop()
        p = self.pull(by_digest, conf)
        self.assertEqual(p.stdout.strip().splitlines()[-1], self.snap)
        self.assertIn(f"mirror `{self.mirror.host}/team-cache/counter` failed, passed over", p.stderr)
        self.assertIn(f"`{self.primary.host}/team/counter` serves", p.stderr)
        self.assertGreater(len(blob_gets(self.primary)), 2)
        # A mirror that answers but holds nothing of it (404) gives way too.
        self.mirror.start()
        other = self.registries_conf(name="other.conf")
        with open(other) as f:
            text = f.read().replace("/team-cache", "/nothing-here")
        with open(other, "w") as f:
            f.write(text)
        node_c = self.other_store("store-c")
        p = self.gs("pull", by_digest, "--plain-http", "--registries-conf", other, env=node_c)
        self.assertEqual(p.stdout.strip().splitlines()[-1], self.snap)

    def test_a_mirror_serving_other_bytes_is_refused(self):
        conf = self.registries_conf()
        by_digest = f"{self.primary.host}/team/counter@{self.digest}"
        # The mirror's copy of the manifest swapped for another snapshot's.
        self.run_counter("cnt2")
        other = self.push(self.checkpoint("cnt2"), f"{self.primary.host}/team/counter:other")
        self.copy_to_mirror("other")
        swapped = self.mirror.blob_path(self.digest)
        with open(self.mirror.blob_path(other), "rb") as f:
            other_manifest = f.read()
        with open(swapped, "rb") as f:
            manifest = f.read()
        with open(swapped, "wb") as f:
            f.write(other_manifest)
        self.refused(self.pull(by_digest, conf, check=False), by_digest,
                     f"refusing mirror `{self.mirror.host}/team-cache/counter`", other)
        self.assertEqual(blob_gets(self.primary), [])
        # A flipped byte in one of the mirror's blobs.
        with open(swapped, "wb") as f:
            f.write(manifest)
        layer = max(json.loads(manifest)["layers"], key=lambda l: l["size"])
        with open(self.mirror.blob_path(layer["digest"]), "r+b") as f:
            f.seek(layer["size"] // 2)
            b = f.read(1)
            f.seek(layer["size"] // 2)
            f.write(bytes([b[0] ^ 1]))
        line = self.one_line_error(self.pull(by_digest, conf, check=False))
        self.assertIn(f"{layer['digest']} ({layer['annotations']['org.opencontainers.image.title']}) from mirror "
                      f"`{self.mirror.host}/team-cache/counter` does not match its digest", line)
        self.assertEqual(self.gs_json("ls", env=self.node_b), [])

    def test_a_blocked_prefix_and_a_configuration_gpusnap_does_not_read_are_refused(self):
        blocked = os.path.join(self.tmp, "blocked.conf")
        with open(blocked, "w") as f:
            f.write(f'[[registry]]\nlocation = "{self.primary.host}"\nblocked = true\n')
        self.refused(self.pull(self.ref, blocked, check=False), f"`{self.ref}` is blocked by registries.conf")
        self.assertEqual(blob_gets(self.primary), [])
        for text, says in (('[[registry]]\nlocation = "x.example"\nmirrors = []\n', "unknown key `mirrors`"),
                           ('[registries.search]\nregistries = []\n', "the version 1 format is not read"),
                           ('[[registry]]\nlocation = "x.example"\n[[registry.mirror]]\n'
                            'location = "m.example"\npull-from-mirror = "never"\n', "`pull-from-mirror` is `never`")):
            bad = os.path.join(self.tmp, "bad.conf")
            with open(bad, "w") as f:
                f.write(text)
            p = self.pull(self.ref, bad, check=False)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(f"registries.conf `{bad}`", self.refused(p, says))
        # $CONTAINERS_REGISTRIES_CONF names the default.
        p = self.gs("pull", self.ref, "--plain-http", check=False,
                    env=dict(self.node_b, CONTAINERS_REGISTRIES_CONF=blocked))
        self.refused(p, "is blocked by registries.conf")


class SignedThroughAMirror(Mirrored, RegistryMixin, GpusnapCase):
    def setUp(self):
        super().setUp()
        self.set_up_mirror()
        self.key, self.pub = make_key_pair(self.tmp, "sign", cosign_format=False)
        self.digest = self.push(self.snap, self.ref, "--sign-by-sigstore-private-key", self.key)
        self.copy_to_mirror("v1")
        self.policy = os.path.join(self.tmp, "policy.json")
        with open(self.policy, "w") as f:
            json.dump({"default": [{"type": "reject"}],
                       "transports": {"docker": {f"{self.primary.host}/team": [
                           {"type": "sigstoreSigned", "keyPath": self.pub}]}}}, f)

    def test_the_signature_is_checked_for_the_reference_named_while_the_mirror_serves(self):
        conf = self.registries_conf()
        # The signature travels with the snapshot to the mirror; the primary goes away.
        sig = f"sha256-{self.digest[7:]}.sig"
        self.copy_to_mirror(sig)
        self.primary.stop()
        by_digest = f"{self.primary.host}/team/counter@{self.digest}"
        out = self.gs_json("restore", by_digest, "--plain-http", "--registries-conf", conf, "--policy", self.policy,
                           "--name", "copy", env=self.node_b)
        self.wait_count(out["pid"], self.count(out["pid"]) + 2)
        self.assertGreater(len(blob_gets(self.mirror)), 2)

    def test_a_mirror_that_resolves_the_tag_to_unsigned_bytes_is_refused(self):
        # The mirror's v1 is another snapshot, unsigned; the primary's v1 is signed.
        self.run_counter("cnt2")
        self.push(self.checkpoint("cnt2"), f"{self.primary.host}/team/counter:unsigned")
        self.copy_to_mirror("unsigned", "v1")
        line = self.refused(self.pull(self.ref, self.registries_conf("all"), "--policy", self.policy, check=False),
                            self.ref, "no signature")
        self.assertNotIn(self.digest, line)
        # Resolved at the primary (digest-only), the tag is the signed snapshot; its blobs and its
        # signature are the mirror's.
        self.copy_to_mirror("v1", "by-digest")
        self.copy_to_mirror(f"sha256-{self.digest[7:]}.sig")
        before = len(self.primary.served())
        p = self.pull(self.ref, self.registries_conf(), "--policy", self.policy)
        self.assertEqual(p.stdout.strip().splitlines()[-1], self.snap)
        self.assertEqual(blob_gets(self.primary, before), [])


class AgentThroughAMirror(Mirrored, RegistryMixin, base.AgentCase):
    def setUp(self):
        super().setUp()
        self.set_up_mirror()
        self.digest = self.push(self.snap, self.ref)
        self.copy_to_mirror("v1")

    def test_the_agent_pulls_through_the_mirrors_of_its_registries_conf(self):
        agent = self.start_agent("--plain-http", "--registries-conf", self.registries_conf(),
                                 env=self.node_b)
        self.primary.stop()
        by_digest = f"{self.primary.host}/team/counter@{self.digest}"
        status, reply = agent.request("POST", "/v1/restores", {"snapshot": by_digest, "name": "copy"})
        self.assertEqual(status, 202, reply)
        job = self.wait_job(agent, reply["job"])
        self.assertEqual(job["state"], "succeeded", f"{job}\n{agent.log()}")
        self.assertEqual(job["pull"]["digest"], self.digest)
        self.wait_count(job["restoredPid"], self.count(job["restoredPid"]) + 2)
        self.assertGreater(len(blob_gets(self.mirror)), 2)


if __name__ == "__main__":
    import unittest
    unittest.main()
