"""The scheduler (kube-scheduler's default profile, for what the emulated workloads use): binds
each pending pod of the default scheduler to a ready node whose taints it tolerates, whose
labels match its nodeSelector and required node affinity, and whose allocatable minus what its
pods hold covers each device-plugin resource the pod asks for (`nvidia.com/gpu`,
`nvidia.com/mig-<profile>`: kube-scheduler's NodeResourcesFit for extended resources); among
those, the most free devices of what it asks (for a device pod), then the fewest pods, then
the name. A pod that fits nowhere gets PodScheduled=False, Unschedulable, with the scheduler's
message ("Insufficient <resource>") and a FailedScheduling event.

A pod with ResourceClaims (DRA) goes as the DynamicResources plugin places it (kubernetes
pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go, 1.34): it waits until
the claim controller has made its template claims; a claim already allocated pins it to the
nodes of its allocation's nodeSelector; the others must all be allocatable on the node
(gpuprov.lab.kube.dra.allocate against the node's ResourceSlices, leaving out the devices of
every allocated claim), else the node's reason is "cannot allocate all claims". On the chosen
node each claim gets status.allocation (results and a nodeSelector on the node's
metadata.name, as the structured allocator writes for a slice with nodeName) and the pod in
status.reservedFor, before the pod is bound (the plugin's PreBind).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuprov.lab.kube import dra, selectors
from gpuprov.lab.kube.controllers import guarded
from gpuprov.lab.kube.controllers.resourceclaims import CLAIMS, claim_names
from gpuprov.lab.kube.objects import (
    UNSCHEDULABLE_TAINT,
    condition,
    node_ready,
    node_taints,
    set_condition,
)
from gpuprov.lab.kube.registry import NODES, PODS, R, device_requests, is_terminal

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
    claims = Claims(cluster) if any(p["spec"].get("resourceClaims") for p in pods) else None
    for pod in pods:
        guarded(_schedule_pod, cluster, pod, nodes, used, count, claims)


class Claims:
    """One pass's view of DRA: the claims, DeviceClasses and ResourceSlices, and the devices
    allocated (updated as this pass allocates)."""

    def __init__(self, cluster: Cluster) -> None:
        reg = cluster.registry
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c
                       for c in reg.list(CLAIMS)[0]}
        self.classes = reg.list(R["DeviceClass"])[0]
        self.slices = reg.list(R["ResourceSlice"])[0]
        self.taken = dra.in_use(self.claims.values())

    def of_pod(self, pod: dict) -> list[dict] | None:
        """The pod's claims; None while one is not there yet."""
        ns = pod["metadata"]["namespace"]
        found = [self.claims.get((ns, name)) for name in claim_names(pod).values()
                 if name is not None]
        if len(found) != len(pod["spec"]["resourceClaims"]) or None in found:
            return None
        return found  # type: ignore[return-value]

    def place(self, claims: list[dict], node_obj: dict) -> tuple[str, dict[str, list]]:
        """Why the claims cannot be on the node ('' when they can), and the allocation
        results of those not allocated yet (claim name -> results)."""
        node = node_obj["metadata"]["name"]
        planned: dict[str, list] = {}
        taken = set(self.taken)
        for claim in claims:
            allocation = (claim.get("status") or {}).get("allocation")
            if allocation:
                terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms")
                if terms and not any(selectors.node_selector_term_matches(t, node_obj)
                                     for t in terms):
                    return "node(s) didn't match allocated claim's node selector", {}
                continue
            try:
                results = dra.allocate(claim, self.classes, self.slices, node, taken)
            except (dra.NotEmulated, dra.SelectorError) as exc:
                return f"claim {claim['metadata']['name']}: {exc}", {}
            if results is None:
                return dra.CANNOT_ALLOCATE, {}
            taken |= {(r.driver, r.pool, r.device) for r in results}
            planned[claim["metadata"]["name"]] = results
        return "", planned

    def commit(self, cluster: Cluster, pod: dict, claims: list[dict], node: str,
               planned: dict[str, list]) -> bool:
        """Write each claim's allocation (where planned) and the pod's reservation."""
        ref = {"resource": "pods", "name": pod["metadata"]["name"],
               "uid": pod["metadata"]["uid"]}
        for claim in claims:
            results = planned.get(claim["metadata"]["name"])

            def reserve(status: dict, results: list | None = results) -> None:
                if results is not None:
                    status["allocation"] = {
                        "devices": {"results": [r.to_dict() for r in results]},
                        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{
                            "key": "metadata.name", "operator": "In", "values": [node]}]}]}}
                reserved = status.get("reservedFor") or []
                if not any(r.get("uid") == ref["uid"] for r in reserved):
                    status["reservedFor"] = [*reserved, ref]

            if cluster.mutate_status(claim, reserve, CLAIMS) is None:
                return False
            if results is not None:
                self.taken |= {(r.driver, r.pool, r.device) for r in results}
        return True


def _free(node: dict, used: dict[str, int], resource: str) -> int:
    return int((node.get("status", {}).get("allocatable") or {}).get(resource, 0)) \
        - used.get(resource, 0)


def _schedule_pod(cluster: Cluster, pod: dict, nodes: list[dict],
                  used: dict[str, dict[str, int]], count: dict[str, int],
                  dra_view: Claims | None) -> None:
    spec = pod["spec"]
    if (spec.get("nodeName") or is_terminal(pod)
            or pod["metadata"].get("deletionTimestamp")
            or spec.get("schedulerName", "default-scheduler") != "default-scheduler"):
        return
    want = device_requests(spec)
    claims: list[dict] = []
    if spec.get("resourceClaims"):
        found = dra_view.of_pod(pod) if dra_view is not None else None
        if found is None:
            return  # the claim controller has not made them yet: the next pass looks again
        claims = found
    plans: dict[str, dict[str, list]] = {}
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
        if not why and claims:
            why, plans[name] = dra_view.place(claims, node)  # type: ignore[union-attr]
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
    if claims and not dra_view.commit(  # type: ignore[union-attr]
            cluster, pod, claims, name, plans.get(name, {})):
        return
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
