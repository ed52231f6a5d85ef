"""Selecting objects, for the test bed's API server (apiserver.py):

- label selectors as in `?labelSelector=` (`k=v`, `k==v`, `k!=v`, `k`, `!k`,
  `k in (a,b)`, `k notin (a,b)`) and as LabelSelector objects
  (`matchLabels`, `matchExpressions` with In, NotIn, Exists, DoesNotExist);
- field selectors as in `?fieldSelector=` (`f=v`, `f==v`, `f!=v`), over the
  fields each resource supports (FIELDS; others are refused, as
  kube-apiserver refuses them);
- a subset of CEL for a webhook's `matchConditions`: literals (strings, ints,
  true, false, null), lists, the variables `object`, `oldObject` and
  `request`, field selection and indexing, `has()`, `size()`, `in`, `!`,
  `&&`, `||`, `==`, `!=`, `<`, `<=`, `>`, `>=`, and the string methods
  `startsWith`, `endsWith`, `contains`. Selecting a field that is not there
  is an error, as in CEL. An expression outside the subset does not compile
  (CelError), so a configuration using one is refused when it is stored.

Parse errors raise SelectorError (the API server answers 400) or CelError."""
import re


class SelectorError(Exception):
    """A selector that does not parse or names an unsupported field."""


# --- label selectors ----------------------------------------------------------
_TERM = re.compile(r"\s*(!?)\s*([A-Za-z0-9][-A-Za-z0-9_./]*)\s*(?:(==|=|!=)\s*([-A-Za-z0-9_.]*)|"
                   r"\s(in|notin)\s*\(([^)]*)\))?\s*$")


def _split_terms(text):
    terms, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    return [t for t in terms if t.strip()]


def parse_label_selector(text):
    """`?labelSelector=` text -> a predicate over a labels dict."""
    reqs = []
    for term in _split_terms(text or ""):
        m = _TERM.match(term)
        if not m or (m.group(1) and (m.group(3) or m.group(5))):
            raise SelectorError(f"unable to parse requirement: {term.strip()!r}")
        neg, key, op, value, setop, values = m.groups()
        if setop:
            reqs.append((key, setop, {v.strip() for v in values.split(",") if v.strip()}))
        elif op:
            reqs.append((key, "!=" if op == "!=" else "=", value))
        else:
            reqs.append((key, "!" if neg else "exists", None))

    def match(labels):
        labels = labels or {}
        for key, op, value in reqs:
            have = key in labels
            ok = {"=": lambda: have and labels[key] == value,
                  "!=": lambda: not have or labels[key] != value,
                  "in": lambda: have and labels[key] in value,
                  "notin": lambda: not have or labels[key] not in value,
                  "exists": lambda: have,
                  "!": lambda: not have}[op]()
            if not ok:
                return False
        return True
    return match


def label_selector_matches(selector, labels):
    """A LabelSelector object (None or {} selects everything) against a labels dict."""
    labels = labels or {}
    selector = selector or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        have = key in labels
        if op == "In" and not (have and labels[key] in values):
            return False
        if op == "NotIn" and have and labels[key] in values:
            return False
        if op == "Exists" and not have:
            return False
        if op == "DoesNotExist" and have:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise SelectorError(f"unknown label selector operator {op!r}")
    return True


# --- field selectors ----------------------------------------------------------
def _dig(obj, path):
    for p in path.split("."):
        obj = obj.get(p) if isinstance(obj, dict) else None
    if obj is None:
        return ""
    if isinstance(obj, bool):
        return "true" if obj else "false"
    return str(obj)


_COMMON = ("metadata.name", "metadata.namespace")
# (group, resource) -> the field labels kube-apiserver supports for it.
FIELDS = {
    ("", "pods"): _COMMON + ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
                             "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName"),
    ("", "events"): _COMMON + ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                               "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                               "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"),
    ("", "namespaces"): _COMMON + ("status.phase",),
}


def parse_field_selector(text, resource_key):
    """`?fieldSelector=` text -> a predicate over an object of `resource_key`."""
    allowed = FIELDS.get(resource_key, _COMMON)
    reqs = []
    for term in _split_terms(text or ""):
        m = re.match(r"\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not m:
            raise SelectorError(f"invalid selector: {term.strip()!r}; can't understand {term.strip()!r}")
        field, op, value = m.groups()
        if field not in allowed:
            raise SelectorError(f"field label not supported: {field}")
        reqs.append((field, op != "!=", value))

    def match(obj):
        for field, equal, value in reqs:
            got = _dig(obj, "source.component" if field == "source" else field)
            if (got == value) != equal:
                return False
        return True
    return match


# --- CEL subset ---------------------------------------------------------------
class CelError(Exception):
    """An expression outside the supported subset, or an error evaluating it."""


_TOKEN = re.compile(r"\s*(?:(\d+)|'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"|([A-Za-z_][A-Za-z0-9_]*)|"
                    r"(&&|\|\||==|!=|<=|>=|[!<>.()\[\],]))")
_MISSING = object()


def _tokens(text):
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise CelError(f"cannot parse at {text[pos:pos + 20]!r}")
        num, s1, s2, ident, op = m.groups()
        if num is not None:
            out.append(("lit", int(num)))
        elif s1 is not None or s2 is not None:
            out.append(("lit", bytes(s1 if s1 is not None else s2, "utf-8").decode("unicode_escape")))
        elif ident in ("true", "false", "null"):
            out.append(("lit", {"true": True, "false": False, "null": None}[ident]))
        elif ident == "in":
            out.append(("op", "in"))
        elif ident is not None:
            out.append(("id", ident))
        else:
            out.append(("op", op))
        pos = m.end()
    return out


class _Parser:
    """Recursive descent over the tokens; builds nested tuples evaluated by _eval."""

    def __init__(self, text):
        self.toks, self.i = _tokens(text), 0

    def peek(self, value=None):
        t = self.toks[self.i] if self.i < len(self.toks) else (None, None)
        return t if value is None or t == ("op", value) else None

    def take(self, value):
        if not self.peek(value):
            raise CelError(f"expected {value!r}")
        self.i += 1

    def parse(self):
        node = self.or_()
        if self.i != len(self.toks):
            raise CelError(f"unexpected {self.toks[self.i][1]!r}")
        return node

    def _chain(self, op, kind, operand):
        node = operand()
        while self.peek(op):
            self.i += 1
            node = (kind, node, operand())
        return node

    def or_(self):
        return self._chain("||", "or", self.and_)

    def and_(self):
        return self._chain("&&", "and", self.rel)

    def rel(self):
        node = self.unary()
        for op in ("==", "!=", "<=", ">=", "<", ">", "in"):
            if self.peek(op):
                self.i += 1
                return ("rel", op, node, self.unary())
        return node

    def unary(self):
        if self.peek("!"):
            self.i += 1
            return ("not", self.unary())
        return self.member()

    def items(self, close):
        """Expressions separated by commas, up to `close` (taken)."""
        out = []
        while not self.peek(close):
            out.append(self.or_())
            if not self.peek(close):
                self.take(",")
        self.take(close)
        return out

    def args(self):
        self.take("(")
        return self.items(")")

    def member(self):
        node = self.primary()
        while True:
            if self.peek("."):
                self.i += 1
                kind, name = self.peek()
                if kind != "id":
                    raise CelError("expected a field name after '.'")
                self.i += 1
                if self.peek("("):
                    if name not in ("startsWith", "endsWith", "contains"):
                        raise CelError(f"unsupported method {name}()")
                    node = ("call", name, [node] + self.args())
                else:
                    node = ("field", node, name)
            elif self.peek("["):
                self.i += 1
                index = self.or_()
                self.take("]")
                node = ("index", node, index)
            else:
                return node

    def primary(self):
        kind, value = self.peek()
        self.i += 1
        if kind is None:
            raise CelError("unexpected end of expression")
        if kind == "lit":
            return ("lit", value)
        if (kind, value) == ("op", "("):
            node = self.or_()
            self.take(")")
            return node
        if (kind, value) == ("op", "["):
            return ("list", self.items("]"))
        if kind == "id" and self.peek("("):
            if value == "has":
                (arg,) = self.args()
                if arg[0] != "field":
                    raise CelError("has() takes a field selection")
                return ("has", arg)
            if value == "size":
                (arg,) = self.args()
                return ("call", "size", [arg])
            raise CelError(f"unsupported function {value}()")
        if kind == "id":
            if value not in ("object", "oldObject", "request"):
                raise CelError(f"undeclared reference to {value!r}")
            return ("var", value)
        raise CelError(f"unexpected {value!r}")


def _eval(node, env):
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "list":
        return [_eval(n, env) for n in node[1]]
    if kind == "var":
        return env[node[1]]
    if kind == "field":
        base = _eval(node[1], env)
        if not isinstance(base, dict) or node[2] not in base:
            raise CelError(f"no such key: {node[2]}")
        return base[node[2]]
    if kind == "index":
        base, key = _eval(node[1], env), _eval(node[2], env)
        try:
            return base[key]
        except (KeyError, IndexError, TypeError):
            raise CelError(f"no such key: {key}") from None
    if kind == "has":
        base = _eval(node[1][1], env)
        return isinstance(base, dict) and node[1][2] in base
    if kind == "not":
        v = _eval(node[1], env)
        if not isinstance(v, bool):
            raise CelError("'!' needs a bool")
        return not v
    if kind in ("and", "or"):
        # CEL's commutative logic: a decisive side wins over an error on the other.
        results = []
        for side in node[1:]:
            try:
                results.append(_eval(side, env))
            except CelError as e:
                results.append(e)
        decisive = kind == "or"
        if decisive in results:
            return decisive
        for r in results:
            if isinstance(r, CelError):
                raise r
            if not isinstance(r, bool):
                raise CelError(f"'{'&&' if kind == 'and' else '||'}' needs bools")
        return not decisive
    if kind == "rel":
        op, a, b = node[1], _eval(node[2], env), _eval(node[3], env)
        if op == "in":
            if not isinstance(b, (dict, list)):
                raise CelError("'in' needs a map or a list")
            return a in b
        if op in ("==", "!="):
            return (a == b) == (op == "==")
        try:
            return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
        except TypeError:
            raise CelError(f"no matching overload for '{op}'") from None
    if kind == "call":
        name, args = node[1], [_eval(a, env) for a in node[2]]
        if name == "size":
            if not isinstance(args[0], (str, list, dict)):
                raise CelError("no matching overload for 'size'")
            return len(args[0])
        if len(args) != 2 or not all(isinstance(a, str) for a in args):
            raise CelError(f"no matching overload for '{name}'")
        return {"startsWith": args[0].startswith, "endsWith": args[0].endswith,
                "contains": args[0].__contains__}[name](args[1])
    raise CelError(f"cannot evaluate {kind}")


def compile_cel(expression):
    """Parses `expression`; returns a function of (object, oldObject, request) giving a bool.
    Raises CelError if the expression is outside the subset; the function raises CelError
    when evaluation fails (a missing field, a type mismatch, a non-bool result)."""
    tree = _Parser(expression).parse()

    def run(obj, old, request):
        value = _eval(tree, {"object": obj, "oldObject": old, "request": request})
        if not isinstance(value, bool):
            raise CelError(f"expression gave {type(value).__name__}, not bool")
        return value
    return run
