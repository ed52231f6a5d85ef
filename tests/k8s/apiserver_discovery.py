"""What the test bed's API server (apiserver.py) serves about itself: the
resources it has, API discovery (the legacy documents and the aggregated
`apidiscovery.k8s.io/v2` ones kubectl asks for first), the OpenAPI v3
documents kubectl reads to learn that the server validates fields itself
(`fieldValidation` on PATCH), /version, and server-side tables
(`as=Table`) as `kubectl get` prints them."""
import collections
import datetime

Resource = collections.namedtuple("Resource", "group version name kind namespaced short_names categories subresources")

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
RESOURCES = [
    Resource("", "v1", "namespaces", "Namespace", False, ["ns"], [], ["status"]),
    Resource("", "v1", "nodes", "Node", False, ["no"], [], ["status"]),
    Resource("", "v1", "pods", "Pod", True, ["po"], ["all"], ["status", "binding"]),
    Resource("", "v1", "events", "Event", True, ["ev"], [], []),
    Resource("", "v1", "secrets", "Secret", True, [], [], []),
    Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration",
             False, [], ["api-extensions"], []),
]
VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.3-testbed", "gitCommit": "", "gitTreeState": "clean",
           "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.23", "compiler": "gc", "platform": "linux/amd64"}
AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def group_version(r):
    return f"{r.group}/{r.version}" if r.group else r.version


def find(group, version, name):
    return next((r for r in RESOURCES if (r.group, r.version, r.name) == (group, version, name)), None)


def groups():
    return sorted({r.group for r in RESOURCES if r.group})


def _sub_verbs(sub):
    return ["create"] if sub == "binding" else ["get", "patch", "update"]


def resource_list(group, version):
    """/api/v1 or /apis/<group>/<version> (APIResourceList), None if unknown."""
    rs = [r for r in RESOURCES if (r.group, r.version) == (group, version)]
    if not rs:
        return None
    out = []
    for r in rs:
        out.append({"name": r.name, "singularName": r.kind.lower(), "namespaced": r.namespaced, "kind": r.kind,
                    "verbs": VERBS, **({"shortNames": r.short_names} if r.short_names else {}),
                    **({"categories": r.categories} if r.categories else {})})
        for sub in r.subresources:
            kind = "Binding" if sub == "binding" else r.kind
            out.append({"name": f"{r.name}/{sub}", "singularName": "", "namespaced": r.namespaced, "kind": kind,
                        "verbs": _sub_verbs(sub)})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version(rs[0]), "resources": out}


def api_versions(address):
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]}


def _group(name):
    versions = sorted({r.version for r in RESOURCES if r.group == name})
    gvs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list():
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g) for g in groups()]}


def api_group(name):
    return dict(_group(name), kind="APIGroup", apiVersion="v1") if name in groups() else None


def _aggregated_group(name):
    versions = []
    for version in sorted({r.version for r in RESOURCES if r.group == name}):
        resources = []
        for r in (r for r in RESOURCES if (r.group, r.version) == (name, version)):
            gvk = {"group": r.group, "version": r.version, "kind": r.kind}
            entry = {"resource": r.name, "responseKind": gvk, "scope": "Namespaced" if r.namespaced else "Cluster",
                     "singularResource": r.kind.lower(), "verbs": VERBS}
            if r.short_names:
                entry["shortNames"] = r.short_names
            if r.categories:
                entry["categories"] = r.categories
            if r.subresources:
                entry["subresources"] = [
                    {"subresource": s, "verbs": _sub_verbs(s),
                     "responseKind": dict(gvk, kind="Binding") if s == "binding" else gvk} for s in r.subresources]
            resources.append(entry)
        versions.append({"version": version, "resources": resources, "freshness": "Current"})
    return {"metadata": {"name": name, "creationTimestamp": None}, "versions": versions}


def aggregated(legacy):
    """/api (legacy=True) or /apis as an APIGroupDiscoveryList."""
    names = [""] if legacy else groups()
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {},
            "items": [_aggregated_group(n) for n in names]}


def wants_aggregated(accept):
    """True when the Accept header asks for aggregated discovery v2 before anything else."""
    for part in (accept or "").split(","):
        params = {p.split("=", 1)[0].strip(): p.split("=", 1)[-1].strip() for p in part.split(";")[1:]}
        if params.get("g") == "apidiscovery.k8s.io" and params.get("as") == "APIGroupDiscoveryList":
            if params.get("v") == "v2":
                return True
            continue
        if part.strip().startswith(("application/json", "*/*")):
            return False
    return False


# --- OpenAPI v3 -------------------------------------------------------------------
def _openapi_path(r):
    return "api/v1" if not r.group else f"apis/{r.group}/{r.version}"


def openapi_root():
    paths = {_openapi_path(r): {"serverRelativeURL": f"/openapi/v3/{_openapi_path(r)}?hash=testbed"}
             for r in RESOURCES}
    return {"paths": paths}


def openapi_document(path):
    """/openapi/v3/<path>: each object's PATCH, with its GVK and the fieldValidation parameter,
    which is what kubectl looks for. No schemas: kubectl then builds strategic merge patches
    from its own types. None for an unknown path."""
    rs = [r for r in RESOURCES if _openapi_path(r) == path]
    if not rs:
        return None
    paths = {}
    for r in rs:
        base = f"/{path}/namespaces/{{namespace}}/{r.name}/{{name}}" if r.namespaced else f"/{path}/{r.name}/{{name}}"
        params = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
                  {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
                  {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}}]
        content = {t: {"schema": {"type": "object"}} for t in ("application/json-patch+json",
                                                               "application/merge-patch+json")}
        paths[base] = {"patch": {"operationId": f"patch{r.kind}", "parameters": params,
                                 "requestBody": {"content": content, "required": True},
                                 "responses": {"200": {"description": "OK"}},
                                 "x-kubernetes-action": "patch",
                                 "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version,
                                                                     "kind": r.kind}}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": VERSION["gitVersion"]}, "paths": paths,
            "components": {"schemas": {}}}


# --- tables --------------------------------------------------------------------------
def wants_table(accept):
    return "as=Table" in (accept or "")


def _age(meta):
    ts = meta.get("creationTimestamp")
    if not ts:
        return "<unknown>"
    then = datetime.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    s = int((datetime.datetime.now(datetime.timezone.utc) - then).total_seconds())
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s // n}{unit}"
    return f"{max(s, 0)}s"


def _pod_cells(pod):
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for s in statuses:
        waiting = (s.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    restarts = sum(s.get("restartCount", 0) for s in statuses)
    return [f"{ready}/{len(spec.get('containers') or [])}", reason, restarts, _age(pod["metadata"]),
            status.get("podIP") or "<none>", spec.get("nodeName") or "<none>", "<none>", "<none>"]


_COLUMNS = {
    "Pod": [("Ready", "string", 0), ("Status", "string", 0), ("Restarts", "string", 0), ("Age", "string", 0),
            ("IP", "string", 1), ("Node", "string", 1), ("Nominated Node", "string", 1),
            ("Readiness Gates", "string", 1)],
    "Event": [("Last Seen", "string", 0), ("Type", "string", 0), ("Reason", "string", 0), ("Object", "string", 0),
              ("Message", "string", 0)],
    "Namespace": [("Status", "string", 0), ("Age", "string", 0)],
}


def _cells(obj):
    kind, meta = obj.get("kind"), obj["metadata"]
    if kind == "Pod":
        return _pod_cells(obj)
    if kind == "Event":
        io = obj.get("involvedObject") or {}
        return [_age(meta), obj.get("type", ""), obj.get("reason", ""),
                f"{(io.get('kind') or '').lower()}/{io.get('name', '')}", obj.get("message", "")]
    if kind == "Namespace":
        return [(obj.get("status") or {}).get("phase", ""), _age(meta)]
    return [_age(meta)]


def table(kind, objects, list_meta, include_object="Metadata"):
    """A meta.k8s.io/v1 Table of `objects` (each with kind set), as kube-apiserver renders it."""
    cols = [("Name", "string", 0)] + _COLUMNS.get(kind, [("Age", "string", 0)])
    rows = []
    for o in objects:
        row = {"cells": [o["metadata"]["name"]] + _cells(o)}
        if include_object == "Object":
            row["object"] = o
        elif include_object != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": o["metadata"]}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta,
            "columnDefinitions": [{"name": n, "type": t, "format": "name" if n == "Name" else "", "description": n,
                                   "priority": p} for n, t, p in cols],
            "rows": rows}
