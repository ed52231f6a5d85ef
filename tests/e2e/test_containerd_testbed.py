"""The containerd test bed (scripts/containerd-testbed.sh) proven real: a
containerd of its own, an image built offline with buildah and imported with
ctr, and a container on the overlayfs snapshotter whose writable layer is the
upperdir of the overlay at its root, holding what the container wrote and a
whiteout (a 0/0 character device) for what it deleted; its cgroup names the
container. The groundwork of issue 16's rootfs capture.

Skips, saying so, where containerd, buildah or busybox-static is missing."""
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTBED = os.path.join(HERE, "..", "..", "scripts", "containerd-testbed.sh")
MISSING = [t for t in ("containerd", "ctr", "buildah") if shutil.which(t) is None]
if not os.path.exists("/usr/bin/busybox"):
    MISSING.append("busybox-static")


def upper_dir(pid):
    """The upperdir of the overlay mounted at pid's root (mountinfo escapes decoded)."""
    with open(f"/proc/{pid}/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == "/" and " - overlay " in line:
                opts = line.split(" - ", 1)[1].split()[2]
                m = re.search(r"(?:^|,)upperdir=([^,]*)", opts)
                if m:
                    return re.sub(r"\\([0-7]{3})", lambda o: chr(int(o.group(1), 8)), m.group(1))
    return None


@unittest.skipIf(os.geteuid() != 0, "SKIPPED: needs root (containerd)")
@unittest.skipIf(MISSING, f"SKIPPED: not installed: {', '.join(MISSING)} (scripts/setup.sh installs them)")
class ContainerdTestbed(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="gpusnap-ctd-", dir="/var/tmp")
        cls.bed = staticmethod(lambda *a: subprocess.run(["bash", TESTBED, *a], capture_output=True, text=True,
                                                        timeout=300))
        p = cls.bed("start", cls.dir)
        if p.returncode != 0:
            raise AssertionError(f"start failed: {p.stderr}")
        p = cls.bed("image", cls.dir)
        if p.returncode != 0:
            cls.bed("stop", cls.dir)
            raise AssertionError(f"image failed: {p.stderr}")

    @classmethod
    def tearDownClass(cls):
        p = cls.bed("stop", cls.dir)
        assert p.returncode == 0, p.stderr
        assert not os.path.exists(cls.dir)

    def test_a_container_writes_into_its_own_overlay_upper_dir(self):
        p = self.bed("run", self.dir, "writer", "/bin/sh", "-c",
                     "echo made > /tmp/made; rm /bin/wget; mkdir -p /cache/x; echo c > /cache/x/c; sleep 1000000")
        self.assertEqual(p.returncode, 0, p.stderr)
        pid = int(p.stdout.strip())
        up = upper_dir(pid)
        self.assertIsNotNone(up, "no overlay at the container's root")
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(up, "cache", "x", "c")) and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(os.path.join(up, "tmp", "made")) as f:
            self.assertEqual(f.read(), "made\n")
        st = os.lstat(os.path.join(up, "bin", "wget"))
        self.assertTrue(stat.S_ISCHR(st.st_mode) and st.st_rdev == 0, "the deletion is no 0/0 whiteout")
        self.assertFalse(os.path.exists(os.path.join(up, "bin", "sh")), "an untouched image file is in the upper dir")
        with open(f"/proc/{pid}/cgroup") as f:
            self.assertIn("/default/writer", f.read())


if __name__ == "__main__":
    unittest.main()
