"""The object store: objects by resource type, namespace and name; one resourceVersion counter;
an event log that watches replay from.

Stored objects are never mutated in place: every write stores a new dict, so readers may hold
references without copying and serialise them outside the lock.
"""

from __future__ import annotations

import bisect
import datetime
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpuprov.lab.kube.errors import ApiError
from gpuprov.lab.kube.resources import ResourceType

# How many events a watch can resume from; older resourceVersions get 410 Gone, as on a real
# server after etcd compaction.
EVENT_WINDOW = 20000


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Event:
    rv: int
    rtype: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict
    old: dict | None


class Store:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._objects: dict[str, dict[tuple[str, str], dict]] = {}
        self._rv = 0
        self._events: list[Event] = []
        self._event_rvs: list[int] = []
        self._oldest_rv = 0  # events with rv > this are all in the log
        self.closed = False

    @property
    def resource_version(self) -> int:
        return self._rv

    def _bucket(self, rt: ResourceType) -> dict[tuple[str, str], dict]:
        return self._objects.setdefault(rt.key, {})

    def get(self, rt: ResourceType, namespace: str, name: str) -> dict | None:
        with self.lock:
            return self._bucket(rt).get((namespace, name))

    def list(self, rt: ResourceType, namespace: str | None = None,
             accept: Callable[[dict], bool] | None = None) -> tuple[list[dict], int]:
        with self.lock:
            items = [o for (ns, _), o in self._bucket(rt).items()
                     if (namespace is None or ns == namespace) and (accept is None or accept(o))]
            return items, self._rv

    def _record(self, rt: ResourceType, type_: str, obj: dict, old: dict | None) -> None:
        self._events.append(Event(self._rv, rt.key, type_, obj, old))
        self._event_rvs.append(self._rv)
        if len(self._events) > 2 * EVENT_WINDOW:
            cut = len(self._events) - EVENT_WINDOW
            self._oldest_rv = self._event_rvs[cut - 1]
            del self._events[:cut]
            del self._event_rvs[:cut]
        self.changed.notify_all()

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def create(self, rt: ResourceType, obj: dict) -> dict:
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        with self.lock:
            bucket = self._bucket(rt)
            if key in bucket:
                raise ApiError.already_exists(rt.group, rt.plural, meta["name"])
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", now())
            meta["resourceVersion"] = self._next_rv()
            bucket[key] = obj
            self._record(rt, "ADDED", obj, None)
            return obj

    def update(self, rt: ResourceType, obj: dict, expect_rv: str | None = None) -> dict:
        """Store `obj` in place of the object of the same name; a no-op change keeps the
        old resourceVersion, as the real server does."""
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        with self.lock:
            bucket = self._bucket(rt)
            old = bucket.get(key)
            if old is None:
                raise ApiError.not_found(rt.group, rt.plural, meta["name"])
            if expect_rv and expect_rv != old["metadata"]["resourceVersion"]:
                raise ApiError.conflict(rt.group, rt.plural, meta["name"])
            for fixed in ("uid", "creationTimestamp", "generation", "deletionTimestamp",
                          "deletionGracePeriodSeconds"):
                if fixed in old["metadata"]:
                    meta[fixed] = old["metadata"][fixed]
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            if obj == old:
                return old
            if "generation" in old["metadata"] and obj.get("spec") != old.get("spec"):
                meta["generation"] = old["metadata"]["generation"] + 1
            meta["resourceVersion"] = self._next_rv()
            bucket[key] = obj
            self._record(rt, "MODIFIED", obj, old)
            return obj

    def remove(self, rt: ResourceType, namespace: str, name: str) -> dict:
        with self.lock:
            bucket = self._bucket(rt)
            old = bucket.pop((namespace, name), None)
            if old is None:
                raise ApiError.not_found(rt.group, rt.plural, name)
            gone = {**old, "metadata": {**old["metadata"], "resourceVersion": self._next_rv()}}
            self._record(rt, "DELETED", gone, old)
            return gone

    def events_after(self, rv: int) -> Iterator[Event]:
        """Events with resourceVersion > rv (call with the lock held)."""
        if rv < self._oldest_rv:
            raise ApiError.gone(f"too old resource version: {rv} ({self._oldest_rv + 1})")
        start = bisect.bisect_right(self._event_rvs, rv)
        return iter(self._events[start:])

    def wait(self, after_rv: int, timeout: float) -> bool:
        """Block until the store moves past after_rv (True) or timeout passes (False)."""
        with self.lock:
            return self.changed.wait_for(lambda: self._rv > after_rv or self.closed, timeout)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.changed.notify_all()
