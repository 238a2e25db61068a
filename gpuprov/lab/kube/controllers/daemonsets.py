"""The DaemonSet controller (kubernetes pkg/controller/daemon): one pod per node that the
template's nodeSelector, required node affinity and tolerations admit, pinned to its node by
node affinity on metadata.name; pods on nodes that no longer qualify, and failed pods, are
deleted; a rolling update replaces pods of older template generations within maxUnavailable;
status counts as the real controller reports them.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from gpuprov.lab.kube import selectors
from gpuprov.lab.kube.controllers import guarded
from gpuprov.lab.kube.objects import owned_by, owner_ref
from gpuprov.lab.kube.registry import NODES, PODS, R, pod_ready

if TYPE_CHECKING:
    from gpuprov.lab.kube.cluster import Cluster

# Tolerations the DaemonSet controller adds to every daemon pod.
DAEMON_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]


def sync_daemonsets(cluster: Cluster) -> None:
    nodes = cluster.registry.list(NODES)[0]
    for ds in cluster.registry.list(R["DaemonSet"])[0]:
        if not ds["metadata"].get("deletionTimestamp"):
            guarded(_sync_daemonset, cluster, ds, nodes)


def _sync_daemonset(cluster: Cluster, ds: dict, nodes: list[dict]) -> None:
    meta, spec = ds["metadata"], ds["spec"]
    ns, uid, generation = meta["namespace"], meta["uid"], meta.get("generation", 1)
    template = spec["template"]
    tmpl_spec = {**template["spec"],
                 "tolerations": (template["spec"].get("tolerations") or [])
                 + DAEMON_TOLERATIONS}
    pods = [p for p in cluster.registry.list(PODS, ns)[0] if owned_by(p, uid)]
    desired = scheduled = misscheduled = ready = updated = 0
    max_unavailable = (spec.get("updateStrategy") or {}).get("rollingUpdate", {}) \
        .get("maxUnavailable", 1)
    wanted_nodes = []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        name = node["metadata"]["name"]
        view = {**node, "spec": {**node.get("spec", {}),
                                 "taints": (node.get("spec") or {}).get("taints") or []}}
        should = (selectors.node_selector_matches(tmpl_spec, node)
                  and selectors.node_affinity_matches(tmpl_spec, node)
                  and not selectors.untolerated_taints(tmpl_spec, view))
        mine = [p for p in pods if _daemon_node(p) == name
                and not p["metadata"].get("deletionTimestamp")]
        if should:
            desired += 1
            wanted_nodes.append(name)
        for p in mine:
            if not should or (p.get("status") or {}).get("phase") == "Failed":
                cluster.registry.delete(PODS, ns, p["metadata"]["name"])
        mine = [p for p in mine if should and p["status"].get("phase") != "Failed"]
        if should and not mine:
            _create_daemon_pod(cluster, ds, name, generation)
            continue
        if not should and mine:
            misscheduled += 1
        if mine:
            scheduled += 1
            current = [p for p in mine if p["metadata"].get("labels", {})
                       .get("pod-template-generation") == str(generation)]
            updated += bool(current)
            ready += any(pod_ready(p) for p in mine)
    outdated = [p for p in pods if _daemon_node(p) in wanted_nodes
                and not p["metadata"].get("deletionTimestamp")
                and p["metadata"].get("labels", {}).get("pod-template-generation")
                != str(generation)]
    budget = _count(max_unavailable, desired) - (desired - ready)
    if (spec.get("updateStrategy") or {}).get("type", "RollingUpdate") == "RollingUpdate":
        for p in outdated[:max(0, budget)]:
            cluster.registry.delete(PODS, ns, p["metadata"]["name"])
    status = {"currentNumberScheduled": scheduled, "numberMisscheduled": misscheduled,
              "desiredNumberScheduled": desired, "numberReady": ready,
              "observedGeneration": generation, "updatedNumberScheduled": updated,
              "numberAvailable": ready}
    if desired - ready:
        status["numberUnavailable"] = desired - ready
    if status != ds.get("status"):
        cluster.registry.replace(R["DaemonSet"], ns, meta["name"], {**ds, "status": status},
                                 "status")


def _create_daemon_pod(cluster: Cluster, ds: dict, node: str, generation: int) -> None:
    template = copy.deepcopy(ds["spec"]["template"])
    spec = template["spec"]
    spec["tolerations"] = (spec.get("tolerations") or []) + [
        t for t in DAEMON_TOLERATIONS if t not in (spec.get("tolerations") or [])]
    affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    meta = template.get("metadata") or {}
    labels = {**(meta.get("labels") or {}), "pod-template-generation": str(generation),
              "controller-revision-hash": f"{generation:x}"}
    cluster.registry.create(PODS, ds["metadata"]["namespace"], {
        "metadata": {"generateName": ds["metadata"]["name"] + "-", "labels": labels,
                     "annotations": meta.get("annotations") or {},
                     "ownerReferences": [owner_ref(ds)]},
        "spec": spec})


def _daemon_node(pod: dict) -> str:
    if pod["spec"].get("nodeName"):
        return pod["spec"]["nodeName"]
    terms = ((((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
             .get("nodeSelectorTerms") or [])
    for term in terms:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return f["values"][0]
    return ""


def _count(value: object, total: int) -> int:
    text = str(value)
    if text.endswith("%"):
        return max(1, total * int(text[:-1]) // 100)
    return int(text)
