"""Cluster checks: what Kubernetes says about each inventory node, from one LIST of nodes
and one LIST of pods (gpuprov.verify.cluster), compared with the node's probe report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuprov.nvidia import labels as label_module
from gpuprov.verify import cluster
from gpuprov.verify.facts import ClusterFacts
from gpuprov.verify.findings import Verdict, check, passed, problem, skipped

GPU_RESOURCE = "nvidia.com/gpu"
# The NVIDIA device plugin's pods are recognised by their image, as kubelet-side tooling
# does: the DaemonSet's name and labels differ between the static manifest, the Helm chart
# and the GPU Operator; the image (nvcr.io/nvidia/k8s-device-plugin) does not.
DEVICE_PLUGIN_IMAGE = "k8s-device-plugin"


def is_device_plugin(pod: Mapping[str, Any]) -> bool:
    containers = (pod.get("spec") or {}).get("containers") or []
    return any(DEVICE_PLUGIN_IMAGE in str(c.get("image", "")) for c in containers)


def dra_node(facts: ClusterFacts) -> Verdict | None:
    """The device plugin's checks' verdict on a node in DRA mode (None: the plugin's node)."""
    if facts.node.dra:
        return skipped("gpu_allocation dra: NVIDIA's DRA driver allocates this node's GPUs "
                       "(see dra.*)")
    return None


def _not_found(facts: ClusterFacts) -> Verdict:
    return problem(f"no Kubernetes node named {facts.node.node_name} (kubectl get nodes); "
                   "the inventory name must be the node name, or set "
                   "gpu_node_labels_node_name for the host")


@check(
    "k8s.node-ready",
    phase="cluster",
    severity="error",
    gpu_only=False,
    description="the node is registered in Kubernetes and Ready",
    remediation="kubectl describe node NODE; check the kubelet (journalctl -u kubelet) "
    "and the container runtime on the node",
)
def node_ready(facts: ClusterFacts) -> Verdict:
    if facts.k8s_node is None:
        return _not_found(facts)
    ready = cluster.ready_condition(facts.k8s_node)
    unschedulable = bool((facts.k8s_node.get("spec") or {}).get("unschedulable"))
    if not cluster.is_ready(facts.k8s_node):
        why = (ready or {}).get("message") or (ready or {}).get("reason") or "no Ready condition"
        return problem(f"node not Ready: {why}", condition=dict(ready or {}),
                       gpu_allocation=facts.node.gpu_allocation)
    # Each node's allocation mode in the report: which of the k8s.* and dra.* checks apply.
    return passed("Ready" + (" (cordoned)" if unschedulable else "")
                  + f", gpu_allocation {facts.node.gpu_allocation}",
                  unschedulable=unschedulable, gpu_allocation=facts.node.gpu_allocation)


@check(
    "k8s.device-plugin",
    phase="cluster",
    severity="error",
    description="an NVIDIA device plugin pod is Running on the node",
    remediation="kubectl -n kube-system get pods -o wide | grep device-plugin; re-run the "
    "nvidia_device_plugin role; a plugin pod missing from a node means its nodeSelector or "
    "tolerations do not match it",
)
def device_plugin(facts: ClusterFacts) -> Verdict:
    if facts.k8s_node is None:
        return _not_found(facts)
    if (verdict := dra_node(facts)) is not None:
        return verdict
    plugins = [p for p in facts.pods if is_device_plugin(p)]
    if not plugins:
        return problem("no NVIDIA device plugin pod on the node")
    states = {p["metadata"]["namespace"] + "/" + p["metadata"]["name"]:
              (p.get("status") or {}).get("phase") for p in plugins}
    running = [name for name, phase in states.items() if phase == "Running"]
    if not running:
        return problem("device plugin pod not Running: "
                       + ", ".join(f"{n} {s}" for n, s in states.items()), pods=states)
    return passed(f"{running[0]} Running", pods=states)


def _gpu_quantity(resources: Mapping[str, Any] | None) -> int | None:
    value = (resources or {}).get(GPU_RESOURCE)
    return None if value is None else int(str(value))


def gpus_allocated(pods: tuple[Mapping[str, Any], ...]) -> int:
    """GPUs the node's non-terminated pods hold (extended resources: limits == requests)."""
    total = 0
    for pod in pods:
        for container in (pod.get("spec") or {}).get("containers") or []:
            resources = container.get("resources") or {}
            total += _gpu_quantity(resources.get("limits") or resources.get("requests")) or 0
    return total


def expected_resources(report: Mapping[str, Any], strategy: str) -> dict[str, int]:
    """What NVIDIA's device plugin offers for the node's healthy GPUs under its MIG strategy
    (the strategies as the plugin's README defines them, v0.20.0): none, every GPU as
    nvidia.com/gpu whatever its MIG mode; single, where every GPU has MIG on, its MIG devices
    as nvidia.com/gpu; mixed, GPUs with MIG off as nvidia.com/gpu and each MIG profile as
    nvidia.com/mig-<profile> ("+" written ".")."""
    gpus = [g for g in (report.get("nvml") or {}).get("gpus") or [] if g.get("error") is None]
    enabled = [g for g in gpus if (g.get("mig") or {}).get("current")]
    if strategy == "none" or not enabled:
        return {GPU_RESOURCE: len(gpus)}
    devices = [d for g in enabled for d in (g["mig"].get("devices") or [])]
    if strategy == "single":
        return {GPU_RESOURCE: 0 if single_refusal(report) else len(devices)}
    found = {GPU_RESOURCE: len(gpus) - len(enabled)}
    for device in devices:
        name = f"nvidia.com/mig-{str(device.get('profile') or '').replace('+', '.')}"
        found[name] = found.get(name, 0) + 1
    return found


def single_refusal(report: Mapping[str, Any]) -> str | None:
    """Why NVIDIA's device plugin refuses the node's MIG layout under the single strategy
    (and so offers nothing), as v0.20.0's internal/rm/device_map.go does: MIG on some GPUs and
    off on others, a GPU in MIG mode without MIG devices, more than one MIG profile. None
    where it starts (no GPU in MIG mode included)."""
    gpus = [g for g in (report.get("nvml") or {}).get("gpus") or [] if g.get("error") is None]
    enabled = [g for g in gpus if (g.get("mig") or {}).get("current")]
    if not enabled:
        return None
    if len(enabled) != len(gpus):
        return f"MIG is on for {len(enabled)} of {len(gpus)} GPUs"
    empty = [str(g.get("index")) for g in enabled if not g["mig"].get("devices")]
    if empty:
        return f"GPU(s) {', '.join(empty)} in MIG mode without MIG devices"
    profiles = sorted({str(d.get("profile")) for g in enabled for d in g["mig"]["devices"]})
    if len(profiles) > 1:
        return f"more than one MIG profile ({', '.join(profiles)})"
    return None


def _quantity(resources: Mapping[str, Any] | None, name: str) -> int:
    value = (resources or {}).get(name)
    return 0 if value is None else int(str(value))


@check(
    "k8s.allocatable",
    phase="cluster",
    severity="error",
    description="the node's allocatable GPU resources are NVML's healthy GPUs, or their MIG "
    "devices, as the device plugin's MIG strategy offers them",
    remediation="the device plugin did not register the GPUs: kubectl logs its pod on the "
    "node; restart it after fixing the driver or runtime (kubectl delete pod ...)",
)
def allocatable(facts: ClusterFacts) -> Verdict:
    if facts.k8s_node is None:
        return _not_found(facts)
    if (verdict := dra_node(facts)) is not None:
        return verdict
    if facts.report is None:
        return skipped("no probe report for the node (see host.probe)")
    status = facts.k8s_node.get("status") or {}
    strategy = facts.node.mig_strategy
    refusal = single_refusal(facts.report) if strategy == "single" else None
    if refusal:
        return problem(f"the device plugin's single MIG strategy refuses this node's MIG layout "
                       f"({refusal}) and offers no GPU: use the mixed strategy, or one MIG "
                       f"profile on every GPU", mig_strategy=strategy)
    expected = expected_resources(facts.report, strategy)
    offered = {name: _quantity(status.get("allocatable"), name)
               for name in sorted({*expected, *(n for n in status.get("allocatable") or {}
                                                 if n.startswith("nvidia.com/mig-"))})}
    alloc = offered.get(GPU_RESOURCE, 0)
    capacity = _gpu_quantity(status.get("capacity"))
    healthy = facts.healthy_gpu_count or 0
    gpus = ((facts.report.get("nvml") or {}).get("gpus")) or []
    busy = sum(1 for g in gpus if g.get("processes"))
    allocated = gpus_allocated(facts.pods)
    details = {"allocatable": alloc, "capacity": capacity, "nvml_healthy": healthy,
               "allocated_to_pods": allocated, "busy_with_processes": busy}
    usage = f"; {allocated} allocated to pods, {busy} busy with processes (NVML)"
    mig = {n: v for n, v in expected.items() if n != GPU_RESOURCE}
    if mig or strategy != "none" and expected[GPU_RESOURCE] != healthy:
        details.update(mig_strategy=strategy, expected=expected, offered=offered)
    wrong = {n: (offered.get(n, 0), want) for n, want in
             {**dict.fromkeys(offered, 0), **expected}.items() if offered.get(n, 0) != want}
    if set(wrong) == {GPU_RESOURCE} and not mig and expected[GPU_RESOURCE] == healthy:
        return problem(f"allocatable {GPU_RESOURCE} {alloc} != {healthy} healthy in NVML"
                       + usage, **details)
    if wrong:
        what = "; ".join(f"allocatable {n} {have} != {want}" for n, (have, want) in wrong.items())
        return problem(f"{what} (NVML's MIG devices under mig strategy {strategy})" + usage,
                       **details)
    if mig or expected[GPU_RESOURCE] != healthy:
        shown = ", ".join(f"{n} {v}" for n, v in expected.items())
        return passed(f"allocatable {shown} (mig strategy {strategy})" + usage, **details)
    return passed(f"allocatable {alloc} == NVML healthy {healthy}" + usage, **details)


@check(
    "k8s.labels",
    phase="cluster",
    severity="error",
    gpu_only=False,  # a node whose GPUs are gone must lose its GPU labels too
    description="the node's GPU labels are what gpuprov's labels module computes from its probe",
    remediation="re-run the gpu_node_labels role (ansible-playbook site.yml --limit NODE); "
    "labels gpuprov owns are not to be edited by hand",
)
def labels(facts: ClusterFacts) -> Verdict:
    if facts.k8s_node is None:
        return _not_found(facts)
    if facts.report is None:
        return skipped("no probe report for the node (see host.probe)")
    series_key = facts.node.series_key
    actual = dict((facts.k8s_node.get("metadata") or {}).get("labels") or {})
    expected = label_module.compute_labels(facts.report, series_key, facts.node.mig_strategy)
    drift = label_module.diff_labels(actual, expected, series_key)
    if drift:
        shown = (drift if isinstance(drift, Mapping) else {"diff": drift})
        text = "; ".join(f"{k}: {v}" for k, v in shown.items())
        return problem(f"labels drifted: {text}", diff=_plain(shown))
    return passed(f"{len(expected)} gpuprov label(s) as computed")


def _plain(value: Any) -> Any:
    """Whatever diff_labels returns, as JSON-friendly data."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


@check(
    "k8s.health",
    phase="cluster",
    severity="error",
    description="the node's gpuprov health agent reports no problem (no gpuprov.io/ condition "
    "True)",
    remediation="gpuprov health show; the condition's message names the GPU, the evidence and "
    "the action; after fixing an XID fault: gpuprov health ack NODE --reason TEXT; another "
    "problem clears after passing checks (systemctl reload gpuprov-health-agent on the node "
    "checks at once)",
)
def health(facts: ClusterFacts) -> Verdict:
    from gpuprov.health import fleet

    if facts.k8s_node is None:
        return _not_found(facts)
    node = fleet.node_health(facts.k8s_node)
    if not node.conditions:
        return skipped("no gpuprov.io/ conditions: the gpu_health agent does not run here")
    problems = node.problems
    if problems:
        return problem("; ".join(f"{c['type']} since {c.get('lastTransitionTime')}: "
                                 f"{c.get('message')}" for c in problems),
                       conditions=[dict(c) for c in problems])
    if node.unknown:
        return passed("the health agent has not finished its first check cycle (Unknown)")
    return passed(f"{len(node.conditions)} gpuprov.io/ condition(s) False")
