"""The nvidia_device_plugin role's decisions about the cluster, from what the Kubernetes API
answered (k8s_info's resources, the k8s module's apply result), called through the filters in
plugins/filter/nvidia_device_plugin.py:

    node_problem       before the apply: GPU nodes the cluster does not know, and those the
                       DaemonSet's nodeSelector leaves out (None when there are none)
    applied_daemonset  the DaemonSet as the API answered the apply
    settled            nothing to wait for: the DaemonSet's controller has seen this template,
                       every node it selects runs an available pod of it (what `kubectl rollout
                       status` checks), and every GPU node advertised nvidia.com/gpu before
                       the apply, which restarted no pod; a second run then makes no wait
                       request
    ds_generation      the DaemonSet's generation once its controller has seen it (0 until
                       then): its pods of the current template carry it in the label
                       pod-template-generation
    without_pod        GPU nodes without a Running plugin pod of the current template
    allocatable_gpus   each GPU node's allocatable GPU devices: nvidia.com/gpu plus the MIG
                       devices of the mixed strategy, nvidia.com/mig-<profile> ("0" when none)
    without_gpus       GPU nodes that advertise none
    registration       after the waits: the nodes without a current pod or without GPUs, each
                       node's allocatable GPUs, and the problem to fail with (None: none)
    node_modes         each GPU host's cdi | legacy, which names its plugin config
    device_list_problems  the legacy strategy against the toolkit settings of each GPU host
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from gpuprov import runtime_mode
from gpuprov.stages import _toolkit_config
from gpuprov.stages._node_read import truthy

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def _meta(obj: Mapping) -> Mapping:
    return obj.get("metadata") or {}


def unselected_nodes(node_list: Iterable[Mapping], gpu_nodes: list, selector: Mapping) -> list:
    """The play's GPU nodes whose labels lack one of the nodeSelector's."""
    out = []
    for node in node_list:
        labels = _meta(node).get("labels") or {}
        if _meta(node).get("name") in gpu_nodes and any(
                labels.get(key) != value for key, value in selector.items()):
            out.append(_meta(node)["name"])
    return out


def node_problem(node_list: list, gpu_nodes: list, selector: Mapping,
                 check_mode: bool = False) -> str | None:
    """What is wrong with the play's GPU nodes as the cluster has them, with what to do. In
    check mode the labels stage changed nothing, so missing labels are not a problem yet."""
    known = {_meta(node).get("name") for node in node_list}
    unknown = [name for name in gpu_nodes if name not in known]
    unselected = [] if check_mode else unselected_nodes(node_list, gpu_nodes, selector)
    text = ""
    if unknown:
        text += (f"GPU nodes not in the cluster: {', '.join(unknown)} (kubectl get nodes; join "
                 "them first, or set gpu_node_labels_node_name when the inventory name is not "
                 "the node name). ")
    if unselected:
        text += (f"GPU nodes without the labels {json.dumps(dict(selector))} the DaemonSet "
                 f"selects: {', '.join(unselected)}. Run the labels stage first "
                 "(playbooks/labels.yml), or change nvidia_device_plugin_node_selector.")
    return text or None


def applied_daemonset(applied: Mapping) -> dict:
    """The DaemonSet in the k8s module's result of applying several objects ({} if none)."""
    for item in (applied.get("result") or {}).get("results") or []:
        obj = (item.get("result") or {}) if isinstance(item, Mapping) else {}
        if obj.get("kind") == "DaemonSet":
            return dict(obj)
    return {}


def allocatable_gpus(names: Iterable[str], nodes: Iterable[Mapping]) -> dict[str, str]:
    """Each named node's allocatable GPU devices in a LIST of Node objects (nvidia.com/gpu and,
    under the plugin's mixed MIG strategy, nvidia.com/mig-<profile>: a node whose GPUs are all
    partitioned offers no nvidia.com/gpu), "0" when the node has none or is not in the list."""
    allocatable = {}
    for node in nodes:
        if isinstance(node, Mapping):
            resources = (node.get("status") or {}).get("allocatable") or {}
            allocatable[_meta(node).get("name")] = str(sum(
                int(str(value)) for key, value in resources.items()
                if (key == GPU_RESOURCE or str(key).startswith(MIG_RESOURCE_PREFIX))
                and str(value).isdigit()))
    return {name: allocatable.get(name, "0") for name in names}


def without_gpus(gpu_nodes: Iterable[str], nodes: Iterable[Mapping]) -> list:
    return [name for name, count in allocatable_gpus(gpu_nodes, nodes).items() if count == "0"]


def settled(daemonset: Mapping, gpu_nodes: list, nodes_before: list) -> bool:
    if not daemonset:
        return False
    status = daemonset.get("status") or {}
    desired = status.get("desiredNumberScheduled", -1)
    return (status.get("observedGeneration", 0) >= _meta(daemonset).get("generation", 1)
            and status.get("updatedNumberScheduled", 0) == desired
            and status.get("numberAvailable", 0) == desired
            and not without_gpus(gpu_nodes, nodes_before))


def ds_generation(resources: list) -> int:
    daemonset = resources[0] if resources else {}
    generation = _meta(daemonset).get("generation", 0)
    observed = (daemonset.get("status") or {}).get("observedGeneration", 0)
    return generation if observed >= generation else 0


def without_pod(pods: Iterable[Mapping], gpu_nodes: list, generation: int) -> list:
    running = set()
    for pod in pods:
        meta = _meta(pod)
        if ((pod.get("status") or {}).get("phase") == "Running"
                and "deletionTimestamp" not in meta
                and (meta.get("labels") or {}).get("pod-template-generation") == str(generation)):
            running.add((pod.get("spec") or {}).get("nodeName"))
    return [name for name in gpu_nodes if name not in running]


def _resources(read: Mapping | None) -> list[Mapping]:
    """A k8s_info result's objects ([] where the task was skipped or failed)."""
    return [o for o in ((read or {}).get("resources") or []) if isinstance(o, Mapping)]


def registration(gpu_nodes: list, *, daemonset: Mapping | None = None,
                 pods: Mapping | None = None, nodes: Mapping | None = None,
                 nodes_before: Mapping | None = None, settled: bool = False,
                 namespace: str = "", pod_label: str = "", wait_s: int = 0) -> dict:
    """What the role's waits saw, from their k8s_info results (the DaemonSet, its pods, the
    nodes; each skipped when the rollout was settled already): the GPU nodes without a running
    pod of the current template, those without allocatable GPUs (in the last LIST of nodes,
    else the one before the apply), each node's allocatable GPUs, a one-line summary, and the
    problem to fail with (None: the plugin registered everywhere)."""
    listed = _resources(nodes) if (nodes or {}).get("resources") is not None else _resources(
        nodes_before)
    missing_pod = [] if settled else without_pod(
        _resources(pods), gpu_nodes, ds_generation(_resources(daemonset)))
    missing_gpus = without_gpus(gpu_nodes, listed)
    allocatable = allocatable_gpus(gpu_nodes, listed)
    problem = None
    if missing_pod or missing_gpus:
        problem = (f"The NVIDIA device plugin did not register on every GPU node within "
                   f"{wait_s} s. "
                   + (f"No running plugin pod of the current template on: "
                      f"{', '.join(missing_pod)}. " if missing_pod else "")
                   + (f"No allocatable nvidia.com/gpu on: {', '.join(missing_gpus)}. "
                      if missing_gpus else "")
                   + f"Look at `kubectl -n {namespace} get pods -l name={pod_label} -o wide` and "
                   "the pod's logs: the driver (nvidia-smi on the node) and the NVIDIA runtime in "
                   "the container runtime (the container toolkit stage) must work first.")
    summary = (", ".join(f"{name}: {count}" for name, count in sorted(allocatable.items()))
               or "no GPU node in this play")
    return {"without_pod": missing_pod, "without_gpus": missing_gpus, "allocatable": allocatable,
            "summary": summary, "problem": problem}


# The nvidia_container_toolkit role's settings and the toolkit keys they set.
_TOOLKIT_SETTINGS = {
    "nvidia_container_toolkit_accept_envvar_unprivileged":
        "accept-nvidia-visible-devices-envvar-when-unprivileged",
    "nvidia_container_toolkit_accept_volume_mounts":
        "accept-nvidia-visible-devices-as-volume-mounts",
}


def _gpu_hosts(hosts: Iterable[str], hostvars: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    for host in hosts:
        values = hostvars[host]
        if truthy(values.get("gpu_preflight_has_gpu", True)):
            yield host, values


def node_modes(hosts: Iterable[str], hostvars: Mapping[str, Any]) -> dict[str, str]:
    """{Kubernetes node name: cdi | legacy} of the GPU hosts: the mode the toolkit stage
    applied in this run, else the same decision from the inventory's setting and the runtime
    version the preflight's probe found (gpuprov/runtime_mode.py)."""
    modes = {}
    for host, values in _gpu_hosts(hosts, hostvars):
        name = str(values.get("gpu_node_labels_node_name") or host)
        mode = values.get("nvidia_container_toolkit_mode_applied")
        if mode not in (runtime_mode.CDI, runtime_mode.LEGACY):
            probe = values.get("gpu_preflight_probe") or {}
            runtime = str(values.get("nvidia_container_toolkit_runtime") or "containerd")
            choice = runtime_mode.choose(
                values.get("nvidia_container_toolkit_mode"), runtime,
                runtime_mode.packaged_version(runtime, (probe.get("packages") or {})))
            mode = choice.mode or runtime_mode.LEGACY
        modes[name] = mode
    return modes


def device_list_problems(strategy: str, hosts: list[str],
                         hostvars: Mapping[str, Any]) -> list[str]:
    """The legacy strategy against the toolkit settings of the GPU hosts in legacy mode (CDI
    nodes get the plugin's cdi config, which the toolkit's access keys do not gate); settings
    the inventory does not set are the toolkit role's defaults."""
    modes = node_modes(hosts, hostvars)
    settings = {}
    for host, values in _gpu_hosts(hosts, hostvars):
        if modes.get(str(values.get("gpu_node_labels_node_name") or host)) == runtime_mode.CDI:
            continue
        settings[str(host)] = {
            key: truthy(values[var]) if var in values else _toolkit_config.SECURE[key]
            for var, key in _TOOLKIT_SETTINGS.items()}
    return _toolkit_config.strategy_problems(str(strategy), settings)
