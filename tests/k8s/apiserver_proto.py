"""The Kubernetes protobuf encoding, as far as the test bed's API server
(apiserver.py) needs it: kubectl's typed commands (`kubectl create
namespace`, `kubectl create secret`) send `application/vnd.kubernetes.protobuf` bodies. A body is the
magic "k8s\\0" and a runtime.Unknown message (typeMeta = 1 with apiVersion = 1
and kind = 2, raw = 2); `decode` turns the raw message of the kinds in
SCHEMAS into JSON and raises ValueError for other kinds. Responses are always
JSON (clients accept it next to protobuf)."""

import base64

MAGIC = b"k8s\x00"
_OBJECT_META = {1: ("name", "str"), 2: ("generateName", "str"), 3: ("namespace", "str"), 11: ("labels", "map"),
                12: ("annotations", "map"), 14: ("finalizers", "strs")}
SCHEMAS = {
    ("v1", "Namespace"): {1: ("metadata", _OBJECT_META), 2: ("spec", {1: ("finalizers", "strs")})},
    # map<string, bytes> data = 2 (JSON: base64), type = 3, map<string, string> stringData = 4.
    ("v1", "Secret"): {1: ("metadata", _OBJECT_META), 2: ("data", "bytesmap"), 3: ("type", "str"),
                       4: ("stringData", "map")},
}


def _varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def _fields(buf):
    """(field number, wire type, value) of a message; value is bytes for length-delimited fields."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _message(buf, schema):
    out = {}
    for number, _, value in _fields(buf):
        if number not in schema:
            continue
        name, kind = schema[number]
        if isinstance(kind, dict):
            out[name] = _message(value, kind)
        elif kind == "str":
            out[name] = value.decode()
        elif kind == "strs":
            out.setdefault(name, []).append(value.decode())
        elif kind == "map":
            entry = {n: v.decode() for n, _, v in _fields(value)}
            out.setdefault(name, {})[entry.get(1, "")] = entry.get(2, "")
        elif kind == "bytesmap":
            entry = dict((n, v) for n, _, v in _fields(value))
            out.setdefault(name, {})[entry.get(1, b"").decode()] = base64.b64encode(entry.get(2, b"")).decode()
    for name, kind in schema.values():  # empty strings are what proto2 sends for unset fields
        if kind == "str" and out.get(name) == "":
            del out[name]
    return out


def decode(body):
    """A protobuf-encoded object as JSON; raises ValueError when it cannot be decoded."""
    if not body.startswith(MAGIC):
        raise ValueError("not a Kubernetes protobuf body (no k8s\\0 magic)")
    type_meta, raw = {}, b""
    for number, _, value in _fields(body[len(MAGIC):]):
        if number == 1:
            type_meta = {n: v.decode() for n, _, v in _fields(value)}
        elif number == 2:
            raw = value
    api_version, kind = type_meta.get(1, ""), type_meta.get(2, "")
    schema = SCHEMAS.get((api_version, kind))
    if schema is None:
        raise ValueError(f"protobuf bodies of {api_version}/{kind} are not decoded; send JSON")
    return dict(_message(raw, schema), apiVersion=api_version, kind=kind)
