"""A workload's new pid namespace never takes an inode that a CUDA socket
name still carries.

The CUDA driver binds `@cuda-uvmfd-<pid namespace inode>-<pid>` in every
process at cuInit, in the network namespace all workloads share with the
node. A CUDA process restored by CRIU keeps that name, with the inode of its
old namespace, which is gone; the kernel gives a freed inode to the next
namespace it makes, and a new workload there at the same pid failed cuInit
with CUDA_ERROR_OPERATING_SYSTEM (EADDRINUSE). Here the driver's bind is done
by a small Python workload, and the restored process's name is held by the
test, after the namespace it names is gone."""
import os
import socket
import time
import unittest

from harness import GpusnapCase

# Binds the name the CUDA driver binds at cuInit, and says whether it could.
CUDA_LIKE = r"""
import os, socket, time
ino = os.stat("/proc/self/ns/pid").st_ino
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.bind(f"\0cuda-uvmfd-{ino}-{os.getpid()}\0")
    print(f"bound {ino}-{os.getpid()}", flush=True)
except OSError as e:
    print(f"bind {ino}-{os.getpid()}: {e}", flush=True)
time.sleep(600)
"""


class NamespaceInodes(GpusnapCase):
    def run_cuda_like(self, name):
        log = os.path.join(self.tmp, f"{name}.log")
        pid = int(self.gs("run", "--name", name, "--log", log, "--", "/usr/bin/python3", "-c", CUDA_LIKE)
                  .stdout.strip())
        end = time.time() + 30
        while time.time() < end:
            text = open(log).read() if os.path.exists(log) else ""
            if text.strip():
                return pid, text.strip()
            time.sleep(0.05)
        self.fail(f"workload {name} said nothing")

    def test_names_left_by_restored_processes_do_not_break_the_next_workload(self):
        pid, said = self.run_cuda_like("first")
        self.assertTrue(said.startswith("bound "), said)
        inode = os.stat(f"/proc/{pid}/ns/pid").st_ino
        reaper = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        self.gs("kill", "first")
        self.assertTrue(self.wait_gone(pid) and self.wait_gone(reaper), "the first workload's namespace stays")
        # What processes restored from namespaces now gone still hold: the
        # names of the inodes about `first`'s, which the kernel hands out next
        # (the lowest free first).
        taken = set(range(inode - 16, inode + 17))
        for ino in sorted(taken):
            left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.addCleanup(left.close)
            try:
                left.bind(f"\0cuda-uvmfd-{ino}-2\0")
            except OSError:  # a live workload's own name: its namespace is not free anyway
                left.close()
        for i in range(3):
            with self.subTest(workload=i):
                pid, said = self.run_cuda_like(f"next{i}")
                self.assertNotIn(os.stat(f"/proc/{pid}/ns/pid").st_ino, taken)
                self.assertTrue(said.startswith("bound "), said)


if __name__ == "__main__":
    unittest.main()
