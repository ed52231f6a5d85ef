"""The CRIU bundle: found, versioned, and leaking nothing into what CRIU runs;
and its checkpointctl reads gpusnap snapshots."""
import json
import os
import subprocess
import tarfile
import unittest

from harness import GpusnapCase

BUNDLE = os.environ.get("GPUSNAP_CRIU", os.path.join(os.path.dirname(__file__), "../../build/criu-bundle"))


class Bundle(GpusnapCase):
    def test_version_names_the_bundle_and_its_criu(self):
        v = self.gs_json("version")
        self.assertEqual(os.path.realpath(v["criu"]["bundle"]), os.path.realpath(BUNDLE))
        with open(os.path.join(BUNDLE, "VERSION")) as f:
            self.assertEqual(v["criu"]["version"], f.read().strip())
        major = int(v["criu"]["runtime_version"].split(".")[0])
        self.assertGreaterEqual(major, 4)  # Debian 12's 3.17 does not work here
        self.assertIn("network_lock_nftables", v["criu"]["features"])

    def test_a_wrong_bundle_path_is_an_error(self):
        env = dict(self.env, GPUSNAP_CRIU=os.path.join(self.tmp, "nothing"))
        p = self.gs("version", env=env, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("is not a CRIU bundle", p.stdout + p.stderr)

    def test_nothing_criu_runs_inherits_bundle_libraries(self):
        """A helper CRIU execs during dump and restore records its environment
        and the libc it loaded: the host's, with no bundle path anywhere."""
        record = os.path.join(self.tmp, "helper.out")
        helper = os.path.join(self.tmp, "helper.sh")
        with open(helper, "w") as f:
            f.write("#!/bin/sh\n"
                    f"{{ echo \"action=$CRTOOLS_SCRIPT_ACTION\"; env; echo MAPS; cat /proc/self/maps; }} >> {record}\n")
        os.chmod(helper, 0o755)
        config = os.path.join(self.tmp, "criu.conf")
        with open(config, "w") as f:
            f.write(f"action-script {helper}\n")
        self.run_counter("leak")
        snap = self.checkpoint("leak", "--criu-config", config)
        pid = self.restore(snap, "--criu-config", config)
        self.wait_count(pid, self.count(pid) + 3)
        with open(record) as f:
            text = f.read()
        runs = text.split("action=")[1:]
        actions = [r.splitlines()[0] for r in runs]
        self.assertIn("post-dump", actions)
        self.assertIn("post-restore", actions)
        bundle = os.path.realpath(BUNDLE)
        for run in runs:
            env, maps = run.split("MAPS", 1)
            libc = [l.split()[-1] for l in maps.splitlines() if "libc.so" in l]
            self.assertTrue(libc, "the helper loaded no libc?")
            for path in libc:
                self.assertFalse(os.path.realpath(path).startswith(bundle), f"helper loaded the bundle's libc: {path}")
            for line in env.splitlines():
                if line.startswith("LD_"):
                    self.assertNotIn(bundle, line)
                    self.assertNotIn("criu-bundle", line)

    def test_checkpointctl_reads_a_snapshot(self):
        self.run_counter("ctl")
        snap = self.checkpoint("ctl", "--leave-running")
        archive = os.path.join(self.tmp, "snap.tar")
        with tarfile.open(archive, "w") as t:
            d = os.path.join(self.store, "snapshots", snap)
            for name in os.listdir(d):
                t.add(os.path.join(d, name), arcname=name)
        ctl = [os.path.join(BUNDLE, "lib", "ld-linux-x86-64.so.2"), os.path.join(BUNDLE, "bin", "checkpointctl")]
        show = subprocess.run(ctl + ["show", archive], capture_output=True, text=True)
        self.assertEqual(show.returncode, 0, show.stderr)
        self.assertIn("ctl", show.stdout)
        self.assertIn("gpusnap", show.stdout)
        inspect = subprocess.run(ctl + ["inspect", archive, "--format", "json"], capture_output=True, text=True)
        self.assertEqual(inspect.returncode, 0, inspect.stderr)
        info = json.loads(inspect.stdout)
        self.assertEqual(info[0]["container_id"] if "container_id" in info[0] else info[0].get("id"), snap)


if __name__ == "__main__":
    unittest.main()
