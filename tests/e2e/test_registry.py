"""Snapshots through a real OCI registry (Debian's docker-registry, started by
tests/e2e/registry.py on 127.0.0.1) with `gpusnap push`, `gpusnap pull` and
`gpusnap restore REF`: the artifact as other OCI tools read it (skopeo),
only missing blobs moved, digests checked as they stream, nothing half
pulled ever visible, TLS and credentials, and every fault of the issue
refused with one clear line and the store as it was. The workloads and CRIU
are real; the GPU side runs on the fake libcuda (gpushare chunks)."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import registry
from harness import GPUSNAP, FakeGpuCase, GpusnapCase, WorkerSteps
from test_registry_fixture import make_oci_layout

SKOPEO = shutil.which("skopeo") or "/usr/bin/skopeo"
BUILD = os.path.dirname(GPUSNAP)
WORKLOADS = os.environ.get("GPUSNAP_WORKLOADS", os.path.join(BUILD, "workloads"))
WORKER = os.path.join(WORKLOADS, "vmm_worker")
SHIM = os.path.join(BUILD, "libgpusnap_gpushare.so")


def require_registry(case):
    if not os.access(registry.DOCKER_REGISTRY, os.X_OK):
        case.skipTest(f"no docker-registry at {registry.DOCKER_REGISTRY} (apt: docker-registry)")
    if not os.access(SKOPEO, os.X_OK):
        case.skipTest(f"no skopeo at {SKOPEO} (apt: skopeo)")


class RegistryMixin:
    """A registry of `mode` for the test, and gpusnap's flags to reach it."""

    def start_worker_registry(self):
        """For a gpushare worker's snapshots: the registry, and the worker's log."""
        require_registry(self)
        for path in (WORKER, SHIM):
            if not os.path.exists(path):
                self.skipTest(f"no {path}")
        self.reg = self.start_registry()
        self.output = os.path.join(self.run_dir, "logs", "vmm.log")

    def start_registry(self, mode="plain", name="registry"):
        reg = registry.Registry(os.path.join(self.tmp, name), mode)
        self.addCleanup(reg.close)
        reg.start()
        self.__dict__.setdefault("started_registries", []).append(reg)
        return reg

    def flags(self, reg):
        if reg.mode == "plain":
            return ["--plain-http"]
        config = os.path.join(self.tmp, f"docker-{reg.port}.json")
        registry.write_docker_config(config, reg.host, reg.username, reg.password)
        return ["--ca-file", reg.ca_file, "--registry-config", config]

    def other_store(self, name):
        return dict(self.env, GPUSNAP_STORE=os.path.join(self.tmp, name))

    def skopeo(self, *args, check=True, flags=("--insecure-policy",)):
        """skopeo ARGS under `flags` (its global options: the policy, registries.d)."""
        home = os.path.join(self.tmp, "skopeo-home")
        os.makedirs(home, exist_ok=True)
        conf = os.path.join(home, "registries.conf")
        open(conf, "a").close()
        env = dict(os.environ, HOME=home, XDG_RUNTIME_DIR=home, XDG_CONFIG_HOME=home, CONTAINERS_REGISTRIES_CONF=conf)
        p = registry.run_skopeo([SKOPEO, *flags, *args], env)
        if check and p.returncode != 0:
            # A registry's answer (a 500 now and then under load) is in its log.
            logs = "".join(f"\n{os.path.basename(r.workdir)} log:\n{registry.log_tail(r.log)}"
                           for r in self.__dict__.get("started_registries", []))
            self.fail(f"skopeo {' '.join(args)} failed:\n{p.stderr}{logs}")
        return p

    def one_line_error(self, p):
        self.assertNotEqual(p.returncode, 0, p.stdout)
        lines = [line for line in p.stderr.splitlines() if line.startswith("gpusnap:")]
        self.assertEqual(len(lines), 1, p.stderr)
        return lines[0]

    def store_is_empty(self, env):
        self.assertEqual(self.gs_json("ls", env=env), [])
        root = env["GPUSNAP_STORE"]
        pulls = os.path.join(root, "pulls")
        return sorted(os.listdir(pulls)) if os.path.isdir(pulls) else []


class PushPullCpu(RegistryMixin, GpusnapCase):
    def setUp(self):
        super().setUp()
        require_registry(self)
        self.reg = self.start_registry()
        pid = self.run_counter("cnt")
        self.count_at_dump = None
        self.snap = self.checkpoint("cnt")
        self.assertTrue(self.wait_gone(pid))
        self.ref = f"{self.reg.host}/team/counter:v1"

    def push(self, *extra, check=True, ref=None):
        return self.gs("--json", "push", self.snap, ref or self.ref, *self.flags(self.reg), *extra, check=check)

    def test_push_pull_restore_and_the_state_goes_on(self):
        pushed = json.loads(self.push().stdout)
        # Files of the same bytes are one blob: moved once, then found there.
        self.assertGreater(pushed["blobs_moved"], pushed["blobs"] / 2)
        self.assertEqual(pushed["blobs_moved"] + pushed["blobs_skipped"], pushed["blobs"])
        self.assertTrue(pushed["digest"].startswith("sha256:"))
        # Again: nothing to move.
        again = json.loads(self.push().stdout)
        self.assertEqual((again["blobs_moved"], again["blobs_skipped"]), (0, again["blobs"]))
        self.assertEqual(again["digest"], pushed["digest"])
        # Node B: restore from the reference into an empty store.
        node_b = self.other_store("store-b")
        out = self.gs_json("restore", self.ref, "--plain-http", "--name", "copy", env=node_b)
        self.assert_runs(out["pid"])
        self.wait_count(out["pid"], self.count(out["pid"]) + 3)
        self.assertIn("pull", out["timings_s"])
        self.assertEqual([s["id"] for s in self.gs_json("ls", env=node_b)], [self.snap])
        self.assertEqual(os.listdir(os.path.join(node_b["GPUSNAP_STORE"], "pulls")), [])
        # A second pull finds it there.
        p = self.gs_json("pull", self.ref, "--plain-http", env=node_b)
        self.assertTrue(p["already_present"])
        # --as gives it another id, and its metadata says so.
        p = self.gs_json("pull", self.ref, "--plain-http", "--as", "other-id", env=node_b)
        self.assertEqual(p["id"], "other-id")
        self.assertEqual(self.gs_json("inspect", "other-id", env=node_b)["id"], "other-id")

    def test_every_restore_from_a_reference_returns_with_its_tree_running(self):
        # Once a tree restored from a reference had not counted 1.5 s after the
        # restore returned: each of these is seen running at once, into a store
        # of its own (a pull every time), and counts on.
        self.push()
        for i in range(5):
            node = self.other_store(f"store-loop-{i}")
            out = self.gs_json("restore", self.ref, "--plain-http", "--name", f"copy{i}", env=node)
            self.assert_runs(out["pid"])
            self.wait_count(out["pid"], self.count(out["pid"]) + 2)
            [w] = [w for w in self.workloads() if w["name"] == f"copy{i}"]
            os.kill(w["reaper_pid"], signal.SIGTERM)
            self.assertTrue(self.wait_gone(out["pid"]))

    def test_other_oci_tools_read_and_copy_the_artifact(self):
        digest = json.loads(self.push().stdout)["digest"]
        raw = self.skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{self.ref}").stdout
        manifest = json.loads(raw)
        self.assertEqual(manifest["artifactType"], "application/vnd.gpusnap.snapshot.v1")
        self.assertEqual(manifest["config"]["mediaType"], "application/vnd.gpusnap.snapshot.config.v1+json")
        titles = {l["annotations"]["org.opencontainers.image.title"] for l in manifest["layers"]}
        self.assertIn("checkpoint/inventory.img", titles)
        # skopeo copy to a second registry keeps the digest; gpusnap pulls it from there.
        second = self.start_registry(name="second")
        copy = f"{second.host}/mirror/counter:v1"
        self.skopeo("copy", "--src-tls-verify=false", "--dest-tls-verify=false", f"docker://{self.ref}",
                    f"docker://{copy}")
        raw2 = self.skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{copy}").stdout
        self.assertEqual(raw2, raw)
        node_b = self.other_store("store-b")
        pulled = self.gs_json("pull", f"{second.host}/mirror/counter@{digest}", "--plain-http", env=node_b)
        self.assertEqual(pulled["id"], self.snap)
        out = self.gs_json("restore", self.snap, "--name", "copy", env=node_b)
        self.assert_runs(out["pid"])
        self.wait_count(out["pid"], self.count(out["pid"]) + 3)

    def test_a_push_mounts_blobs_from_another_repository(self):
        self.push()
        p = json.loads(self.push("--mount-from", "team/counter", ref=f"{self.reg.host}/team/elsewhere:v1").stdout)
        self.assertEqual(p["blobs_moved"], 0)
        self.assertEqual(p["blobs_skipped"], p["blobs"])

    def test_a_flipped_byte_in_the_registry_is_refused_and_nothing_stored(self):
        self.push()
        manifest = json.loads(self.skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{self.ref}").stdout)
        layer = max(manifest["layers"], key=lambda l: l["size"])
        path = self.reg.blob_path(layer["digest"])
        with open(path, "r+b") as f:
            f.seek(layer["size"] // 2)
            b = f.read(1)
            f.seek(layer["size"] // 2)
            f.write(bytes([b[0] ^ 1]))
        node_b = self.other_store("store-b")
        line = self.one_line_error(self.gs("pull", self.ref, "--plain-http", env=node_b, check=False))
        self.assertIn(layer["digest"], line)
        self.assertIn("does not match its digest", line)
        left = self.store_is_empty(node_b)
        # What was pulled before the bad blob waits for the next pull; the bad blob is not among it.
        title = layer["annotations"]["org.opencontainers.image.title"]
        for staged in left:
            self.assertFalse(os.path.exists(os.path.join(node_b["GPUSNAP_STORE"], "pulls", staged, title)))
        p = self.gs("restore", self.ref, "--plain-http", env=node_b, check=False)
        self.assertIn(layer["digest"], self.one_line_error(p))
        self.assertEqual(self.workloads(), [w for w in self.workloads() if w["name"] == "cnt"])

    def test_refuses_references_and_manifests_that_are_not_ours(self):
        node_b = self.other_store("store-b")
        for ref, why in ((f"{self.reg.host}/../etc:v1", "`..` path component"),
                         (f"{self.reg.host}/Team/x", "`Team`"),
                         ("just-a-name", "no such"),
                         (f"{self.reg.host}/team/counter:nope", "has no `nope`")):
            with self.subTest(ref=ref):
                p = self.gs("pull", ref, "--plain-http", env=node_b, check=False)
                line = self.one_line_error(p)
                if why != "no such":
                    self.assertIn(why, line)
                else:
                    self.assertIn("no registry host", line)
        # A plain container image, pushed by skopeo.
        layout = os.path.join(self.tmp, "layout")
        make_oci_layout(layout)
        self.skopeo("copy", "--dest-tls-verify=false", f"oci:{layout}:v1", f"docker://{self.reg.host}/team/image:v1")
        line = self.one_line_error(self.gs("pull", f"{self.reg.host}/team/image:v1", "--plain-http", env=node_b,
                                           check=False))
        self.assertIn("not a gpusnap snapshot: it is a container image", line)
        self.store_is_empty(node_b)

    def test_a_registry_that_goes_away_mid_push_and_mid_pull(self):
        # Mid-push: the blobs are up, the registry dies before the manifest.
        proc, resume = self.paused(["push", self.snap, self.ref, "--plain-http"], "push-manifest")
        self.reg.stop(signal.SIGKILL)
        open(resume, "w").close()
        _, err = proc.communicate(timeout=60)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("unreachable", err)
        self.reg.start()
        done = json.loads(self.push().stdout)
        self.assertEqual(done["blobs_moved"], 0, "the blobs of the cut-off push were there already")
        # Down before a pull: one line, the store as it was.
        node_b = self.other_store("store-b")
        self.reg.stop()
        line = self.one_line_error(self.gs("pull", self.ref, "--plain-http", env=node_b, check=False))
        self.assertIn(f"registry `{self.reg.host}` is unreachable", line)
        self.reg.start()
        # The registry killed in the middle of a pull (its manifest read, no file yet): one line, nothing
        # in the store; started again, the next pull completes.
        node_d = self.other_store("store-d")
        proc, resume = self.paused(["pull", self.ref, "--plain-http"], "pull-files", env=node_d)
        self.reg.stop(signal.SIGKILL)
        open(resume, "w").close()
        _, err = proc.communicate(timeout=60)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(f"registry `{self.reg.host}`", err)
        self.assertEqual(self.gs_json("ls", env=node_d), [])
        self.reg.start()
        self.assertEqual(self.gs_json("pull", self.ref, "--plain-http", env=node_d)["id"], self.snap)
        # Cut off mid-pull (the files in, not yet published): the next pull goes on.
        proc, resume = self.paused(["--json", "pull", self.ref, "--plain-http"], "pull-files-in", env=node_b)
        proc.kill()
        proc.wait()
        self.assertEqual(self.gs_json("ls", env=node_b), [])
        staged = os.listdir(os.path.join(node_b["GPUSNAP_STORE"], "pulls"))
        self.assertTrue(any(not s.endswith(".lock") for s in staged), staged)
        p = self.gs_json("pull", self.ref, "--plain-http", env=node_b)
        self.assertEqual(p["blobs_moved"], 1, "only the config is fetched again")
        out = self.gs_json("restore", self.snap, "--name", "copy", env=node_b)
        self.assert_runs(out["pid"])
        self.wait_count(out["pid"], self.count(out["pid"]) + 3)

    def test_a_full_disk_during_a_pull_leaves_the_store_as_it_was(self):
        self.push()
        disk = os.path.join(self.tmp, "small")
        os.makedirs(disk)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", disk], check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", disk])
        env = dict(self.env, GPUSNAP_STORE=os.path.join(disk, "store"))
        line = self.one_line_error(self.gs("pull", self.ref, "--plain-http", env=env, check=False))
        self.assertIn("No space left on device", line)
        self.assertEqual(self.store_is_empty(env), [])
        chunks = os.path.join(disk, "store", "chunks")
        self.assertEqual([f for _, _, fs in os.walk(chunks) for f in fs], [])


class PushPullTls(RegistryMixin, GpusnapCase):
    def setUp(self):
        super().setUp()
        require_registry(self)
        pid = self.run_counter("cnt")
        self.snap = self.checkpoint("cnt")
        self.assertTrue(self.wait_gone(pid))

    def round_trip(self, reg):
        ref = f"{reg.host}/team/counter:v1"
        p = self.gs("--json", "push", self.snap, ref, *self.flags(reg))
        node_b = self.other_store("store-b")
        out = self.gs_json("restore", ref, *self.flags(reg), "--name", "copy", env=node_b)
        self.assert_runs(out["pid"])
        self.wait_count(out["pid"], self.count(out["pid"]) + 3)
        for text in (p.stdout, p.stderr, self.logs()):
            self.assertNotIn(reg.password, text)
        return ref

    def test_basic_auth_over_tls_and_its_faults(self):
        reg = self.start_registry("tls-basic")
        ref = self.round_trip(reg)
        node_c = self.other_store("store-c")
        # Wrong credentials: refused, named, never printed.
        bad = os.path.join(self.tmp, "bad.json")
        registry.write_docker_config(bad, reg.host, reg.username, "wrong-" + reg.password)
        p = self.gs("pull", ref, "--ca-file", reg.ca_file, "--registry-config", bad, env=node_c, check=False)
        line = self.one_line_error(p)
        self.assertIn("refused the credentials", line)
        self.assertIn(bad, line)
        self.assertNotIn("wrong-" + reg.password, p.stderr + p.stdout)
        # No credentials at all.
        empty = os.path.join(self.tmp, "empty.json")
        with open(empty, "w") as f:
            json.dump({"auths": {}}, f)
        line = self.one_line_error(self.gs("pull", ref, "--ca-file", reg.ca_file, "--registry-config", empty,
                                           env=node_c, check=False))
        self.assertIn("asks for credentials", line)
        # An untrusted certificate, and TLS spoken to as plain HTTP.
        config = os.path.join(self.tmp, f"docker-{reg.port}.json")
        line = self.one_line_error(self.gs("pull", ref, "--registry-config", config, env=node_c, check=False))
        self.assertIn("not trusted", line)
        self.store_is_empty(node_c)

    def test_bearer_tokens_from_the_token_service(self):
        reg = self.start_registry("tls-token")
        self.round_trip(reg)
        # One token per scope and process, not one per request.
        self.assertLessEqual(reg.token_server.token_requests, 4)
        node_c = self.other_store("store-c")
        bad = os.path.join(self.tmp, "bad.json")
        registry.write_docker_config(bad, reg.host, reg.username, "wrong")
        line = self.one_line_error(self.gs("pull", f"{reg.host}/team/counter:v1", "--ca-file", reg.ca_file,
                                           "--registry-config", bad, env=node_c, check=False))
        self.assertIn("the token service refused the credentials", line)
        # DOCKER_CONFIG is where credentials come from without a flag.
        dir_ = os.path.join(self.tmp, "docker-dir")
        os.makedirs(dir_)
        registry.write_docker_config(os.path.join(dir_, "config.json"), reg.host, reg.username, reg.password)
        p = self.gs_json("pull", f"{reg.host}/team/counter:v1", "--ca-file", reg.ca_file,
                         env=dict(node_c, DOCKER_CONFIG=dir_))
        self.assertEqual(p["id"], self.snap)


class PushPullChunks(RegistryMixin, WorkerSteps, FakeGpuCase):
    """gpushare chunks as blobs: only what changed moves, and gc keeps what a
    pulled snapshot names."""

    def setUp(self):
        super().setUp()
        self.start_worker_registry()

    def start(self):
        args = ["--mib", "200,5", "--interval-ms", "20"]
        pid = int(self.gs("run", "--gpushare", "--name", "vmm", "--", WORKER, *args, "--device-file", self.device,
                          env=self.gpu_env).stdout.strip())
        self.wait_steps(3)
        return pid

    def test_only_the_chunks_the_registry_lacks_move(self):
        self.start()
        first = self.gs("checkpoint", "vmm", "--leave-running", env=self.gpu_env).stdout.strip().splitlines()[-1]
        ref = f"{self.reg.host}/team/vmm"
        one = self.gs_json("push", first, ref + ":one", "--plain-http", env=self.gpu_env)
        self.wait_steps(len(self.steps()) + 3)
        second = self.gs("checkpoint", "vmm", env=self.gpu_env).stdout.strip().splitlines()[-1]
        two = self.gs_json("push", second, ref + ":two", "--plain-http", env=self.gpu_env)
        self.assertLess(two["bytes_moved"], one["bytes_moved"])
        manifest = json.loads(self.skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{ref}:two").stdout)
        chunks = [l for l in manifest["layers"] if l["mediaType"] == "application/vnd.gpusnap.gpushare.chunk.v1"]
        self.assertTrue(chunks)
        # Node B pulls both: the second fetches only the chunks the first did not bring.
        node_b = dict(self.gpu_env, GPUSNAP_STORE=os.path.join(self.tmp, "store-b"))
        a = self.gs_json("pull", ref + ":one", "--plain-http", env=node_b)
        b = self.gs_json("pull", ref + ":two", "--plain-http", env=node_b)
        self.assertGreater(b["blobs_skipped"], 0)
        self.assertLess(b["bytes_moved"], a["bytes_moved"])
        # gc keeps every chunk the pulled snapshots name; the restore loads them.
        self.gs("gc", env=node_b)
        self.set_device_state(2)
        out = self.gs_json("restore", second, "--name", "copy", env=node_b)
        self.assert_runs(out["pid"])
        self.wait_steps(len(self.steps()) + 3)

    def test_a_full_disk_while_chunks_arrive_beside_the_files_takes_back_every_chunk(self):
        # The chunks arrive while the files other than the chunk manifests do:
        # a disk that fills up part-way leaves no chunk and no staging behind,
        # whichever of them met the full disk.
        self.start()
        snap = self.gs("checkpoint", "vmm", env=self.gpu_env).stdout.strip().splitlines()[-1]
        ref = f"{self.reg.host}/team/vmm:v1"
        self.gs("push", snap, ref, "--plain-http", env=self.gpu_env)
        manifest = json.loads(self.skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{ref}").stdout)
        sizes = [l["size"] for l in manifest["layers"]]
        chunk = max(sizes)
        self.assertGreaterEqual(len([s for s in sizes if s == chunk]), 2)
        disk = os.path.join(self.tmp, "small")
        os.makedirs(disk)
        # Room for a chunk or so and the files, not for the rest of the chunks.
        room = (sum(sizes) - sum(s for s in sizes if s == chunk) + chunk * 3 // 2) // 4096 * 4096
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={room}", "tmpfs", disk], check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", disk])
        env = dict(self.gpu_env, GPUSNAP_STORE=os.path.join(disk, "store"))
        line = self.one_line_error(self.gs("pull", ref, "--plain-http", "--jobs", "2", env=env, check=False))
        self.assertIn("No space left on device", line)
        self.assertEqual(self.store_is_empty(env), [])
        chunks = os.path.join(disk, "store", "chunks")
        self.assertEqual([f for _, _, fs in os.walk(chunks) for f in fs], [])
        # With room, the same pull completes.
        subprocess.run(["mount", "-o", f"remount,size={sum(sizes) * 2}", disk], check=True)
        self.assertEqual(self.gs_json("pull", ref, "--plain-http", env=env)["id"], snap)

    def test_a_restore_from_a_reference_loads_chunks_as_they_arrive(self):
        self.start()
        snap = self.gs("checkpoint", "vmm", env=self.gpu_env).stdout.strip().splitlines()[-1]
        ref = f"{self.reg.host}/team/vmm:v1"
        self.gs("push", snap, ref, "--plain-http", env=self.gpu_env)
        at_dump = len(self.steps())
        # A chunk blob with a flipped byte: the restore fails, nothing of it runs, nothing joins the store.
        manifest = json.loads(self.skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{ref}").stdout)
        chunk = next(l for l in reversed(manifest["layers"])
                     if l["mediaType"] == "application/vnd.gpusnap.gpushare.chunk.v1")
        path = self.reg.blob_path(chunk["digest"])
        with open(path, "rb") as f:
            good = f.read()
        with open(path, "wb") as f:
            f.write(good[:100] + bytes([good[100] ^ 1]) + good[101:])
        node_c = dict(self.gpu_env, GPUSNAP_STORE=os.path.join(self.tmp, "store-c"))
        self.set_device_state(2)
        p = self.gs("restore", ref, "--plain-http", "--name", "copy", env=node_c, check=False)
        self.assertIn(chunk["digest"], self.one_line_error(p))
        self.assertEqual(self.gs_json("ls", env=node_c), [])
        self.assertEqual([w for w in self.workloads() if w["running"]], [])
        self.assertEqual(len(self.steps()), at_dump)
        # The blob mended: the next restore goes on from what the first pulled.
        with open(path, "wb") as f:
            f.write(good)
        self.set_device_state(2)
        p = self.gs("restore", ref, "--plain-http", "--name", "copy", env=node_c)
        self.assert_runs(int(p.stdout.split()[-1]))
        self.assertNotIn("load that memory themselves", p.stderr)  # the preload took every chunk as it came
        self.assertIn("[restore] pull done", p.stderr)
        self.wait_steps(at_dump + 3)
        self.assert_steps_unbroken()
        self.assertEqual([s["id"] for s in self.gs_json("ls", env=node_c)], [snap])
        self.assertEqual([n for n in os.listdir(os.path.join(self.tmp, "store-c", "pulls"))], [])


if __name__ == "__main__":
    unittest.main()
