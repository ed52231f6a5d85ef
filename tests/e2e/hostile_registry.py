"""A hostile registry for the tests: a server on 127.0.0.1 in front of a
real one (registry.py) that passes every request through, except those a
test's `misbehave(handler)` takes over (returns True once it answered). It
does what the real docker-registry never does: redirects anywhere, endless
error bodies, answers that never come, huge manifests, blobs dripped a byte
at a time. With `ca` (a registry.CertAuthority) it speaks TLS."""
import http.client
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HostileRegistry:
    def __init__(self, upstream, misbehave=lambda handler: False, ca=None):
        self.upstream = upstream  # "127.0.0.1:PORT", plain HTTP
        self.misbehave = misbehave
        self.paths = []  # every request's path, in order
        self.closing = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.scheme = "http"
        if ca is not None:
            cert, key = ca.issue_server("hostile")
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def host(self):
        return f"127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()

    def forward(self, handler, path=None):
        """Answers `handler`'s request with what the real registry answers to it (at `path`)."""
        conn = http.client.HTTPConnection(self.upstream, timeout=30)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("host", "connection")}
        conn.request(handler.command, path or handler.path, body=body, headers=headers)
        answer = conn.getresponse()
        data = answer.read()
        handler.send_response(answer.status)
        for k, v in answer.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                handler.send_header(k, v)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(data)
        conn.close()

    def _handler(self):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):
                pass

            def _any(self):
                outer.paths.append(self.path)
                try:
                    if not outer.misbehave(self):
                        outer.forward(self)
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    self.close_connection = True

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _any

        return Handler


def is_blob(handler):
    return handler.command == "GET" and "/blobs/sha256:" in handler.path


def is_manifest(handler):
    return handler.command == "GET" and "/manifests/" in handler.path


def hold(handler, outer):
    """Accepts the request and never answers (until the server closes)."""
    outer.closing.wait(120)
    handler.close_connection = True
    return True


def endless_body(handler, outer, status=500):
    """An error answer whose body never ends."""
    handler.send_response(status)
    handler.send_header("Content-Type", "text/plain")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    chunk = b"x" * 65536
    while not outer.closing.is_set():
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    handler.close_connection = True
    return True

