"""The objects of the test bed's API server (apiserver.py), as kube-apiserver's
registry handles them, without HTTP: create (defaults, mutating admission,
validation, generated names, uid, creationTimestamp, a pod's initial status),
update and the three patch types (a pod's spec may not change, status only
through pods/status, optimistic concurrency on resourceVersion, retried for
patches), pods/binding, delete (graceful for bound pods if asked; a namespace
takes its objects with it) and list with selectors and pages.

Every refusal is an ApiError carrying kube-apiserver's Status object."""
import base64
import copy
import json
import uuid

import apiserver_admission
import apiserver_discovery as disc
import apiserver_patch
import apiserver_pods
import apiserver_select
import apiserver_store

NAMESPACE_KEY = ("", "namespaces")
MWC_KEY = ("admissionregistration.k8s.io", "mutatingwebhookconfigurations")
PATCH_TYPES = {"application/json-patch+json": "json", "application/merge-patch+json": "merge",
               "application/strategic-merge-patch+json": "strategic"}


class ApiError(Exception):
    """A request the API server refuses; `status` is the Status object, `code` its HTTP code."""

    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code = code
        self.status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
                       "reason": reason, "code": code}
        if details:
            self.status["details"] = details

    @classmethod
    def from_status(cls, status):
        e = cls(status.get("code", 500), status.get("reason", ""), status.get("message", ""))
        e.status = status
        return e


def _qualified(res):
    return f"{res.name}.{res.group}" if res.group else res.name


def _secret_errors(secret):
    """What kube-apiserver refuses of a Secret: data values that are not
    base64, and a kubernetes.io/dockerconfigjson without a JSON
    `.dockerconfigjson`. `stringData` is merged into `data` first, as there."""
    for key, value in (secret.pop("stringData", None) or {}).items():
        secret.setdefault("data", {})[key] = base64.b64encode(str(value).encode()).decode()
    secret.setdefault("type", "Opaque")
    errors, decoded = [], {}
    for key, value in (secret.get("data") or {}).items():
        try:
            decoded[key] = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            errors.append((f"data[{key}]", "Invalid value", "illegal base64 data"))
    if secret["type"] == "kubernetes.io/dockerconfigjson":
        if ".dockerconfigjson" not in decoded:
            errors.append(("data[.dockerconfigjson]", "Required value", ""))
        else:
            try:
                json.loads(decoded[".dockerconfigjson"])
            except ValueError as e:
                errors.append(("data[.dockerconfigjson]", "Invalid value", f"invalid character: {e}"))
    return errors


def not_found(res, name):
    return ApiError(404, "NotFound", f'{_qualified(res)} "{name}" not found',
                    {"name": name, "group": res.group, "kind": res.name} if res.group else
                    {"name": name, "kind": res.name})


def _conflict(res, name):
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {_qualified(res)} "{name}": the object has '
                                     "been modified; please apply your changes to the latest version and try again",
                    {"name": name, "kind": res.name})


def _invalid(res, name, errors):
    parts = [f"{f}: {t}" + (f": {d}" if d else "") for f, t, d in errors]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    return ApiError(422, "Invalid", f'{res.kind} "{name}" is invalid: {joined}',
                    {"name": name, "kind": res.kind,
                     "causes": [{"reason": "Field" + t.replace(" ", ""), "message": f"{t}: {d}" if d else t,
                                 "field": f} for f, t, d in errors]})


def _now():
    return apiserver_pods.now_rfc3339()


def _refusal_as_api_error(fn, *args, **kwargs):
    """fn(...), with an admission refusal raised as the ApiError of its Status."""
    try:
        return fn(*args, **kwargs)
    except apiserver_admission.AdmissionError as e:
        raise ApiError.from_status(e.status) from None


def resource(name):
    """The served resource called `name` (e.g. "pods"); ValueError if there is none."""
    r = next((r for r in disc.RESOURCES if r.name == name), None)
    if r is None:
        raise ValueError(f"no resource {name!r}")
    return r


class Objects:
    """`store` an apiserver_store.Store, `admission` an apiserver_admission.Dispatcher.
    Methods take the resource (a disc.Resource), the namespace (None for cluster-scoped
    objects), the query parameters of the request (dryRun, fieldManager, selectors) and the
    user (the userInfo sent to webhooks; None for the test's own calls)."""

    def __init__(self, store, admission, graceful_pod_deletion=False):
        self.store = store
        self.admission = admission
        self.graceful_pod_deletion = graceful_pod_deletion

    def check_type(self, res, obj):
        gv = disc.group_version(res)
        if obj.get("apiVersion") not in (None, gv):
            raise ApiError(400, "BadRequest", f"the API version in the data ({obj.get('apiVersion')}) does not match "
                                              f"the expected API version ({gv})")
        if obj.get("kind") not in (None, res.kind):
            raise ApiError(400, "BadRequest", f'{obj.get("kind")} in version "{res.version}" cannot be handled as a '
                                              f"{res.kind}")
        obj["apiVersion"], obj["kind"] = gv, res.kind
        if not isinstance(obj.get("metadata", {}), dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")

    def admit(self, res, operation, ns, name, obj, old, query, user, sub=None):
        after = apiserver_pods.apply_defaults if res.name == "pods" else None
        options = {"kind": {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}[operation],
                   "apiVersion": "meta.k8s.io/v1"}
        if query.get("fieldManager"):
            options["fieldManager"] = query["fieldManager"]
        return _refusal_as_api_error(
            self.admission.admit, operation, (res.group, res.version, res.name, res.kind), res.namespaced, ns, name,
            obj, old, subresource=sub or "", dry_run=query.get("dryRun") == "All", user=user, options=options,
            after_patch=after)

    def validate(self, res, obj):
        name = obj["metadata"].get("name", "")
        if res.name == "pods":
            errors = apiserver_pods.validate(obj)
        else:
            errors = [] if name else [("metadata.name", "Required value", "name or generateName is required")]
        if res.name == "events":
            io_ns = (obj.get("involvedObject") or {}).get("namespace")
            if io_ns and io_ns != obj["metadata"].get("namespace"):
                errors.append(("involvedObject.namespace", "Invalid value", f'"{io_ns}": does not match '
                               "event.namespace"))
        if res.name == "secrets":
            errors += _secret_errors(obj)
        if errors:
            raise _invalid(res, name, errors)

    def create(self, res, ns, obj, query, user):
        """(stored object, warnings)."""
        self.check_type(res, obj)
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                                                  "sent on the request")
            if self.store.get(NAMESPACE_KEY, None, ns) is None:
                raise not_found(resource("namespaces"), ns)
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        for k in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "generation", "managedFields"):
            meta.pop(k, None)
        if res.name == "pods":
            apiserver_pods.prepare_for_admission(obj)
        elif res.name == "namespaces":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta.get("name", "")
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            obj["status"] = {"phase": "Active"}
        elif res.name == "mutatingwebhookconfigurations":
            _refusal_as_api_error(apiserver_admission.default_and_validate, obj)
        obj, warnings = self.admit(res, "CREATE", ns, meta.get("name", ""), obj, None, query, user)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + apiserver_pods.random_suffix()
        self.validate(res, obj)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        if res.name == "pods":
            obj["status"] = apiserver_pods.initial_status(obj)
        if res.name == "mutatingwebhookconfigurations":
            meta["generation"] = 1
        if query.get("dryRun") == "All":
            return obj, warnings
        try:
            return self.store.write((res.group, res.name), ns, meta["name"], obj, create=True), warnings
        except apiserver_store.Conflict:
            raise ApiError(409, "AlreadyExists", f'{_qualified(res)} "{meta["name"]}" already exists',
                           {"name": meta["name"], "kind": res.name}) from None

    def prepare_update(self, res, current, new, sub):
        """`new` as it may be stored over `current` (kube-apiserver's update strategies)."""
        meta, cur_meta = new.setdefault("metadata", {}), current["metadata"]
        if meta.get("name", cur_meta["name"]) != cur_meta["name"]:
            raise ApiError(400, "BadRequest", f"the name of the object ({meta.get('name')}) does not match the name "
                                              f"on the URL ({cur_meta['name']})")
        for k in ("name", "namespace", "uid", "creationTimestamp", "generateName", "deletionTimestamp",
                  "deletionGracePeriodSeconds", "generation"):
            if k in cur_meta:
                meta[k] = cur_meta[k]
            else:
                meta.pop(k, None)
        if res.name in ("pods", "namespaces", "nodes"):
            if sub == "status":
                new["spec"] = copy.deepcopy(current.get("spec"))
                if res.name == "pods" and "ownerReferences" in cur_meta:
                    meta["ownerReferences"] = cur_meta["ownerReferences"]
            else:
                new["status"] = copy.deepcopy(current.get("status"))
        if res.name == "pods":
            apiserver_pods.apply_defaults(new)
            errors = apiserver_pods.check_update(current, new)
            if errors:
                raise _invalid(res, cur_meta["name"], errors)
        if res.name == "mutatingwebhookconfigurations":
            _refusal_as_api_error(apiserver_admission.default_and_validate, new)
            if new.get("webhooks") != current.get("webhooks"):
                meta["generation"] = cur_meta.get("generation", 1) + 1
        return new

    def store_update(self, res, ns, current, new, query, user, sub, expected_rv):
        new = self.prepare_update(res, current, new, sub)
        new, warnings = self.admit(res, "UPDATE", ns, current["metadata"]["name"], new, current, query, user, sub)
        self.validate(res, new)
        if query.get("dryRun") == "All":
            return new, warnings
        return self.store.write((res.group, res.name), ns, current["metadata"]["name"], new,
                                expected_rv=expected_rv), warnings

    def update(self, res, ns, name, sub, obj, query, user):
        self.check_type(res, obj)
        wanted_rv = (obj.get("metadata") or {}).get("resourceVersion")
        for _ in range(10):
            current = self.store.get((res.group, res.name), ns, name)
            if current is None:
                raise not_found(res, name)
            try:
                return self.store_update(res, ns, current, copy.deepcopy(obj), query, user, sub,
                                          wanted_rv or current["metadata"]["resourceVersion"])
            except apiserver_store.Conflict:
                if wanted_rv:
                    raise _conflict(res, name) from None
        raise _conflict(res, name)

    def patch(self, res, ns, name, sub, body, content_type, query, user):
        kind = PATCH_TYPES.get(content_type.split(";")[0].strip())
        if kind is None:
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - accepted "
                                                        f"media types include: {', '.join(PATCH_TYPES)} (server-side "
                                                        "apply is not served)")
        try:
            patch = json.loads(body)
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"error decoding patch: {e}") from None
        apply = {"json": apiserver_patch.json_patch, "merge": apiserver_patch.merge_patch,
                 "strategic": apiserver_patch.strategic_merge_patch}[kind]
        return self.update_with(res, ns, name, sub, lambda current: apply(current, patch), query, user)

    def update_with(self, res, ns, name, sub, change, query=None, user=None):
        """Applies change(current) -> new, retrying on conflicts; (object, warnings) for HTTP,
        the object alone when called from Python (query None)."""
        for _ in range(10):
            current = self.store.get((res.group, res.name), ns, name)
            if current is None:
                raise not_found(res, name)
            try:
                new = change(copy.deepcopy(current))
            except apiserver_patch.PatchError as e:
                raise ApiError(422, "Invalid", str(e)) from None
            if not isinstance(new, dict):
                raise ApiError(422, "Invalid", "the patched object is not a JSON object")
            self.check_type(res, new)
            wanted_rv = (new.get("metadata") or {}).get("resourceVersion")
            if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
                raise _conflict(res, name)
            try:
                out = self.store_update(res, ns, current, new, query or {}, user, sub,
                                         current["metadata"]["resourceVersion"])
                return out if query is not None else out[0]
            except apiserver_store.Conflict:
                continue
        raise _conflict(res, name)

    def bind(self, ns, name, binding):
        node = (binding.get("target") or {}).get("name")
        if not node:
            raise ApiError(422, "Invalid", "Binding: target.name: Required value")

        def change(pod):
            if pod["spec"].get("nodeName"):
                raise ApiError(409, "Conflict", f"Operation cannot be fulfilled on pods/binding \"{name}\": pod "
                                                f"{name} is already assigned to node \"{pod['spec']['nodeName']}\"")
            pod["spec"]["nodeName"] = node
            conds = [c for c in pod["status"].get("conditions") or [] if c.get("type") != "PodScheduled"]
            pod["status"]["conditions"] = conds + [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                                    "lastTransitionTime": _now()}]
            return pod
        # A binding changes spec.nodeName, which no update may: it writes the store directly.
        for _ in range(10):
            current = self.store.get(("", "pods"), ns, name)
            if current is None:
                raise not_found(resource("pods"), name)
            try:
                return self.store.write(("", "pods"), ns, name, change(current),
                                        expected_rv=current["metadata"]["resourceVersion"])
            except apiserver_store.Conflict:
                continue
        raise _conflict(resource("pods"), name)

    def delete(self, res, ns, name, options, query, user):
        current = self.store.get((res.group, res.name), ns, name)
        if current is None:
            raise not_found(res, name)
        pre = options.get("preconditions") or {}
        for field in ("uid", "resourceVersion"):
            if pre.get(field) and pre[field] != current["metadata"].get(field):
                raise ApiError(409, "Conflict", f"Operation cannot be fulfilled on {_qualified(res)} \"{name}\": "
                                                f"Precondition failed: {field.upper() if field == 'uid' else field} in "
                                                f"precondition: {pre[field]}, {field} in object meta: "
                                                f"{current['metadata'].get(field)}")
        if query.get("dryRun") == "All" or (options.get("dryRun") or []) == ["All"]:
            return current
        self.admit(res, "DELETE", ns, name, None, current, query, user)
        if res.name == "pods" and self.graceful_pod_deletion and current["spec"].get("nodeName"):
            grace = options.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
            grace = int(grace if grace is not None else current["spec"].get("terminationGracePeriodSeconds", 30))
            if grace > 0:
                if current["metadata"].get("deletionTimestamp"):
                    return current
                current["metadata"]["deletionTimestamp"] = _now()
                current["metadata"]["deletionGracePeriodSeconds"] = grace
                return self.store.write(("", "pods"), ns, name, current)
        if res.name == "namespaces":
            for r in disc.RESOURCES:
                if r.namespaced:
                    for o in self.store.list((r.group, r.name), name)[0]:
                        self.store.delete((r.group, r.name), name, o["metadata"]["name"])
        gone = self.store.delete((res.group, res.name), ns, name)
        if res.name in ("pods", "namespaces"):
            return gone
        details = {"name": name, "kind": res.name, "uid": current["metadata"]["uid"]}
        if res.group:
            details["group"] = res.group
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}

    def delete_collection(self, res, ns, query, user):
        items = self.list(res, ns, query)["items"]
        deleted = [self.delete(res, o["metadata"].get("namespace"), o["metadata"]["name"], {}, query, user)
                   for o in items]
        return {"kind": res.kind + "List", "apiVersion": disc.group_version(res), "metadata": {},
                "items": [o for o in deleted if o.get("kind") != "Status"]}

    # --- list ---------------------------------------------------------------------------
    def selector(self, res, query):
        try:
            labels = apiserver_select.parse_label_selector(query.get("labelSelector", ""))
            fields = apiserver_select.parse_field_selector(query.get("fieldSelector", ""), (res.group, res.name))
        except apiserver_select.SelectorError as e:
            raise ApiError(400, "BadRequest", str(e)) from None
        return lambda o: labels(o["metadata"].get("labels")) and fields(o)

    def list(self, res, ns, query):
        match = self.selector(res, query)
        items, rv = self.store.list((res.group, res.name), ns)
        items = [o for o in items if match(o)]
        meta = {"resourceVersion": str(rv)}
        start = query.get("continue")
        if start:
            try:
                token = json.loads(base64.urlsafe_b64decode(start.encode()))
                after = tuple(token["after"])
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "BadRequest", "invalid continue token") from None
            items = [o for o in items if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > after]
        limit = int(query.get("limit") or 0)
        if 0 < limit < len(items):
            last = items[limit - 1]["metadata"]
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"rv": rv, "after": [last.get("namespace", ""), last["name"]]}).encode()).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {"items": items, "metadata": meta}
