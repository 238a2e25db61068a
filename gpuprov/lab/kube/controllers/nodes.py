"""Node status: what each node's kubelet posts about its node, and NVIDIA's device plugin
registering with it.

The Ready condition and the not-ready taint follow the node's `node-notready` fault (the
kubelet's node status manager, kubernetes pkg/kubelet/kubelet_node_status.go, with the node
lifecycle controller's taint; kwok's node controller plays this part for fake nodes).
The device plugin's resources (`nvidia.com/gpu`, and `nvidia.com/mig-<profile>` with the mixed
MIG strategy) follow the device plugin: registered while its pod runs on the node with NVIDIA's
runtime and finds GPUs (the kubelet's device manager). Capacity is the devices it serves (read
when its pod started, kubelet.PluginDevices), allocatable those whose GPU NVML reports
healthy. A resource it does not serve (any more) stays in capacity at 0, as the kubelet keeps
an unregistered resource's capacity at 0 (kubernetes pkg/kubelet/cm/devicemanager/manager.go
GetCapacity: deleted resources are reported with capacity 0); while no plugin is registered,
every nvidia.com/* resource keeps its capacity with nothing allocatable.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from gpuprov.lab.kube.backend import NodeSpec, host_kernel
from gpuprov.lab.kube.objects import (
    NOT_READY_TAINT,
    device_plugin_container,
    is_device_plugin,
    node_ready,
)
from gpuprov.lab.kube.registry import NODES, PODS, is_device_resource
from gpuprov.lab.kube.resources import GIT_VERSION
from gpuprov.lab.kube.store import now
from gpuprov.lab.toolkit import toolkit_rules

if TYPE_CHECKING:
    from gpuprov.lab.kube.cluster import Cluster


def sync_nodes(cluster: Cluster) -> None:
    registry = cluster.registry
    pods = registry.list(PODS)[0]
    for name, kubelet in cluster.kubelets.items():
        node = registry.find(NODES, "", name)
        if node is None:
            continue
        ready = "node-notready" not in cluster.faults(name)
        status = copy.deepcopy(node.get("status") or {})
        conds = status.get("conditions") or []
        if node_ready(node) != ready:
            conds = [c for c in conds if c.get("type") != "Ready"]
            conds += [c for c in node_conditions(ready) if c["type"] == "Ready"]
        status["conditions"] = conds
        capacity = dict(status.get("capacity") or {})
        allocatable = dict(status.get("allocatable") or {})
        kubelet.registered = registered_plugin(cluster, name, pods)
        served = kubelet.served()
        if served is not None:
            for resource in [r for r in capacity if is_device_resource(r)]:
                if resource not in served.resources:  # of an earlier plugin or layout
                    capacity[resource] = allocatable[resource] = "0"
            for resource, devices in served.resources.items():
                capacity[resource] = str(len(devices))
                allocatable[resource] = str(sum(map(kubelet.healthy, devices)))
        else:
            # The kubelet keeps a resource whose plugin went away, with nothing allocatable.
            for resource in [r for r in capacity if is_device_resource(r)]:
                allocatable[resource] = "0"
        status["capacity"], status["allocatable"] = capacity, allocatable
        spec = copy.deepcopy(node.get("spec") or {})
        taints = [t for t in spec.get("taints") or [] if t.get("key") != NOT_READY_TAINT["key"]]
        if not ready:
            taints.append({**NOT_READY_TAINT, "timeAdded": now()})
        old_taints = [t for t in (node.get("spec") or {}).get("taints") or []]
        if [(t["key"], t["effect"]) for t in taints] != \
                [(t["key"], t["effect"]) for t in old_taints]:
            if taints:
                spec["taints"] = taints
            else:
                spec.pop("taints", None)
            node = registry.replace(NODES, "", name, {**node, "spec": spec})
        if status != node.get("status"):
            registry.replace(NODES, "", name, {**node, "status": status}, "status")


def registered_plugin(cluster: Cluster, node: str, pods: list[dict]) -> str | None:
    """The UID of the device plugin pod registered on the node, None while none is."""
    if "plugin-unregistered" in cluster.faults(node):
        return None
    kubelet = cluster.kubelets[node]
    runtime = cluster.backend.runtime(node)
    node_gpus = [g.uuid for g in cluster.gpus_of(node)]
    for pod in pods:
        if (is_device_plugin(pod) and pod["spec"].get("nodeName") == node
                and pod.get("status", {}).get("phase") == "Running"
                and not pod["metadata"].get("deletionTimestamp")
                and runtime.handler_is_nvidia(kubelet._runtime_handler(pod["spec"]))):
            # The plugin sees the GPUs NVIDIA's runtime gives its container (its image asks
            # for all of them by NVIDIA_VISIBLE_DEVICES); one that finds no GPU, or cannot
            # initialise NVML, registers nothing.
            container = kubelet.container_view(pod, device_plugin_container(pod))
            try:
                found = toolkit_rules.container_gpus(
                    container, runtime.toolkit_settings, node_gpus, True)
            except toolkit_rules.UnknownDevice:
                return None
            uid = pod["metadata"]["uid"]
            return uid if found and kubelet.served(uid) is not None else None
    return None


def node_object(spec: NodeSpec) -> dict:
    """The Node a node's kubelet registers."""
    resources = {"cpu": spec.cpu, "memory": spec.memory, "pods": "110",
                 "ephemeral-storage": "100Gi"}
    return {
        "metadata": {"name": spec.name, "labels": {
            "kubernetes.io/hostname": spec.name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "gpuprov.io/emulated": "true"}},
        "spec": {},
        "status": {
            "capacity": dict(resources), "allocatable": dict(resources),
            "conditions": node_conditions(True),
            "addresses": [{"type": "Hostname", "address": spec.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64", "bootID": "", "containerRuntimeVersion":
                "containerd://emulated", "kernelVersion": host_kernel(),
                "kubeProxyVersion": "", "kubeletVersion": GIT_VERSION,
                "machineID": "", "operatingSystem": "linux",
                "osImage": "Debian GNU/Linux 12 (bookworm)", "systemUUID": ""},
        },
    }


def node_conditions(ready: bool) -> list[dict]:
    stamp = now()
    conds = []
    for type_, reason in (("MemoryPressure", "KubeletHasSufficientMemory"),
                          ("DiskPressure", "KubeletHasNoDiskPressure"),
                          ("PIDPressure", "KubeletHasSufficientPID")):
        conds.append({"type": type_, "status": "False", "reason": reason,
                      "lastHeartbeatTime": stamp, "lastTransitionTime": stamp})
    conds.append({"type": "Ready", "status": "True" if ready else "False",
                  "reason": "KubeletReady" if ready else "KubeletNotReady",
                  "message": "kubelet is posting ready status" if ready
                  else "container runtime network not ready (fault node-notready)",
                  "lastHeartbeatTime": stamp, "lastTransitionTime": stamp})
    return conds
