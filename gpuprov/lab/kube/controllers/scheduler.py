"""The scheduler (kube-scheduler's default profile, for what the emulated workloads use): binds
each pending pod of the default scheduler to a ready node whose taints it tolerates, whose
labels match its nodeSelector and required node affinity, and whose allocatable minus what its
pods hold covers each device-plugin resource the pod asks for (`nvidia.com/gpu`,
`nvidia.com/mig-<profile>`: kube-scheduler's NodeResourcesFit for extended resources); among
those, the most free devices of what it asks (for a device pod), then the fewest pods, then
the name. A pod that fits nowhere gets PodScheduled=False, Unschedulable, with the scheduler's
message ("Insufficient <resource>") and a FailedScheduling event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuprov.lab.kube import selectors
from gpuprov.lab.kube.controllers import guarded
from gpuprov.lab.kube.objects import (
    UNSCHEDULABLE_TAINT,
    condition,
    node_ready,
    node_taints,
    set_condition,
)
from gpuprov.lab.kube.registry import NODES, PODS, device_requests, is_terminal

if TYPE_CHECKING:
    from gpuprov.lab.kube.cluster import Cluster


def schedule(cluster: Cluster) -> None:
    pods = cluster.registry.list(PODS)[0]
    nodes = sorted(cluster.registry.list(NODES)[0], key=lambda n: n["metadata"]["name"])
    used: dict[str, dict[str, int]] = {}
    count: dict[str, int] = {}
    for p in pods:
        node = p["spec"].get("nodeName")
        if node and not is_terminal(p):
            held = used.setdefault(node, {})
            for resource, n in device_requests(p["spec"]).items():
                held[resource] = held.get(resource, 0) + n
            count[node] = count.get(node, 0) + 1
    for pod in pods:
        guarded(_schedule_pod, cluster, pod, nodes, used, count)


def _free(node: dict, used: dict[str, int], resource: str) -> int:
    return int((node.get("status", {}).get("allocatable") or {}).get(resource, 0)) \
        - used.get(resource, 0)


def _schedule_pod(cluster: Cluster, pod: dict, nodes: list[dict],
                  used: dict[str, dict[str, int]], count: dict[str, int]) -> None:
    spec = pod["spec"]
    if (spec.get("nodeName") or is_terminal(pod)
            or pod["metadata"].get("deletionTimestamp")
            or spec.get("schedulerName", "default-scheduler") != "default-scheduler"):
        return
    want = device_requests(spec)
    reasons: dict[str, int] = {}
    best = None
    for node in nodes:
        name = node["metadata"]["name"]
        held = used.get(name, {})
        why = fits_node(spec, node)
        if not why:
            short = [r for r, n in want.items() if _free(node, held, r) < n]
            # kube-scheduler reports each insufficient resource; one reason per node here.
            why = f"Insufficient {short[0]}" if short else ""
        if why:
            reasons[why] = reasons.get(why, 0) + 1
            continue
        free = sum(_free(node, held, r) for r in want)
        rank = (-free if want else 0, count.get(name, 0), name)
        if best is None or rank < best[0]:
            best = (rank, name)
    if best is None:
        detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        message = (f"0/{len(nodes)} nodes are available: {detail}. preemption: "
                   f"0/{len(nodes)} nodes are available: {len(nodes)} Preemption is "
                   "not helpful for scheduling.")
        cond = condition("PodScheduled", False, "Unschedulable", message)

        def unschedulable(status: dict, cond: dict = cond) -> None:
            old = [c for c in status.get("conditions") or []
                   if c.get("type") == "PodScheduled"]
            if old and old[0].get("message") == cond["message"]:
                return
            status["conditions"] = set_condition(status.get("conditions") or [], cond)

        before = cluster.mutate_status(pod, unschedulable)
        if before is not None and before is not pod:
            cluster.event(pod, "FailedScheduling", message, "Warning", "default-scheduler")
        return
    name = best[1]
    cluster.registry.bind(pod["metadata"]["namespace"], pod["metadata"]["name"],
                          {"target": {"kind": "Node", "name": name}})
    cluster.mutate_status(pod, lambda s: s.update(conditions=set_condition(
        s.get("conditions") or [], condition("PodScheduled", True))))
    held = used.setdefault(name, {})
    for resource, n in want.items():
        held[resource] = held.get(resource, 0) + n
    count[name] = count.get(name, 0) + 1
    cluster.event(pod, "Scheduled", f"Successfully assigned "
                  f"{pod['metadata']['namespace']}/{pod['metadata']['name']} to {name}",
                  "Normal", "default-scheduler")


def fits_node(spec: dict, node: dict) -> str:
    """Why a pod spec cannot go to a node ('' when it can), in the scheduler's words."""
    if not node_ready(node):
        return "node(s) were not ready"
    view = {**node, "spec": {**node.get("spec", {}), "taints": node_taints(node)}}
    untolerated = selectors.untolerated_taints(spec, view)
    if untolerated:
        t = untolerated[0]
        if t["key"] == UNSCHEDULABLE_TAINT["key"]:
            return "node(s) were unschedulable"
        return f"node(s) had untolerated taint {{{t['key']}: {t.get('value', '')}}}"
    if not selectors.node_selector_matches(spec, node) or \
            not selectors.node_affinity_matches(spec, node):
        return "node(s) didn't match Pod's node affinity/selector"
    return ""
