"""A restored listening socket binds its old port again. Connections the tree
closed itself just before the checkpoint linger on that port in TIME_WAIT,
and a listener without SO_REUSEADDR (NCCL's bootstrap) cannot bind beside
them; the restore ends them first. Real CRIU, a real server and clients."""
import json
import os
import socket
import subprocess
import sys
import unittest

from harness import GpusnapCase, free_port

# Answers each connection with "hello N" and closes it first, so the closed
# connection waits in TIME_WAIT on the server's port; SO_REUSEADDR not set.
SERVER = """
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(8)
n = 0
while True:
    c, _ = s.accept()
    n += 1
    c.sendall(b"hello %d\\n" % n)
    c.close()
"""


def time_wait_on(port):
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return [r for r in rows if r[1].endswith(":%04X" % port) and r[3] == "06"]


class ListeningPorts(GpusnapCase):
    def ask(self, port):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            return c.makefile().readline().strip()

    def start_server(self):
        port = free_port()
        script = os.path.join(self.data, "server.py")
        with open(script, "w") as f:
            f.write(SERVER)
        pid = int(self.gs("run", "--name", "srv", "--", sys.executable, "-u", script, str(port)).stdout.strip())
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                subprocess.run(["sleep", "0.05"])
        return pid, port

    def test_a_port_held_by_time_wait_connections_is_freed_and_the_server_goes_on(self):
        pid, port = self.start_server()  # its readiness probe was hello 1
        self.assertEqual([self.ask(port) for _ in range(3)], ["hello 2", "hello 3", "hello 4"])
        self.assertTrue(time_wait_on(port), "the server closed first: its port must hold TIME_WAIT connections")
        snap = self.checkpoint("srv")
        meta = json.loads(self.gs("inspect", snap).stdout)
        self.assertEqual(meta["criu"]["listen_ports"], [port])
        self.assertTrue(self.wait_gone(pid))
        p = self.gs("restore", snap)
        self.assertIn("free-ports done", p.stderr)
        self.assertEqual(time_wait_on(port), [])
        self.assertEqual(self.ask(port), "hello 5", "the restored server must carry its count on")

    def test_a_tree_without_listeners_records_none(self):
        self.run_counter("c")
        snap = self.checkpoint("c")
        self.assertEqual(json.loads(self.gs("inspect", snap).stdout)["criu"]["listen_ports"], [])


if __name__ == "__main__":
    unittest.main()
