"""`gpusnap restore --lazy-pages`: the tree's memory arrives after the restore
returns, from a real `criu lazy-pages` daemon over userfaultfd. The memory
comes back as a plain restore brings it back (a tree of two processes holding
a known pattern checks every page); a daemon that dies before every page is
in never leaves the tree running with memory missing: during the restore the
restore fails through its undo and says so, after it the keeper kills the
tree and says so in the workload's log and in `gpusnap ps`."""
import glob
import os
import re
import signal
import stat
import subprocess
import time
import unittest

from harness import WORKLOADS, FakeGpuCase, GpusnapCase
from test_restore_into_container import PlaceholderCase

BUNDLE = os.environ.get("GPUSNAP_CRIU", os.path.join(os.path.dirname(__file__), "../../build/criu-bundle"))


def kernel_lazy_pages():
    """Whether this kernel lets CRIU restore lazily (userfaultfd), asked of the bundle's CRIU."""
    argv = [os.path.join(BUNDLE, "lib", "ld-linux-x86-64.so.2"), os.path.join(BUNDLE, "bin", "criu"), "check",
            "--feature", "uffd-noncoop"]
    try:
        return subprocess.run(argv, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


NO_UFFD = None if kernel_lazy_pages() else "SKIPPED: this kernel offers CRIU no userfaultfd (criu check --feature uffd-noncoop)"

MIB = 256  # the parent's; its child holds a quarter of it


def stamp_count(pid):
    """memfill's count, which it keeps in its command name ("mem:<n>")."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except FileNotFoundError:
        return -1
    return int(comm.split(":")[1]) if comm.startswith("mem") and ":" in comm else -1


class LazyHelpers:
    def run_memfill(self, name, mib=MIB):
        pid = int(self.gs("run", "--name", name, "--", os.path.join(WORKLOADS, "memfill"), self.data,
                          str(mib)).stdout.strip())
        self.wait_memfill(pid, 3)
        return pid

    def wait_memfill(self, pid, at_least, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            if not self.alive(pid):
                self.fail(f"memfill {pid} died; log:\n{self.logs()}")
            if stamp_count(pid) >= at_least:
                return stamp_count(pid)
            time.sleep(0.05)
        self.fail(f"memfill {pid} did not reach count {at_least} (at {stamp_count(pid)})")

    def report(self, pid, timeout=60):
        """Both processes check every page and report their count and the hash of their pattern."""
        paths = {role: os.path.join(self.data, f"report-{role}.txt") for role in ("parent", "child")}
        for p in paths.values():
            if os.path.exists(p):
                os.unlink(p)
        os.kill(pid, signal.SIGUSR1)
        end = time.time() + timeout
        while time.time() < end and not all(os.path.exists(p) for p in paths.values()):
            if not self.alive(pid):
                self.fail(f"memfill {pid} died; log:\n{self.logs()}")
            time.sleep(0.05)
        out = {}
        for role, p in paths.items():
            with open(p) as f:
                m = re.fullmatch(r"count (\d+) hash ([0-9a-f]{16})\n", f.read())
            self.assertIsNotNone(m, role)
            out[role] = (int(m[1]), m[2])
        return out

    def tree_of_data(self):
        """Live processes of the workload (their command line names this test's data dir)."""
        out = subprocess.run(["pgrep", "-f", self.data], capture_output=True, text=True).stdout.split()
        return [int(p) for p in out if self.alive(int(p))]

    def lazy_dirs(self):
        return sorted(glob.glob(os.path.join(self.run_dir, "lazy-pages", "*")))

    def of_lazy_pages(self):
        """Live processes of a lazy restore of this test: keepers and daemons name its work dirs."""
        out = subprocess.run(["pgrep", "-f", os.path.join(self.run_dir, "lazy-pages")], capture_output=True,
                             text=True).stdout.split()
        return [int(p) for p in out if self.alive(int(p))]

    @staticmethod
    def state_of(work_dir):
        with open(os.path.join(work_dir, "state")) as f:
            return f.read()

    def serving_dir(self):
        """The work dir of the one lazy restore whose daemon serves."""
        serving = []
        for d in self.lazy_dirs():
            if self.state_of(d).startswith("serving:"):
                serving.append(d)
        self.assertEqual(len(serving), 1, self.lazy_dirs())
        return serving[0]

    def daemon_pid(self):
        """The daemon of the one lazy restore under way, from its state line."""
        with open(os.path.join(self.serving_dir(), "state")) as f:
            m = re.search(r"criu lazy-pages pid (\d+)", f.read())
        self.assertIsNotNone(m)
        return int(m[1])

    def wait_until(self, what, cond, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            if cond():
                return
            time.sleep(0.05)
        self.fail(f"timed out waiting until {what}")

    def assert_nothing_left(self):
        self.wait_until("no process of the workload is left", lambda: not self.tree_of_data(), timeout=10)
        self.wait_until("no keeper or daemon is left", lambda: not self.of_lazy_pages(), timeout=10)
        self.assertEqual([w["name"] for w in self.workloads() if w["running"]], [])

    def checkpointed(self, name, mib=MIB):
        pid = self.run_memfill(name, mib)
        before = self.report(pid)
        snap = self.checkpoint(name)
        self.assertTrue(self.wait_gone(pid))
        return snap, before


class LazyPagesCase(LazyHelpers, GpusnapCase):
    pass


@unittest.skipIf(NO_UFFD, NO_UFFD)
class LazyRestore(LazyPagesCase):
    def test_the_memory_comes_back_as_a_plain_restore_brings_it(self):
        snap, before = self.checkpointed("mem")
        plain = self.gs_json("restore", snap, "--name", "plain")
        got_plain = self.report(plain["pid"])
        os.kill(plain["reaper_pid"], signal.SIGTERM)
        self.assertTrue(self.wait_gone(plain["pid"]))

        lazy = self.gs_json("restore", snap, "--name", "lazy", "--lazy-pages")
        self.assertIn("criu-restore", lazy["timings_s"])
        self.assertIn("lazy-pages-start", lazy["timings_s"])
        got_lazy = self.report(lazy["pid"])
        for role in ("parent", "child"):
            # The same pattern, and the count goes on from where the dump stopped it.
            self.assertEqual(got_lazy[role][1], before[role][1], role)
            self.assertEqual(got_lazy[role][1], got_plain[role][1], role)
            self.assertGreaterEqual(got_lazy[role][0], before[role][0], role)
        self.wait_memfill(lazy["pid"], stamp_count(lazy["pid"]) + 5)
        # Every page in: the daemon and its keeper are gone, and ps says how long it took.
        self.wait_until("the daemon and its keeper end", lambda: not self.of_lazy_pages())
        w = [w for w in self.workloads() if w["name"] == "lazy"][0]
        self.assertTrue(w["running"])
        self.assertRegex(w["lazy_pages"]["state"], r"^done: every page delivered in \d+\.\d+ s")
        self.assertIn("memory done: every page delivered", self.gs("ps").stdout)
        self.assertEqual(self.report(lazy["pid"])["parent"][1], before["parent"][1])
        self.assertTrue(os.path.exists(os.path.join(w["lazy_pages"]["dir"], "lazy-pages.log")))
        self.assert_no_fail_in_logs()


@unittest.skipIf(NO_UFFD, NO_UFFD)
class LazyPagesServerDies(LazyPagesCase):
    def test_before_criu_restores_the_restore_fails_and_leaves_nothing(self):
        snap, _ = self.checkpointed("mem", 64)
        proc, resume = self.paused(["restore", snap, "--lazy-pages"], "lazy-pages")
        os.kill(self.daemon_pid(), signal.SIGKILL)
        open(resume, "w").close()
        _, err = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 1, err)
        self.assertIn("the lazy-pages server (criu lazy-pages, pid", err)
        self.assertIn("was killed by signal 9 (SIGKILL)", err)
        self.assert_nothing_left()
        # Nothing of it is in the way of a lazy restore that works.
        pid = int(self.gs("restore", snap, "--lazy-pages").stdout.strip().splitlines()[-1])
        self.wait_memfill(pid, stamp_count(pid) + 3)

    def test_before_the_restore_is_recorded_it_fails_through_its_undo(self):
        snap, _ = self.checkpointed("mem", 64)
        # The daemon stopped from the start: its pages cannot all be in before it is killed.
        env = dict(self.env, GPUSNAP_TEST_LAZY_PAGES_STOPPED="1")
        proc, resume = self.paused(["restore", snap, "--lazy-pages"], "record", env=env)
        work = self.serving_dir()
        os.kill(self.daemon_pid(), signal.SIGKILL)
        self.wait_until("the keeper has seen it", lambda: self.state_of(work).startswith("failed:"))
        open(resume, "w").close()
        _, err = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 1, err)
        self.assertIn("the lazy-pages server (criu lazy-pages, pid", err)
        self.assertIn("the restored tree of `mem` was killed", err)
        self.assert_nothing_left()

    def test_after_the_restore_the_keeper_kills_the_tree_and_says_why(self):
        snap, _ = self.checkpointed("mem", 64)
        env = dict(self.env, GPUSNAP_TEST_LAZY_PAGES_STOPPED="1")
        out = self.gs_json("restore", snap, "--lazy-pages", env=env)
        self.assertTrue(self.alive(out["pid"]))
        w = [w for w in self.workloads() if w["name"] == "mem"][0]
        self.assertRegex(w["lazy_pages"]["state"], r"^serving: pages arriving")
        os.kill(self.daemon_pid(), signal.SIGKILL)
        self.assertTrue(self.wait_gone(out["pid"], timeout=10), "the tree outlived its page server")
        self.assert_nothing_left()
        w = [w for w in self.workloads() if w["name"] == "mem"][0]
        self.assertFalse(w["running"])
        self.assertRegex(w["lazy_pages"]["state"],
                         r"^failed: the lazy-pages server \(criu lazy-pages, pid \d+\) was killed by signal 9")
        self.assertIn("memory failed: the lazy-pages server", self.gs("ps").stdout)
        with open(w["log"]) as f:
            self.assertIn("gpusnap: the lazy-pages server (criu lazy-pages, pid", f.read())
        with open(os.path.join(w["lazy_pages"]["dir"], "keeper.log")) as f:
            self.assertIn("state: failed:", f.read())


class LazyPagesRefused(LazyPagesCase):
    def test_a_node_without_userfaultfd_is_refused_naming_what_it_lacks(self):
        # A bundle whose CRIU says what CRIU says on a kernel without userfaultfd.
        real = os.path.realpath(os.environ["GPUSNAP_CRIU"])
        fake = os.path.join(self.tmp, "no-uffd-bundle")
        os.makedirs(os.path.join(fake, "bin"))
        os.makedirs(os.path.join(fake, "lib"))
        os.symlink(os.path.join(real, "bin", "criu"), os.path.join(fake, "bin", "criu"))
        loader = os.path.join(fake, "lib", "ld-linux-x86-64.so.2")
        with open(loader, "w") as f:
            f.write("#!/bin/sh\nshift\n"
                    'case "$*" in *uffd-noncoop*) echo "Lazy pages are not available: Function not implemented"; '
                    "exit 1;; esac\n"
                    f'exec {real}/lib/ld-linux-x86-64.so.2 {real}/bin/criu "$@"\n')
        os.chmod(loader, stat.S_IRWXU)
        snap, _ = self.checkpointed("mem", 16)
        p = self.gs("restore", snap, "--lazy-pages", "--criu", fake, check=False)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn("userfaultfd", p.stderr)
        self.assertIn("uffd-noncoop", p.stderr)
        self.assertIn("Lazy pages are not available", p.stderr)
        self.assertIn("without --lazy-pages", p.stderr)
        self.assert_nothing_left()
        pid = int(self.gs("restore", snap, "--criu", fake).stdout.strip().splitlines()[-1])
        self.wait_memfill(pid, stamp_count(pid) + 3)


@unittest.skipIf(NO_UFFD, NO_UFFD)
class LazyRestoreWithFakeDriver(FakeGpuCase):
    def test_a_gpu_snapshot_restores_lazily(self):
        pid = self.run_gpu_counter("gpu")
        snap = self.gs("checkpoint", "-q", "gpu", env=self.gpu_env).stdout.strip().splitlines()[-1]
        self.assertTrue(self.wait_gone(pid))
        at = self.count(pid) if self.alive(pid) else 0
        out = self.gs_json("restore", snap, "--lazy-pages", env=self.gpu_env)
        self.assertEqual(self.device_state(), 0)  # RUNNING: the driver restored it
        self.wait_count(out["pid"], max(at, self.count(out["pid"])) + 5)
        end = time.time() + 30
        while time.time() < end:
            w = [w for w in self.workloads() if w["name"] == "gpu"][0]
            if w["lazy_pages"]["state"].startswith("done:"):
                break
            time.sleep(0.1)
        self.assertRegex(w["lazy_pages"]["state"], r"^done:")
        self.assertTrue(w["running"])
        self.assert_no_fail_in_logs()


@unittest.skipIf(NO_UFFD, NO_UFFD)
class LazyIntoPlaceholder(LazyHelpers, PlaceholderCase):
    def kill_children(self, init):
        """One round of ending what the placeholder holds (orphans come back to it); True once it holds nothing."""
        kids = self.children(init)
        for c in kids:
            try:
                os.kill(c, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return not kids

    def test_a_lazy_restore_into_a_placeholder_and_its_servers_death(self):
        agent = self.start_agent()
        placeholder, init = self.start_placeholder()
        snapshot, before = self.checkpoint_counter(agent)
        new_pid = int(self.gs("restore", snapshot, "--into-container", placeholder, "--lazy-pages").stdout.strip()
                      .splitlines()[-1])
        self.assert_restored_into(new_pid, init)
        self.wait_count(new_pid, max(before, self.count(new_pid)) + 5)
        self.wait_until("every page is in", lambda: not self.of_lazy_pages())
        self.wait_until("the placeholder is idle", lambda: self.kill_children(init), timeout=10)

        # Its server dies: what was restored goes, the placeholder stays.
        env = dict(self.env, GPUSNAP_TEST_LAZY_PAGES_STOPPED="1")
        p = self.gs("restore", snapshot, "--into-container", placeholder, "--lazy-pages", "--name", "again", env=env)
        new_pid = int(p.stdout.strip().splitlines()[-1])
        os.kill(self.daemon_pid(), signal.SIGKILL)
        self.assertTrue(self.wait_gone(new_pid, timeout=10))
        self.wait_until("the placeholder is idle", lambda: not self.children(init), timeout=10)
        self.assertTrue(self.alive(init))
        self.wait_until("no keeper or daemon is left", lambda: not self.of_lazy_pages(), timeout=10)


if __name__ == "__main__":
    unittest.main()
