"""Nothing is lost: every failure leaves the source running, the store without
half snapshots, and says what went wrong in one line."""
import contextlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import time
import unittest

from harness import GPUSNAP, GpusnapCase, free_port, read_meta, write_meta


@contextlib.contextmanager
def tmpfs(path, options):
    """A tmpfs mounted at path for the duration: a small disk, a read-only store."""
    os.makedirs(path)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", path], check=True)


PF_KTHREAD = 0x00200000


def kernel_thread():
    """A kernel thread's pid (kthreadd, pid 2, on a host), or None."""
    for entry in sorted((e for e in os.listdir("/proc") if e.isdigit()), key=int):
        try:
            with open(f"/proc/{entry}/stat") as f:
                flags = int(f.read().rsplit(")", 1)[1].split()[6])
        except (FileNotFoundError, ProcessLookupError):
            continue
        if flags & PF_KTHREAD:
            return int(entry)
    return None


class FailedCheckpoints(GpusnapCase):
    def assert_source_runs_and_store_is_clean(self, pid):
        c = self.count(pid)
        self.wait_count(pid, c + 5)
        self.assertEqual(self.snapshots(), [])
        self.assertEqual(self.tmp_dirs(), [])

    def test_failed_dump_leaves_source_running(self):
        # An established connection without --tcp-established: CRIU refuses.
        port = free_port()
        pid = self.run_counter("refused", port)
        conn = socket.create_connection(("127.0.0.1", port), timeout=5)
        conn.sendall(b"x\n")
        conn.recv(64)
        p = self.gs("checkpoint", "refused", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("CRIU dump failed", p.stderr)
        self.assertIn("Error (", p.stderr)  # CRIU's own reason is shown
        self.assert_source_runs_and_store_is_clean(pid)
        conn.sendall(b"x\n")
        self.assertTrue(conn.recv(64))  # and the connection still works
        conn.close()

    def _kill_at(self, phase, name):
        pid = self.run_counter(name)
        proc, _ = self.paused(["checkpoint", name], phase)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return pid

    def test_sigkill_before_dump(self):
        pid = self._kill_at("dump", "k1")
        self.assertEqual(self.snapshots(), [])
        c = self.count(pid)
        self.wait_count(pid, c + 5)
        # The next run cleans what the killed one left, and works.
        snap = self.checkpoint("k1", "--leave-running")
        self.assertEqual(self.tmp_dirs(), [])
        self.assertEqual([s["id"] for s in self.snapshots()], [snap])

    def test_sigkill_while_tree_is_frozen(self):
        # CRIU holds the tree frozen and waits for our answer; we die instead.
        pid = self._kill_at("post-dump", "k2")
        self.assertEqual(self.snapshots(), [])
        c = self.count(pid)
        self.wait_count(pid, c + 5)  # CRIU resumed it
        # The next run cleans the temporary directory the killed one left.
        self.assertEqual(len(self.tmp_dirs()), 1)
        snap = self.checkpoint("k2", "--leave-running")
        self.assertEqual(self.tmp_dirs(), [])
        self.assertEqual([s["id"] for s in self.snapshots()], [snap])

    def test_sigkill_after_publish(self):
        # Published but not yet answered: the snapshot is whole, the source resumes.
        pid = self._kill_at("published", "k3")
        snaps = self.snapshots()
        self.assertEqual(len(snaps), 1)
        c = self.count(pid)
        self.wait_count(pid, c + 5)
        self.gs("inspect", "--verify", snaps[0]["id"])

    def test_full_disk(self):
        pid = self.run_counter("full")
        with tmpfs(os.path.join(self.tmp, "small"), "size=256k") as small:
            p = self.gs("checkpoint", "full", "--store", small, check=False)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("No space left on device", p.stderr)
            c = self.count(pid)
            self.wait_count(pid, c + 5)
            self.assertEqual(os.listdir(os.path.join(small, "snapshots")), [])

    def test_store_not_writable(self):
        pid = self.run_counter("ro")
        with tmpfs(os.path.join(self.tmp, "ro"), "ro") as ro:
            p = self.gs("-q", "checkpoint", "ro", "--store", ro, check=False)
            self.assertNotEqual(p.returncode, 0)
            self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
            self.assertIn("not writable", p.stderr)
            self.assertIn(ro, p.stderr)
        self.wait_count(pid, self.count(pid) + 3)

    def test_unknown_pid_and_name(self):
        p = self.gs("checkpoint", "999999", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("gpusnap: error: no process with pid 999999", p.stderr)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1)
        p = self.gs("checkpoint", "no-such-workload", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no workload named `no-such-workload`", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.store, "snapshots")) and self.snapshots())

    def test_namespace_init_is_refused(self):
        self.run_counter("init")
        reaper = self.workloads()[0]["reaper_pid"]
        p = self.gs("checkpoint", str(reaper), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("init of its pid namespace", p.stderr)

    def test_kernel_thread_is_refused(self):
        kthread = kernel_thread()
        if kthread is None:
            self.skipTest("no kernel thread is visible in this pid namespace")
        p = self.gs("checkpoint", str(kthread), check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, rf"^gpusnap: error: .*pid {kthread} is a kernel thread \(")
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        self.assertNotIn("CRIU", p.stderr)
        self.assertEqual(self.snapshots(), [])

    def test_missing_criu_config_is_refused(self):
        pid = self.run_counter("cfg")
        missing = os.path.join(self.tmp, "no-such.conf")
        p = self.gs("checkpoint", "cfg", "--criu-config", missing, check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(f"--criu-config: File does not exist: {missing}", p.stderr)
        self.assert_source_runs_and_store_is_clean(pid)

    def test_relative_criu_config_is_honoured(self):
        # CRIU reads the file from its own working directory: a path relative
        # to the caller's must still reach it. This one keeps the source running.
        pid = self.run_counter("cfg")
        with open(os.path.join(self.tmp, "keep.conf"), "w") as f:
            f.write("leave-running\n")
        p = subprocess.run([GPUSNAP, "-q", "checkpoint", "cfg", "--criu-config", "keep.conf"], cwd=self.tmp,
                           env=self.env, capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(self.snapshots()), 1)
        self.assertTrue(self.alive(pid), "the configuration was not read: the source was stopped")
        self.wait_count(pid, self.count(pid) + 5)

    def test_run_of_missing_program(self):
        p = self.gs("run", "--name", "nope", "--", "/no/such/program", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("cannot start `/no/such/program`: No such file or directory", p.stderr)
        self.assertEqual(self.workloads(), [])

    def test_duplicate_workload_name(self):
        self.run_counter("dup")
        p = self.gs("run", "--name", "dup", "--", "sleep", "100", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("already running", p.stderr)


class RemoveRacingACheckpoint(GpusnapCase):
    """Issue 13: `gpusnap rm` of a snapshot whose checkpoint has published it
    but not finished (CRIU still writes stats-dump into it) once left
    `.tmp-rm-<id>/` behind."""

    def test_rm_waits_for_the_checkpoint_to_finish_and_leaves_nothing(self):
        pid = self.run_counter("race")
        ckpt, resume = self.paused(["checkpoint", "race", "--leave-running", "--id", "race-1"], "published")
        self.assertEqual([s["id"] for s in self.snapshots()], ["race-1"])  # published, CRIU not answered yet
        rm = subprocess.Popen([GPUSNAP, "rm", "race-1"], env=self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: rm.poll() is None and rm.kill())
        time.sleep(2)
        self.assertIsNone(rm.poll(), "rm went ahead while the checkpoint still held the snapshot")
        open(resume, "w").close()
        out, err = ckpt.communicate(timeout=120)
        self.assertEqual(ckpt.returncode, 0, err)
        out, err = rm.communicate(timeout=120)
        self.assertEqual(rm.returncode, 0, err)
        self.assertEqual(self.snapshots(), [])
        self.assertEqual(os.listdir(os.path.join(self.store, "snapshots")), [])
        c = self.count(pid)
        self.wait_count(pid, c + 3)


class LeaveRunningPause(GpusnapCase):
    """Issue 15: with --leave-running the source runs again as soon as CRIU has
    dumped it; the publish (digests, fsync) no longer holds it frozen."""

    def test_the_source_runs_while_its_snapshot_is_published(self):
        pid = self.run_counter("lr")
        ckpt, resume = self.paused(["--json", "checkpoint", "lr", "--leave-running", "--id", "lr-1"], "published")
        c = self.count(pid)
        self.wait_count(pid, c + 3)  # counting on, the publish not finished
        open(resume, "w").close()
        out, err = ckpt.communicate(timeout=120)
        self.assertEqual(ckpt.returncode, 0, err)
        timings = json.loads(out)["timings_s"]
        self.assertLess(timings["paused"], timings["total"])
        self.assertIn("publish", timings)
        self.assertEqual([s["id"] for s in self.snapshots()], ["lr-1"])


class BadSnapshots(GpusnapCase):
    def setUp(self):
        super().setUp()
        self.pid = self.run_counter("src")
        self.snap = self.checkpoint("src", "--leave-running")
        self.dir = os.path.join(self.store, "snapshots", self.snap)

    def assert_refused(self, needle):
        before = self.workloads()
        p = self.gs("restore", self.snap, "--name", "copy", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(needle, p.stderr)
        self.assertEqual(self.workloads(), before)  # nothing was restored
        return p

    def test_flipped_bit_is_refused_naming_the_file(self):
        path = os.path.join(self.dir, "checkpoint", "pages-1.img")
        with open(path, "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0x01]))
        p = self.assert_refused("checkpoint/pages-1.img")
        self.assertIn("does not match its digest", p.stderr)

    def test_truncated_image_is_refused(self):
        path = os.path.join(self.dir, "checkpoint", "pstree.img")
        os.truncate(path, 1)
        self.assert_refused("checkpoint/pstree.img")

    def test_missing_image_is_refused(self):
        os.unlink(os.path.join(self.dir, "checkpoint", "inventory.img"))
        self.assert_refused("is missing")

    def test_unknown_schema_version(self):
        meta = os.path.join(self.dir, "gpusnap.json")
        with open(meta) as f:
            text = re.sub(r'"schema_version": "[0-9.]+"', '"schema_version": "9.0"', f.read())
        with open(meta, "w") as f:
            f.write(text)
        self.assert_refused("schema version 9.0 is not supported")

    # --- issue 13: a snapshot holds exactly its files, all regular -----------
    def store_state(self):
        """Every entry of the store: path, type, size and mtime, links not followed."""
        out = []
        for root, dirs, files in os.walk(self.store):
            for name in dirs + files:
                path = os.path.join(root, name)
                st = os.lstat(path)
                out.append((os.path.relpath(path, self.store), stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns))
        return sorted(out)

    def assert_refused_everywhere(self, needle):
        """inspect --verify and restore both refuse, naming `needle`; the store,
        the workloads and the source are as they were."""
        before = self.store_state()
        p = self.gs("inspect", "--verify", self.snap, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(needle, p.stderr)
        self.assertNotIn("match their digests", p.stderr)
        self.assert_refused(needle)
        self.assertEqual(self.store_state(), before)
        c = self.count(self.pid)
        self.wait_count(self.pid, c + 3)  # the source still runs

    def test_extra_symlink_named_like_an_image_is_refused(self):
        planted = os.path.join(self.tmp, "planted.img")
        with open(planted, "wb") as f:
            f.write(b"\0" * 64)
        link = os.path.join(self.dir, "checkpoint", "cgroup.img")
        self.assertFalse(os.path.lexists(link))  # an image CRIU looks for, not in this dump
        os.symlink(planted, link)
        self.assert_refused_everywhere("`checkpoint/cgroup.img` is a symbolic link, not a regular file")

    def test_extra_fifo_is_refused(self):
        os.mkfifo(os.path.join(self.dir, "checkpoint", "extra.img"))
        self.assert_refused_everywhere("`checkpoint/extra.img` is a FIFO, not a regular file")

    def test_extra_socket_is_refused(self):
        s = socket.socket(socket.AF_UNIX)
        s.bind(os.path.join(self.dir, "extra.sock"))
        s.close()
        self.assert_refused_everywhere("`extra.sock` is a socket, not a regular file")

    def test_listed_image_swapped_for_a_symlink_is_named_as_such(self):
        img = os.path.join(self.dir, "checkpoint", "pstree.img")
        moved = os.path.join(self.tmp, "pstree.img")
        os.rename(img, moved)
        os.symlink(moved, img)  # same bytes, behind a link
        self.assert_refused_everywhere("`checkpoint/pstree.img` is a symbolic link, not a regular file")

    # --- issue 13: gpusnap.json is validated and carries its own digest --------
    def test_flipped_bit_in_metadata_is_refused(self):
        meta = os.path.join(self.dir, "gpusnap.json")
        with open(meta, "rb") as f:
            text = bytearray(f.read())
        m = re.search(rb'"host_pid": (\d+)', bytes(text))
        at = m.end(1) - 1  # the last digit: the pid stays a valid pid
        text[at] ^= 0x01
        with open(meta, "wb") as f:
            f.write(text)
        self.assert_refused_everywhere("does not match its digest")

    def test_metadata_syntax_error_names_the_byte(self):
        meta = os.path.join(self.dir, "gpusnap.json")
        with open(meta, "rb") as f:
            text = f.read()
        at = text.index(b'"id"')
        with open(meta, "wb") as f:
            f.write(text[:at] + b"}" + text[at:])
        self.assert_refused_everywhere(f"JSON syntax error at byte {at + 1}")

    def test_out_of_range_listening_port_is_refused(self):
        path = os.path.join(self.dir, "gpusnap.json")
        meta = read_meta(path)
        meta["criu"]["listen_ports"] = [70000]
        write_meta(path, meta)  # digest and all: only the value is wrong
        self.assert_refused_everywhere("field `criu.listen_ports[0]` is 70000, not a TCP port (1..65535)")

    def test_resealed_metadata_is_read(self):
        # The documented canonical form, computed here independently, is the one gpusnap checks.
        path = os.path.join(self.dir, "gpusnap.json")
        meta = read_meta(path)
        digest = meta["meta_sha256"]
        write_meta(path, meta)
        self.assertEqual(read_meta(path)["meta_sha256"], digest)
        self.gs("inspect", "--verify", self.snap)

    def test_unknown_snapshot(self):
        p = self.gs("restore", "no-such-snapshot", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no snapshot `no-such-snapshot`", p.stderr)
        p = self.gs("restore", "../../etc", check=False)
        self.assertIn("invalid snapshot id", p.stderr)

    def test_restore_under_a_running_name_is_refused(self):
        p = self.gs("restore", self.snap, check=False)  # "src" still runs
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("a workload named `src` is already running", p.stderr)

    def test_missing_criu_config_is_refused(self):
        missing = os.path.join(self.tmp, "no-such.conf")
        before = self.workloads()
        p = self.gs("restore", self.snap, "--name", "copy", "--criu-config", missing, check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(f"--criu-config: File does not exist: {missing}", p.stderr)
        self.assertEqual(self.workloads(), before)


if __name__ == "__main__":
    unittest.main()
