"""The image deploy/ names `gpusnap` (scripts/build-image.sh), built offline
with buildah from the portable pack and run under a real containerd
(scripts/containerd-testbed.sh): `gpusnap version` inside prints the bundle's
CRIU from /opt/gpusnap; the agent DaemonSet's own init-container script, read
from deploy/agent-daemonset.yaml, copies a bundle whose bin/gpusnap runs on
the host; the image pushes to a real registry (Debian's docker-registry) and
skopeo reads it back.

Skips, saying so, where containerd, buildah, busybox-static, skopeo or
docker-registry is missing."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import yaml

from registry import Registry

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
TESTBED = os.path.join(REPO, "scripts", "containerd-testbed.sh")
BUILD_IMAGE = os.path.join(REPO, "scripts", "build-image.sh")
GPUSNAP = os.environ.get("GPUSNAP_BIN", os.path.join(REPO, "build", "gpusnap"))
MISSING = [t for t in ("containerd", "ctr", "buildah", "skopeo", "docker-registry") if shutil.which(t) is None]
if not os.path.exists("/usr/bin/busybox"):
    MISSING.append("busybox-static")


def init_script():
    """The agent DaemonSet's install-bundle init container: its command and args."""
    with open(os.path.join(REPO, "deploy", "agent-daemonset.yaml")) as f:
        ds = yaml.safe_load(f)
    (init,) = [c for c in ds["spec"]["template"]["spec"]["initContainers"] if c["name"] == "install-bundle"]
    return init["command"] + init["args"]


@unittest.skipIf(os.geteuid() != 0, "SKIPPED: needs root (containerd, buildah)")
@unittest.skipIf(MISSING, f"SKIPPED: not installed: {', '.join(MISSING)} (scripts/setup.sh installs them)")
class BuildImage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gpusnap-image-", dir="/var/tmp")
        cls.pack = os.path.join(cls.tmp, "pack")
        env = dict(os.environ, GPUSNAP_BUILD_DIR=os.path.dirname(GPUSNAP))
        subprocess.run(["bash", os.path.join(REPO, "scripts", "pack-portable.sh"), cls.pack], check=True, env=env,
                       capture_output=True, timeout=600)
        cls.archive = os.path.join(cls.tmp, "gpusnap.tar")
        p = subprocess.run(["bash", BUILD_IMAGE, "--pack", cls.pack, "--storage", os.path.join(cls.tmp, "buildah"),
                            "--oci-archive", cls.archive, "--tag", "localhost/gpusnap:test"],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise AssertionError(f"build-image.sh failed: {p.stderr}")
        cls.tag = p.stdout.strip().splitlines()[-1]
        cls.ctd = os.path.join(cls.tmp, "containerd")
        for args in (["start", cls.ctd], ["import", cls.ctd, cls.archive, cls.tag]):
            p = subprocess.run(["bash", TESTBED, *args], capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                raise AssertionError(f"containerd-testbed.sh {args[0]} failed: {p.stderr}")

    @classmethod
    def tearDownClass(cls):
        subprocess.run(["bash", TESTBED, "stop", cls.ctd], capture_output=True, timeout=300)
        storage = os.path.join(cls.tmp, "buildah")
        subprocess.run(["buildah", "--storage-driver", "vfs", "--root", os.path.join(storage, "root"), "--runroot",
                        os.path.join(storage, "run"), "rmi", "-a", "-f"], capture_output=True, timeout=300)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def ctr_run(self, name, *argv, mounts=()):
        cmd = ["ctr", "-a", os.path.join(self.ctd, "containerd.sock"), "run", "--rm", "--snapshotter", "overlayfs"]
        for src, dst in mounts:
            cmd += ["--mount", f"type=bind,src={src},dst={dst},options=rbind:rw"]
        return subprocess.run(cmd + [self.tag, name, *argv], capture_output=True, text=True, timeout=120)

    def test_gpusnap_on_path_prints_the_bundles_criu(self):
        p = self.ctr_run("version", "gpusnap", "version")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"^gpusnap \S+\ncriu: criu 4\.")
        self.assertIn("(bundle /opt/gpusnap/criu-bundle)", p.stdout)

    def test_the_daemonsets_init_container_installs_a_bundle_that_runs(self):
        host = os.path.join(self.tmp, "host")
        os.makedirs(host)
        p = self.ctr_run("install-bundle", *init_script(), mounts=[(host, "/host/gpusnap")])
        self.assertEqual(p.returncode, 0, p.stderr)
        bundle = os.path.join(host, "bundle")
        for f in ("bin/gpusnap", "lib/libgpusnap_gpushare.so", "criu-bundle/bin/criu"):
            self.assertTrue(os.path.exists(os.path.join(bundle, f)), f)
        self.assertTrue(os.path.isdir(os.path.join(host, "pods")))
        # As on a node: no GPUSNAP_CRIU pointing elsewhere (the test suite sets one).
        env = {k: v for k, v in os.environ.items() if k != "GPUSNAP_CRIU"}
        v = subprocess.run([os.path.join(bundle, "bin", "gpusnap"), "version"], capture_output=True, text=True,
                           timeout=60, env=env)
        self.assertEqual(v.returncode, 0, v.stderr)
        self.assertIn(f"(bundle {os.path.join(bundle, 'criu-bundle')})", v.stdout)

    def test_the_image_pushes_to_a_registry_and_reads_back(self):
        reg = Registry(os.path.join(self.tmp, "registry"))
        reg.start()
        self.addCleanup(reg.stop)
        dest = f"docker://{reg.host}/gpusnap/gpusnap:test"
        p = subprocess.run(["bash", BUILD_IMAGE, "--pack", self.pack, "--storage", os.path.join(self.tmp, "buildah"),
                            "--tag", self.tag, "--push", dest, "--dest-tls-verify=false"],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = subprocess.run(["skopeo", "inspect", "--tls-verify=false", dest], capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(got.returncode, 0, got.stderr)
        self.assertEqual(json.loads(got.stdout)["Labels"]["org.opencontainers.image.title"], "gpusnap")


if __name__ == "__main__":
    unittest.main()
