"""Mutating admission as kube-apiserver does it, for the test bed's API server
(apiserver.py).

`default_and_validate(config)` gives a MutatingWebhookConfiguration the
defaults kube-apiserver stores (failurePolicy Fail, matchPolicy Equivalent,
timeoutSeconds 10, reinvocationPolicy Never, service port 443, rule scope
`*`, empty selectors) and refuses what it refuses (no clientConfig or both
kinds, a `url` that is not https, sideEffects other than None or
NoneOnDryRun, no `v1` in admissionReviewVersions, a timeout outside 1-30, a
matchCondition that does not compile).

`Dispatcher.admit(...)` runs the stored configurations, sorted by name, over
one request: each webhook whose rules, namespaceSelector, objectSelector and
matchConditions select it gets an `admission.k8s.io/v1` AdmissionReview
over HTTPS, with the certificate checked against `clientConfig.caBundle`
(the system roots when empty) and the name in it against the host: the URL's
host for `url`, and `<service>.<namespace>.svc` for `service`, which is
connected to through the address that `resolve_service` gives. The call is
bounded by timeoutSeconds (the whole exchange, not each read). A call that
fails (connection, TLS, timeout, a status other than 200, an answer that is
not an AdmissionReview v1 with the request's uid) admits the object
unchanged under failurePolicy Ignore and rejects it with a 500 under Fail;
a matchCondition that fails to evaluate does the same. A webhook that
answers `allowed: false` rejects it (its status, at least 400). A patch that
is not a JSONPatch or does not apply rejects it with a 500, whatever the
policy. After each patch `after_patch` (the scheme's defaults) runs again.
Webhooks with reinvocationPolicy IfNeeded are called a second time when a
later webhook changed the object. Warnings are collected for the client's
`Warning:` headers.

Every call is recorded (`Dispatcher.calls`) with the webhook, the outcome and
the error, for tests to assert on."""
import base64
import binascii
import copy
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
import uuid

import apiserver_patch
import apiserver_select


class AdmissionError(Exception):
    """Rejects the request; `status` is the Kubernetes Status object to answer with."""

    def __init__(self, status):
        super().__init__(status["message"])
        self.status = status


class CallError(Exception):
    """A webhook call that failed; failurePolicy decides what follows."""


def _invalid(name, causes):
    msg = "; ".join(f"{f}: {d}" for f, d in causes)
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Invalid", "code": 422,
            "message": f'MutatingWebhookConfiguration.admissionregistration.k8s.io "{name}" is invalid: {msg}',
            "details": {"name": name, "group": "admissionregistration.k8s.io",
                        "kind": "MutatingWebhookConfiguration",
                        "causes": [{"reason": "FieldValueInvalid", "message": d, "field": f} for f, d in causes]}}


def default_and_validate(config):
    """Defaults `config` in place; raises AdmissionError (422) if kube-apiserver would refuse it."""
    name = (config.get("metadata") or {}).get("name", "")
    causes = []
    seen = set()
    for n, wh in enumerate(config.get("webhooks") or []):
        p = f"webhooks[{n}]"
        wh.setdefault("failurePolicy", "Fail")
        wh.setdefault("matchPolicy", "Equivalent")
        wh.setdefault("namespaceSelector", {})
        wh.setdefault("objectSelector", {})
        wh.setdefault("timeoutSeconds", 10)
        wh.setdefault("reinvocationPolicy", "Never")
        for rule in wh.get("rules") or []:
            rule.setdefault("scope", "*")
        cc = wh.get("clientConfig") or {}
        if "service" in cc:
            cc["service"].setdefault("port", 443)
        if wh.get("name", "").count(".") < 2:
            causes.append((f"{p}.name", "should be a domain with at least three segments separated by dots"))
        if wh.get("name") in seen:
            causes.append((f"{p}.name", "Duplicate value"))
        seen.add(wh.get("name"))
        if ("url" in cc) == ("service" in cc):
            causes.append((f"{p}.clientConfig", "exactly one of url or service is required"))
        if "url" in cc and urllib.parse.urlsplit(cc["url"]).scheme != "https":
            causes.append((f"{p}.clientConfig.url", "'https' is the only allowed URL scheme"))
        if wh.get("sideEffects") not in ("None", "NoneOnDryRun"):
            causes.append((f"{p}.sideEffects", "Unsupported value: must be None or NoneOnDryRun"))
        if "v1" not in (wh.get("admissionReviewVersions") or []):
            causes.append((f"{p}.admissionReviewVersions", "must include v1 (the only version the test bed speaks)"))
        if not 1 <= wh["timeoutSeconds"] <= 30:
            causes.append((f"{p}.timeoutSeconds", "must be between 1 and 30 seconds"))
        if wh["failurePolicy"] not in ("Ignore", "Fail"):
            causes.append((f"{p}.failurePolicy", "Unsupported value"))
        for m, cond in enumerate(wh.get("matchConditions") or []):
            try:
                apiserver_select.compile_cel(cond.get("expression", ""))
            except apiserver_select.CelError as e:
                causes.append((f"{p}.matchConditions[{m}].expression",
                               f"compilation failed: {e} (the test bed evaluates a subset of CEL)"))
    if causes:
        raise AdmissionError(_invalid(name, causes))
    return config


def _status(code, reason, message):
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class Dispatcher:
    """Runs mutating webhooks.

    `configs()` returns the stored MutatingWebhookConfigurations;
    `namespace_labels(ns)` the labels of a namespace (None if it is missing);
    `resolve_service(namespace, name, port)` a (host, port) to connect to, or
    None when there is no such Service."""

    def __init__(self, configs, namespace_labels, resolve_service):
        self._configs = configs
        self._namespace_labels = namespace_labels
        self._resolve = resolve_service
        self._lock = threading.Lock()
        self.calls = []

    # --- selection -----------------------------------------------------------
    @staticmethod
    def _rule_matches(rule, op, gvr, subresource, namespaced):
        def has(values, v):
            return "*" in values or v in values
        resources = rule.get("resources") or []
        wanted = gvr[2] + ("/" + subresource if subresource else "")
        resource_ok = wanted in resources or "*/*" in resources or (not subresource and "*" in resources) or \
            (subresource and f"{gvr[2]}/*" in resources) or (subresource and f"*/{subresource}" in resources)
        scope = rule.get("scope", "*")
        scope_ok = scope == "*" or (scope == "Namespaced") == namespaced
        return (has(rule.get("operations") or [], op) and has(rule.get("apiGroups") or [], gvr[0]) and
                has(rule.get("apiVersions") or [], gvr[1]) and resource_ok and scope_ok)

    def _selects(self, wh, req):
        if not any(self._rule_matches(r, req["operation"], req["_gvr"], req.get("subResource"), req["_namespaced"])
                   for r in wh.get("rules") or []):
            return False
        obj = req["object"] if req["object"] is not None else req["oldObject"]
        labels = [((o or {}).get("metadata") or {}).get("labels") or {} for o in (req["object"], req["oldObject"])
                  if o is not None]
        if not any(apiserver_select.label_selector_matches(wh.get("objectSelector"), l) for l in labels):
            return False
        if req["_gvr"][:3] == ("", "v1", "namespaces"):
            ns_labels = (obj.get("metadata") or {}).get("labels") or {}
        elif req["_namespaced"]:
            ns_labels = self._namespace_labels(req["namespace"]) or {}
        else:
            return True
        return apiserver_select.label_selector_matches(wh.get("namespaceSelector"), ns_labels)

    def _conditions_pass(self, wh, req):
        """True/False, or raises CallError when a condition fails to evaluate."""
        errors = []
        public = {k: v for k, v in req.items() if not k.startswith("_")}
        for cond in wh.get("matchConditions") or []:
            try:
                if not apiserver_select.compile_cel(cond["expression"])(req["object"], req["oldObject"], public):
                    return False
            except apiserver_select.CelError as e:
                errors.append(f"{cond.get('name')}: {e}")
        if errors:
            raise CallError("failed to evaluate match condition: " + "; ".join(errors))
        return True

    # --- the call -------------------------------------------------------------
    def _target(self, wh):
        """(host to connect to, its port, server name, the port in the URL, path, URL for messages)."""
        cc = wh.get("clientConfig") or {}
        query = f"timeout={wh['timeoutSeconds']}s"
        if "url" in cc:
            u = urllib.parse.urlsplit(cc["url"])
            port = u.port or 443
            path = (u.path or "/") + "?" + (u.query + "&" if u.query else "") + query
            return u.hostname, port, u.hostname, port, path, f"https://{u.netloc}{path}"
        svc = cc["service"]
        server_name = f"{svc['name']}.{svc['namespace']}.svc"
        path = (svc.get("path") or "/") + "?" + query
        url = f"https://{server_name}:{svc['port']}{path}"
        address = self._resolve(svc["namespace"], svc["name"], svc["port"])
        if address is None:
            raise CallError(f'Post "{url}": service "{svc["name"]}" not found')
        return address[0], address[1], server_name, svc["port"], path, url

    @staticmethod
    def _tls_context(wh):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        bundle = (wh.get("clientConfig") or {}).get("caBundle")
        if bundle:
            try:
                ctx.load_verify_locations(cadata=base64.b64decode(bundle, validate=True).decode())
            except (binascii.Error, ValueError, ssl.SSLError) as e:
                raise CallError(f"could not get REST client: unable to load root certificates: {e}") from None
        else:
            ctx.load_default_certs()
        return ctx

    def _post(self, wh, body):
        """The webhook's answer (status, bytes); raises CallError."""
        host, port, server_name, url_port, path, url = self._target(wh)
        ctx = self._tls_context(wh)
        timeout = wh["timeoutSeconds"]
        out, sock_box = {}, []

        def exchange():
            try:
                raw = socket.create_connection((host, port), timeout=timeout)
                sock_box.append(raw)
                tls = ctx.wrap_socket(raw, server_hostname=server_name)
                sock_box.append(tls)
                conn = http.client.HTTPSConnection(server_name, url_port, timeout=timeout)  # the Host header
                conn.sock = tls
                conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                               "Accept": "application/json, */*",
                                                               "User-Agent": "kube-apiserver-admission"})
                r = conn.getresponse()
                out["result"] = (r.status, r.read())
                conn.close()
            except ssl.SSLCertVerificationError as e:
                out["error"] = f"tls: failed to verify certificate: {e.verify_message or e}"
            except (OSError, http.client.HTTPException) as e:
                out["error"] = str(e) or type(e).__name__

        worker = threading.Thread(target=exchange, daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            for s in sock_box:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            worker.join(5)
            raise CallError(f'Post "{url}": context deadline exceeded')
        if "error" in out:
            raise CallError(f'Post "{url}": {out["error"]}')
        return out["result"]

    def _call(self, wh, req):
        """The webhook's `response`; raises CallError."""
        public = {k: v for k, v in req.items() if not k.startswith("_")}
        review = {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": public}
        status, body = self._post(wh, json.dumps(review).encode())
        if status != 200:
            raise CallError(f"expected response status 200 from the webhook, got {status}: "
                            f"{body[:200].decode(errors='replace')}")
        try:
            answer = json.loads(body)
        except ValueError as e:
            raise CallError(f"the response is not JSON: {e}") from None
        if not isinstance(answer, dict) or answer.get("apiVersion") != "admission.k8s.io/v1" or \
                answer.get("kind") != "AdmissionReview":
            raise CallError("expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got "
                            f"{answer.get('apiVersion') if isinstance(answer, dict) else type(answer).__name__}")
        resp = answer.get("response")
        if not isinstance(resp, dict):
            raise CallError("webhook response was absent")
        if resp.get("uid") != req["uid"]:
            raise CallError(f"expected response.uid={req['uid']!r}, got {resp.get('uid')!r}")
        return resp

    # --- the request ----------------------------------------------------------
    def _record(self, **entry):
        with self._lock:
            self.calls.append(entry)

    def _one(self, config_name, wh, req, warnings):
        """Calls one webhook; returns the (maybe patched) object."""
        started = time.monotonic()
        name = wh["name"]
        try:
            if not self._conditions_pass(wh, req):
                return req["object"]
            resp = self._call(wh, req)
        except CallError as e:
            message = f'failed calling webhook "{name}": failed to call webhook: {e}'
            self._record(configuration=config_name, webhook=name, uid=req["uid"], outcome="error", error=message,
                         policy=wh["failurePolicy"], seconds=time.monotonic() - started)
            if wh["failurePolicy"] == "Ignore":
                return req["object"]
            raise AdmissionError(dict(_status(500, "InternalError", f"Internal error occurred: {message}"),
                                      details={"causes": [{"message": message}]})) from None
        warnings.extend(w for w in resp.get("warnings") or [] if isinstance(w, str))
        entry = dict(configuration=config_name, webhook=name, uid=req["uid"], policy=wh["failurePolicy"],
                     warnings=list(resp.get("warnings") or []), seconds=time.monotonic() - started, error=None)
        if not resp.get("allowed"):
            st = dict(resp.get("status") or {})
            code = max(int(st.get("code") or 0), 400)
            why = st.get("message") or st.get("reason")
            msg = f'admission webhook "{name}" denied the request' + (f": {why}" if why else " without explanation")
            self._record(outcome="denied", **entry)
            raise AdmissionError(dict(_status(code, st.get("reason") or "", msg), details=st.get("details") or {}))
        if "patch" not in resp:
            self._record(outcome="allowed", **entry)
            return req["object"]
        try:
            if resp.get("patchType") != "JSONPatch":
                raise ValueError(f"unsupported patch type {resp.get('patchType')!r}")
            patch = json.loads(base64.b64decode(resp["patch"], validate=True))
            patched = apiserver_patch.json_patch(req["object"], patch)
        except (ValueError, binascii.Error, apiserver_patch.PatchError) as e:
            self._record(outcome="bad patch", **dict(entry, error=str(e)))
            raise AdmissionError(_status(500, "InternalError", f"Internal error occurred: JSON patch of "
                                                                f'webhook "{name}" failed: {e}')) from None
        self._record(outcome="patched", **entry)
        return patched

    def admit(self, operation, gvr, namespaced, namespace, name, obj, old, *, subresource="", dry_run=False,
              user=None, options=None, after_patch=None):
        """Runs the webhooks; returns (object, warnings). Raises AdmissionError.

        `gvr` is (group, version, resource, kind); `obj` is None for DELETE.
        `after_patch(obj)` re-applies the scheme's defaults to a patched object."""
        group, version, resource, kind = gvr
        req = {"uid": str(uuid.uuid4()),
               "kind": {"group": group, "version": version, "kind": kind},
               "resource": {"group": group, "version": version, "resource": resource},
               "requestKind": {"group": group, "version": version, "kind": kind},
               "requestResource": {"group": group, "version": version, "resource": resource},
               "namespace": namespace or "", "operation": operation,
               "userInfo": user or {"username": "testbed-admin", "groups": ["system:masters", "system:authenticated"]},
               "object": copy.deepcopy(obj), "oldObject": copy.deepcopy(old), "dryRun": bool(dry_run),
               "options": options, "_gvr": (group, version, resource), "_namespaced": namespaced}
        if name:
            req["name"] = name
        if subresource:
            req["subResource"] = req["requestSubResource"] = subresource
        warnings = []
        if resource == "mutatingwebhookconfigurations" or resource == "validatingwebhookconfigurations":
            return obj, warnings  # never sent to webhooks, as in kube-apiserver
        selected = [(c["metadata"]["name"], wh) for c in sorted(self._configs(), key=lambda c: c["metadata"]["name"])
                    for wh in c.get("webhooks") or []]
        left_by = {}  # webhook name -> the object as it left that webhook
        for config_name, wh in selected:
            if not self._selects(wh, req):
                continue
            req["uid"] = str(uuid.uuid4())
            patched = self._one(config_name, wh, req, warnings)
            if patched is not req["object"] and operation != "DELETE":
                req["object"] = after_patch(patched) if after_patch else patched
            left_by[wh["name"]] = req["object"]
        for config_name, wh in selected:
            if wh.get("reinvocationPolicy") != "IfNeeded" or wh["name"] not in left_by:
                continue
            if left_by[wh["name"]] == req["object"] or not self._selects(wh, req):  # no later webhook changed it
                continue
            req["uid"] = str(uuid.uuid4())
            patched = self._one(config_name, wh, req, warnings)
            if patched is not req["object"]:
                req["object"] = after_patch(patched) if after_patch else patched
        return req["object"], warnings
