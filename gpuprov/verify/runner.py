"""Select checks, collect every node's facts, then evaluate: nothing is decided until
every node has answered (or failed to), so one bad host never hides the others."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
from collections.abc import Iterable, Sequence

from gpuprov.errors import GpuprovError
from gpuprov.verify import checks as _registered  # noqa: F401 (registers the node phase)
from gpuprov.verify import cluster, containers, node_phase, nodes, pods, swarm

# Registration order is report order: the cluster, pod, container and Swarm phases.
# isort: off
from gpuprov.verify.checks import k8s as _k8s_checks  # noqa: F401 (then the cluster phase)
from gpuprov.verify.checks import dra as _dra_checks  # noqa: F401 (its DRA nodes' checks)
from gpuprov.verify.checks import pods as _pod_checks  # noqa: F401 (the pod phase)
from gpuprov.verify.checks import containers as _container_checks  # noqa: F401 (Docker hosts)
from gpuprov.verify.checks import swarm as _swarm_checks  # noqa: F401 (and Swarm)
# isort: on
from gpuprov.verify.checks.host import PROBE_CHECK
from gpuprov.verify.facts import ClusterFacts, ContainerFacts, NodeFacts, PodFacts, SwarmFacts
from gpuprov.verify.findings import (
    CHECKS,
    ERROR,
    FAIL,
    Check,
    Finding,
    skipped,
)
from gpuprov.verify.inventory import Node

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Options:
    only: tuple[str, ...] = ()  # --checks: ids or families ("gpu"); empty: all
    skip: tuple[str, ...] = ()  # --skip
    timeout: float = 60.0
    concurrency: int = 32
    kubeconfig: str | None = None
    context: str | None = None
    pods: bool = True  # --no-pods: False (the smoke containers and Swarm services too)
    image: str | None = None  # --image: the smoke pods' and containers' image, *.cuda-compat


def _matches(check_id: str, pattern: str) -> bool:
    return check_id == pattern or check_id.split(".", 1)[0] == pattern


def select_checks(only: Iterable[str] = (), skip: Iterable[str] = ()) -> list[Check]:
    """The checks to run, in report order; an unknown id or family is a usage error."""
    only, skip = list(only), list(skip)
    for pattern in only + skip:
        if not any(_matches(c, pattern) for c in CHECKS):
            families = sorted({c.split(".", 1)[0] for c in CHECKS})
            raise GpuprovError(f"unknown check {pattern!r}; known: {', '.join(CHECKS)} "
                               f"(or a family: {', '.join(families)})")
    return [c for c in CHECKS.values()
            if (not only or any(_matches(c.id, p) for p in only))
            and not any(_matches(c.id, p) for p in skip)]


_evaluate = node_phase.evaluate_one


def node_findings(results: Sequence[nodes.ProbeResult], selected: Sequence[Check]) -> list[Finding]:
    node_checks = [c for c in selected if c.phase == "node"]
    fleet = {r.node.name: NodeFacts(r.node, r.report) for r in results if r.report is not None}
    fleet = {name: dataclasses.replace(f, fleet=fleet) for name, f in fleet.items()}
    findings: list[Finding] = []
    for result in results:
        name = result.node.name
        facts = fleet.get(name)
        if facts is None:
            # Reported even when host.probe is not selected: an unreachable node is news.
            status = ERROR if result.unreachable else FAIL
            findings.append(Finding(
                PROBE_CHECK, name, status,
                ("unreachable: " if result.unreachable else "probe failed: ") + str(result.error),
                {"unreachable": result.unreachable}, CHECKS[PROBE_CHECK].remediation))
            findings += [c.finding(name, skipped(f"not checked: no probe report ({PROBE_CHECK})"))
                         for c in node_checks if c.id != PROBE_CHECK]
            continue
        findings += node_phase.evaluate(facts, node_checks)
    return findings


def cluster_findings(results: Sequence[nodes.ProbeResult], view: cluster.ClusterView | None,
                     selected: Sequence[Check], why_none: str = "") -> list[Finding]:
    cluster_checks = [c for c in selected if c.phase == "cluster"]
    findings: list[Finding] = []
    for result in results:
        name = result.node.name
        for check in cluster_checks:
            if view is None:
                findings.append(check.finding(name, skipped(why_none)))
                continue
            k8s = result.node.node_name
            facts = ClusterFacts(result.node, result.report, view.nodes.get(k8s),
                                 view.pods_by_node.get(k8s, ()),
                                 view.slices_by_node.get(k8s, ()))
            gpu_node = bool((result.report or {}).get("pci")) or (
                result.report is None and result.node.gpu_expected)
            if check.gpu_only and not gpu_node:
                findings.append(check.finding(name, skipped("no NVIDIA GPU on PCI")))
            else:
                findings.append(_evaluate(check, name, facts))
    return findings


def _allocatable(k8s_node: dict | None, resource: str = pods.GPU_RESOURCE) -> int:
    value = ((k8s_node or {}).get("status") or {}).get("allocatable", {}).get(resource)
    try:
        return int(value or 0)
    except ValueError:
        return 0


def smoke_resource(k8s_node: dict | None) -> str | None:
    """What the smoke pods request on a node: nvidia.com/gpu where it offers any, else the MIG
    profile it offers most of (mixed strategy, every GPU partitioned), else None."""
    if _allocatable(k8s_node) > 0:
        return pods.GPU_RESOURCE
    offered = ((k8s_node or {}).get("status") or {}).get("allocatable") or {}
    mig = sorted((-_allocatable(k8s_node, name), name) for name in offered
                 if name.startswith("nvidia.com/mig-") and _allocatable(k8s_node, name) > 0)
    return mig[0][1] if mig else None


def _requested(pod: dict, resource: str = pods.GPU_RESOURCE) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        requests = (container.get("resources") or {}).get("requests") or {}
        total += int(limits.get(resource) or requests.get(resource) or 0)
    return total


def pod_findings(results: Sequence[nodes.ProbeResult], view: cluster.ClusterView | None,
                 selected: Sequence[Check], options: Options, api: object | None,
                 why_none: str = "") -> list[Finding]:
    """Smoke workloads on the GPU nodes that advertise GPUs, then the pod checks."""
    pod_checks = [c for c in selected if c.phase == "pod"]
    if not pod_checks:
        return []
    kinds = [k for k in (c.id.split(".", 1)[1] for c in pod_checks)
             if k in pods.SMOKE_KINDS or k in pods.DRA_KINDS]
    targets: list[pods.Target | pods.DraTarget] = []
    why_not: dict[str, str] = {}
    for result in results:
        name, k8s = result.node.name, result.node.node_name
        k8s_node = view.nodes.get(k8s) if view is not None else None
        if not options.pods:
            why_not[name] = "--no-pods"
        elif view is None:
            why_not[name] = why_none
        elif result.report is None:
            why_not[name] = f"no probe report ({PROBE_CHECK})"
        elif not cluster.is_ready(k8s_node):
            # Its pods would wait out --timeout, three times over, to say what it says.
            why_not[name] = "the node is not Ready (see k8s.node-ready)"
        elif result.node.dra:
            # The device plugin's smoke asks for nvidia.com/gpu, which a DRA node does not
            # offer: its GPUs are claimed (dra.claim-*), and no-request runs as everywhere.
            slices = view.slices_by_node.get(k8s, ())
            gpus = [g for g in ((result.report.get("nvml") or {}).get("gpus") or [])
                    if g.get("error") is None and g.get("name")]
            targets.append(pods.DraTarget(
                k8s, slices if isinstance(slices, tuple) else (),
                gpus[0]["name"] if gpus else None,
                functools.partial(nodes.file_exists, result.node, timeout=options.timeout)))
        elif (resource := smoke_resource(k8s_node)) is None:
            why_not[name] = ("the node advertises no nvidia.com/gpu or MIG device "
                             "(see k8s.allocatable)")
        else:
            held = sum(_requested(p, resource) for p in view.pods_by_node.get(k8s, ()))
            targets.append(pods.Target(k8s, _allocatable(k8s_node, resource), held, resource))
    # The smoke pods' image: --image, else the one the inventory gives the role's smoke test,
    # else the role's default (pods.run).
    image = options.image or next((r.node.smoke_image for r in results if r.node.smoke_image),
                                  None)
    runs = pods.run(api, targets, kinds, options.timeout, options.concurrency,
                    image) if targets and kinds else {}
    findings = []
    for result in results:
        name = result.node.name
        facts = PodFacts(result.node, result.report, runs.get(result.node.node_name, {}),
                         why_not.get(name), options.image)
        gpu_node = bool((result.report or {}).get("pci")) or (
            result.report is None and result.node.gpu_expected)
        for check in pod_checks:
            if not gpu_node:
                findings.append(check.finding(name, skipped("no NVIDIA GPU on PCI")))
            else:
                findings.append(_evaluate(check, name, facts))
    return findings


def _gpu_host(result: nodes.ProbeResult) -> bool:
    return bool((result.report or {}).get("pci")) or (
        result.report is None and result.node.gpu_expected)


def _smoke_image(results: Sequence[nodes.ProbeResult], options: Options) -> str:
    from gpuprov import manifests

    default = manifests.load_values()["nvidia_device_plugin_smoke_image"]
    return options.image or next((r.node.smoke_image for r in results if r.node.smoke_image),
                                 None) or default


def container_findings(results: Sequence[nodes.ProbeResult], selected: Sequence[Check],
                       options: Options) -> tuple[list[Finding], dict]:
    """Smoke containers on the Docker hosts with GPUs, then the container checks; and the
    hosts' engines asked for their swarm membership, which the swarm phase needs."""
    checks = [c for c in selected if c.phase == "container"]
    wants_swarm = any(c.phase == "swarm" for c in selected) and any(r.node.swarm
                                                                     for r in results)
    if not checks and not wants_swarm:
        return [], {}
    kinds = [c.id.split(".", 1)[1] for c in checks]
    hosts, why_not = [], {}
    for result in results:
        gpus = ((result.report or {}).get("nvml") or {}).get("gpus") or []
        if not options.pods:
            why_not[result.node.name] = "--no-pods"
        elif result.report is None:
            why_not[result.node.name] = f"no probe report ({PROBE_CHECK})"
        elif result.node.target is None:
            why_not[result.node.name] = "a local node: Docker's API is reached over SSH only"
        else:
            hosts.append((result.node.target, result.node.name,
                          [g for g in gpus if g.get("error") is None], result.node.toolkit_mode))
    runs = containers.run(hosts, _smoke_image(results, options), options.timeout, kinds,
                          options.concurrency) if hosts else {}
    findings = []
    for result in results:
        name = result.node.name
        facts = ContainerFacts(result.node, result.report, runs.get(name), why_not.get(name),
                               options.image)
        for check in checks:
            if not _gpu_host(result):
                findings.append(check.finding(name, skipped("no NVIDIA GPU on PCI")))
            else:
                findings.append(_evaluate(check, name, facts))
    return findings, runs


def swarm_findings(results: Sequence[nodes.ProbeResult], selected: Sequence[Check],
                   options: Options, runs: dict) -> list[Finding]:
    """The swarm's view through a manager, its smoke services, then the swarm checks."""
    checks = [c for c in selected if c.phase == "swarm"]
    members = [r for r in results if r.node.swarm]
    if not checks or not members:
        return []
    view, why_none = None, ""
    if not options.pods:
        why_none = "--no-pods"
    else:
        view = swarm.collect(members, runs, _smoke_image(results, options), options.timeout,
                             {c.id for c in checks})
        why_none = view.error if view.error else ""
    findings = []
    for result in members:
        name = result.node.name
        facts = SwarmFacts(result.node, result.report, view if not why_none else None,
                           why_none or None, runs.get(name))
        for check in checks:
            if not _gpu_host(result):
                findings.append(check.finding(name, skipped("no NVIDIA GPU on PCI")))
            else:
                findings.append(_evaluate(check, name, facts))
    return findings


def run(
    inventory_nodes: list[Node],
    options: Options,
    progress: nodes.Progress | None = None,
    probe: nodes.ProbeFunc | None = None,
) -> list[Finding]:
    """Every selected check on every node, grouped by node in inventory order."""
    selected = select_checks(options.only, options.skip)
    # Kubernetes phases only where the inventory has Kubernetes nodes (a Docker-only site
    # needs no kubeconfig).
    wants_cluster = any(c.phase in ("cluster", "pod") for c in selected) and any(
        not n.docker for n in inventory_nodes)
    api = None
    why_none = ""
    if wants_cluster:
        # Configuration problems (exit 2) surface before minutes of SSH, not after.
        inventory_config = next((n.kubeconfig for n in inventory_nodes if n.kubeconfig), None)
        kubeconfig = cluster.find_kubeconfig(options.kubeconfig, inventory_config)
        if kubeconfig is None:
            if options.context:
                raise GpuprovError(f"--context {options.context} given but no kubeconfig "
                                   "found; pass --kubeconfig FILE")
            why_none = "no kubeconfig (pass --kubeconfig FILE): cluster not checked"
            log.warning("%s", why_none)
        else:
            api = cluster.api_client(kubeconfig, options.context)
    # The cluster's view is read while the nodes are probed: neither waits for the other.
    snapshot = None
    if api is not None:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot")
        dra_nodes = tuple(n.node_name for n in inventory_nodes if n.dra and not n.docker)
        snapshot = pool.submit(cluster.snapshot, api, dra_nodes)
        pool.shutdown(wait=False)
    results = nodes.collect(inventory_nodes, options.timeout, options.concurrency,
                            probe=probe, progress=progress)
    view = snapshot.result() if snapshot is not None else None
    findings = node_findings(results, selected)
    k8s = [r for r in results if not r.node.docker]
    docker = [r for r in results if r.node.docker]
    if wants_cluster:
        findings += cluster_findings(k8s, view, selected, why_none)
        findings += pod_findings(k8s, view, selected, options, api, why_none)
    if docker:
        found, runs = container_findings(docker, selected, options)
        findings += found
        findings += swarm_findings(docker, selected, options, runs)
    order = {n.name: i for i, n in enumerate(inventory_nodes)}
    rank = {c: i for i, c in enumerate(CHECKS)}
    return sorted(findings, key=lambda f: (order.get(f.node, len(order)), rank.get(f.check, 0)))

