"""The garbage collector (kubernetes pkg/controller/garbagecollector) and the namespace
controller's deletion of a namespace's content (pkg/controller/namespace).

Objects whose owners are all gone are deleted (background propagation); an object deleted in
the foreground keeps its foregroundDeletion finalizer until its dependents are gone. A
terminating namespace has its objects deleted, then goes itself once it is empty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuprov.lab.kube.objects import owned_by
from gpuprov.lab.kube.registry import NAMESPACES, Registry
from gpuprov.lab.kube.resources import RESOURCES, ResourceType

if TYPE_CHECKING:
    from gpuprov.lab.kube.cluster import Cluster

# Every object of every kind, by ResourceType.key: one pass's snapshot.
Everything = dict[str, list[dict]]


def collect_garbage(cluster: Cluster) -> None:
    registry = cluster.registry
    everything = {rt.key: registry.list(rt)[0] for rt in RESOURCES}
    uids = {o["metadata"]["uid"] for objs in everything.values() for o in objs}
    for rt in RESOURCES:
        for obj in everything[rt.key]:
            _collect(registry, rt, obj, uids, everything)
    for ns in everything[NAMESPACES.key]:
        if ns["metadata"].get("deletionTimestamp"):
            _finalize_namespace(registry, ns["metadata"]["name"], everything)


def _collect(registry: Registry, rt: ResourceType, obj: dict, uids: set[str],
             everything: Everything) -> None:
    """Delete an object whose owners are all gone; finish a foreground deletion."""
    meta = obj["metadata"]
    ns = meta.get("namespace", "")
    refs = meta.get("ownerReferences") or []
    if refs and not any(r.get("uid") in uids for r in refs) \
            and not meta.get("deletionTimestamp"):
        registry.delete(rt, ns, meta["name"])
    elif "foregroundDeletion" in (meta.get("finalizers") or []):
        _delete_foreground(registry, rt, obj, everything)


def _delete_foreground(registry: Registry, rt: ResourceType, obj: dict,
                       everything: Everything) -> None:
    """Delete the owner's dependents; once none is left, drop its foregroundDeletion
    finalizer (which lets the registry remove it)."""
    meta = obj["metadata"]
    dependents = [(drt, d) for drt in RESOURCES for d in everything[drt.key]
                  if owned_by(d, meta["uid"])]
    for drt, d in dependents:
        if not d["metadata"].get("deletionTimestamp"):
            registry.delete(drt, d["metadata"].get("namespace", ""), d["metadata"]["name"])
    if not dependents:
        rest = [f for f in meta["finalizers"] if f != "foregroundDeletion"]
        registry.replace(rt, meta.get("namespace", ""), meta["name"], {
            **obj, "metadata": {**meta, "finalizers": rest}})


def _finalize_namespace(registry: Registry, name: str, everything: Everything) -> None:
    """Delete a terminating namespace's objects; remove it once it holds none."""
    left = 0
    for rt in RESOURCES:
        if not rt.namespaced:
            continue
        for obj in everything[rt.key]:
            if obj["metadata"].get("namespace") != name:
                continue
            left += 1
            if not obj["metadata"].get("deletionTimestamp"):
                registry.delete(rt, name, obj["metadata"]["name"],
                                {"propagationPolicy": "Background"})
    if not left:
        registry.store.remove(NAMESPACES, "", name)
