"""The test bed API server's storage (apiserver.py): objects by (group,
resource), namespace and name, a resourceVersion counter shared by all
objects (as etcd's revision is), and a bounded history of changes that
watches are served from.

Objects are stored and returned as deep copies. `write` checks an expected
resourceVersion (optimistic concurrency) and skips no-op updates, as
kube-apiserver does (no new resourceVersion, no watch event). A watch from
a resourceVersion older than the history gets `Gone` (410)."""
import collections
import copy
import threading


class Conflict(Exception):
    """The object changed since the resourceVersion the caller had."""


class Gone(Exception):
    """The requested resourceVersion is older than the history kept."""


Change = collections.namedtuple("Change", "rv type key namespace name old new")


class Store:
    def __init__(self, history=20000, first_rv=1000):
        self.cv = threading.Condition(threading.RLock())
        self._rv = first_rv
        self._objects = {}  # (key, namespace, name) -> object
        self._history = collections.deque(maxlen=history)
        self._compacted = first_rv  # changes at or before this resourceVersion are not in the history
        self.closed = False

    @property
    def rv(self):
        with self.cv:
            return self._rv

    def get(self, key, namespace, name):
        with self.cv:
            obj = self._objects.get((key, namespace or "", name))
            return copy.deepcopy(obj)

    def list(self, key, namespace=None):
        """(objects sorted by namespace and name, the current resourceVersion)."""
        with self.cv:
            items = [copy.deepcopy(o) for (k, ns, _), o in sorted(self._objects.items(), key=lambda kv: kv[0][1:])
                     if k == key and (namespace is None or ns == namespace)]
            return items, self._rv

    def write(self, key, namespace, name, obj, expected_rv=None, create=False):
        """Stores `obj`; returns the stored copy. `expected_rv` (a string) must match the stored
        object's; `create` requires that there is none (raises Conflict otherwise)."""
        namespace = namespace or ""
        with self.cv:
            old = self._objects.get((key, namespace, name))
            if create and old is not None:
                raise Conflict("exists")
            if not create and old is None:
                raise KeyError(name)
            if expected_rv and old is not None and old["metadata"].get("resourceVersion") != expected_rv:
                raise Conflict("modified")
            new = copy.deepcopy(obj)
            if old is not None:
                new["metadata"]["resourceVersion"] = old["metadata"].get("resourceVersion")
                if new == old:
                    return copy.deepcopy(old)
            self._rv += 1
            new["metadata"]["resourceVersion"] = str(self._rv)
            self._objects[(key, namespace, name)] = new
            self._append(Change(self._rv, "ADDED" if old is None else "MODIFIED", key, namespace, name, old, new))
            return copy.deepcopy(new)

    def delete(self, key, namespace, name):
        """Removes the object; returns it as it was deleted (with the deletion's resourceVersion)."""
        with self.cv:
            old = self._objects.pop((key, namespace or "", name))
            self._rv += 1
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            self._append(Change(self._rv, "DELETED", key, namespace or "", name, old, gone))
            return copy.deepcopy(gone)

    def _append(self, change):
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].rv
        self._history.append(change)
        self.cv.notify_all()

    def changes_after(self, rv, timeout):
        """Changes with resourceVersion > rv, waiting up to `timeout` seconds for one;
        [] on timeout or when closed. Raises Gone if rv is older than the history."""
        with self.cv:
            if rv < self._compacted:
                raise Gone(rv)
            if self._rv <= rv and not self.closed:
                self.cv.wait(timeout)
            if rv < self._compacted:
                raise Gone(rv)
            return [c for c in self._history if c.rv > rv]

    def wait(self, predicate, timeout):
        """Waits until predicate() (called under the lock) is true; returns its last value."""
        with self.cv:
            return self.cv.wait_for(predicate, timeout)

    def close(self):
        with self.cv:
            self.closed = True
            self.cv.notify_all()
