"""What kube-apiserver does to a Pod beyond storing it, for the test bed's API
server (apiserver.py):

- before admission (`prepare_for_admission`): the defaults of the v1 scheme
  (restartPolicy, dnsPolicy, terminationGracePeriodSeconds, schedulerName,
  securityContext, enableServiceLinks; per container terminationMessage*,
  imagePullPolicy, `resources: {}`, requests defaulted from limits, probe,
  port and fieldRef defaults; per volume defaultMode and hostPath type), and
  the built-in admission plugins that run before the webhooks:
  ServiceAccount (serviceAccountName, the projected `kube-api-access-*`
  volume and its mount in every container), Priority (priority 0,
  preemptionPolicy) and DefaultTolerationSeconds (the not-ready and
  unreachable NoExecute tolerations, 300 s). As Go serializes it, the object
  sent to webhooks has `metadata.creationTimestamp: null` and `status: {}`;
  a generateName pod has no name yet, and no pod has a uid;
- after each webhook's patch (`apply_defaults`): the scheme's defaults again;
- before storing (`validate`): a subset of the Pod validation (names,
  containers, images, volume mounts naming volumes, env, extended-resource
  limits and requests), giving kube-apiserver's field paths and messages;
- on update (`check_update`): a pod's spec cannot change apart from images,
  activeDeadlineSeconds and added tolerations;
- `qos_class`, `initial_status` and `running_status` (what the kubelet
  reports for a running pod), for the server and for tests playing kubelet."""
import copy
import datetime
import random
import re

SA_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what kube-apiserver uses for generated name suffixes
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def random_suffix(n=5):
    return "".join(random.choice(NAME_ALPHABET) for _ in range(n))


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def all_containers(spec):
    return (spec.get("initContainers") or []) + (spec.get("containers") or []) + (spec.get("ephemeralContainers") or [])


# --- defaults -------------------------------------------------------------------
def _default_probe(p):
    if not isinstance(p, dict):
        return
    for k, v in (("timeoutSeconds", 1), ("periodSeconds", 10), ("successThreshold", 1), ("failureThreshold", 3)):
        p.setdefault(k, v)
    if isinstance(p.get("httpGet"), dict):
        p["httpGet"].setdefault("path", "/")
        p["httpGet"].setdefault("scheme", "HTTP")


def _default_field_ref(holder):
    if isinstance(holder, dict) and isinstance(holder.get("fieldRef"), dict):
        holder["fieldRef"].setdefault("apiVersion", "v1")


def _canonical_quantity(q):
    """A quantity given as a JSON number, as kube-apiserver writes it back: a string."""
    if isinstance(q, bool) or not isinstance(q, (int, float)):
        return q
    if q == int(q):
        return str(int(q))
    return f"{round(q * 1000)}m"


def _image_pull_policy(image):
    last = (image or "").rsplit("/", 1)[-1]
    if "@" in last:
        return "IfNotPresent"
    return "Always" if ":" not in last or last.endswith(":latest") else "IfNotPresent"


def _default_container(c, pod_level):
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("imagePullPolicy", _image_pull_policy(c.get("image")))
    res = c.setdefault("resources", {})
    for kind in ("limits", "requests"):
        if isinstance(res.get(kind), dict):
            res[kind] = {k: _canonical_quantity(v) for k, v in res[kind].items()}
    if pod_level and isinstance(res.get("limits"), dict):
        requests = res.setdefault("requests", {})
        for k, v in res["limits"].items():
            requests.setdefault(k, v)
    for port in c.get("ports") or []:
        port.setdefault("protocol", "TCP")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        _default_probe(c.get(probe))
    for e in c.get("env") or []:
        _default_field_ref(e.get("valueFrom"))


_VOLUME_SOURCES = ("hostPath", "emptyDir", "secret", "configMap", "projected", "persistentVolumeClaim", "downwardAPI",
                   "nfs", "csi", "ephemeral", "image", "iscsi", "fc", "cephfs", "rbd", "glusterfs")


def _default_volume(v):
    if not any(k in v for k in _VOLUME_SOURCES):
        v["emptyDir"] = {}
    for kind in ("secret", "configMap", "projected", "downwardAPI"):
        if isinstance(v.get(kind), dict):
            v[kind].setdefault("defaultMode", 420)
    if isinstance(v.get("hostPath"), dict):
        v["hostPath"].setdefault("type", "")
    for item in (v.get("downwardAPI") or {}).get("items") or []:
        _default_field_ref(item)
    for source in (v.get("projected") or {}).get("sources") or []:
        for item in (source.get("downwardAPI") or {}).get("items") or []:
            _default_field_ref(item)


def apply_defaults(pod):
    """The v1 scheme's defaults, in place (idempotent); returns the pod."""
    meta = pod.setdefault("metadata", {})
    meta.setdefault("creationTimestamp", None)
    spec = pod.setdefault("spec", {})
    for k, v in (("restartPolicy", "Always"), ("terminationGracePeriodSeconds", 30), ("dnsPolicy", "ClusterFirst"),
                 ("securityContext", {}), ("schedulerName", "default-scheduler"), ("enableServiceLinks", True)):
        spec.setdefault(k, v)
    if spec.get("serviceAccountName"):
        spec["serviceAccount"] = spec["serviceAccountName"]
    for c in spec.get("initContainers") or []:
        _default_container(c, True)
    for c in spec.get("containers") or []:
        _default_container(c, True)
    for c in spec.get("ephemeralContainers") or []:
        _default_container(c, False)
    for v in spec.get("volumes") or []:
        if isinstance(v, dict):
            _default_volume(v)
    pod.setdefault("status", {})
    return pod


# --- built-in admission before the webhooks ------------------------------------
def _service_account(pod):
    spec = pod["spec"]
    spec.setdefault("serviceAccountName", "default")
    spec["serviceAccount"] = spec["serviceAccountName"]
    if spec.get("automountServiceAccountToken") is False:
        return
    volumes = spec.setdefault("volumes", [])
    name = next((v["name"] for v in volumes if str(v.get("name", "")).startswith("kube-api-access-")), None)
    have_volume = name is not None
    name = name or "kube-api-access-" + random_suffix()
    needed = False
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        mounts = c.setdefault("volumeMounts", [])
        if not any(m.get("mountPath") == SA_MOUNT_PATH for m in mounts):
            mounts.append({"name": name, "readOnly": True, "mountPath": SA_MOUNT_PATH})
            needed = True
    if needed and not have_volume:
        volumes.append({"name": name, "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}})


def _tolerates(tolerations, key):
    for t in tolerations:
        if t.get("effect") not in (None, "", "NoExecute"):
            continue
        if t.get("operator") == "Exists" and t.get("key") in (None, "", key):
            return True
        if t.get("key") == key:
            return True
    return False


def prepare_for_admission(pod):
    """Defaults and the built-in plugins that run before mutating webhooks, in place."""
    apply_defaults(pod)
    _service_account(pod)
    spec = pod["spec"]
    if not spec.get("priorityClassName"):
        spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    tolerations = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not _tolerates(tolerations, key):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})
    if not tolerations:
        del spec["tolerations"]
    return pod


# --- validation -----------------------------------------------------------------
def _quantity(q):
    """A whole-number quantity as an int, else None (validation compares only whole numbers)."""
    if isinstance(q, bool):
        return None
    if isinstance(q, int):
        return q
    return int(q) if isinstance(q, str) and q.isdigit() else None


def _extended(resource):
    return "/" in resource and not resource.startswith(("kubernetes.io/", "requests.")) and \
        not resource.startswith("hugepages-")


def _validate_container(c, path, volumes, errors):
    if not c.get("name"):
        errors.append((f"{path}.name", "Required value", ""))
    elif not _DNS_LABEL.match(c["name"]):
        errors.append((f"{path}.name", "Invalid value", f'"{c["name"]}": a lowercase RFC 1123 label must consist of '
                       "lower case alphanumeric characters or '-'"))
    if not c.get("image") and not path.startswith("spec.ephemeral"):
        errors.append((f"{path}.image", "Required value", ""))
    paths = set()
    for n, m in enumerate(c.get("volumeMounts") or []):
        mp = f"{path}.volumeMounts[{n}]"
        if m.get("name") not in volumes:
            errors.append((f"{mp}.name", "Not found", f'"{m.get("name")}"'))
        if not m.get("mountPath"):
            errors.append((f"{mp}.mountPath", "Required value", ""))
        elif m["mountPath"] in paths:
            errors.append((f"{mp}.mountPath", "Invalid value", f'"{m["mountPath"]}": must be unique'))
        paths.add(m.get("mountPath"))
        if m.get("subPath") and m.get("subPathExpr"):
            errors.append((f"{mp}.subPathExpr", "Invalid value", f'"{m["subPathExpr"]}": subPathExpr and subPath '
                           "are mutually exclusive"))
    for n, e in enumerate(c.get("env") or []):
        ep = f"{path}.env[{n}]"
        if not _ENV_NAME.match(str(e.get("name", ""))):
            errors.append((f"{ep}.name", "Invalid value", f'"{e.get("name", "")}": a valid environment variable name '
                           "must consist of alphabetic characters, digits, '_', '-', or '.'"))
        if e.get("value") and e.get("valueFrom"):
            errors.append((f"{ep}.valueFrom", "Invalid value", "\"\": may not be specified when `value` is not empty"))
    res = c.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    for r in set(limits) | set(requests):
        if not _extended(r):
            continue
        if r not in limits:
            errors.append((f"{path}.resources.limits", "Required value", "Limit must be set for non overcommitable "
                           "resources"))
        elif r in requests and _quantity(requests[r]) != _quantity(limits[r]):
            errors.append((f"{path}.resources.requests[{r}]", "Invalid value", f'"{requests[r]}": must be equal to '
                           f"{r} limit of {limits[r]}"))


def validate(pod):
    """Returns [(field, type, detail)], empty when valid."""
    errors = []
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    name = meta.get("name") or ""
    if not name:
        errors.append(("metadata.name", "Required value", "name or generateName is required"))
    elif len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        errors.append(("metadata.name", "Invalid value", f'"{name}": a lowercase RFC 1123 subdomain must consist '
                       "of lower case alphanumeric characters, '-' or '.'"))
    volumes = set()
    for n, v in enumerate(spec.get("volumes") or []):
        vname = v.get("name") if isinstance(v, dict) else None
        if not vname or not _DNS_LABEL.match(vname):
            errors.append((f"spec.volumes[{n}].name", "Invalid value", f'"{vname}"'))
        elif vname in volumes:
            errors.append((f"spec.volumes[{n}].name", "Duplicate value", f'"{vname}"'))
        volumes.add(vname)
    if not spec.get("containers"):
        errors.append(("spec.containers", "Required value", ""))
    names = set()
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for n, c in enumerate(spec.get(field) or []):
            if not isinstance(c, dict):
                errors.append((f"spec.{field}[{n}]", "Invalid value", "not an object"))
                continue
            _validate_container(c, f"spec.{field}[{n}]", volumes, errors)
            if c.get("name") in names:
                errors.append((f"spec.{field}[{n}].name", "Duplicate value", f'"{c.get("name")}"'))
            names.add(c.get("name"))
    if spec.get("restartPolicy") not in ("Always", "OnFailure", "Never"):
        errors.append(("spec.restartPolicy", "Unsupported value", f'"{spec.get("restartPolicy")}"'))
    if spec.get("dnsPolicy") not in ("ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"):
        errors.append(("spec.dnsPolicy", "Unsupported value", f'"{spec.get("dnsPolicy")}"'))
    return errors


_MUTABLE_SPEC = ("`spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, "
                 "`spec.tolerations` (only additions to existing tolerations), "
                 "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)")


def check_update(old, new):
    """[(field, type, detail)] for changes an update of a pod may not make (the spec)."""
    def masked(spec):
        spec = copy.deepcopy(spec or {})
        for field in ("containers", "initContainers"):
            for c in spec.get(field) or []:
                c.pop("image", None)
        spec.pop("activeDeadlineSeconds", None)
        spec.pop("tolerations", None)
        return spec
    o, n = old.get("spec") or {}, new.get("spec") or {}
    added_only = all(t in (n.get("tolerations") or []) for t in (o.get("tolerations") or []))
    if masked(o) != masked(n) or not added_only:
        return [("spec", "Forbidden", f"pod updates may not change fields other than {_MUTABLE_SPEC}")]
    return []


# --- status ---------------------------------------------------------------------
def qos_class(pod):
    guaranteed, any_set = True, False
    for c in all_containers(pod.get("spec") or {}):
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for r in ("cpu", "memory"):
            if r in limits or r in requests:
                any_set = True
            if r not in limits or requests.get(r, limits.get(r)) != limits.get(r):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def initial_status(pod):
    """The status kube-apiserver gives a pod it stores on create."""
    return {"phase": "Pending", "qosClass": qos_class(pod)}


def running_status(pod, container_ids=None, pod_ip="10.244.0.10", host_ip="192.168.0.10"):
    """A status as a kubelet reports it for a pod whose containers all run.
    `container_ids` maps container names to IDs such as "containerd://<64 hex>";
    missing ones are made up."""
    now = now_rfc3339()
    container_ids = container_ids or {}

    def status_of(c):
        cid = container_ids.get(c["name"]) or "containerd://" + "".join(random.choice("0123456789abcdef")
                                                                        for _ in range(64))
        return {"name": c["name"], "state": {"running": {"startedAt": now}}, "lastState": {}, "ready": True,
                "restartCount": 0, "image": c.get("image", ""), "imageID": "", "containerID": cid, "started": True}
    spec = pod.get("spec") or {}
    status = {"phase": "Running", "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "podIP": pod_ip,
              "podIPs": [{"ip": pod_ip}], "startTime": now, "qosClass": qos_class(pod),
              "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                             for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                       "PodScheduled")],
              "containerStatuses": [status_of(c) for c in spec.get("containers") or []]}
    if spec.get("initContainers"):
        status["initContainerStatuses"] = [dict(status_of(c), ready=True, started=False,
                                                state={"terminated": {"exitCode": 0, "reason": "Completed",
                                                                      "startedAt": now, "finishedAt": now}})
                                           for c in spec["initContainers"]]
    return status
