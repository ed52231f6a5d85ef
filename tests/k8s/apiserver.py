"""A small local Kubernetes API server for tests: what kube-apiserver does for
pods, mutating admission webhooks, namespaces, nodes and events, served over
HTTPS to the real kubectl and to gpusnap's own clients (the agent's watch).
Python 3 standard library and the `openssl` command only.

Starting it and pointing clients at it:

    import sys; sys.path.insert(0, "<repo>/tests/k8s")
    from apiserver import LocalApiServer

    class MyTest(unittest.TestCase):
        def setUp(self):
            self.api = LocalApiServer().start()       # own CA and certificate, an ephemeral port
            self.addCleanup(self.api.stop)

        def test_something(self):
            subprocess.run([kubectl, "get", "pods"], env=self.api.kubectl_env(), check=True)
            # or: kubectl --kubeconfig self.api.kubeconfig --cache-dir self.api.cache_dir ...

- `api.url` ("https://127.0.0.1:PORT"), `api.host`, `api.port`;
- `api.ca_file` / `api.ca_pem`: the CA that signed the server's certificate
  (for 127.0.0.1, localhost, kubernetes, kubernetes.default.svc);
- `api.token` / `api.token_file`: the bearer token every request needs
  (except /healthz, /livez, /readyz and /version); `api.add_token(token,
  username)` adds others (the user is recorded and sent to webhooks, there is
  no RBAC);
- `api.kubeconfig`: a kubeconfig file with all three; `api.kubectl_env()`:
  os.environ plus KUBECONFIG and a private KUBECACHEDIR;
- `api.in_cluster_env()`: KUBERNETES_SERVICE_HOST/PORT, for a client that
  reads its token and CA from files (`token_file`, `ca_file`) as a pod would.

Objects, from Python (the same code path as HTTP, admission included):
`create(resource, obj, namespace=None)`, `get(resource, name, namespace=None)`
(None when absent), `list(resource, namespace=None, label_selector="",
field_selector="")`, `patch(resource, name, patch, namespace=None,
patch_type="merge"|"json"|"strategic", subresource=None)`, `delete(...)`,
`ensure_namespace(name, labels=None)`, `add_node(name, labels=None)`. A
resource is "pods", "namespaces", "nodes", "events", "secrets" or
"mutatingwebhookconfigurations". Errors raise ApiError (its `.status` is the
Kubernetes Status, `.code` the HTTP code).

Playing scheduler and kubelet (there are neither):
`bind_pod(ns, name, node)` sets spec.nodeName as a Binding does (with the
PodScheduled condition); `set_pod_status(ns, name, status)` replaces the
status as the kubelet does; `run_pod(ns, name, node, container_ids=None)`
does both with a Running status (containerStatuses with container IDs such as
"containerd://<64 hex>"); `finish_pod_deletion(ns, name)` removes a pod whose
deletion is pending (LocalApiServer(graceful_pod_deletion=True) only). Each
change is a MODIFIED watch event, exactly as a client would see it.

Webhooks: a MutatingWebhookConfiguration whose clientConfig names a Service
is called at `<service>.<namespace>.svc` (the name checked in the
certificate) through the address given by `services=` or `set_service`:
`set_service("gpusnap-system", "gpusnap-webhook", "127.0.0.1", 8443)`.
`admission_calls` lists every webhook call (webhook, uid, outcome, error,
policy, warnings, seconds); apiserver_admission.py says what is checked.

Waiting, without sleeps: `wait_for(resource, name, namespace, predicate,
timeout)` returns the object once predicate(object) holds (None stands for
absent); `requests` lists every request served (seq, method, path, query,
user, code, user_agent, watching) and `wait_for_request(predicate, timeout,
after=seq)` waits for one. To know that a client's watch has started (so that
no change made next can be missed): `n = api.request_count`, start the
client, then `api.wait_for_request(lambda r: r.get("watching"), after=n)`.
`events(namespace=None)` lists core v1 Events.

A client such as gpusnap's agent: HTTPS to `api.url`, verifying `api.ca_file`,
with `Authorization: Bearer <api.token>`; e.g. the placeholders on node-a:
GET /api/v1/pods?labelSelector=gpusnap.io%2Fplaceholder%3Dtrue&fieldSelector=
spec.nodeName%3Dnode-a, then the same with `&watch=true&resourceVersion=<the
list's metadata.resourceVersion>`; PATCH .../pods/NAME with
`application/merge-patch+json` or `application/json-patch+json`; POST
/api/v1/namespaces/NS/events. Bodies are JSON.

Certificates for webhooks in tests: `make_ca(dir, name)` and
`issue_certificate(dir, ca_name, name, dns=(), ips=())` (openssl, ECDSA).

What is served (group/version/resource): core v1 namespaces, nodes, pods
(+ status, binding), events, secrets (data checked as base64, a
kubernetes.io/dockerconfigjson's `.dockerconfigjson` as JSON);
admissionregistration.k8s.io/v1 mutatingwebhookconfigurations. Verbs: get, list, watch (`?watch=true`:
chunked JSON events ADDED/MODIFIED/DELETED/BOOKMARK/ERROR, from a
resourceVersion or with the initial state first, `sendInitialEvents`,
`allowWatchBookmarks`, `timeoutSeconds`; an object that stops matching the
selectors is DELETED for that watch, one that starts matching is ADDED),
create, update, patch (JSON patch, merge patch, strategic merge patch),
delete and deletecollection; `labelSelector` (=, ==, !=, in, notin, exists,
!exists), `fieldSelector` (metadata.name, metadata.namespace and each
resource's own fields, e.g. spec.nodeName and status.phase for pods),
`limit`/`continue`, `dryRun=All`; discovery (legacy and aggregated), OpenAPI
v3 (just what kubectl reads), server-side tables for `kubectl get`, Status
objects with kube-apiserver's reasons and codes (400, 401, 404, 405, 409,
410, 415, 422, 500), `Warning:` headers from webhooks. docs/WEBHOOK.md lists
what it does not do."""
import base64
import copy
import json
import os
import select
import shutil
import socket
import socketserver
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
import uuid
import http.server

import apiserver_admission
import apiserver_discovery as disc
import apiserver_pods
import apiserver_proto
import apiserver_store
from apiserver_objects import MWC_KEY, NAMESPACE_KEY, PATCH_TYPES, ApiError, Objects, not_found
from apiserver_objects import resource as find_resource


def _openssl(*args, cwd):
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {p.stderr}")


def make_ca(directory, name):
    """A self-signed ECDSA CA in DIR/NAME.crt and DIR/NAME.key; returns the certificate's path."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=directory)
    return os.path.join(directory, f"{name}.crt")


def issue_certificate(directory, ca, name, dns=(), ips=()):
    """A server certificate signed by CA (a make_ca name) for the given DNS names and IP
    addresses, in DIR/NAME.crt and DIR/NAME.key; returns (certificate, key) paths."""
    sans = ",".join([f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips])
    with open(os.path.join(directory, f"{name}.ext"), "w") as f:
        f.write(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=directory)
    return os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")


class _HttpServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address, api, context):
        self.api, self.context = api, context
        self.connections = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def get_request(self):
        sock, addr = self.socket.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # headers and body go out as separate writes
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def handle_error(self, request, client_address):
        pass  # a client that went away, a failed handshake: nothing for the tests to see


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "testbed-apiserver"

    def setup(self):
        self.request.settimeout(120)
        self.request.do_handshake()
        with self.server.connections_lock:
            self.server.connections.add(self.request)
        super().setup()

    def finish(self):
        with self.server.connections_lock:
            self.server.connections.discard(self.request)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, *args):
        pass

    def _serve(self):
        self.server.api._serve(self)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


class LocalApiServer:
    """See the module's docstring. Not reusable after stop()."""

    def __init__(self, workdir=None, host="127.0.0.1", port=0, token=None, services=None,
                 graceful_pod_deletion=False, bookmark_interval=10.0, history=20000):
        """`workdir`: where the certificate, token and kubeconfig go (a new temporary directory,
        removed by stop(), when None). `services`: {"namespace/name": (host, port)} or
        {"namespace/name:servicePort": (host, port)}, as set_service. `history`: how many
        changes watches can start from (older resourceVersions get 410 Gone). With
        `graceful_pod_deletion`, deleting a pod bound to a node only sets its
        deletionTimestamp, and finish_pod_deletion removes it (the kubelet's part)."""
        self._own_dir = workdir is None
        self.dir = workdir or tempfile.mkdtemp(prefix="testbed-apiserver-")
        self.host, self._port = host, port
        self.token = token or uuid.uuid4().hex
        self._users = {self.token: {"username": "testbed-admin", "uid": "testbed-admin",
                                    "groups": ["system:masters", "system:authenticated"]}}
        self._services = dict(services or {})
        self.bookmark_interval = bookmark_interval
        self.store = apiserver_store.Store(history=history)
        self.admission = apiserver_admission.Dispatcher(self._webhook_configs, self._namespace_labels,
                                                        self._resolve_service)
        self.objects = Objects(self.store, self.admission, graceful_pod_deletion)
        self._requests = []
        self._seq = 0
        self._httpd = None
        self._thread = None
        self._stopping = threading.Event()

    # --- lifecycle ----------------------------------------------------------------
    def start(self):
        """Makes the certificate, token and kubeconfig files, creates the default namespaces and
        starts serving; returns self."""
        os.makedirs(self.dir, exist_ok=True)
        make_ca(self.dir, "apiserver-ca")
        cert, key = issue_certificate(self.dir, "apiserver-ca", "apiserver",
                                      dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
                                      ips=("127.0.0.1", "::1") if self.host in ("127.0.0.1", "localhost") else
                                      (self.host,))
        self.ca_file = os.path.join(self.dir, "apiserver-ca.crt")
        with open(self.ca_file) as f:
            self.ca_pem = f.read()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(cert, key)
        ctx.set_alpn_protocols(["http/1.1"])
        self._httpd = _HttpServer((self.host, self._port), self, ctx)
        self.port = self._httpd.server_address[1]
        self.url = f"https://{self.host}:{self.port}"
        self.token_file = os.path.join(self.dir, "token")
        with open(self.token_file, "w") as f:
            f.write(self.token)
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        self.cache_dir = os.path.join(self.dir, "kube-cache")
        with open(self.kubeconfig, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "testbed",
                       "clusters": [{"name": "testbed", "cluster": {
                           "server": self.url,
                           "certificate-authority-data": base64.b64encode(self.ca_pem.encode()).decode()}}],
                       "users": [{"name": "testbed", "user": {"token": self.token}}],
                       "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": "testbed",
                                                                    "namespace": "default"}}]}, f, indent=1)
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.ensure_namespace(ns)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="testbed-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Stops serving, ends open watches and connections; removes a temporary workdir."""
        if self._httpd is None or self._stopping.is_set():
            return
        self._stopping.set()
        self.store.close()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._httpd.connections_lock:
            for conn in list(self._httpd.connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._thread.join(10)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # --- clients ------------------------------------------------------------------
    def kubectl_env(self, base=None):
        """`base` (default os.environ) with KUBECONFIG and KUBECACHEDIR for this server."""
        env = dict(os.environ if base is None else base)
        env.update(KUBECONFIG=self.kubeconfig, KUBECACHEDIR=self.cache_dir)
        return env

    def in_cluster_env(self):
        return {"KUBERNETES_SERVICE_HOST": self.host, "KUBERNETES_SERVICE_PORT": str(self.port)}

    def add_token(self, token, username, groups=("system:authenticated",)):
        self._users[token] = {"username": username, "uid": username, "groups": list(groups)}

    def set_service(self, namespace, name, host, port, service_port=None):
        """Calls to the Service namespace/name (on `service_port`, or any) go to host:port."""
        key = f"{namespace}/{name}" + (f":{service_port}" if service_port else "")
        self._services[key] = (host, port)

    def remove_service(self, namespace, name):
        for key in [k for k in self._services if k == f"{namespace}/{name}" or k.startswith(f"{namespace}/{name}:")]:
            del self._services[key]

    def _resolve_service(self, namespace, name, port):
        return self._services.get(f"{namespace}/{name}:{port}") or self._services.get(f"{namespace}/{name}")

    @property
    def admission_calls(self):
        return list(self.admission.calls)

    @property
    def requests(self):
        """Requests served so far, oldest first: dicts with seq (a running number), method, path,
        query (a dict), user, code (None while in progress), user_agent, content_type, and
        watching (True once a watch will see every change made after it)."""
        with self.store.cv:
            return [dict(r) for r in self._requests]

    @property
    def request_count(self):
        """The seq the next request will get (for wait_for_request's `after`)."""
        with self.store.cv:
            return self._seq

    def wait_for_request(self, predicate, timeout=10, after=0):
        """The first request with seq >= `after` for which predicate(request) holds; raises
        TimeoutError. E.g. `after=api.request_count` before starting a client, and
        `lambda r: r.get("watching")` to know that its watch has started."""
        def found():
            return next((dict(r) for r in self._requests if r["seq"] >= after and predicate(r)), None)
        hit = self.store.wait(found, timeout)
        if hit is None:
            raise TimeoutError("no such request was served")
        return hit

    # --- Python API over the objects ---------------------------------------------
    _ADMIN = None  # the user of calls from Python: the admin of the admission requests

    def create(self, resource, obj, namespace=None):
        res = find_resource(resource)
        ns = namespace or (obj.get("metadata") or {}).get("namespace") or ("default" if res.namespaced else None)
        return self.objects.create(res, ns, copy.deepcopy(obj), {}, self._ADMIN)[0]

    def get(self, resource, name, namespace=None):
        res = find_resource(resource)
        return self.store.get((res.group, res.name), namespace if res.namespaced else None, name)

    def list(self, resource, namespace=None, label_selector="", field_selector=""):
        res = find_resource(resource)
        query = {"labelSelector": label_selector, "fieldSelector": field_selector}
        return self.objects.list(res, namespace, query)["items"]

    def patch(self, resource, name, patch, namespace=None, patch_type="merge", subresource=None):
        res = find_resource(resource)
        ctype = {v: k for k, v in PATCH_TYPES.items()}[patch_type]
        body = json.dumps(patch).encode()
        return self.objects.patch(res, namespace, name, subresource, body, ctype, {}, self._ADMIN)[0]

    def delete(self, resource, name, namespace=None):
        res = find_resource(resource)
        return self.objects.delete(res, namespace, name, {}, {}, self._ADMIN)

    def events(self, namespace=None):
        return self.list("events", namespace)

    def ensure_namespace(self, name, labels=None):
        """The namespace `name`, created if missing, with `labels` added."""
        ns = self.get("namespaces", name)
        if ns is None:
            return self.create("namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": name, "labels": dict(labels or {})}})
        if labels:
            return self.patch("namespaces", name, {"metadata": {"labels": labels}})
        return ns

    def add_node(self, name, labels=None):
        return self.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "labels": dict({"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
                                         **(labels or {}))},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}})

    def bind_pod(self, namespace, name, node):
        """What the scheduler's Binding does: spec.nodeName and the PodScheduled condition."""
        self.objects.bind(namespace, name, {"target": {"kind": "Node", "name": node}})
        return self.get("pods", name, namespace)

    def set_pod_status(self, namespace, name, status):
        """Replaces the pod's status, as the kubelet does through pods/status."""
        return self.objects.update_with(find_resource("pods"), namespace, name, "status",
                                 lambda pod: dict(pod, status=copy.deepcopy(status)))

    def run_pod(self, namespace, name, node, container_ids=None, **addresses):
        """Binds the pod to `node` and gives it a Running status (apiserver_pods.running_status)."""
        pod = self.get("pods", name, namespace)
        if pod is None:
            raise not_found(find_resource("pods"), name)
        if not pod["spec"].get("nodeName"):
            pod = self.bind_pod(namespace, name, node)
        return self.set_pod_status(namespace, name, apiserver_pods.running_status(pod, container_ids, **addresses))

    def finish_pod_deletion(self, namespace, name):
        return self.store.delete(("", "pods"), namespace, name)

    def wait_for(self, resource, name, namespace=None, predicate=None, timeout=10):
        """The object once predicate(object) is true (object is None when absent; the default
        predicate waits for it to exist). Raises TimeoutError with the last state seen."""
        res = find_resource(resource)
        predicate = predicate or (lambda o: o is not None)
        last = []

        def check():
            last[:] = [self.store.get((res.group, res.name), namespace if res.namespaced else None, name)]
            return predicate(last[0])
        if not self.store.wait(check, timeout):
            raise TimeoutError(f"{resource} {namespace}/{name}: condition not met in {timeout} s; last state: "
                               f"{json.dumps(last[0])[:2000]}")
        return last[0]

    # --- configuration lookups for admission -----------------------------------
    def _webhook_configs(self):
        return self.store.list(MWC_KEY)[0]

    def _namespace_labels(self, name):
        ns = self.store.get(NAMESPACE_KEY, None, name)
        return None if ns is None else (ns["metadata"].get("labels") or {})

    # --- HTTP -----------------------------------------------------------------------
    def _serve(self, h):
        url = urllib.parse.urlsplit(h.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        entry = {"method": h.command, "path": url.path, "query": query, "user": None, "code": None,
                 "user_agent": h.headers.get("User-Agent", ""), "content_type": h.headers.get("Content-Type", "")}
        h.testbed_entry = entry
        with self.store.cv:  # logged on arrival, so that a watch can be waited for while it runs
            entry["seq"] = self._seq
            self._seq += 1
            self._requests.append(entry)
            if len(self._requests) > 20000:
                del self._requests[:10000]
            self.store.cv.notify_all()
        warnings = []
        try:
            body = self._read_body(h)
            user = self._authenticate(h, url.path)
            entry["user"] = user["username"] if user else None
            code, obj, warnings, ctype = self._route(h, url.path, query, body, user)
        except ApiError as e:
            code, obj, ctype = e.code, e.status, "application/json"
        with self.store.cv:
            entry["code"] = code
            self.store.cv.notify_all()
        if obj is _WATCHED:
            return
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        h.send_header("Cache-Control", "no-cache, private")
        h.send_header("Audit-Id", str(uuid.uuid4()))
        for w in warnings:
            h.send_header("Warning", '299 - "' + w.replace("\\", "\\\\").replace('"', '\\"') + '"')
        h.end_headers()
        h.wfile.write(data)

    @staticmethod
    def _read_body(h):
        if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(h.rfile.readline().split(b";")[0], 16)
                data += h.rfile.read(size)
                h.rfile.readline()
                if size == 0:
                    return data
        return h.rfile.read(int(h.headers.get("Content-Length") or 0))

    def _authenticate(self, h, path):
        auth = h.headers.get("Authorization", "")
        user = self._users.get(auth[7:].strip()) if auth.startswith("Bearer ") else None
        if user is None and path not in ("/healthz", "/livez", "/readyz", "/version"):
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return user

    def _route(self, h, path, query, body, user):
        """(code, body object or bytes, warnings, content type)."""
        accept = h.headers.get("Accept", "")
        js = "application/json"
        if path in ("/healthz", "/livez", "/readyz"):
            return 200, b"ok", [], "text/plain; charset=utf-8"
        if path == "/version":
            return 200, disc.VERSION, [], js
        if path in ("/api", "/apis"):
            if disc.wants_aggregated(accept):
                return 200, disc.aggregated(path == "/api"), [], disc.AGGREGATED
            return 200, (disc.api_versions(f"{self.host}:{self.port}") if path == "/api" else
                         disc.api_group_list()), [], js
        if path == "/openapi/v3":
            return 200, disc.openapi_root(), [], js
        if path.startswith("/openapi/v3/"):
            doc = disc.openapi_document(path[len("/openapi/v3/"):])
            if doc is not None:
                return 200, doc, [], js
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["apis"] and len(parts) == 2 and disc.api_group(parts[1]):
            return 200, disc.api_group(parts[1]), [], js
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            doc = disc.resource_list(group, version)
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return 200, doc, [], js
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and disc.find(group, version, rest[2]):
            namespace, rest = rest[1], rest[2:]
        res = disc.find(group, version, rest[0])
        across = res is not None and res.namespaced and namespace is None and len(rest) == 1 and h.command == "GET"
        if res is None or len(rest) > 3 or (res.namespaced != (namespace is not None) and not across):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub is not None and sub not in res.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return self._verb(h, res, namespace, name, sub, query, body, user, accept)

    def _verb(self, h, res, ns, name, sub, query, body, user, accept):
        js = "application/json"
        method = h.command
        if method == "GET" and name is None:
            if query.get("watch") in ("true", "1"):
                self._watch(h, res, ns, query, accept)
                return 200, _WATCHED, [], js
            out = self.objects.list(res, ns, query)
            return 200, self._maybe_table(res, out["items"], out["metadata"], query, accept, list_items=True), [], js
        if method == "GET":
            obj = self.store.get((res.group, res.name), ns, name)
            if obj is None:
                raise not_found(res, name)
            return 200, self._maybe_table(res, [obj], {"resourceVersion": obj["metadata"]["resourceVersion"]}, query,
                                          accept) if disc.wants_table(accept) else obj, [], js
        if method == "POST" and name is None:
            obj = self._decode(body, h.headers.get("Content-Type", ""))
            obj, warnings = self.objects.create(res, ns, obj, query, user)
            return 201, obj, warnings, js
        if method == "POST" and sub == "binding":
            self.objects.bind(ns, name, self._decode(body))
            return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, [], js
        if method == "PUT" and name is not None:
            obj = self._decode(body, h.headers.get("Content-Type", ""))
            obj, warnings = self.objects.update(res, ns, name, sub, obj, query, user)
            return 200, obj, warnings, js
        if method == "PATCH" and name is not None:
            obj, warnings = self.objects.patch(res, ns, name, sub, body, h.headers.get("Content-Type", ""), query, user)
            return 200, obj, warnings, js
        if method == "DELETE" and name is not None and sub is None:
            return 200, self.objects.delete(res, ns, name, self._decode(body) if body else {}, query, user), [], js
        if method == "DELETE" and name is None:
            return 200, self.objects.delete_collection(res, ns, query, user), [], js
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    @staticmethod
    def _decode(body, content_type="application/json"):
        if content_type.startswith("application/vnd.kubernetes.protobuf"):
            try:
                return apiserver_proto.decode(body)
            except (ValueError, IndexError) as e:
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: "
                                                            f"{e}") from None
        try:
            obj = json.loads(body)
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"the body of the request is not JSON: {e} (YAML and protobuf are "
                                              "not served)") from None
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the body of the request is not a JSON object")
        return obj

    def _maybe_table(self, res, items, list_meta, query, accept, list_items=False):
        if disc.wants_table(accept):
            typed = [dict(o, kind=res.kind, apiVersion=disc.group_version(res)) for o in items]
            return disc.table(res.kind, typed, list_meta, query.get("includeObject", "Metadata"))
        if not list_items:
            return items[0]
        return {"kind": res.kind + "List", "apiVersion": disc.group_version(res), "metadata": list_meta,
                "items": [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items]}

    def _watch(self, h, res, ns, query, accept):
        match = self.objects.selector(res, query)
        key = (res.group, res.name)
        as_table = disc.wants_table(accept)
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        deadline = time.monotonic() + timeout if timeout else None
        bookmarks = query.get("allowWatchBookmarks") == "true"
        initial = query.get("sendInitialEvents") == "true"
        rv_param = query.get("resourceVersion", "")
        with self.store.cv:
            if rv_param in ("", "0") or initial:
                items, cursor = self.store.list(key, ns)
                first = [("ADDED", o) for o in items if match(o)]
            else:
                if not rv_param.isdigit():
                    raise ApiError(400, "BadRequest", f"invalid resource version: {rv_param}")
                cursor, first = int(rv_param), []
            h.testbed_entry["watching"] = True
            self.store.cv.notify_all()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header("Cache-Control", "no-cache, private")
        h.end_headers()
        h.close_connection = True

        def send(kind, obj):
            if as_table and kind != "ERROR" and kind != "BOOKMARK":
                obj = disc.table(res.kind, [obj], {"resourceVersion": obj["metadata"]["resourceVersion"]},
                                 query.get("includeObject", "Metadata"))
            data = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            h.wfile.flush()

        def bookmark(annotations=None):
            meta = {"resourceVersion": str(cursor)}
            if annotations:
                meta["annotations"] = annotations
            send("BOOKMARK", {"kind": res.kind, "apiVersion": disc.group_version(res), "metadata": meta})

        try:
            for kind, obj in first:
                send(kind, obj)
            if initial and bookmarks:
                bookmark({"k8s.io/initial-events-end": "true"})
            last_bookmark = time.monotonic()
            while not self._stopping.is_set():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                try:
                    changes = self.store.changes_after(cursor, min(left or 1.0, 1.0))
                except apiserver_store.Gone:
                    send("ERROR", ApiError(410, "Expired", f"too old resource version: {cursor} "
                                                           f"({self.store.rv})").status)
                    break
                for c in changes:
                    cursor = c.rv
                    if c.key != key or (ns is not None and c.namespace != ns):
                        continue
                    was, now = c.old is not None and match(c.old), c.type != "DELETED" and match(c.new)
                    if now:
                        send("MODIFIED" if was else "ADDED", c.new)
                    elif was:
                        gone = copy.deepcopy(c.old if c.type != "DELETED" else c.new)
                        gone["metadata"]["resourceVersion"] = str(c.rv)
                        send("DELETED", gone)
                if bookmarks and time.monotonic() - last_bookmark > self.bookmark_interval:
                    bookmark()
                    last_bookmark = time.monotonic()
                if not changes and self._client_gone(h):
                    return
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except OSError:
            pass

    @staticmethod
    def _client_gone(h):
        try:
            readable, _, _ = select.select([h.connection], [], [], 0)
            if not readable:
                return False
            h.connection.settimeout(0.1)
            return h.connection.recv(1) == b""
        except (OSError, ValueError):
            return True
        finally:
            try:
                h.connection.settimeout(120)
            except OSError:
                pass


_WATCHED = object()  # the watch wrote its own response
