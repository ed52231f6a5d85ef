"""`gpusnap` with a node agent running: checkpoint, restore, ls, inspect and rm
go through the agent found on $GPUSNAP_AGENT_SOCKET without --agent; a stale
socket, --no-agent, another store and in-process-only flags keep them in this
process; a socket we may not open is refused. The progress bar on a terminal
(a real pseudo-terminal), plain lines without one."""
import fcntl
import json
import os
import pty
import re
import select
import socket
import struct
import subprocess
import termios
import threading
import time
import tty
import unittest

import test_agent as base
from harness import GPUSNAP


class AgentCliCase(base.AgentCase):
    agent_args = ()

    def setUp(self):
        super().setUp()
        self.agent = self.start_agent(*self.agent_args)
        self.env["GPUSNAP_AGENT_SOCKET"] = self.agent.socket
        # Without $GPUSNAP_STORE the CLI names no store of its own; through the
        # agent it then acts on the agent's (self.store), in-process on the
        # default /var/lib/gpusnap, which holds none of this test's snapshots.
        self.bare_env = {k: v for k, v in self.env.items() if k != "GPUSNAP_STORE"}

    def jobs(self):
        status, jobs = self.agent.request("GET", "/v1/jobs")
        self.assertEqual(status, 200, jobs)
        return jobs

    def notes(self, stderr):
        return [line for line in stderr.splitlines() if line.startswith("gpusnap: note: ")]

    def in_store(self, store, snapshot_id):
        return os.path.isfile(os.path.join(store, "snapshots", snapshot_id, "gpusnap.json"))


class ThroughTheAgent(AgentCliCase):
    def test_checkpoint_and_restore_without_the_agent_flag(self):
        pid = self.run_counter("auto")
        p = self.gs("checkpoint", "auto", "--id", "auto-1")
        self.assertEqual(p.stdout.strip().splitlines()[-1], "auto-1")
        self.assertEqual(self.notes(p.stderr), [])
        self.assertIn("[checkpoint] dump done", p.stderr)
        self.assertTrue(self.wait_gone(pid))
        [job] = self.jobs()
        self.assertEqual((job["kind"], job["state"], job["snapshot"]), ("checkpoint", "succeeded", "auto-1"))

        restored = self.restore("auto-1", "--name", "back")
        restore_job = self.jobs()[0]
        self.assertEqual((restore_job["kind"], restore_job["state"]), ("restore", "succeeded"))
        self.assertEqual(restore_job["restoredPid"], restored)
        self.wait_count(restored, self.count(restored) + 5)
        self.assertEqual([w["pid"] for w in self.workloads() if w["name"] == "back"], [restored])

        # --json: the in-process shapes, with the job's id.
        snap = self.gs_json("checkpoint", "back", "--id", "auto-2", "--leave-running")
        self.assertEqual(snap["id"], "auto-2")
        self.assertEqual(snap["job"], self.jobs()[0]["id"])
        self.assertGreater(snap["total_bytes"], 0)
        self.assertIn("total", snap["timings_s"])
        self.assertTrue(self.alive(restored))
        again = self.gs_json("restore", "auto-2", "--name", "again")
        self.assertEqual(again["job"], self.jobs()[0]["id"])
        self.assertEqual((again["name"], again["restored_from"]), ("again", "auto-2"))
        self.wait_count(again["pid"], self.count(again["pid"]) + 3)
        self.assertEqual(len(self.jobs()), 4)

    def test_ls_inspect_rm_act_on_the_agents_store(self):
        self.run_counter("listed")
        self.gs("checkpoint", "listed", "--id", "listed-1", "--leave-running")
        ids = [s["id"] for s in self.gs_json("ls", env=self.bare_env)]
        self.assertEqual(ids, ["listed-1"])
        table = self.gs("ls", env=self.bare_env).stdout
        self.assertIn("listed-1", table)
        self.assertIn("listed", table.splitlines()[1])
        meta = json.loads(self.gs("inspect", "listed-1", env=self.bare_env).stdout)
        self.assertEqual(meta["id"], "listed-1")
        self.assertEqual(self.gs("rm", "listed-1", env=self.bare_env).stdout.strip(), "listed-1")
        self.assertFalse(self.in_store(self.store, "listed-1"))
        p = self.gs("inspect", "listed-1", env=self.bare_env, check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("the agent refused (HTTP 404)", p.stderr)


    def test_sixty_commands_at_once_are_all_answered_by_the_agent(self):
        # A busy agent is no missing agent: every command is answered from the
        # agent's store (the default store, where a fallback would look, holds
        # no "busy-1"), none falls back, none fails.
        self.run_counter("busy")
        self.gs("checkpoint", "busy", "--id", "busy-1", "--leave-running")
        commands = [["--json", "ls"], ["inspect", "busy-1"], ["ls"]]
        procs = [subprocess.Popen([GPUSNAP, *commands[i % len(commands)]], env=self.bare_env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(60)]
        for i, proc in enumerate(procs):
            out, err = proc.communicate(timeout=120)
            with self.subTest(command=commands[i % len(commands)], i=i):
                self.assertEqual((proc.returncode, err), (0, ""), out)
                if i % len(commands) == 0:
                    self.assertEqual([s["id"] for s in json.loads(out)], ["busy-1"])
                elif i % len(commands) == 1:
                    self.assertEqual(json.loads(out)["id"], "busy-1")
                else:
                    self.assertIn("busy-1", out)
        self.assertEqual([j["snapshot"] for j in self.jobs()], ["busy-1"])


class BusyAgent(AgentCliCase):
    # One connection at a time, each allowed 12 s to send its request: a
    # client that holds it makes the agent busy for everyone else.
    agent_args = ("--threads", "1", "--max-connections", "1", "--io-timeout", "12")

    def health_status(self):
        """The status line of the agent's answer to GET /healthz; it may
        answer (503) and close before the request is all written."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(self.agent.socket)
            try:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
            except OSError:
                pass
            return s.recv(4096).split(b"\r\n")[0].decode()

    def hold_the_agent(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.agent.socket)
        s.sendall(b"GET /healthz HTTP/1.1\r\n")  # and never the rest
        deadline = time.time() + 30
        while self.health_status() != "HTTP/1.1 503 Service Unavailable":  # it holds the only slot now
            self.assertLess(time.time(), deadline, "the agent never got busy")
            time.sleep(0.05)
        return s

    def test_a_busy_agent_is_waited_for_then_answers(self):
        self.run_counter("wait")
        self.gs("checkpoint", "wait", "--id", "wait-1", "--leave-running")
        held = self.hold_the_agent()
        threading.Timer(1.0, held.close).start()  # it lets go within the CLI's wait
        p = self.gs("--json", "ls", env=self.bare_env)
        self.assertEqual(self.notes(p.stderr), [])
        self.assertEqual([s["id"] for s in json.loads(p.stdout)], ["wait-1"])

    def test_an_agent_busy_past_the_wait_is_an_error_not_a_fallback(self):
        held = self.hold_the_agent()
        try:
            p = self.gs("--json", "ls", env=self.bare_env, check=False)
        finally:
            held.close()
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertEqual(self.notes(p.stderr), [])
        failure = json.loads(p.stdout)  # no listing of another store: the error
        self.assertEqual(failure["code"], "Timeout")
        # The last try read the agent's 503, or was closed on while it wrote.
        self.assertRegex(failure["error"],
                         rf"^the agent on `{re.escape(self.agent.socket)}` is busy \(no answer within 10 s; last: "
                         r"(it answered HTTP 503: the agent's unix listener is full \(--max-connections 1\): retry "
                         r"later|it closed the connection before the request was written)\): try again, or pass "
                         r"--no-agent to work in-process$")


class InProcess(AgentCliCase):
    def test_stale_socket_falls_back_with_one_note(self):
        pid = self.run_counter("stale")
        self.agent.kill()  # SIGKILL: its socket file stays, with nothing listening
        self.assertTrue(os.path.exists(self.agent.socket))
        p = self.gs("checkpoint", "stale", "--id", "stale-1")
        self.assertEqual(self.notes(p.stderr),
                         [f"gpusnap: note: no agent answers on `{self.agent.socket}` (nothing listens on it); "
                          "working in-process"])
        self.assertTrue(self.in_store(self.store, "stale-1"))
        self.assertTrue(self.wait_gone(pid))
        restored = self.restore("stale-1")
        self.wait_count(restored, self.count(restored) + 3)
        # No socket file at all: not a word.
        os.unlink(self.agent.socket)
        p = self.gs("ls")
        self.assertEqual(self.notes(p.stderr), [])
        self.assertIn("stale-1", p.stdout)

    def test_no_agent_flag(self):
        pid = self.run_counter("mine")
        p = self.gs("checkpoint", "mine", "--id", "mine-1", "--no-agent", "--leave-running")
        self.assertEqual(self.notes(p.stderr), [])
        self.assertTrue(self.in_store(self.store, "mine-1"))
        self.assertEqual(self.jobs(), [])
        restored = self.restore("mine-1", "--name", "mine-copy", "--no-agent")
        self.wait_count(restored, self.count(restored) + 3)
        self.assertEqual(self.jobs(), [])
        self.assertTrue(self.alive(pid))
        # Without $GPUSNAP_STORE, --no-agent reads the default store, not the agent's.
        ids = [s["id"] for s in self.gs_json("ls", "--no-agent", env=self.bare_env)]
        self.assertNotIn("mine-1", ids)
        p = self.gs("checkpoint", "mine", "--agent", self.agent.socket, "--no-agent", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("excludes", p.stderr)

    def test_another_store_is_never_swapped_for_the_agents(self):
        other = os.path.join(self.tmp, "other-store")
        self.run_counter("split")
        p = self.gs("checkpoint", "split", "--id", "split-1", "--leave-running", "--store", other)
        self.assertEqual(self.notes(p.stderr),
                         [f"gpusnap: note: the agent at `{self.agent.socket}` uses the store `{self.store}`, not "
                          f"`{other}` (--store); working in-process"])
        self.assertTrue(self.in_store(other, "split-1"))
        self.assertFalse(self.in_store(self.store, "split-1"))
        env = dict(self.env, GPUSNAP_STORE=other)
        p = self.gs("checkpoint", "split", "--id", "split-2", "--leave-running", env=env)
        self.assertIn("($GPUSNAP_STORE); working in-process", p.stderr)
        self.assertTrue(self.in_store(other, "split-2"))
        self.assertEqual(self.jobs(), [])
        self.assertEqual(sorted(s["id"] for s in self.gs_json("ls", env=env)), ["split-1", "split-2"])
        # The agent's own store, by another name, is the agent's.
        p = self.gs("checkpoint", "split", "--id", "split-3", "--leave-running", "--store", self.store + "/./")
        self.assertEqual(self.notes(p.stderr), [])
        self.assertEqual([j["snapshot"] for j in self.jobs()], ["split-3"])
        # Asked for the agent by name, another store is refused.
        p = self.gs("checkpoint", "split", "--agent", self.agent.socket, "--store", other, check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(f"--store `{other}` is not the store of the agent", p.stderr)

    def test_in_process_only_flags_use_the_agents_store(self):
        pid = self.run_counter("flags")
        p = self.gs("checkpoint", "flags", "--id", "flags-1", "--leave-running", "--verbose", env=self.bare_env)
        self.assertEqual(self.notes(p.stderr),
                         [f"gpusnap: note: --verbose does not apply through the agent; working in-process on its "
                          f"store `{self.store}`"])
        self.assertTrue(self.in_store(self.store, "flags-1"))
        self.assertEqual(self.jobs(), [])
        p = self.gs("inspect", "--verify", "flags-1", env=self.bare_env)
        self.assertIn("flags-1: all", p.stderr)
        self.assertIn("--verify does not apply through the agent", p.stderr)
        self.assertTrue(self.alive(pid))

    def test_a_socket_we_may_not_open_is_refused(self):
        # A store nobody may look at would fail `ls` for its own reasons: this one does not exist.
        nobody = dict(self.env, GPUSNAP_STORE=f"/gpusnap-e2e-no-store-{os.getpid()}")

        def as_nobody():
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)

        def ls(*extra):
            return subprocess.run([GPUSNAP, "ls", *extra], capture_output=True, text=True, env=nobody,
                                  preexec_fn=as_nobody, timeout=60)

        if ls("--no-agent").returncode != 0:
            self.skipTest("the gpusnap binary cannot be run by nobody here")
        p = ls()
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(f"the agent's socket `{self.agent.socket}` is not accessible (Permission denied)", p.stderr)
        self.assertIn("--no-agent", p.stderr)


def run_on_terminal(args, env, columns=120, timeout=120):
    """Runs gpusnap with stderr on a new pseudo-terminal; returns (exit status,
    stdout, what the terminal received)."""
    master, slave = pty.openpty()
    tty.setraw(slave)  # "\n" arrives as written, not as "\r\n"
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    try:
        proc = subprocess.Popen([GPUSNAP, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=slave, env=dict(env, TERM="xterm"))
    finally:
        os.close(slave)
    received = b""
    end = time.time() + timeout
    try:
        while time.time() < end:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer has closed the terminal
                    break
                if not chunk:
                    break
                received += chunk
            elif proc.poll() is not None:
                break
        stdout = proc.communicate(timeout=max(1, end - time.time()))[0].decode()
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stdout, received.decode(errors="replace")


class Progress(AgentCliCase):
    def assert_bar(self, terminal, operation):
        redraws = terminal.split("\r")
        self.assertGreaterEqual(len(redraws), 3, repr(terminal))
        final = redraws[-1].split("\n")[0]  # the bar's last state; then its newline and the summary
        self.assertIn(f"[{operation}] [", final)
        self.assertIn("100%  done", final)
        self.assertTrue(final.endswith(" s\x1b[K"), repr(final))
        for line in redraws[1:-1]:
            self.assertRegex(line, rf"^\[{operation}\] \[[#-]+\] +\d+%  ", repr(line))

    def test_bar_on_a_terminal_in_process_and_through_the_agent(self):
        self.run_counter("bar")
        code, out, term = run_on_terminal(["checkpoint", "bar", "--id", "bar-1", "--leave-running"], self.env)
        self.assertEqual(code, 0, term)
        self.assertEqual(out.strip().splitlines()[-1], "bar-1")
        self.assert_bar(term, "checkpoint")
        self.assertEqual([j["snapshot"] for j in self.jobs()], ["bar-1"])
        self.assertNotIn("dump done (", term)  # no plain lines on a terminal

        code, out, term = run_on_terminal(["checkpoint", "bar", "--id", "bar-2", "--leave-running", "--no-agent"],
                                          self.env)
        self.assertEqual(code, 0, term)
        self.assert_bar(term, "checkpoint")
        self.assertIn("[checkpoint] bar-2: ", term)

        code, out, term = run_on_terminal(["restore", "bar-1", "--name", "bar-back"], self.env)
        self.assertEqual(code, 0, term)
        self.assert_bar(term, "restore")
        restored = int(out.strip().splitlines()[-1])
        self.wait_count(restored, self.count(restored) + 3)

    def test_failure_ends_the_bar_before_the_error(self):
        code, out, term = run_on_terminal(["restore", "no-such-snapshot"], self.env)
        self.assertEqual(code, 1)
        self.assertNotIn("100%", term)
        bar, error = term.split("\n")[-3:-1] if term.endswith("\n") else term.split("\n")[-2:]
        self.assertIn("failed", bar)
        self.assertTrue(error.startswith("gpusnap: error: "), repr(term))

    def test_plain_lines_json_and_quiet(self):
        self.run_counter("plain")
        for extra in ([], ["--no-agent"]):
            p = self.gs("checkpoint", "plain", "--leave-running", *extra)
            self.assertNotIn("\r", p.stderr)
            self.assertIn("[checkpoint] dump done (", p.stderr)
            self.assertIn("[checkpoint] publish done (", p.stderr)
        code, out, term = run_on_terminal(["--json", "checkpoint", "plain", "--leave-running"], self.env)
        self.assertEqual(code, 0, term)
        self.assertNotIn("\r", term)
        self.assertIn("total_bytes", json.loads(out))
        code, out, term = run_on_terminal(["-q", "checkpoint", "plain", "--leave-running"], self.env)
        self.assertEqual(code, 0, term)
        self.assertEqual(term, "")


if __name__ == "__main__":
    unittest.main()
