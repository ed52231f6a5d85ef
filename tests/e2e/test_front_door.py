"""One front door per operation (issue 21): values parsed where they enter and
refused before any disk or network work, the same rules through the CLI and
the agent, a CLI that names its job when the agent dies under it, and a
container's init held during an in-process checkpoint as through the agent."""
import os
import socket
import subprocess
import time
import unittest

import test_agent as base
import test_agent_runc as runc
from harness import GPUSNAP


class EdgesOfTheCli(base.AgentCase):
    def test_an_empty_or_malformed_name_is_a_usage_error_with_the_whole_rule(self):
        self.run_counter("src")
        snap = self.checkpoint("src", "--leave-running")
        for name in ("", "-x", ".hidden", "a/b"):
            p = self.gs("restore", snap, "--standby", "--name", name, check=False)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
            self.assertIn(f"invalid workload name `{name}`", p.stderr)
            self.assertIn("not starting with '.' or '-'", p.stderr)
        p = self.gs("run", "--name", ".hidden", "--", "/bin/true", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("not starting with '.' or '-'", p.stderr)
        # Nothing was started under any of them.
        self.assertEqual(sorted(w["name"] for w in self.workloads() if w["running"]), ["src"])

    def test_no_snapshot_in_a_store_that_does_not_exist_yet(self):
        env = dict(self.env, GPUSNAP_STORE=os.path.join(self.tmp, "never-made"))
        p = self.gs("restore", "does-not-exist", env=env, check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("no snapshot `does-not-exist`", p.stderr)
        self.assertNotIn("No such file or directory", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "never-made")))

    def test_option_combinations_are_refused_before_the_network(self):
        # A registry that would hang: a listener that never answers. Refusals
        # must come before any connection to it.
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(8)
            ref = f"127.0.0.1:{silent.getsockname()[1]}/team/app:v1"
            for extra, needle in (
                    (["--standby", "--into-container", "0123456789ab"], "--standby restores into a fresh namespace only"),
                    (["--standby", "--gpus", "0"], "a standby's GPUs are chosen when it is woken")):
                started = time.monotonic()
                p = self.gs("restore", ref, "--plain-http", "--registry-timeout", "30", *extra, check=False,
                            timeout=60)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn(needle, p.stderr)
                self.assertLess(time.monotonic() - started, 20, "the refusal waited for the registry")
            # Nothing connected to the registry.
            silent.setblocking(False)
            with self.assertRaises(BlockingIOError):
                silent.accept()
        # A malformed GPU map is refused where it enters, naming the entry.
        p = self.gs("restore", ref, "--gpu-map", "0:1", check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--gpu-map entry `0:1`", p.stderr)


class AgentDiesUnderTheCli(base.AgentCase):
    def test_the_cli_names_the_job_to_look_up(self):
        self.run_counter("src")
        agent = self.start_agent(env=dict(self.env, GPUSNAP_TEST_PAUSE_AT="dump"))
        env = dict(self.env, GPUSNAP_AGENT_SOCKET=agent.socket)
        cli = subprocess.Popen([GPUSNAP, "checkpoint", "src"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        agent.wait_line("paused at dump")
        status, jobs = agent.request("GET", "/v1/jobs")
        self.assertEqual(status, 200)
        [job] = [j["id"] for j in jobs if j["state"] == "running"]
        agent.kill()
        _, err = cli.communicate(timeout=60)
        self.assertEqual(cli.returncode, 1, err)
        self.assertIn(f"following job {job}", err)
        self.assertIn(f"GET /v1/jobs/{job}", err)
        # A restarted agent tells what became of it, and the tree runs on.
        agent = self.start_agent()
        status, record = agent.request("GET", f"/v1/jobs/{job}")
        self.assertEqual((status, record["state"]), (200, "failed"), record)
        pid = [w["pid"] for w in self.workloads() if w["name"] == "src"][0]
        self.wait_count(pid, self.count(pid) + 3)


class ContainerInitHeldInProcess(runc.RuncCase):
    def test_an_in_process_checkpoint_of_a_container_holds_its_init(self):
        # The container's init is a shell that exits with its last child: the
        # dump must not lose its namespace (and CRIU in it) before it answers.
        cid = self.start_container(self.counter_args())
        pid = self.counter_in(cid)
        init, _ = self.container_init(cid)
        before = self.count(pid)
        proc, resume = self.paused(["checkpoint", str(pid), "--no-agent"], "post-dump")
        with open(f"/proc/{init}/stat") as f:
            self.assertEqual(f.read().rsplit(")", 1)[1].split()[0], "T", "the init runs while CRIU dumps")
        open(resume, "w").close()
        out, err = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 0, err)
        snap = out.strip().splitlines()[-1]
        self.assertTrue(self.wait_gone(pid))
        self.assertTrue(self.wait_gone(init))  # let go after the dump: it had nothing left to wait for
        # Into a fresh namespace here, as the agent restores: the container's cgroups went with it.
        config = os.path.join(self.tmp, "criu-restore.conf")
        with open(config, "w") as f:
            f.write("manage-cgroups=ignore\n")
        restored = self.restore(snap, "--name", "from-runc", "--no-agent", "--criu-config", config)
        self.assertGreaterEqual(self.count(restored), before)
        self.wait_count(restored, self.count(restored) + 5)


if __name__ == "__main__":
    unittest.main()
