"""A real OCI registry for the tests: Debian's docker-registry (distribution
2.8) on 127.0.0.1, its storage in a directory the test gives, its log in a
file. Three modes:

  plain      plain HTTP, no auth;
  tls-basic  HTTPS with a test CA made by openssl, htpasswd (bcrypt) basic auth;
  tls-token  HTTPS, bearer tokens from TokenServer (below, same CA): a small
             HTTPS token server that checks basic credentials and issues RS256
             JWTs the registry verifies against its rootcertbundle.

    reg = Registry(tmpdir, "tls-token")
    reg.start()                 # waits until /v2/ answers
    reg.host, reg.url, reg.username, reg.password, reg.cert_dir
    Registry(tmpdir, "tls-token", users=("team-a", "team-b")).passwords["team-a"]
    reg.served()                # [{"method", "uri", "status", "agent"}] of every request, refused ones too
    reg.token_server.requests() # [{"user", "scopes", "status"}]: who asked for access to what
    reg.stop(); reg.start()     # same port, same storage
    reg.close()                 # stops the registry and the token server

Nothing here needs gpusnap; stdlib only, plus the openssl and htpasswd tools."""
import base64
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DOCKER_REGISTRY = os.environ.get("GPUSNAP_DOCKER_REGISTRY",
                                 shutil.which("docker-registry") or "/usr/bin/docker-registry")
MODES = ("plain", "tls-basic", "tls-token")
SERVICE = "gpusnap-test-registry"
ISSUER = "gpusnap-test-token-server"


class RegistryError(Exception):
    """The registry did not start or stop; the message carries its log's tail."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(args, **kwargs):
    p = subprocess.run(args, capture_output=True, **kwargs)
    if p.returncode != 0:
        err = p.stderr.decode(errors="replace") if isinstance(p.stderr, bytes) else p.stderr
        raise RegistryError(f"{args[0]} {args[1]} failed ({p.returncode}): {err.strip()}")
    return p.stdout


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def log_tail(path, lines=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def run_skopeo(argv, env, timeout=120):
    """skopeo `argv` (its path first); a copy answered 500 is run again.

    A snapshot's artifact may list one blob several times (files of equal
    bytes); skopeo handles them at once, and under load docker-registry has
    answered one of its requests 500 meanwhile (docs/DISTRIBUTION.md). A copy
    is idempotent, so a retry changes nothing but the flake."""
    for _ in range(3):
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        if not ("copy" in argv and p.returncode != 0 and "500 (Internal Server Error)" in p.stderr):
            return p
    return p


class CertAuthority:
    """A CA made by openssl in `directory`, and certificates it signs."""

    def __init__(self, directory, name="gpusnap test CA"):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.cert = os.path.join(directory, "ca.crt")
        self.key = os.path.join(directory, "ca.key")
        conf = self._write("ca.cnf", "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = " + name + "\n"
                           "[ext]\nbasicConstraints = critical,CA:TRUE\nkeyUsage = critical,keyCertSign,cRLSign\n"
                           "subjectKeyIdentifier = hash\n")
        _run(["openssl", "req", "-x509", "-config", conf, "-extensions", "ext", "-newkey", "rsa:2048", "-nodes",
              "-keyout", self.key, "-out", self.cert, "-days", "2"])

    def _write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def issue(self, name, extensions):
        """NAME.crt and NAME.key, an RSA key and a certificate with the
        given extension lines (openssl x509v3 config syntax); their paths."""
        key, csr, cert = (os.path.join(self.dir, name + s) for s in (".key", ".csr", ".crt"))
        ext = self._write(name + ".ext", "[ext]\n" + "".join(line + "\n" for line in extensions))
        _run(["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
              "-subj", "/CN=" + name])
        _run(["openssl", "x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key,
              "-set_serial", str(secrets.randbits(63)), "-days", "2", "-extfile", ext, "-extensions", "ext",
              "-out", cert])
        return cert, key

    def issue_server(self, name="server"):
        return self.issue(name, ["subjectAltName = IP:127.0.0.1,DNS:localhost", "basicConstraints = CA:FALSE",
                                 "keyUsage = critical,digitalSignature,keyEncipherment",
                                 "extendedKeyUsage = serverAuth"])

    def issue_signer(self, name="token-signer"):
        return self.issue(name, ["basicConstraints = CA:FALSE", "keyUsage = critical,digitalSignature"])


def self_signed(directory, name):
    """A self-signed RSA certificate no registry here trusts: (cert, key)."""
    cert, key = os.path.join(directory, name + ".crt"), os.path.join(directory, name + ".key")
    _run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
          "-days", "2", "-subj", "/CN=" + name])
    return cert, key


def cert_der(cert_path):
    with open(cert_path) as f:
        return ssl.PEM_cert_to_DER_cert(f.read())


def libtrust_key_id(cert_path):
    """The key id distribution's libtrust gives a certificate's public key
    (the `kid` it looks up among the keys of its rootcertbundle): SHA-256 of
    the DER SubjectPublicKeyInfo, its first 240 bits in base32, in groups of 4."""
    spki = _run(["openssl", "x509", "-in", cert_path, "-noout", "-pubkey"])
    der = _run(["openssl", "pkey", "-pubin", "-outform", "DER"], input=spki)
    s = base64.b32encode(hashlib.sha256(der).digest()[:30]).decode().rstrip("=")
    return ":".join(s[i:i + 4] for i in range(0, len(s), 4))


def write_docker_config(path, host, username, password):
    """A docker-style config.json holding the credentials of one registry."""
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"auths": {host: {"auth": auth}}}, f, indent=2)
    return path


def parse_scopes(values):
    """[(type, name, [actions])] of `scope` query values; a value may hold
    several scopes separated by spaces, a name may hold ':'."""
    scopes = []
    for value in values:
        for scope in value.split():
            parts = scope.split(":")
            if len(parts) < 3:
                continue
            scopes.append((parts[0], ":".join(parts[1:-1]), [a for a in parts[-1].split(",") if a]))
    return scopes


class TokenServer:
    """The registry's token server over HTTPS (see the docker token spec):
    `GET /token?service=S&scope=repository:NAME:pull,push` with basic
    credentials answers {"token", "access_token", "expires_in", "issued_at"};
    `POST /token` takes the OAuth2 password grant as a form. Each user gets the
    requested actions that `users[name][1]` allows; wrong or missing
    credentials get 401, a wrong service 400.

    Tokens carry the signing certificate in `x5c` (the registry verifies it
    against the CA in its rootcertbundle) and its libtrust id in `kid`.
    `log` lists every request as {"user", "scopes", "status"}; requests are
    served on threads, and `log` is appended under `lock`."""

    def __init__(self, cert, key, signer_cert, signer_key, users, service=SERVICE, issuer=ISSUER, log_path=None):
        self.service, self.issuer = service, issuer
        self.signer_cert, self.signer_key = signer_cert, signer_key
        self.users = users
        self.lock = threading.Lock()
        self.log = []
        self.lifetime = 300
        self._log_file = open(log_path or os.devnull, "a")
        self._x5c = [base64.b64encode(cert_der(signer_cert)).decode()]
        self._kid = libtrust_key_id(signer_cert)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        # The handshake happens on each request's thread, so that a client
        # that connects and says nothing holds up no other.
        self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True, do_handshake_on_connect=False)
        self.url = f"https://127.0.0.1:{self._server.server_address[1]}/token"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def requests(self):
        """A copy of `log`: who asked for access to what, and the answer."""
        with self.lock:
            return [dict(r) for r in self.log]

    @property
    def token_requests(self):
        """How many token requests came, answered or refused."""
        with self.lock:
            return len(self.log)

    @property
    def tokens_issued(self):
        with self.lock:
            return sum(1 for r in self.log if r["status"] == 200)

    def close(self):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._log_file.close()

    def make_token(self, subject, access, *, audience=None, issuer=None, lifetime=None, not_before=None,
                   header=("x5c", "kid"), signer=None):
        """A signed JWT. `access` is [(type, name, [actions])]; `header` says
        which of x5c and kid the header carries; `signer` is another (cert,
        key) to sign with. The other arguments override the claims, so a test
        can make tokens the registry must refuse."""
        now = int(time.time())
        cert, key = signer or (self.signer_cert, self.signer_key)
        head = {"typ": "JWT", "alg": "RS256"}
        if "x5c" in header:
            head["x5c"] = [base64.b64encode(cert_der(cert)).decode()] if signer else self._x5c
        if "kid" in header:
            head["kid"] = libtrust_key_id(cert) if signer else self._kid
        claims = {"iss": issuer or self.issuer, "sub": subject, "aud": self.service if audience is None else audience,
                  "exp": now + (self.lifetime if lifetime is None else lifetime),
                  "nbf": now - 1 if not_before is None else not_before, "iat": now, "jti": secrets.token_hex(16),
                  "access": [{"type": t, "name": n, "actions": a} for t, n, a in access]}
        signing_input = (b64url(json.dumps(head, separators=(",", ":")).encode()) + "." +
                         b64url(json.dumps(claims, separators=(",", ":")).encode()))
        signature = _run(["openssl", "dgst", "-sha256", "-sign", key], input=signing_input.encode())
        return signing_input + "." + b64url(signature)

    def _grant(self, user, scopes):
        allowed = set(self.users[user][1])
        access = []
        for t, name, actions in scopes:
            granted = [a for a in actions if a in allowed or "*" in allowed]
            if granted:
                access.append((t, name, granted))
        return access

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):
                server._log_file.write("%s %s\n" % (self.log_date_time_string(), fmt % args))
                server._log_file.flush()

            def _reply(self, status, body, headers=()):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _basic(self):
                kind, _, value = self.headers.get("Authorization", "").partition(" ")
                if kind.lower() != "basic":
                    return None, None
                try:
                    user, _, password = base64.b64decode(value).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    return None, None
                return user, password

            def _answer(self, user, password, service, scope_values):
                scopes = parse_scopes(scope_values)
                if user is None or user not in server.users or \
                        not secrets.compare_digest(server.users[user][0], password or ""):
                    status = 401
                    self._reply(401, {"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]},
                                [("WWW-Authenticate", 'Basic realm="gpusnap-test-token"')])
                elif service != server.service:
                    status = 400
                    self._reply(400, {"errors": [{"code": "UNSUPPORTED", "message": f"service {service!r}"}]})
                else:
                    status = 200
                    token = server.make_token(user, server._grant(user, scopes))
                    issued = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    self._reply(200, {"token": token, "access_token": token, "expires_in": server.lifetime,
                                      "issued_at": issued})
                with server.lock:
                    server.log.append({"user": user, "scopes": scopes, "status": status})

            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                if url.path != "/token":
                    return self._reply(404, {"errors": [{"code": "NOT_FOUND"}]})
                query = urllib.parse.parse_qs(url.query)
                user, password = self._basic()
                self._answer(user, password, query.get("service", [""])[0], query.get("scope", []))

            def do_POST(self):
                if urllib.parse.urlsplit(self.path).path != "/token":
                    return self._reply(404, {"errors": [{"code": "NOT_FOUND"}]})
                length = int(self.headers.get("Content-Length", "0"))
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                if form.get("grant_type", [""])[0] != "password":
                    return self._reply(400, {"error": "unsupported_grant_type"})
                self._answer(form.get("username", [None])[0], form.get("password", [""])[0],
                             form.get("service", [""])[0], form.get("scope", []))

        return Handler


class Registry:
    """docker-registry on 127.0.0.1 in one of MODES, everything under
    `workdir` (which the caller owns and removes): storage/, registry.log,
    config.json and, for the TLS modes, tls/ (the CA, the server's
    certificate, the token signer's) and certs/ (ca.crt alone, for
    `--cert-dir`-style clients). The port is chosen once and kept across
    stop() and start().

    Exposes host, url, storage_dir, log, mode; the TLS modes also ca_file,
    cert_dir, username, password; tls-token also reader_username,
    reader_password (pull only), token_server (a TokenServer) and
    token_url. The TLS modes take more `users` (names), each with a password
    of its own in `passwords` (the first user's there too; with tls-token,
    each may pull and push). docker-registry's log names the user of a
    request only when it fails: with tls-token, the token server's log says
    which user asked for access to which repository, and every request
    carries the token it got."""

    READY_TIMEOUT = 20.0

    def __init__(self, workdir, mode="plain", users=()):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: not one of {', '.join(MODES)}")
        self.mode = mode
        self.workdir = os.path.abspath(workdir)
        self.storage_dir = os.path.join(self.workdir, "storage")
        self.log = os.path.join(self.workdir, "registry.log")
        self.config = os.path.join(self.workdir, "config.json")
        self.port = free_port()
        self.proc = None
        self.ca = self.ca_file = self.cert_dir = self.username = self.password = None
        self.reader_username = self.reader_password = None
        self.token_server = self.token_url = None
        os.makedirs(self.storage_dir, exist_ok=True)
        if users and mode == "plain":
            raise ValueError("users need a TLS mode, not plain")
        self.passwords = {}
        self._auth = None
        self._tls = None
        if mode != "plain":
            self._set_up_tls(users)
        if mode == "tls-basic":
            self._set_up_htpasswd()
        elif mode == "tls-token":
            self._set_up_token_server()
        self._started_once = self._closed = False
        # Kept across restarts: upload URLs carry state signed with it, so a
        # client can resume an upload that a restart interrupted.
        self._secret = secrets.token_hex(16)

    # --- set-up ---------------------------------------------------------------

    def _set_up_tls(self, users):
        tls = os.path.join(self.workdir, "tls")
        self.ca = CertAuthority(tls)
        self.ca_file = self.ca.cert
        self.server_cert, self.server_key = self.ca.issue_server()
        self.cert_dir = os.path.join(self.workdir, "certs")
        os.makedirs(self.cert_dir, exist_ok=True)
        shutil.copy(self.ca_file, os.path.join(self.cert_dir, "ca.crt"))
        self._tls = {"certificate": self.server_cert, "key": self.server_key}
        self.username, self.password = "gpusnap-test", secrets.token_urlsafe(12)
        self.passwords = {self.username: self.password}
        for user in users:
            self.passwords[user] = secrets.token_urlsafe(12)

    def _set_up_htpasswd(self):
        path = os.path.join(self.workdir, "htpasswd")
        with open(path, "w") as f:
            for user, password in self.passwords.items():
                f.write(_run(["htpasswd", "-Bbn", user, password]).decode().strip() + "\n")
        self._auth = {"htpasswd": {"realm": "gpusnap-test-registry", "path": path}}

    def _set_up_token_server(self):
        signer_cert, signer_key = self.ca.issue_signer()
        # The CA lets the registry verify x5c chains; the signer's own
        # certificate puts its key among the ones a bare `kid` may name.
        bundle = os.path.join(self.workdir, "tls", "token-roots.crt")
        with open(bundle, "w") as out:
            for path in (self.ca_file, signer_cert):
                with open(path) as f:
                    out.write(f.read())
        self.reader_username, self.reader_password = "gpusnap-reader", secrets.token_urlsafe(12)
        users = {self.username: (self.password, ["pull", "push", "delete"]),
                 self.reader_username: (self.reader_password, ["pull"])}
        for user, password in self.passwords.items():
            users.setdefault(user, (password, ["pull", "push"]))
        self.token_server = TokenServer(self.server_cert, self.server_key, signer_cert, signer_key, users,
                                        log_path=os.path.join(self.workdir, "token-server.log"))
        self.token_url = self.token_server.url
        self._auth = {"token": {"realm": self.token_url, "service": SERVICE, "issuer": ISSUER,
                                "rootcertbundle": bundle}}

    def _write_config(self):
        http = {"addr": self.host, "secret": self._secret}
        if self._tls:
            http["tls"] = self._tls
        config = {"version": "0.1",
                  "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
                  "storage": {"filesystem": {"rootdirectory": self.storage_dir},
                              "delete": {"enabled": True},
                              "maintenance": {"uploadpurging": {"enabled": False}}},
                  "http": http}
        if self._auth:
            config["auth"] = self._auth
        # JSON is YAML: docker-registry reads this as its config.yml.
        with open(self.config, "w") as f:
            json.dump(config, f, indent=2)

    # --- what it served ----------------------------------------------------------

    _ACCESS = re.compile(r'^\S+ - \S+ \[[^]]*\] "(\S+) (\S+) [^"]*" (\d{3}) \S+ "[^"]*" "([^"]*)"')

    def served(self):
        """Every request the registry got, answered or refused (401 too),
        from its access log, oldest first: {"method", "uri", "status",
        "agent" (the User-Agent; this harness's own probes are
        Python-urllib's)}."""
        try:
            with open(self.log, errors="replace") as f:
                return [{"method": m[1], "uri": m[2], "status": int(m[3]), "agent": m[4]}
                        for m in map(self._ACCESS.match, f) if m]
        except OSError:
            return []

    # --- addresses ------------------------------------------------------------

    @property
    def host(self):
        return f"127.0.0.1:{self.port}"

    @property
    def url(self):
        return ("http://" if self.mode == "plain" else "https://") + self.host

    def ssl_context(self):
        """An SSLContext that trusts the test CA (None in plain mode)."""
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None

    def blob_path(self, digest):
        """Where the filesystem driver keeps the bytes of blob `digest`
        ("sha256:<64 hex>"), so a test can damage them."""
        m = re.fullmatch(r"sha256:([0-9a-f]{64})", digest)
        if not m:
            raise ValueError(f"digest {digest!r}: not sha256:<64 hex>")
        hexd = m.group(1)
        return os.path.join(self.storage_dir, "docker/registry/v2/blobs/sha256", hexd[:2], hexd, "data")

    # --- life -----------------------------------------------------------------

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self):
        """Starts docker-registry and waits until /v2/ answers. The first
        start moves to another free port if the chosen one was taken."""
        if self._closed:
            raise RegistryError(f"registry on {self.host} was closed")
        if self.running:
            raise RegistryError(f"registry on {self.host} already running (pid {self.proc.pid})")
        for attempt in range(3):
            self._write_config()
            try:
                self._spawn_and_wait()
                self._started_once = True
                return self
            except RegistryError:
                if self._started_once or attempt == 2 or "address already in use" not in log_tail(self.log, 5):
                    raise
                self.port = free_port()

    def _spawn_and_wait(self):
        # REGISTRY_* variables would override the config file.
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
        with open(self.log, "ab") as log:
            log.write(f"=== docker-registry serve {self.config} on {self.host} ===\n".encode())
            log.flush()
            self.proc = subprocess.Popen([DOCKER_REGISTRY, "serve", self.config], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(context=self.ssl_context()))
        deadline = time.monotonic() + self.READY_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise RegistryError(f"docker-registry on {self.host} exited ({code}):\n{log_tail(self.log)}")
            try:
                with opener.open(self.url + "/v2/", timeout=2):
                    return
            except urllib.error.HTTPError as e:
                if e.code == 401:
                    return
                error = f"/v2/ answered {e.code}"
            except (urllib.error.URLError, OSError) as e:
                error = str(e)
            if time.monotonic() > deadline:
                self.stop(sig=signal.SIGKILL)
                raise RegistryError(f"docker-registry on {self.host} did not answer /v2/ within "
                                    f"{self.READY_TIMEOUT:.0f} s ({error}):\n{log_tail(self.log)}")
            time.sleep(0.05)

    def stop(self, sig=signal.SIGTERM, timeout=10.0):
        """Sends `sig` to the registry's pid (SIGKILL: a crash), waits, and
        kills it if it is still there after `timeout` seconds."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self):
        """Stops the registry and the token server, for good."""
        self._closed = True
        self.stop()
        if self.token_server:
            self.token_server.close()
            self.token_server = None

    def __enter__(self):
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc):
        self.close()
