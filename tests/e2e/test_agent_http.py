"""The node agent's HTTP edge, against a real agent over real sockets: bodies
it will not hold (chunked ones included, memory measured in /proc), JSON it
will not guess at (duplicate keys, bytes that are not UTF-8), the
form-encoded body limit, and clients that drip their requests: they are cut
off, one peer holds only its share of the workers, the others are served.
And who may call on the unix socket: the kernel's word for the caller
(SO_PEERCRED), not the socket file's mode, decides."""
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import test_agent as base
from harness import free_port

BODY_LIMIT = 64 << 10  # --max-body-bytes' default, as docs/AGENT.md says


def peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def read_response(sock, timeout=60):
    """(status, parsed JSON body or text) of one HTTP response on a raw
    socket, or (None, what came) if the agent closed without one."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            chunk = b""
        if not chunk:
            return None, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    body = rest[:length].decode()
    return status, (json.loads(body) if headers.get("content-type", "").startswith("application/json") else body)


class Dripper:
    """A raw connection that sends its request a few bytes at a time, as a
    slow or hostile client does, until the agent answers or closes."""

    def __init__(self, address, source=None, head=b"GET /healthz HTTP/1.1\r\nHost: agent\r\n", drip=b"X-Slow: y\r\n",
                 every=0.2, family=socket.AF_INET):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        if source:
            self.sock.bind((source, 0))
        self.sock.connect(address)
        self.head, self.drip, self.every = head, drip, every
        self.answer = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.sock.sendall(self.head)
            while not self.stopped.is_set():
                for byte in self.drip:
                    self.sock.sendall(bytes([byte]))
                    if self.stopped.wait(self.every):
                        return
        except OSError:
            pass  # the agent closed its end

    def wait_answer(self, timeout=60):
        status, body = read_response(self.sock, timeout)
        self.stopped.set()
        self.thread.join(timeout=10)
        self.sock.close()
        return status, body

    def close(self):
        self.stopped.set()
        self.thread.join(timeout=10)
        self.sock.close()


class AgentHttpCase(base.AgentCase):
    def unix_socket(self, agent):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(agent.socket)
        return s

    def send_chunked(self, sock, method, path, total, chunk=64 << 10):
        """Sends `total` bytes of a JSON-looking body in chunks while the
        agent's answer is read on this thread; the agent may stop reading
        (and close) at any point. Returns (status, body, bytes sent)."""
        sent = [0]

        def sender():
            try:
                sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: agent\r\nTransfer-Encoding: chunked\r\n"
                             "Content-Type: application/json\r\n\r\n".encode())
                piece = b"x" * chunk
                first = b'{"pad": "' + piece[9:]
                while sent[0] < total:
                    data = first if sent[0] == 0 else piece
                    sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))
                    sent[0] += len(data)
                sock.sendall(b'2\r\n"}\r\n0\r\n\r\n')
            except OSError:
                pass

        t = threading.Thread(target=sender, daemon=True)
        t.start()
        status, body = read_response(sock, timeout=120)
        t.join(timeout=120)
        sock.close()
        return status, body, sent[0]


class Bodies(AgentHttpCase):
    def test_a_chunked_body_is_bounded_as_a_sized_one(self):
        agent = self.start_agent()
        self.assertEqual(agent.request("GET", "/healthz")[0], 200)
        total = 50 << 20
        # Read up to the limit where a body is taken; refused unread elsewhere.
        for method, path, want, needle in (
                ("POST", "/v1/checkpoints", 413, "request body too large (over 65536 bytes"),
                ("POST", "/v1/restores", 413, "request body too large (over 65536 bytes"),
                ("POST", "/v1/nothing-here", 404, "no endpoint POST /v1/nothing-here"),
                ("DELETE", "/v1/snapshots/x", 400, "DELETE /v1/snapshots/x takes no body"),
                ("PUT", "/v1/snapshots/x", 405, "method PUT is not served")):
            with self.subTest(method=method, path=path):
                before = peak_rss_kib(agent.proc.pid)
                status, reply, sent = self.send_chunked(self.unix_socket(agent), method, path, total)
                grown = peak_rss_kib(agent.proc.pid) - before
                self.assertEqual(status, want, reply)
                self.assertIn(needle, reply["error"])
                # The agent held a bounded part of it: nowhere near the 50 MiB sent.
                self.assertLess(grown, 8 << 10, f"peak RSS grew by {grown} KiB for {sent} bytes sent")
        self.assertEqual(agent.request("GET", "/v1/jobs"), (200, []))
        self.assertEqual(agent.request("GET", "/healthz")[0], 200)
        self.assertIn("request body too large (over 65536 bytes", agent.log())

    def test_a_form_encoded_body_has_the_documented_limit(self):
        # `curl -d` sends application/x-www-form-urlencoded: the limit is
        # --max-body-bytes all the same.
        agent = self.start_agent()
        missing = 4194000
        while os.path.exists(f"/proc/{missing}"):
            missing -= 1
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        padded = json.dumps({"pid": missing}) + " " * (20 << 10)  # whitespace is JSON too
        status, reply = agent.request("POST", "/v1/checkpoints", padded, form)
        self.assertEqual(status, 404, reply)
        self.assertIn(f"no process with pid {missing}", reply["error"])
        status, reply = agent.request("POST", "/v1/checkpoints", padded + " " * BODY_LIMIT, form)
        self.assertEqual(status, 413, reply)
        self.assertIn("request body too large (over 65536 bytes", reply["error"])
        self.assertEqual(agent.request("GET", "/v1/jobs"), (200, []))

    def test_a_duplicate_key_is_refused_naming_it(self):
        agent = self.start_agent()
        pid = self.run_counter("dup")
        cases = [
            ("/v1/checkpoints", f'{{"pid": {pid}, "leaveRunning": true, "pid": 1}}', "`pid`"),
            ("/v1/checkpoints", f'{{"pid": 1, "pid": {pid}, "leaveRunning": true}}', "`pid`"),
            ("/v1/checkpoints", '{"pod": {"namespace": "a", "name": "p", "container": "c", "namespace": "b"}}',
             "`pod.namespace`"),
            ("/v1/restores", '{"snapshot": "x", "gpuMap": {"0": "1", "0": "2"}}', "`gpuMap.0`"),
        ]
        for path, body, key in cases:
            with self.subTest(body=body):
                status, reply = agent.request("POST", path, body)
                self.assertEqual(status, 400, reply)
                self.assertIn(f"duplicate key {key}", reply["error"])
        self.assertEqual(agent.request("GET", "/v1/jobs"), (200, []))
        self.assertEqual(self.store_entries(), [])
        self.wait_count(pid, self.count(pid) + 3)

    def test_bytes_that_are_not_utf8_are_400(self):
        agent = self.start_agent()
        bodies = [b'{"pid": 5, "snapshotId": "caf\xe9"}', b'{"snapshot": "\xff\xfe"}', b'{"pid": 5, "\xc3": 1}',
                  b'{"pid": 5, "snapshotId": "\xed\xa0\x80"}']
        for body in bodies:
            path = "/v1/restores" if b"snapshot\"" in body else "/v1/checkpoints"
            with self.subTest(body=body):
                status, reply = agent.request("POST", path, body)
                self.assertEqual(status, 400, reply)
                self.assertIn("not valid UTF-8", reply["error"])
        for method, path in (("GET", "/v1/snapshots/caf%E9"), ("DELETE", "/v1/snapshots/%FF"),
                             ("GET", "/v1/jobs/%C3"), ("GET", "/v1/processes?all=%FF"), ("GET", "/v1/%FF")):
            with self.subTest(path=path):
                status, reply = agent.request(method, path)
                self.assertEqual(status // 100, 4, reply)
                self.assertIsInstance(reply["error"], str)
        # The log names them in text: the bytes as \xNN.
        self.assertIn("unix GET /v1/snapshots/caf\\xe9 from uid 0 (gid 0, pid ", agent.log())
        self.assertEqual(agent.request("GET", "/v1/jobs"), (200, []))


class SlowClients(AgentHttpCase):
    def setUp(self):
        super().setUp()
        token = "t0k3n-" + os.urandom(16).hex()
        self.token_file = os.path.join(self.tmp, "token")
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, (token + "\n").encode())
        os.close(fd)
        self.token = token
        self.port = free_port()

    def tcp_agent(self, *extra):
        return self.start_agent("--listen", f"127.0.0.1:{self.port}", "--token-file", self.token_file,
                                "--io-timeout", "2", *extra)

    def served(self, agent, source):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30, source_address=(source, 0))
        return agent.request("GET", "/v1/snapshots", headers={"Authorization": f"Bearer {self.token}"}, conn=conn)

    def test_drippers_of_one_peer_do_not_starve_another(self):
        agent = self.tcp_agent("--threads", "8", "--max-connections-per-peer", "4")
        drippers = [Dripper(("127.0.0.1", self.port)) for _ in range(16)]
        try:
            # While they drip, another peer is served, over and over.
            for _ in range(5):
                self.assertEqual(self.served(agent, "127.0.0.2"), (200, []))
            answers = [d.wait_answer() for d in drippers]
        finally:
            for d in drippers:
                d.close()
        statuses = sorted(status for status, _ in answers)
        self.assertEqual(statuses, [408] * 4 + [503] * 12, answers)
        for status, reply in answers:
            if status == 408:
                self.assertIn("did not arrive within 2 s", reply["error"])
            else:
                self.assertIn("too many connections from 127.0.0.1 (at most 4 at once)", reply["error"])
        # Cut off, the dripping peer is served again.
        self.assertEqual(self.served(agent, "127.0.0.1"), (200, []))

    def test_a_dripped_body_is_cut_off_too(self):
        agent = self.tcp_agent()
        head = (f"POST /v1/checkpoints HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {self.token}\r\n"
                "Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n{\"pid\": 1").encode()
        dripper = Dripper(("127.0.0.1", self.port), head=head, drip=b" ")
        status, reply = dripper.wait_answer()
        self.assertEqual(status, 408, reply)
        self.assertIn("did not arrive within 2 s", reply["error"])
        # On the unix socket as well.
        dripper = Dripper(agent.socket, family=socket.AF_UNIX)
        status, reply = dripper.wait_answer()
        self.assertEqual(status, 408, reply)
        self.assertEqual(agent.request("GET", "/v1/jobs"), (200, []))

    def test_connections_past_the_listeners_limit_are_503(self):
        agent = self.tcp_agent("--threads", "2", "--max-connections", "4")
        drippers = [Dripper(("127.0.0.1", self.port), source=f"127.0.0.{10 + i}") for i in range(8)]
        try:
            answers = [d.wait_answer() for d in drippers]
        finally:
            for d in drippers:
                d.close()
        self.assertEqual(sorted(status for status, _ in answers), [408] * 4 + [503] * 4, answers)
        for status, reply in answers:
            if status == 503:
                self.assertIn("the agent's tcp listener is full (--max-connections 4)", reply["error"])
        self.assertEqual(self.served(agent, "127.0.0.2"), (200, []))


# Run as another uid: one request on the agent's unix socket; prints the
# answer, or why there is none.
AS_OTHER_UID = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except OSError as e:
    sys.exit(print(f"connect: {e}"))
try:
    s.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
except OSError:
    pass  # refused at once: the answer is already there to read
data = b""
try:
    while chunk := s.recv(65536):
        data += chunk
except OSError as e:
    data += f"recv: {e}".encode()
print(data.decode())
"""


class SocketCallers(base.AgentCase):
    def socket_dir(self):
        """A directory others may enter (the tests' own tmp is root's only),
        removed at teardown."""
        d = tempfile.mkdtemp(prefix="gpusnap-sock-")
        os.chmod(d, 0o755)
        self.addCleanup(lambda: os.path.isdir(d) and os.rmdir(d))
        return d

    def call_as(self, uid, socket_path):
        # The system python: another uid may not enter root's own installs.
        p = subprocess.run(["/usr/bin/python3", "-c", AS_OTHER_UID, socket_path], user=uid, group=uid,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout

    def refusals(self, agent, status):
        _, text = agent.request("GET", "/metrics")
        for line in text.splitlines():
            if line.startswith(f'gpusnap_agent_refusals_total{{listener="unix",status="{status}"}} '):
                return int(line.split()[-1])
        return 0

    def test_a_socket_opened_to_others_still_serves_root_alone(self):
        # A mistake an administrator can make: the socket's mode widened.
        path = os.path.join(self.socket_dir(), "agent.sock")
        agent = self.start_agent(socket_path=path)
        os.chmod(path, 0o666)
        answer = self.call_as(1000, path)
        self.assertIn("HTTP/1.1 403", answer)
        self.assertIn("only root may call the agent; this connection is from uid 1000", answer)
        self.assertNotIn("HTTP/1.1 200", answer)
        agent.wait_line("unix: refusing uid 1000 (gid 1000, pid ")
        self.assertEqual(self.refusals(agent, 403), 1)
        self.assertEqual(agent.request("GET", "/v1/jobs"), (200, []))

    def test_an_allowed_uid_is_served_and_no_other(self):
        path = os.path.join(self.socket_dir(), "agent.sock")
        agent = self.start_agent("--allow-uid", "1001", socket_path=path)
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o666)
        self.assertIn("HTTP/1.1 200", self.call_as(1001, path))
        answer = self.call_as(1002, path)
        self.assertIn("HTTP/1.1 403", answer)
        self.assertIn("only root, uid 1001 may call the agent; this connection is from uid 1002", answer)
        agent.wait_line("unix: refusing uid 1002 (gid 1002, pid ")
        self.assertEqual(self.refusals(agent, 403), 1)

    def test_refused_requests_are_logged_with_the_caller_and_counted(self):
        agent = self.start_agent()
        status, _ = agent.request("GET", "/v1/jobs/job-0000000000000000")
        self.assertEqual(status, 404)
        agent.wait_line(f"unix GET /v1/jobs/job-0000000000000000 from uid 0 (gid 0, pid ")
        self.assertEqual(self.refusals(agent, 404), 1)

    def test_a_bad_allowed_uid_refuses_the_start(self):
        p = subprocess.run([base.GPUSNAP, "agent", "--socket", os.path.join(self.tmp, "a.sock"), "--allow-uid", "x"],
                           capture_output=True, text=True, timeout=60, env=self.env)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--allow-uid", p.stderr)


if __name__ == "__main__":
    unittest.main()
