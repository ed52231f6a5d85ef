"""The rootfs capture path (docs/CAPTURE-PATHS.md, issue 16) with real
containerd containers on the overlayfs snapshotter (scripts/containerd-testbed.sh).

The workload (tests/workloads/compile_cache.sh, the image's /app/run.sh) fetches
a source from an HTTP server of the test on 127.0.0.1 (the containers share the
host's network) into its root filesystem and "compiles" it for seconds into a
cache volume and its root, deleting a file its image ships; a later start skips
what it finds. Its container is captured by the rootfs path and restored into a
new placeholder container of the same image (`gpusnap __placeholder` as its
init, the gpusnap binary and the host's libraries bound in read-only): the
restored start fetches nothing, compiles nothing, and the deleted file stays
deleted. `auto` picks rootfs for a tree holding an io_uring ring and says why;
a `both` snapshot falls back to rootfs on a node whose process restore is
refused (no CRIU there); another image, a diff escaping the root and a corrupt
archive are refused before anything is written or started.

A rootfs snapshot goes through a real registry (tests/e2e/registry.py): it
restores from its reference into an empty store (pulled whole first), and is
pulled into another store, the same bytes, and restores from there. The agent takes a container by the rootfs path
when asked, by itself (its default `auto`) for an io_uring tree, and restores
a rootfs snapshot into a placeholder as a job.

Skips, saying so, where containerd, buildah or busybox-static is missing (and
docker-registry, for the registry's test)."""
import filecmp
import hashlib
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
import unittest
import uuid

import registry
from harness import GPUSNAP, WORKLOADS, read_meta, write_meta
from test_agent import Agent, wait_for_job

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
TESTBED = os.path.join(REPO, "scripts", "containerd-testbed.sh")
WORKLOAD = os.path.join(REPO, "tests", "workloads", "compile_cache.sh")
RING_PROBE = os.path.join(os.path.abspath(WORKLOADS), "ring_probe")
CRIU_BUNDLE = os.path.abspath(os.environ.get("GPUSNAP_CRIU", os.path.join(REPO, "build", "criu-bundle")))
IMAGE = "localhost/gpusnap-testbed:1"
OTHER_IMAGE = "localhost/gpusnap-other:1"  # the same content under another name
COMMAND = ["sh", "-c", "/app/run.sh & wait"]
SOURCE = b"int main(void) { return 42; }\n" * 64
MISSING = [t for t in ("containerd", "ctr", "buildah") if shutil.which(t) is None]
if not os.path.exists("/usr/bin/busybox"):
    MISSING.append("busybox-static")
# What a placeholder needs to run gpusnap: the host's C library and the others
# the binary links, read-only at their own paths.
HOST_LIBS = [d for d in ("/lib", "/lib64", "/usr/lib") if os.path.isdir(d)]
CHUNK = 64 << 20


def file_digest(path):
    """A file's digest as gpusnap.json's `sha256-64MiB-chunks` names it."""
    parts = []
    with open(path, "rb") as f:
        while True:
            block = f.read(CHUNK)
            if not block and parts:
                break
            parts.append(hashlib.sha256(block).digest())
            if len(block) < CHUNK:
                break
    if len(parts) == 1:
        return parts[0].hex()
    return hashlib.sha256(b"".join(parts)).hexdigest()


def upper_dir(pid):
    """The upperdir of the overlay mounted at pid's root (mountinfo escapes decoded)."""
    with open(f"/proc/{pid}/mountinfo") as f:
        lines = [line for line in f if line.split()[4] == "/" and " - overlay " in line]
    if not lines:
        return None
    opts = lines[-1].split(" - ", 1)[1].split()[2]
    m = re.search(r"(?:^|,)upperdir=([^,]*)", opts)
    return re.sub(r"\\([0-7]{3})", lambda o: chr(int(o.group(1), 8)), m.group(1)) if m else None


def tree_of(top):
    """Every path under `top` with its kind and content's digest: what a
    refused restore must leave as it was."""
    out = {}
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, top)
            if os.path.islink(path):
                out[rel] = "link " + os.readlink(path)
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
            else:
                out[rel] = "dir" if os.path.isdir(path) else "other"
    return out


def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


class SourceServer(http.server.ThreadingHTTPServer):
    """The workload's source on 127.0.0.1, counting who fetched it."""

    def __init__(self):
        self.fetches = 0
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(handler):
                if handler.path != "/source.txt":
                    handler.send_error(404)
                    return
                with self.lock:
                    self.fetches += 1
                handler.send_response(200)
                handler.send_header("Content-Length", str(len(SOURCE)))
                handler.end_headers()
                handler.wfile.write(SOURCE)

            def log_message(handler, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/source.txt"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def count(self):
        with self.lock:
            return self.fetches


@unittest.skipIf(os.geteuid() != 0, "SKIPPED: needs root (containerd, buildah)")
@unittest.skipIf(MISSING, f"SKIPPED: not installed: {', '.join(MISSING)} (scripts/setup.sh installs them)")
class RootfsCapture(unittest.TestCase):
    """One containerd, one image, one source workload (first start done) for
    every test; each test its own placeholders and snapshots."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gpusnap-rootfs-", dir="/var/tmp")
        cls.bed_dir = os.path.join(cls.tmp, "containerd")
        cls.store = os.path.join(cls.tmp, "store")
        cls.env = dict(os.environ, GPUSNAP_STORE=cls.store, GPUSNAP_RUN_DIR=os.path.join(cls.tmp, "run"),
                       GPUSNAP_AGENT_SOCKET=os.path.join(cls.tmp, "no-agent", "agent.sock"))
        cls.server = SourceServer()
        try:
            stale = os.path.join(cls.tmp, "app-stale.conf")
            with open(stale, "w") as f:
                f.write("stale = true\n")
            cls.bed("start", cls.bed_dir)
            cls.bed("image", cls.bed_dir, IMAGE,
                    env={"TESTBED_IMAGE_FILES": f"{WORKLOAD}:/app/run.sh {stale}:/etc/app-stale.conf"})
            cls.bed("import", cls.bed_dir, os.path.join(cls.bed_dir, "image.tar"), OTHER_IMAGE)
            cls.source = cls.start_workload(mode="first")
            cls.source_log = cls.wait_log(cls.source, "ready")
        except BaseException:
            cls.tearDownClass()
            raise
        cls.snapshots = {}

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()
        cls.server.server_close()
        p = subprocess.run(["bash", TESTBED, "stop", cls.bed_dir], capture_output=True, text=True, timeout=300)
        shutil.rmtree(cls.tmp, ignore_errors=True)
        assert p.returncode == 0, p.stderr

    # --- containers ----------------------------------------------------------
    @classmethod
    def bed(cls, *args, env=None):
        p = subprocess.run(["bash", TESTBED, *args], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, **(env or {})))
        if p.returncode != 0:
            raise AssertionError(f"containerd-testbed.sh {args[0]} failed: {p.stderr}")
        return p.stdout.strip()

    @classmethod
    def run_container(cls, argv, image=IMAGE, env=(), ro=(), cwd=None):
        """A container of `image` with a cache volume at /cache and a log
        directory at /out of its own, on the host's network: a dict of its id,
        init's host pid, bundle and host directories."""
        cid = uuid.uuid4().hex + uuid.uuid4().hex
        c = {"id": cid, "cache": os.path.join(cls.tmp, f"cache-{cid[:8]}"),
             "out": os.path.join(cls.tmp, f"out-{cid[:8]}"),
             "bundle": os.path.join(cls.bed_dir, "state", "io.containerd.runtime.v2.task", "default", cid)}
        os.makedirs(c["cache"])
        os.makedirs(c["out"])
        c["log"] = os.path.join(c["out"], "log")
        settings = {"TESTBED_IMAGE": image, "TESTBED_NET_HOST": "1",
                    "TESTBED_MOUNTS": f"{c['cache']}:/cache {c['out']}:/out",
                    "TESTBED_RO_MOUNTS": " ".join(f"{d}:{d}" for d in ro), "TESTBED_ENV": " ".join(env)}
        if cwd:
            settings["TESTBED_CWD"] = cwd
        c["init"] = int(cls.bed("run", cls.bed_dir, cid, *argv, env=settings))
        return c

    @classmethod
    def start_workload(cls, mode):
        # The CRIU bundle at its own path, as on a node: a `both` capture runs
        # CRIU inside the workload's mount namespace.
        return cls.run_container(COMMAND, env=[f"SOURCE_URL={cls.server.url}", f"APP_MODE={mode}"], cwd="/app",
                                 ro=[CRIU_BUNDLE])

    def start_placeholder(self, image=IMAGE):
        """A placeholder container, as the webhook makes one: the workload's
        image with `gpusnap __placeholder` as its init, the pod's environment."""
        # The binary alone is bound in, not its directory: a mount point of
        # the placeholder where the source's diff holds a directory (the
        # parents runc made for the source's own mounts, the CRIU bundle's
        # among them) would refuse the restore.
        gpusnap = os.path.realpath(GPUSNAP)
        c = self.run_container([gpusnap, "__placeholder"], image=image,
                               env=[f"SOURCE_URL={self.server.url}", "APP_MODE=restored"], ro=[gpusnap, *HOST_LIBS])
        end = time.time() + 10
        while time.time() < end and alive(c["init"]):
            with open(f"/proc/{c['init']}/cmdline", "rb") as f:
                if f.read().split(b"\0")[1:2] == [b"__placeholder"]:
                    break
            time.sleep(0.05)
        if not alive(c["init"]):
            self.fail(f"the placeholder exited: {self.container_out(c)}")
        c["upper"] = upper_dir(c["init"])
        self.assertIsNotNone(c["upper"], "the placeholder's root is no overlay")
        return c

    def container_out(self, c):
        path = os.path.join(self.bed_dir, f"{c['id']}.out")
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return f.read()

    @classmethod
    def wait_log(cls, c, text, timeout=30):
        end = time.time() + timeout
        log = ""
        while time.time() < end:
            if os.path.exists(c["log"]):
                with open(c["log"]) as f:
                    log = f.read()
                if "FAIL:" in log:
                    break
                if text in log:
                    return log
            time.sleep(0.05)
        raise AssertionError(f"the workload's log never said {text!r}:\n{log}")

    @staticmethod
    def tree_root(c):
        """The host pid of the one child of a container's init: the tree a checkpoint names."""
        end = time.time() + 10
        while not children(c["init"]) and time.time() < end:
            time.sleep(0.05)
        kids = children(c["init"])
        assert len(kids) == 1, f"container {c['id']}'s init has children {kids}"
        return kids[0]

    # --- gpusnap ---------------------------------------------------------------
    def gs(self, *args, check=True, timeout=300, env=None):
        p = subprocess.run([GPUSNAP, *args], capture_output=True, text=True, env=env or self.env, timeout=timeout)
        if check and p.returncode != 0:
            self.fail(f"gpusnap {' '.join(args)} failed ({p.returncode}):\n{p.stderr}{p.stdout}")
        return p

    def inspect(self, snapshot):
        return json.loads(self.gs("--json", "inspect", snapshot).stdout)

    def snapdir(self, snapshot):
        return os.path.join(self.store, "snapshots", snapshot)

    def capture(self, path):
        """The source workload captured by `path` (once per class), left running."""
        if path not in self.snapshots:
            sid = f"source-{path}"
            p = self.gs("checkpoint", "--capture-path", path, "--cache", "/cache", "--id", sid, "--leave-running",
                        str(self.tree_root(self.source)))
            self.snapshots[path] = (sid, p)
        return self.snapshots[path][0]

    def restore(self, snapshot, placeholder, *extra, check=True, env=None):
        return self.gs("--json", "restore", snapshot, "--name", f"r-{placeholder['id'][:8]}", *extra,
                       "--into-container", placeholder["id"], check=check, env=env)

    def copy_snapshot(self, snapshot, new_id):
        """A copy of a snapshot under another id, sealed as gpusnap seals one."""
        shutil.copytree(self.snapdir(snapshot), self.snapdir(new_id), ignore=shutil.ignore_patterns("gpusnap.json"))
        meta = read_meta(os.path.join(self.snapdir(snapshot), "gpusnap.json"))
        meta["id"] = new_id
        write_meta(os.path.join(self.snapdir(new_id), "gpusnap.json"), meta)
        return new_id

    def reseal(self, snapshot, name):
        """Seals the changed file `name` into the snapshot's digests: it
        verifies, whatever it holds."""
        path = os.path.join(self.snapdir(snapshot), "gpusnap.json")
        meta = read_meta(path)
        self.assertEqual(meta.get("digest", "sha256"), "sha256-64MiB-chunks")
        meta["files"][name] = {"size": os.path.getsize(os.path.join(self.snapdir(snapshot), name)),
                               "sha256": file_digest(os.path.join(self.snapdir(snapshot), name))}
        meta["total_bytes"] = sum(f["size"] for f in meta["files"].values())
        write_meta(path, meta)

    # --- checks ----------------------------------------------------------------
    def assert_untouched(self, placeholder, before):
        self.assertTrue(alive(placeholder["init"]))
        self.assertEqual(children(placeholder["init"]), [], "something was started in the placeholder")
        self.assertEqual(tree_of(placeholder["upper"]), before, "something was written into the placeholder's root")
        self.assertEqual(os.listdir(placeholder["cache"]), [], "something was written into its cache volume")
        self.assertFalse(os.path.exists(placeholder["log"]), "the workload ran in the placeholder")

    def assert_restored_start(self, placeholder, started):
        """The workload started in `placeholder` (host pid `started`) found its
        first start's work: nothing fetched, nothing compiled, the image's
        deleted file still deleted, the files the same."""
        self.assertEqual(children(placeholder["init"]), [started])
        with open(f"/proc/{started}/cmdline", "rb") as f:
            self.assertEqual(f.read().split(b"\0")[:-1], [a.encode() for a in COMMAND])
        for ns in ("pid", "mnt", "net"):
            self.assertEqual(os.stat(f"/proc/{started}/ns/{ns}").st_ino,
                             os.stat(f"/proc/{placeholder['init']}/ns/{ns}").st_ino, ns)
        with open(f"/proc/{started}/cgroup") as a, open(f"/proc/{placeholder['init']}/cgroup") as b:
            self.assertEqual(a.read(), b.read())
        log = self.wait_log(placeholder, "ready")
        self.assertIn("fetch: skipped", log)
        self.assertIn("compile: skipped", log)
        self.assertIn("stale: /etc/app-stale.conf absent", log)
        self.assertIn("cwd /app, mode restored", log)  # the recorded cwd, the placeholder's environment
        self.assertLess(float(re.search(r"ready in ([\d.]+) s", log)[1]), 2.0, log)
        root = f"/proc/{started}/root"
        self.assertFalse(os.path.lexists(f"{root}/etc/app-stale.conf"))
        for rel in ("var/lib/app/source.txt", "var/lib/app/compiled.bin"):
            with open(f"{root}/{rel}", "rb") as a, open(f"/proc/{self.source['init']}/root/{rel}", "rb") as b:
                self.assertEqual(a.read(), b.read(), rel)
        with open(os.path.join(placeholder["cache"], "compiled.bin"), "rb") as a, \
                open(os.path.join(self.source["cache"], "compiled.bin"), "rb") as b:
            self.assertEqual(a.read(), b.read())

    # --- the tests -------------------------------------------------------------
    def test_the_source_workload_fetched_and_compiled_on_its_first_start(self):
        # The fixture itself, so that the skipped steps below mean something.
        self.assertRegex(self.source_log, r"fetch: \d+ bytes in")
        self.assertRegex(self.source_log, r"compile: [\d.]+ s")
        self.assertGreaterEqual(float(re.search(r"compile: ([\d.]+) s", self.source_log)[1]), 2.9)
        self.assertIn("stale: /etc/app-stale.conf absent", self.source_log)
        self.assertGreaterEqual(self.server.count(), 1)
        # The image ships the file the first start deleted.
        other = self.run_container(["/bin/sleep", "1000"])
        self.assertTrue(os.path.exists(f"/proc/{other['init']}/root/etc/app-stale.conf"))

    def test_a_capture_that_does_not_fit_the_store_fails_cleanly(self):
        small = os.path.join(self.tmp, "small-" + uuid.uuid4().hex[:8])
        os.makedirs(small)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", small], check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", small])
        env = dict(self.env, GPUSNAP_STORE=os.path.join(small, "store"))
        root = self.tree_root(self.source)
        p = self.gs("checkpoint", "--capture-path", "rootfs", "--cache", "/cache", "--id", "too-big", str(root),
                    check=False, env=env)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertRegex(p.stderr, r"the rootfs capture needs \d+ bytes in `[^`]*`, which has \d+ free")
        # No snapshot, no temporary directory left; the workload runs on, its cgroup thawed.
        self.assertEqual(json.loads(self.gs("--json", "ls", env=env).stdout), [])
        self.assertEqual(os.listdir(os.path.join(small, "store", "snapshots")), [])
        self.assertTrue(alive(root))
        with open(f"/proc/{root}/cgroup") as f:
            lines = f.read().splitlines()
        checked = []
        for line in lines:
            _, controllers, path = line.split(":", 2)
            for state, frozen in ((f"/sys/fs/cgroup/freezer{path}/freezer.state", "FROZEN"),
                                  (f"/sys/fs/cgroup/unified{path}/cgroup.events", "frozen 1"),
                                  (f"/sys/fs/cgroup{path}/cgroup.events", "frozen 1")):
                if controllers in ("freezer", "") and os.path.exists(state):
                    with open(state) as f:
                        self.assertNotIn(frozen, f.read(), state)
                    checked.append(state)
        self.assertTrue(checked, f"found no freezer state of the container's cgroup in {lines}")

    def test_rootfs_capture_restored_into_a_new_container_skips_both_steps(self):
        fetches = self.server.count()
        sid = self.capture("rootfs")
        # The workload was left running, frozen only while its files were read.
        self.assertTrue(alive(self.tree_root(self.source)))
        with open(self.source["log"]) as f:
            self.assertEqual(f.read().count("start at"), 1)

        meta = self.inspect(sid)
        self.assertEqual(meta["capture_path"]["path"], "rootfs")
        self.assertEqual(meta["capture_path"]["requested"], "rootfs")
        rootfs = meta["rootfs"]
        self.assertEqual(rootfs["image"], IMAGE)
        self.assertEqual(rootfs["command"], COMMAND)
        self.assertEqual(rootfs["cwd"], "/app")
        self.assertEqual([(c["path"], c["file"], c["mount"]) for c in rootfs["caches"]],
                         [("/cache", "caches/0.tar", True)])
        self.assertGreaterEqual(rootfs["deleted"], 1)
        d = self.snapdir(sid)
        with open(os.path.join(d, "deleted.files")) as f:
            self.assertIn("/etc/app-stale.conf", json.load(f))
        with tarfile.open(os.path.join(d, "rootfs-diff.tar")) as t:
            names = set(t.getnames())
        self.assertIn("var/lib/app/compiled.bin", names)
        self.assertIn("var/lib/app/source.txt", names)
        # Mount points (the volumes, the host's /etc/hosts) are not in the diff.
        self.assertFalse({n for n in names if re.match(r"(cache|out|etc/hosts|etc/resolv\.conf)(/|$)", n)}, names)
        with tarfile.open(os.path.join(d, "caches", "0.tar")) as t:
            self.assertIn("compiled.bin", [os.path.normpath(n) for n in t.getnames()])

        placeholder = self.start_placeholder()
        out = json.loads(self.restore(sid, placeholder).stdout)
        self.assertEqual(out["restore_path"], "rootfs")
        self.assertFalse(out.get("fallback_reason"))
        self.assert_restored_start(placeholder, out["pid"])
        self.assertEqual(self.server.count(), fetches, "the restored start fetched its source again")

    def test_another_image_is_refused_naming_both(self):
        sid = self.capture("rootfs")
        placeholder = self.start_placeholder(image=OTHER_IMAGE)
        before = tree_of(placeholder["upper"])
        p = self.restore(sid, placeholder, check=False)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertIn(IMAGE, p.stderr)
        self.assertIn(OTHER_IMAGE, p.stderr)
        self.assert_untouched(placeholder, before)

    def ring_container(self):
        """A container whose one tree (ring_probe) holds an io_uring ring:
        the container, the tree's root and the ring's fd. Skips where there is
        no ring_probe or the kernel gives no io_uring."""
        if not os.path.exists(RING_PROBE):
            self.skipTest(f"no {RING_PROBE} (build target wl_ring_probe)")
        ring = self.run_container(["sh", "-c", f"{RING_PROBE} >/out/log 2>&1 & wait"],
                                  ro=[os.path.dirname(RING_PROBE), *HOST_LIBS])
        log = self.wait_log(ring, "step 3")
        if "io_uring: refused" in log:
            self.skipTest(f"this kernel gives no io_uring ({log.splitlines()[0]})")
        return ring, self.tree_root(ring), re.search(r"io_uring: fd (\d+)", log)[1]

    def test_auto_picks_rootfs_for_a_tree_holding_an_io_uring_ring(self):
        _, pid, fd = self.ring_container()

        p = self.gs("checkpoint", "--capture-path", "process", "--id", "ring-process", str(pid), check=False)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertIn("io_uring", p.stderr)

        p = self.gs("checkpoint", "--capture-path", "auto", "--id", "ring-auto", str(pid))
        chosen = self.inspect("ring-auto")["capture_path"]
        self.assertEqual((chosen["path"], chosen["requested"]), ("rootfs", "auto"))
        self.assertIn("io_uring", chosen["reason"])
        self.assertIn(f"pid {pid}", chosen["reason"])
        self.assertIn(f"fd {fd}", chosen["reason"])
        said = p.stdout + p.stderr
        self.assertIn("rootfs", said)
        self.assertIn("io_uring", said)

    def test_both_falls_back_to_rootfs_when_the_process_restore_is_refused(self):
        fetches = self.server.count()
        sid = self.capture("both")
        meta = self.inspect(sid)
        self.assertEqual(meta["capture_path"]["path"], "both")
        self.assertIn("criu", meta)
        self.assertIn("rootfs", meta)
        self.assertTrue(alive(self.tree_root(self.source)))

        placeholder = self.start_placeholder()
        # A node without CRIU: the process part cannot run here; the rootfs part needs none.
        p = self.restore(sid, placeholder, "--criu", "/nonexistent")
        out = json.loads(p.stdout)
        self.assertEqual(out["restore_path"], "rootfs")
        self.assertIn(f"[restore] restored by the rootfs path: {out['fallback_reason']}\n", p.stderr)
        self.assertIn("the process restore cannot run here", out["fallback_reason"])
        self.assertIn("/nonexistent", out["fallback_reason"])
        self.assert_restored_start(placeholder, out["pid"])
        self.assertEqual(self.server.count(), fetches)

        # Without --json, the reason is said on stderr, the pid printed on stdout.
        second = self.start_placeholder()
        p = self.gs("restore", sid, "--name", f"r-{second['id'][:8]}", "--criu", "/nonexistent",
                    "--into-container", second["id"])
        self.assertEqual(p.stderr.count(out["fallback_reason"]), 1, p.stderr)
        self.assertIn("by its rootfs capture", p.stderr)
        self.assert_restored_start(second, int(p.stdout.strip().splitlines()[-1]))
        self.assertEqual(self.server.count(), fetches)

    def crafted_diff(self, new_id, entries):
        """A copy of the rootfs snapshot whose rootfs-diff.tar holds `entries`
        ((name, data) for a file, (name, None, target) for a symbolic link),
        sealed: it verifies, only what it holds is wrong."""
        sid = self.copy_snapshot(self.capture("rootfs"), new_id)
        with tarfile.open(os.path.join(self.snapdir(sid), "rootfs-diff.tar"), "w", format=tarfile.PAX_FORMAT) as t:
            for name, data, *link in entries:
                info = tarfile.TarInfo(name)
                info.mtime = int(time.time())
                if link:
                    info.type, info.linkname = tarfile.SYMTYPE, link[0]
                    t.addfile(info)
                else:
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
        self.reseal(sid, "rootfs-diff.tar")
        self.gs("inspect", "--verify", sid)
        return sid

    def test_a_diff_escaping_the_root_is_refused_and_nothing_applied(self):
        mark = "gpusnap-e2e-evil-" + uuid.uuid4().hex[:8]
        through_link = self.crafted_diff("escape", [("var/lib/app/harmless", b"fine\n"), ("escape", None, "/etc"),
                                                    (f"escape/{mark}", b"through the link\n"),
                                                    (f"../{mark}", b"above the root\n")])
        above = self.crafted_diff("dotdot", [("var/lib/app/harmless", b"fine\n"), (f"../{mark}", b"above the root\n")])

        placeholder = self.start_placeholder()
        before = tree_of(placeholder["upper"])
        p = self.restore(through_link, placeholder, check=False)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertIn(f"`rootfs-diff.tar`: `escape/{mark}` lies under `escape`, which the archive makes a symbolic "
                      "link (to `/etc`)", p.stderr)
        self.assertIn(f"; also refused: `../{mark}`; nothing was applied", p.stderr)
        self.assert_untouched(placeholder, before)

        p = self.restore(above, placeholder, check=False)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertIn(f"`../{mark}`", p.stderr)
        self.assertIn("nothing was applied", p.stderr)
        self.assert_untouched(placeholder, before)
        for path in (f"/etc/{mark}", os.path.join(placeholder["bundle"], mark),
                     os.path.join(os.path.dirname(placeholder["upper"]), mark)):
            self.assertFalse(os.path.lexists(path), path)

    def test_a_corrupt_archive_is_refused_before_anything_starts(self):
        flipped = self.copy_snapshot(self.capture("rootfs"), "flipped")
        path = os.path.join(self.snapdir(flipped), "rootfs-diff.tar")
        with open(path, "r+b") as f:
            f.seek(700)  # in the first entry's data or header
            b = f.read(1)
            f.seek(700)
            f.write(bytes([b[0] ^ 0xFF]))
        # Cut short and sealed again: it verifies, but is no whole tar.
        cut = self.copy_snapshot(self.capture("rootfs"), "cut")
        path = os.path.join(self.snapdir(cut), "caches", "0.tar")
        with open(path, "r+b") as f:
            f.truncate(700)
        self.reseal(cut, "caches/0.tar")

        placeholder = self.start_placeholder()
        before = tree_of(placeholder["upper"])
        p = self.restore(flipped, placeholder, check=False)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertIn("file `rootfs-diff.tar` does not match its digest", p.stderr)
        self.assert_untouched(placeholder, before)

        p = self.restore(cut, placeholder, check=False)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertIn("checking `caches/0.tar`", p.stderr)
        self.assertIn("is no intact tar archive", p.stderr)
        self.assert_untouched(placeholder, before)


    # --- through a registry ----------------------------------------------------
    def start_registry(self):
        if not os.access(registry.DOCKER_REGISTRY, os.X_OK):
            self.skipTest(f"no docker-registry at {registry.DOCKER_REGISTRY} (apt: docker-registry)")
        reg = registry.Registry(os.path.join(self.tmp, "registry-" + uuid.uuid4().hex[:8]), "plain")
        self.addCleanup(reg.close)
        reg.start()
        return reg

    def other_store(self, name):
        return dict(self.env, GPUSNAP_STORE=os.path.join(self.tmp, f"{name}-{uuid.uuid4().hex[:8]}"))

    def test_a_rootfs_snapshot_pushed_pulled_into_another_store_and_restored_from_there(self):
        reg = self.start_registry()
        fetches = self.server.count()
        sid = self.capture("rootfs")
        ref = f"{reg.host}/team/rootfs:v1"
        pushed = json.loads(self.gs("--json", "push", sid, ref, "--plain-http").stdout)
        self.assertTrue(pushed["digest"].startswith("sha256:"), pushed)

        # Restored from the reference itself into an empty store: pulled whole, then restored.
        placeholder = self.start_placeholder()
        node_c = self.other_store("store-c")
        out = json.loads(self.restore(ref, placeholder, "--plain-http", env=node_c).stdout)
        self.assertEqual(out["restore_path"], "rootfs")
        self.assertIn("pull", out["timings_s"])
        self.assert_restored_start(placeholder, out["pid"])
        self.assertEqual([s["id"] for s in json.loads(self.gs("--json", "ls", env=node_c).stdout)], [sid])
        self.assertEqual(os.listdir(os.path.join(node_c["GPUSNAP_STORE"], "pulls")), [])

        # Pulled into another empty store: the same bytes.
        node_b = self.other_store("store-b")
        pulled = json.loads(self.gs("--json", "pull", ref, "--plain-http", env=node_b).stdout)
        self.assertEqual(pulled["id"], sid)
        there = os.path.join(node_b["GPUSNAP_STORE"], "snapshots", sid)
        for name in ("rootfs-diff.tar", "deleted.files", os.path.join("caches", "0.tar")):
            self.assertTrue(filecmp.cmp(os.path.join(self.snapdir(sid), name), os.path.join(there, name),
                                        shallow=False), name)
        self.assertEqual(json.loads(self.gs("--json", "inspect", sid, env=node_b).stdout)["rootfs"],
                         self.inspect(sid)["rootfs"])

        # Restored by its id from that store, into a second placeholder.
        second = self.start_placeholder()
        out = json.loads(self.restore(sid, second, env=node_b).stdout)
        self.assertEqual(out["restore_path"], "rootfs")
        self.assertFalse(out.get("fallback_reason"))
        self.assert_restored_start(second, out["pid"])
        self.assertEqual(self.server.count(), fetches, "a restored start fetched its source again")

    # --- through the agent -----------------------------------------------------
    def start_agent(self):
        agent = Agent(self, socket_path=os.path.join(self.tmp, "agent-" + uuid.uuid4().hex[:8], "agent.sock"))
        self.addCleanup(agent.stop)
        return agent

    def agent_job(self, agent, path, body, timeout=120):
        """POSTs `body` to `path` and waits for its job to end: the job."""
        status, reply = agent.request("POST", path, body)
        self.assertEqual(status, 202, reply)
        return wait_for_job(self, agent, reply["job"], timeout)

    def test_the_agent_captures_by_the_rootfs_path_and_restores_into_a_placeholder(self):
        fetches = self.server.count()
        agent = self.start_agent()
        job = self.agent_job(agent, "/v1/checkpoints", {"container": self.source["id"], "capturePath": "rootfs",
                                                        "caches": ["/cache"], "leaveRunning": True,
                                                        "snapshotId": "agent-rootfs"})
        self.assertEqual(job["state"], "succeeded", f"{job}\n{agent.log()}")
        self.assertEqual(job["snapshot"], "agent-rootfs")
        self.assertEqual((job["capturePath"]["requested"], job["capturePath"]["path"]), ("rootfs", "rootfs"))
        self.assertIn(self.source["id"], job["target"])
        self.assertTrue(alive(self.tree_root(self.source)))
        meta = self.inspect("agent-rootfs")
        self.assertEqual(meta["capture_path"]["path"], "rootfs")
        self.assertEqual([(c["path"], c["file"], c["mount"]) for c in meta["rootfs"]["caches"]],
                         [("/cache", "caches/0.tar", True)])

        placeholder = self.start_placeholder()
        job = self.agent_job(agent, "/v1/restores", {"snapshot": "agent-rootfs", "name": f"r-{placeholder['id'][:8]}",
                                                     "target": {"container": placeholder["id"]}})
        self.assertEqual(job["state"], "succeeded", f"{job}\n{agent.log()}")
        self.assertEqual(job["restorePath"], "rootfs")
        self.assertNotIn("fallbackReason", job)
        self.assert_restored_start(placeholder, job["restoredPid"])
        self.assertEqual(self.server.count(), fetches, "the restored start fetched its source again")

    def test_the_agents_default_takes_an_io_uring_tree_by_the_rootfs_path(self):
        ring, pid, fd = self.ring_container()
        agent = self.start_agent()
        job = self.agent_job(agent, "/v1/checkpoints", {"container": ring["id"]})
        self.assertEqual(job["state"], "succeeded", f"{job}\n{agent.log()}")
        chosen = job["capturePath"]
        self.assertEqual((chosen["requested"], chosen["path"]), ("auto", "rootfs"))
        self.assertIn("io_uring", chosen["reason"])
        self.assertIn(f"pid {pid}", chosen["reason"])
        self.assertIn(f"fd {fd}", chosen["reason"])
        recorded = self.inspect(job["snapshot"])["capture_path"]
        self.assertEqual({k: recorded.get(k) for k in chosen}, chosen)
        self.assertIn("by the rootfs path (asked: auto", agent.log())
        # A rootfs capture leaves the tree running, and its init not held stopped.
        self.assertTrue(alive(pid))
        with open(f"/proc/{ring['init']}/stat") as f:
            self.assertNotEqual(f.read().rsplit(")", 1)[1].split()[0], "T")


if __name__ == "__main__":
    unittest.main()
