"""Round trips of a real multi-process, multi-threaded workload through the
real CRIU: the count continues, and pipes, unix sockets, files, deleted files,
/dev/shm and TCP still work after a restore (the workload checks itself)."""
import os
import signal
import socket
import subprocess
import time
import unittest

from harness import GPUSNAP, WORKLOADS, GpusnapCase, free_port


def ask(port, sock=None):
    s = sock or socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"count?\n")
    data = s.recv(64)
    if sock is None:
        s.close()
    return int(data.decode().strip())


class RoundTrip(GpusnapCase):
    def test_a_caller_with_sigterm_blocked_still_starts_a_stoppable_workload(self):
        # A daemon calling gpusnap (the agent) blocks SIGTERM for sigwait and ignores
        # SIGPIPE; neither may reach the reaper or the workload.
        def block():
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        p = subprocess.run([GPUSNAP, "run", "--name", "masked", "--", os.path.join(WORKLOADS, "counter"), self.data,
                            "0"], capture_output=True, text=True, env=self.env, preexec_fn=block, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        pid = int(p.stdout.strip())
        self.wait_count(pid, 2)
        for who in (pid, self.workloads()[0]["reaper_pid"]):
            with open(f"/proc/{who}/status") as f:
                fields = dict(line.split(":", 1) for line in f)
            self.assertEqual(int(fields["SigBlk"], 16), 0, f"pid {who} starts with signals blocked")
            self.assertEqual(int(fields["SigIgn"], 16) & (1 << (signal.SIGPIPE - 1)), 0, f"pid {who} ignores SIGPIPE")
        os.kill(self.workloads()[0]["reaper_pid"], signal.SIGTERM)
        self.assertTrue(self.wait_gone(pid, timeout=10), "SIGTERM to the reaper did not stop the workload")

    def test_subtree_whose_session_is_led_from_outside_it(self):
        # The counter's session leader is the shell above it, which stays out
        # of the snapshot: the dump and the restore both need CRIU's shell-job mode.
        sh = int(self.gs("run", "--name", "sj", "--", "sh", "-c",
                         f"{os.path.join(WORKLOADS, 'counter')} {self.data} 0 & wait").stdout.strip())
        child = None
        for _ in range(100):
            with open(f"/proc/{sh}/task/{sh}/children") as f:
                kids = f.read().split()
            if kids:
                child = int(kids[0])
                break
            time.sleep(0.05)
        self.assertIsNotNone(child, "the shell started no counter")
        at = self.wait_count(child, 3)
        snap = self.checkpoint(str(child))
        self.assertTrue(self.gs_json("inspect", snap)["criu"]["shell_job"])
        new = self.restore(snap)
        self.assertGreaterEqual(self.count(new), at)
        self.wait_count(new, at + 3)

    def test_count_continues_after_restore(self):
        port = free_port()
        pid = self.run_counter("counter", port)
        tree_before = self.gs_json("ps")[0]
        before = self.wait_count(pid, 10)
        snap = self.checkpoint("counter")
        self.assertTrue(self.wait_gone(pid), "source should be gone after a checkpoint without --leave-running")
        stopped_at = self.count(pid) if self.alive(pid) else before
        new_pid = self.restore(snap)
        # Not from zero: from where it stopped.
        first = self.count(new_pid)
        self.assertGreaterEqual(first, stopped_at)
        self.wait_count(new_pid, first + 10)
        self.assertGreater(ask(port), first)  # the TCP listener came back
        time.sleep(0.5)
        self.assertTrue(self.alive(new_pid))
        self.assert_no_fail_in_logs()  # pipes, sockets, files, shm all verified by the workload
        w = [w for w in self.workloads() if w["name"] == "counter"][0]
        self.assertEqual(w["pid"], new_pid)
        self.assertEqual(w["restored_from"], snap)
        self.assertEqual(w["cmdline"], tree_before["cmdline"])
        # The whole tree came back: the child, and the idle pair.
        children = open(f"/proc/{new_pid}/task/{new_pid}/children").read().split()
        self.assertEqual(len(children), 2)

    def test_huge_pages_are_always_while_criu_restores_and_the_hosts_mode_comes_back(self):
        thp = os.path.join(self.tmp, "thp-enabled")  # stands for /sys/kernel/mm/transparent_hugepage/enabled
        with open(thp, "w") as f:
            f.write("always [madvise] never\n")
        env = dict(self.env, GPUSNAP_THP_FILE=thp)
        pid = self.run_counter("hp")
        snap = self.checkpoint("hp")
        self.assertTrue(self.wait_gone(pid))
        proc, resume = self.paused(["restore", snap, "--huge-pages"], "huge-pages", env=env)
        with open(thp) as f:
            self.assertEqual(f.read().strip(), "always")
        open(resume, "w").close()
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, err)
        with open(thp) as f:
            self.assertEqual(f.read().strip(), "madvise")
        new = int(out.strip().splitlines()[-1])
        self.wait_count(new, self.count(new) + 3)

    def test_leave_running_keeps_both_counting(self):
        pid = self.run_counter("both")
        snap = self.checkpoint("both", "--leave-running")
        self.assertTrue(self.alive(pid))
        c = self.count(pid)
        new_pid = self.restore(snap, "--name", "both-copy")
        self.assertNotEqual(new_pid, pid)
        self.wait_count(pid, c + 10)
        self.wait_count(new_pid, self.count(new_pid) + 10)
        self.assertTrue(self.alive(pid) and self.alive(new_pid))
        self.assert_no_fail_in_logs()

    def test_checkpoint_by_pid(self):
        pid = self.run_counter("bypid")
        snap = self.checkpoint(str(pid))
        meta = self.gs_json("ls")[0]
        self.assertEqual(meta["id"], snap)
        self.assertEqual(meta["source"], "bypid")  # the pid was recognised as the workload
        new_pid = self.restore(snap)
        self.wait_count(new_pid, self.count(new_pid) + 5)

    def test_process_not_started_by_gpusnap(self):
        """A plain host process, named by its pid: dumped from the host's
        namespace, restored into a fresh one."""
        src = subprocess.Popen([os.path.join(WORKLOADS, "counter"), self.data], start_new_session=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(src.wait)
        self.wait_count(src.pid, 5)
        snap = self.checkpoint(str(src.pid))
        src.wait(timeout=10)  # CRIU ended the source after the dump
        stopped_at = self.gs_json("inspect", snap)["source"]
        self.assertEqual(stopped_at["kind"], "pid")
        new_pid = self.restore(snap)
        first = self.count(new_pid)
        self.assertGreaterEqual(first, 5)
        self.wait_count(new_pid, first + 10)
        self.assertEqual([w["name"] for w in self.workloads() if w["running"]], [f"restored-{src.pid}"])

    def test_ten_cycles(self):
        pid = self.run_counter("cycles")
        last = self.count(pid)
        for i in range(10):
            snap = self.checkpoint("cycles")
            self.assertTrue(self.wait_gone(pid))
            pid = self.restore(snap)
            now = self.count(pid)
            self.assertGreaterEqual(now, last, f"cycle {i}: count went back")
            last = self.wait_count(pid, now + 3)
            self.gs("rm", snap)
        self.assert_no_fail_in_logs()
        self.assertEqual(self.snapshots(), [])

    def test_established_tcp_connection_survives(self):
        port = free_port()
        pid = self.run_counter("tcp", port)
        conn = socket.create_connection(("127.0.0.1", port), timeout=5)
        first = ask(port, conn)
        snap = self.checkpoint("tcp", "--tcp-established")
        self.assertTrue(self.wait_gone(pid))
        new_pid = self.restore(snap)
        self.wait_count(new_pid, self.count(new_pid) + 3)
        # The very same connection answers again, with a count that went on.
        self.assertGreater(ask(port, conn), first)
        conn.close()

    def test_json_output(self):
        self.run_counter("js")
        meta = self.gs_json("checkpoint", "js")
        self.assertIn("id", meta)
        self.assertGreater(meta["total_bytes"], 0)
        self.assertIn("dump", meta["timings_s"])
        restored = self.gs_json("restore", meta["id"])
        self.assertTrue(restored["running"])
        self.assertIn("criu-restore", restored["timings_s"])
        inspected = self.gs_json("inspect", meta["id"])
        self.assertEqual(inspected["id"], meta["id"])
        self.assertIn("checkpoint/pstree.img", inspected["files"])


if __name__ == "__main__":
    unittest.main()
