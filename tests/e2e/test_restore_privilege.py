"""A restore into a placeholder container never gives the restored tree more
privilege than the placeholder's init holds (docs/SECURITY.md, "A restore
never gains privilege"), and placeholders as hardened as Kubernetes'
`restricted` profile (every capability dropped, another uid, no_new_privs, a
seccomp profile) take the snapshots that fit them.

Each test checkpoints a counter from a real runc container given the
credentials it names and restores it with the real CRIU into a real runc
container running `gpusnap __placeholder` with the credentials it names."""
import os
import re
import time
import unittest

from test_restore_into_container import PlaceholderCase

CAP_SYS_ADMIN = 21
CAP_SYS_RESOURCE = 24
SETS = ("bounding", "effective", "permitted", "inheritable", "ambient")


def caps(*names):
    """An OCI process's capabilities: `names` in the bounding, effective and
    permitted sets (as a runtime gives a pod's added capabilities)."""
    return {"capabilities": {s: list(names) if s in ("bounding", "effective", "permitted") else [] for s in SETS}}


NO_CAPS = {"capabilities": {s: [] for s in SETS}}
UID_1000 = {"user": {"uid": 1000, "gid": 1000}}
# A seccomp profile as a runtime's default is one: everything allowed but a few calls.
SECCOMP = {"defaultAction": "SCMP_ACT_ALLOW",
           "syscalls": [{"names": ["keyctl", "add_key", "request_key"], "action": "SCMP_ACT_ERRNO"}]}


def status(pid):
    """/proc/PID/status as a dict of its lines."""
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def holds(pid, cap):
    return bool(int(status(pid)["CapEff"], 16) >> cap & 1)


class RestorePrivilege(PlaceholderCase):
    def restore_into(self, snapshot, placeholder, env=None):
        return self.gs("restore", snapshot, "--into-container", placeholder, check=False, env=env)

    def assert_refused_before_criu(self, p, snapshot, placeholder, init):
        """The restore `p` refused naming the snapshot and the placeholder,
        CRIU never ran, the placeholder is idle and the snapshot whole."""
        self.assertEqual(p.returncode, 1, p.stdout)
        errors = [line for line in p.stderr.splitlines() if line.startswith("gpusnap: error:")]
        self.assertEqual(len(errors), 1, p.stderr)
        self.assertTrue(errors[0].startswith(
            f"gpusnap: error: snapshot `{snapshot}` needs more privilege than placeholder container `{placeholder}` "
            "holds: "), p.stderr)
        self.assertTrue(p.stderr.rstrip().endswith(errors[0]), p.stderr)  # nothing after: no CRIU lines
        logs = os.path.join(self.run_dir, "logs")
        self.assertEqual([n for n in os.listdir(logs) if n.startswith(f"restore-{snapshot}-")]
                         if os.path.isdir(logs) else [], [])
        self.assertEqual(self.children(init), [])
        self.assertEqual(self.container_init(placeholder)[1], "running")
        self.gs("inspect", "--verify", snapshot)
        self.assertEqual([w for w in self.workloads() if w["running"]], [])

    def restore_and_count(self, snapshot, placeholder, init):
        p = self.restore_into(snapshot, placeholder)
        self.assertEqual(p.returncode, 0, f"{p.stderr}\n{self.logs()}")
        new_pid = int(p.stdout.strip().splitlines()[-1])
        self.assert_restored_into(new_pid, init)
        self.wait_count(new_pid, self.count(new_pid) + 5)
        return new_pid

    def test_a_privileged_snapshot_is_refused_by_an_unprivileged_placeholder(self):
        agent = self.start_agent()
        placeholder, init = self.start_placeholder(process=dict(UID_1000, **NO_CAPS))
        self.assertEqual(status(init)["CapEff"], "0000000000000000")
        # Root with CAP_SYS_ADMIN (the harness's default container).
        snapshot, _ = self.checkpoint_counter(agent)
        p = self.restore_into(snapshot, placeholder)
        self.assert_refused_before_criu(p, snapshot, placeholder, init)
        self.assertRegex(p.stderr, r"pid \d+ \(cnt:\d+\), .* in the snapshot: each runs as uid 0 \(the "
                                   r"placeholder's init: uid 1000, without CAP_SETUID\)")
        self.assertIn("runs as gid 0", p.stderr)
        self.assertIn("holds CAP_KILL, CAP_SYS_ADMIN in its permitted, effective and bounding sets, which the "
                      "placeholder's init does not", p.stderr)

        # The agent's restore into it is the same Restore, refused alike.
        status_code, reply = agent.request("POST", "/v1/restores",
                                           {"snapshot": snapshot, "name": "by-agent",
                                            "target": {"container": placeholder}})
        self.assertEqual(status_code, 202, reply)
        job = self.wait_job(agent, reply["job"])
        self.assertEqual(job["state"], "failed", job)
        self.assertIn("needs more privilege than placeholder container", job["error"])
        self.assertIn("CAP_SYS_ADMIN", job["error"])
        self.assertEqual(self.children(init), [])

        # Root with a lesser capability: refused for its uid and that capability.
        snapshot, _ = self.checkpoint_counter(agent, process=caps("CAP_KILL"))
        p = self.restore_into(snapshot, placeholder)
        self.assert_refused_before_criu(p, snapshot, placeholder, init)
        self.assertIn("runs as uid 0", p.stderr)
        self.assertIn("holds CAP_KILL in its permitted, effective and bounding sets", p.stderr)
        self.assertNotIn("CAP_SYS_ADMIN", p.stderr)

    def test_a_root_placeholder_without_cap_sys_admin_refuses_a_snapshot_holding_it(self):
        # Same uid, fewer capabilities: without the check, CRIU restored the
        # tree holding CAP_SYS_ADMIN into this placeholder.
        agent = self.start_agent()
        placeholder, init = self.start_placeholder(process=caps("CAP_KILL", "CAP_CHECKPOINT_RESTORE"))
        snapshot, _ = self.checkpoint_counter(agent)
        p = self.restore_into(snapshot, placeholder)
        if p.returncode == 0:
            new_pid = int(p.stdout.strip().splitlines()[-1])
            self.fail(f"restored into a placeholder without CAP_SYS_ADMIN; pid {new_pid} holds it: "
                      f"{holds(new_pid, CAP_SYS_ADMIN)} (CapEff {status(new_pid)['CapEff']})")
        self.assert_refused_before_criu(p, snapshot, placeholder, init)
        self.assertIn("holds CAP_SYS_ADMIN in its permitted, effective and bounding sets", p.stderr)
        self.assertNotIn("runs as uid", p.stderr)

    def test_a_placeholder_as_privileged_as_the_snapshot_takes_it(self):
        agent = self.start_agent()
        placeholder, init = self.start_placeholder()
        snapshot, _ = self.checkpoint_counter(agent)
        new_pid = self.restore_and_count(snapshot, placeholder, init)
        self.assertTrue(holds(new_pid, CAP_SYS_ADMIN))
        self.assertEqual(status(new_pid)["CapEff"], status(init)["CapEff"])
        self.assert_no_fail_in_logs()

    def test_a_tree_without_capabilities_restores_into_a_placeholder_without_any(self):
        # The restricted profile's shape at uid 0: every capability dropped,
        # the placeholder's init unable to set where its namespace's pids start.
        agent = self.start_agent()
        placeholder, init = self.start_placeholder(process=NO_CAPS)
        snapshot, _ = self.checkpoint_counter(agent, process=NO_CAPS)
        new_pid = self.restore_and_count(snapshot, placeholder, init)
        self.assertEqual(status(new_pid)["CapEff"], "0000000000000000")
        self.assertEqual(status(new_pid)["CapBnd"], "0000000000000000")
        self.assertEqual(status(new_pid)["NoNewPrivs"], "1")
        self.assert_no_fail_in_logs()

    def test_a_uid_1000_tree_restores_into_a_uid_1000_placeholder(self):
        effective = int(status(os.getpid())["CapEff"], 16)
        if not effective >> CAP_SYS_RESOURCE & 1:
            self.skipTest("this machine's root lacks CAP_SYS_RESOURCE, which CRIU needs to dump a tree of "
                          "another uid (`Can't get rlimit 0: Operation not permitted`)")
        # uid 1000 reaches the counter's files.
        os.chmod(self.tmp, 0o755)
        os.chmod(self.data, 0o777)
        agent = self.start_agent()
        placeholder, init = self.start_placeholder(process=dict(UID_1000, **NO_CAPS))
        snapshot, _ = self.checkpoint_counter(agent, process=dict(UID_1000, **NO_CAPS))
        new_pid = self.restore_and_count(snapshot, placeholder, init)
        self.assertEqual(status(new_pid)["Uid"].split(), ["1000"] * 4)
        self.assertEqual(status(new_pid)["CapEff"], "0000000000000000")

    def test_no_new_privs_and_seccomp_of_the_placeholder_bind_the_snapshot(self):
        agent = self.start_agent()
        placeholder, init = self.start_placeholder(seccomp=SECCOMP)
        self.assertEqual(status(init)["Seccomp"], "2")
        self.assertEqual(status(init)["NoNewPrivs"], "1")

        # Without them: refused, naming both.
        snapshot, _ = self.checkpoint_counter(agent, process={"noNewPrivileges": False})
        p = self.restore_into(snapshot, placeholder)
        self.assert_refused_before_criu(p, snapshot, placeholder, init)
        self.assertIn("runs without no_new_privs, which the placeholder's init has", p.stderr)
        self.assertIn("runs without seccomp, whose filters bind the placeholder's init", p.stderr)
        self.assertNotIn("CAP_", p.stderr)

        # Another filter than the placeholder's: refused.
        other = dict(SECCOMP, syscalls=[{"names": ["keyctl"], "action": "SCMP_ACT_ERRNO"}])
        snapshot, _ = self.checkpoint_counter(agent, seccomp=other)
        p = self.restore_into(snapshot, placeholder)
        self.assert_refused_before_criu(p, snapshot, placeholder, init)
        self.assertIn("is not bound by 1 of the 1 seccomp filter(s) that bind the placeholder's init", p.stderr)

        # With them: restored, bound by the same filter; by the agent, whose
        # worker thread reads the filters by ptrace.
        snapshot, _ = self.checkpoint_counter(agent, seccomp=SECCOMP)
        status_code, reply = agent.request("POST", "/v1/restores",
                                           {"snapshot": snapshot, "target": {"container": placeholder}})
        self.assertEqual(status_code, 202, reply)
        job = self.wait_job(agent, reply["job"])
        self.assertEqual(job["state"], "succeeded", f"{job}\n{self.criu_log(job)}\n{agent.log()}")
        new_pid = job["restoredPid"]
        self.assert_restored_into(new_pid, init)
        self.wait_count(new_pid, self.count(new_pid) + 5)
        self.assertEqual(status(new_pid)["Seccomp"], "2")
        self.assertEqual(status(new_pid)["NoNewPrivs"], "1")
        self.assert_no_fail_in_logs()

    def test_the_check_after_criu_ends_a_tree_that_holds_more(self):
        # The check before CRIU skipped (a test hook): CRIU restores a root
        # tree holding CAP_SYS_ADMIN into an unprivileged placeholder, and the
        # check of the restored tasks, before any runs, ends it by the undo.
        agent = self.start_agent()
        placeholder, init = self.start_placeholder(process=dict(UID_1000, **NO_CAPS))
        snapshot, _ = self.checkpoint_counter(agent)
        p = self.restore_into(snapshot, placeholder, env=dict(self.env, GPUSNAP_TEST_SKIP_AT="check-privilege"))
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn(f"restore of `{snapshot}` failed: the tree CRIU restored holds more privilege than "
                      f"placeholder container `{placeholder}`", p.stderr)
        restored = re.search(r"pid (\d+) \(cnt:\d+\), .* as restored: each runs as uid 0", p.stderr)
        self.assertTrue(restored, p.stderr)
        self.assertIn("CAP_SYS_ADMIN", p.stderr)
        logs = os.path.join(self.run_dir, "logs")
        self.assertTrue([n for n in os.listdir(logs) if n.startswith(f"restore-{snapshot}-")])  # CRIU ran
        self.assertTrue(self.wait_gone(int(restored.group(1))))
        self.assertTrue(self.wait_idle(init), self.children(init))
        self.assertEqual([w for w in self.workloads() if w["running"]], [])
        self.gs("inspect", "--verify", snapshot)

        # The seccomp filters of the restored threads, read by ptrace while
        # CRIU holds them stopped, against a filtered placeholder's.
        filtered, filtered_init = self.start_placeholder(seccomp=SECCOMP)
        other = dict(SECCOMP, syscalls=[{"names": ["keyctl"], "action": "SCMP_ACT_ERRNO"}])
        snapshot, _ = self.checkpoint_counter(agent, seccomp=other)
        p = self.restore_into(snapshot, filtered, env=dict(self.env, GPUSNAP_TEST_SKIP_AT="check-privilege"))
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn("the tree CRIU restored holds more privilege than placeholder container", p.stderr)
        self.assertIn("as restored: each is not bound by 1 of the 1 seccomp filter(s) that bind the placeholder's "
                      "init", p.stderr)
        self.assertTrue(self.wait_idle(filtered_init), self.children(filtered_init))

    def wait_idle(self, init, timeout=10):
        end = time.time() + timeout
        while time.time() < end:
            if not self.children(init):
                return True
            time.sleep(0.05)
        return False


if __name__ == "__main__":
    unittest.main()
