"""A snapshot restored into a running placeholder container (the Kubernetes
case): a runc container whose process is `gpusnap __placeholder` holds its pid
namespace; a counter checkpointed from another runc container is restored into
it, by the CLI (--into-container) and by the agent (target {container}). The
restored tree runs in the placeholder's pid namespace and the container's
cgroups. A busy placeholder, and a container whose init is no placeholder, are
refused, and nothing changes."""
import os
import unittest

from harness import GPUSNAP
from test_agent_runc import RuncCase


class PlaceholderCase(RuncCase):
    """Placeholder containers and the snapshots restored into them (no tests of its own)."""

    def start_placeholder(self, process=None, seccomp=None):
        """A placeholder container (its credentials as start_container takes
        them): its id and its init's host pid."""
        # The gpusnap binary is seen inside at its host path, as the CRIU bundle is.
        gpusnap = os.path.realpath(GPUSNAP)
        cid = self.start_container([gpusnap, "__placeholder"], extra_binds=[os.path.dirname(gpusnap)],
                                   process=process, seccomp=seccomp)
        init, status = self.container_init(cid)
        self.assertEqual(status, "running")
        return cid, init

    def checkpoint_counter(self, agent, data=None, process=None, seccomp=None, pod=None):
        """A counter in a runc container (keeping its files in `data`, by
        default the test's data directory; its credentials as start_container
        takes them; the container of `pod`, (namespace, name, container), as
        the kubelet's log link says), checkpointed (and so ended): its
        snapshot id and the count it had reached."""
        source = self.start_container(self.counter_args(data), process=process, seccomp=seccomp, pod=pod)
        pid = self.counter_in(source)
        before = self.count(pid)
        job = self.wait_job(agent, self.checkpoint_via(agent, {"container": source}))
        self.assertEqual(job["state"], "succeeded", f"{job}\n{agent.log()}")
        self.assertTrue(self.wait_gone(pid))
        return job["snapshot"], before

    @staticmethod
    def children(pid):
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]

    @staticmethod
    def ns_inode(pid):
        return os.stat(f"/proc/{pid}/ns/pid").st_ino

    @staticmethod
    def cgroups(pid):
        with open(f"/proc/{pid}/cgroup") as f:
            return f.read()

    def assert_restored_into(self, new_pid, init):
        self.assertEqual(self.ns_inode(new_pid), self.ns_inode(init))
        self.assertNotEqual(self.ns_inode(new_pid), self.ns_inode(os.getpid()))
        self.assertEqual(self.cgroups(new_pid), self.cgroups(init))
        self.assertEqual(self.children(init), [new_pid])


class RestoreIntoContainer(PlaceholderCase):
    def test_cli_restores_into_a_placeholder_and_refuses_a_busy_one(self):
        agent = self.start_agent()
        placeholder, init = self.start_placeholder()
        snapshot, count_before = self.checkpoint_counter(agent)

        new_pid = self.restore(snapshot, "--into-container", placeholder[:12])
        self.assert_restored_into(new_pid, init)
        counted = self.count(new_pid)
        self.assertGreaterEqual(counted, count_before)  # from where it was, not from 0
        self.wait_count(new_pid, counted + 5)

        # Busy now: refused, and the restored tree counts on.
        p = self.gs("restore", snapshot, "--name", "again", "--into-container", placeholder, check=False)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn(f"container {placeholder} is not an idle gpusnap placeholder", p.stderr)
        self.assertIn("already holds", p.stderr)
        self.wait_count(new_pid, self.count(new_pid) + 3)
        self.assertEqual(self.children(init), [new_pid])

        # A container whose init is not a placeholder: refused, left alone.
        other = self.start_container(["/bin/sleep", "1000"])
        p = self.gs("restore", snapshot, "--name", "other", "--into-container", other, check=False)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn(f"container {other} is not an idle gpusnap placeholder", p.stderr)
        self.assertIn("/bin/sleep 1000", p.stderr)
        self.assertEqual(self.container_init(other)[1], "running")

        # An unknown container.
        p = self.gs("restore", snapshot, "--name", "unknown", "--into-container", "ab" * 32, check=False)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn("no running process is in container", p.stderr)
        self.assert_no_fail_in_logs()

    def test_agent_restores_into_a_placeholder_and_refuses_a_busy_one(self):
        agent = self.start_agent()
        placeholder, init = self.start_placeholder()
        snapshot, _ = self.checkpoint_counter(agent)

        status, reply = agent.request("POST", "/v1/restores",
                                      {"snapshot": snapshot, "target": {"container": placeholder}})
        self.assertEqual(status, 202, reply)
        job = self.wait_job(agent, reply["job"])
        self.assertEqual(job["state"], "succeeded", f"{job}\n{self.criu_log(job)}\n{agent.log()}")
        self.assertIn(placeholder, job["target"])
        new_pid = job["restoredPid"]
        self.assert_runs(new_pid)
        self.assert_restored_into(new_pid, init)
        self.wait_count(new_pid, self.count(new_pid) + 5)

        status, reply = agent.request("POST", "/v1/restores",
                                      {"snapshot": snapshot, "name": "again", "target": {"container": placeholder}})
        self.assertEqual(status, 409, reply)
        self.assertIn("is not an idle gpusnap placeholder", reply["error"])
        other = self.start_container(["/bin/sleep", "1000"])
        status, reply = agent.request("POST", "/v1/restores",
                                      {"snapshot": snapshot, "name": "other", "target": {"container": other[:12]}})
        self.assertEqual(status, 409, reply)
        self.assertIn(f"container {other} is not an idle gpusnap placeholder", reply["error"])
        self.assertEqual(len(agent.request("GET", "/v1/jobs")[1]), 2)  # the checkpoint and the one restore
        self.wait_count(new_pid, self.count(new_pid) + 3)

    def test_placeholder_refuses_to_run_outside_a_namespace_of_its_own(self):
        p = self.gs("__placeholder", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("must be pid 1", p.stderr)


if __name__ == "__main__":
    unittest.main()
