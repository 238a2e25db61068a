"""Swarm checks: what a manager of the swarm says of each Swarm GPU node, and what Swarm's own
scheduling gave the smoke services (gpuprov.verify.swarm)."""

from __future__ import annotations

from gpuprov.verify.checks.containers import judge_no_request
from gpuprov.verify.facts import ContainerFacts, SwarmFacts
from gpuprov.verify.findings import Verdict, check, errored, passed, problem, skipped


def _view(facts: SwarmFacts) -> tuple[object | None, str | None, Verdict | None]:
    if facts.skipped:
        return None, None, skipped(facts.skipped)
    view = facts.view
    if view is None:
        return None, None, skipped("not run")
    if view.error:
        return None, None, errored(view.error)
    node_id = view.node_ids.get(facts.node.name)
    if not node_id:
        return None, None, problem("the host's engine is in no swarm (docker info: "
                                   "Swarm.LocalNodeState is not active)")
    return view, node_id, None


@check(
    "swarm.generic-resources",
    phase="swarm",
    severity="error",
    description="a Swarm GPU node advertises exactly its healthy GPUs (NVML's UUIDs) as named "
    "generic resources of the GPU kind, as the swarm's manager sees it",
    remediation="run the toolkit stage on the node (ansible-playbook site.yml --limit NODE): "
    "it merges the node's healthy GPUs into node-generic-resources of /etc/docker/daemon.json "
    "and restarts Docker",
)
def generic_resources(facts: SwarmFacts) -> Verdict:
    view, node_id, reason = _view(facts)
    if reason:
        return reason
    kind = facts.node.swarm_kind
    advertised = [v for k, v in view.nodes.get(node_id, {}).get("resources", []) if k == kind]
    healthy = facts.healthy_uuids
    extra = sorted(set(advertised) - set(healthy))
    missing = sorted(set(healthy) - set(advertised))
    details = {"advertised": advertised, "healthy": healthy, "kind": kind, "node_id": node_id}
    if extra or missing or len(advertised) != len(set(advertised)):
        parts = []
        if extra:
            parts.append(f"advertises {len(extra)} GPU(s) it does not have (or not healthy): "
                         f"{', '.join(extra)}")
        if missing:
            parts.append(f"does not advertise {len(missing)} healthy GPU(s): "
                         f"{', '.join(missing)}")
        if len(advertised) != len(set(advertised)):
            parts.append("advertises a GPU twice")
        return problem(f"Swarm node {node_id[:12]} " + "; ".join(parts), **details)
    return passed(f"advertises its {len(healthy)} healthy GPU(s) as {kind}, by UUID", **details)


@check(
    "swarm.service",
    phase="swarm",
    severity="error",
    description="a Swarm service reserving one GPU runs on the node and its container sees "
    "exactly the GPU Swarm assigned; a service placed by the node's GPU series label lands on "
    "a node of that series",
    remediation="check the toolkit's swarm-resource on the node (DOCKER_RESOURCE_ and the kind, "
    "upper-cased), that NVIDIA's runtime is Docker's default there, and the node's labels "
    "(the labels stage, through a manager: ansible-playbook site.yml --limit NODE)",
)
def service(facts: SwarmFacts) -> Verdict:
    view, node_id, reason = _view(facts)
    if reason:
        return reason
    record = view.services.get(facts.node.name)
    if record is None:
        return skipped("no service was run (swarm.service not selected?)")
    details = {"request": record.request, "assigned": list(record.assigned),
               "seen": list(record.seen), "state": record.state}
    if record.error:
        return problem(f"service `{record.request}`: {record.error}", **details)
    if record.node_id != node_id:
        return problem(f"service `{record.request}` ran on {record.node_id[:12]}, not on this "
                       "node", **details)
    if len(record.assigned) != 1 or list(record.seen) != list(record.assigned):
        return problem(f"Swarm assigned {', '.join(record.assigned) or 'nothing'}, the "
                       f"container saw {', '.join(record.seen) or 'no GPU'}", **details)
    key = facts.node.series_key
    mine = [s for s, ids in view.series_nodes.items() if node_id in ids]
    for series in mine:
        placed = view.placed.get(series)
        details[f"placed:{series}"] = placed.node_id if placed else None
        if placed is None or placed.error:
            return problem(f"the service placed by node.labels.{key}=={series}: "
                           f"{placed.error if placed else 'not run'}", **details)
        if placed.node_id not in view.series_nodes[series]:
            return problem(f"the service placed by node.labels.{key}=={series} landed on "
                           f"{placed.node_id[:12]}, which has no {series}", **details)
    where = f"; placed by {key}=={', '.join(mine)} it landed on a node of that series" \
        if mine else ""
    return passed(f"Swarm assigned {record.assigned[0]} and the container saw exactly it{where}",
                  **details)


@check(
    "swarm.no-request",
    phase="swarm",
    severity="warning",
    description="on a Swarm GPU node, a container that asks for no GPU but sets "
    "NVIDIA_VISIBLE_DEVICES=all sees none (Swarm needs NVIDIA's runtime as Docker's default and "
    "the variable honoured, so this is reported, not failed)",
    remediation="Swarm tasks can pick no runtime, and NVIDIA's hook reads a task's assigned GPUs "
    "only from its environment (toolkit internal/config/image/cuda_image.go VisibleDevices): a "
    "Swarm GPU node cannot refuse GPUs to containers that set the variable; keep untrusted "
    "workloads off Swarm GPU nodes, or take the node out of docker_swarm "
    "(nvidia_container_toolkit_docker_swarm: false) to close it",
)
def no_request(facts: SwarmFacts) -> Verdict:
    if facts.run is None:
        return skipped(facts.skipped or "no smoke containers ran on the node")
    return judge_no_request(ContainerFacts(facts.node, facts.report, facts.run))
