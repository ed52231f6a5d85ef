"""The three patch formats of the Kubernetes API, for the test bed's API server
(apiserver.py): RFC 6902 JSON Patch, RFC 7386 JSON merge patch, and the
strategic merge patch that kubectl sends for built-in types.

Every function takes a JSON document (dicts, lists, scalars) and a patch, and
returns a new document; the input is never changed. A patch that does not
apply raises PatchError with the reason.

The strategic merge patch knows the merge keys of the fields of Pods, Events,
Namespaces and MutatingWebhookConfigurations (MERGE_KEYS, by field name: the
types served here never use one name with two keys). Lists without a key are
replaced, as for atomic lists. The directives kubectl produces are handled:
`$patch` (replace, delete, merge) in maps and list items, `$retainKeys`,
`$setElementOrder/<field>` and `$deleteFromPrimitiveList/<field>`."""
import copy

# Field name -> merge key of the list of objects under it.
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "volumes": "name",
    "env": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath", "ports": "containerPort",
    "imagePullSecrets": "name", "hostAliases": "ip", "ownerReferences": "uid", "conditions": "type",
    "webhooks": "name", "resourceClaims": "name", "schedulingGates": "name", "podIPs": "ip", "hostIPs": "ip",
}
# Lists of scalars that a strategic merge patch merges (a set union) instead of replacing.
MERGED_SCALAR_LISTS = {"finalizers"}


class PatchError(Exception):
    """A patch that cannot be applied; str() is the reason."""


# --- RFC 6902 ------------------------------------------------------------------
def _pointer(path):
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(seq, token, allow_end):
    if token == "-" and allow_end:
        return len(seq)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r}")
    i = int(token)
    if i > len(seq) or (i == len(seq) and not allow_end):
        raise PatchError(f"array index {i} out of bounds (length {len(seq)})")
    return i


def _parent(doc, tokens, path):
    node = doc
    for t in tokens[:-1]:
        if isinstance(node, dict):
            if t not in node:
                raise PatchError(f"path {path!r}: no member {t!r}")
            node = node[t]
        elif isinstance(node, list):
            node = node[_index(node, t, False)]
        else:
            raise PatchError(f"path {path!r}: {t!r} is not in an object or array")
    return node


def _member(doc, path, remove=False):
    """The value at `path`, which must exist; taken out of the document when `remove`."""
    tokens = _pointer(path)
    if not tokens:
        if remove:
            raise PatchError("cannot remove the whole document")
        return doc
    parent, last = _parent(doc, tokens, path), tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path {path!r} does not exist")
        return parent.pop(last) if remove else parent[last]
    if isinstance(parent, list):
        i = _index(parent, last, False)
        return parent.pop(i) if remove else parent[i]
    raise PatchError(f"path {path!r}: parent is not an object or array")


def _add(doc, path, value):
    tokens = _pointer(path)
    if not tokens:
        return value
    parent, last = _parent(doc, tokens, path), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, True), value)
    else:
        raise PatchError(f"path {path!r}: parent is not an object or array")
    return doc


def json_patch(doc, patch):
    """RFC 6902: the operations of `patch` (a list) applied in order."""
    if not isinstance(patch, list):
        raise PatchError("a JSON patch must be an array of operations")
    doc = copy.deepcopy(doc)
    for n, op in enumerate(patch):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"operation {n}: needs 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"operation {n} ({kind}): missing 'value'")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            _member(doc, path, remove=True)
        elif kind == "replace":
            _member(doc, path)  # must exist
            if _pointer(path):
                _member(doc, path, remove=True)
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind in ("move", "copy"):
            if "from" not in op:
                raise PatchError(f"operation {n} ({kind}): missing 'from'")
            if kind == "move" and (path + "/").startswith(op["from"] + "/") and path != op["from"]:
                raise PatchError(f"operation {n}: cannot move {op['from']!r} into its own child {path!r}")
            value = copy.deepcopy(_member(doc, op["from"]))
            if kind == "move":
                _member(doc, op["from"], remove=True)
            doc = _add(doc, path, value)
        elif kind == "test":
            if _member(doc, path) != op["value"]:
                raise PatchError(f"operation {n}: test failed at {path!r}")
        else:
            raise PatchError(f"operation {n}: unknown op {kind!r}")
    return doc


# --- RFC 7386 ------------------------------------------------------------------
def merge_patch(doc, patch):
    """RFC 7386: objects merged key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(doc) if isinstance(doc, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# --- strategic merge patch ----------------------------------------------------
def _strip(value):
    """A patch value stored as it is: without directives."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip(v) for v in value if not (isinstance(v, dict) and v.get("$patch") == "delete")]
    return copy.deepcopy(value)


def _merge_keyed_list(current, items, key, field):
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in items):
        return [_strip(i) for i in items if not (isinstance(i, dict) and "$patch" in i)]
    out = copy.deepcopy(current)
    for item in items:
        if not isinstance(item, dict) or key not in item:
            raise PatchError(f"{field}: list item without merge key {key!r}: {item!r}")
        at = next((n for n, e in enumerate(out) if isinstance(e, dict) and e.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                out.pop(at)
        elif at is None:
            out.append(_strip(item))
        else:
            merged = _merge_map(out[at], item)
            out[at] = merged if merged is not None else out[at]
    return out


def _order(values, order, key):
    """`values` in the order of `order` (a $setElementOrder list); others after, as they were."""
    def ident(v):
        return v.get(key) if key and isinstance(v, dict) else v
    rank = {repr(ident(o)): n for n, o in enumerate(order)}
    return sorted(values, key=lambda v: rank.get(repr(ident(v)), len(rank)))


def _merge_map(current, patch):
    """Merges `patch` into the map `current`; None when the patch deletes the map."""
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    if directive == "replace":
        return _strip(patch)
    if directive not in (None, "merge"):
        raise PatchError(f"unknown $patch directive {directive!r}")
    out = copy.deepcopy(current) if isinstance(current, dict) else {}
    orders = {}
    for k, v in patch.items():
        if k.startswith("$setElementOrder/"):
            orders[k.split("/", 1)[1]] = v
        elif k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            out[field] = [x for x in out.get(field, []) if x not in v]
        elif k.startswith("$"):
            continue
        elif v is None:
            out.pop(k, None)
        elif isinstance(v, dict):
            merged = _merge_map(out.get(k), v)
            if merged is None:
                out.pop(k, None)
            else:
                out[k] = merged
        elif isinstance(v, list) and k in MERGE_KEYS and isinstance(out.get(k), list):
            out[k] = _merge_keyed_list(out[k], v, MERGE_KEYS[k], k)
        elif isinstance(v, list) and k in MERGED_SCALAR_LISTS and isinstance(out.get(k), list):
            out[k] = out[k] + [x for x in v if x not in out[k]]
        else:
            out[k] = _strip(v)
    if "$retainKeys" in patch:
        keep = set(patch["$retainKeys"])
        out = {k: v for k, v in out.items() if k in keep}
    for field, order in orders.items():
        if isinstance(out.get(field), list):
            out[field] = _order(out[field], order, MERGE_KEYS.get(field))
    return out


def strategic_merge_patch(doc, patch):
    """A strategic merge patch (a JSON object) applied to `doc`."""
    if not isinstance(patch, dict):
        raise PatchError("a strategic merge patch must be a JSON object")
    out = _merge_map(doc, patch)
    if out is None:
        raise PatchError("a strategic merge patch cannot delete the whole object")
    return out
