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

Every HEARTBEAT_SECONDS each kubelet reads its node (NodeBackend.node_info: OS image, kernel,
runtime version, boot ID, machine ID, from the node itself) into status.nodeInfo, with a
`Rebooted` Warning event when the boot ID changed (setters.go MachineInfo), and renews its
node Lease in kube-node-lease, as the kubelet's node lease controller does
(k8s.io/component-helpers apimachinery/lease/controller.go newLease: holderIdentity = the node,
leaseDurationSeconds, renewTime now; the owner is the Node, kubernetes
pkg/kubelet/util/nodelease.go SetNodeOwnerFunc). A node that is not running does neither, as its
kubelet is down with it.
"""

from __future__ import annotations

import copy
import datetime
import time
from typing import TYPE_CHECKING

from gpuprov.lab.kube.backend import NodeInfo, NodeSpec
from gpuprov.lab.kube.errors import ApiError
from gpuprov.lab.kube.objects import (
    NOT_READY_TAINT,
    device_plugin_container,
    is_device_plugin,
    node_ready,
)
from gpuprov.lab.kube.registry import NODES, PODS, R, is_device_resource
from gpuprov.lab.kube.resources import GIT_VERSION
from gpuprov.lab.kube.store import now
from gpuprov.lab.toolkit import toolkit_rules

if TYPE_CHECKING:
    from gpuprov.lab.kube.cluster import Cluster


# The kubelet's defaults: nodeStatusUpdateFrequency 10 s; nodeLeaseDurationSeconds 40, renewed
# every quarter of it (kubernetes pkg/kubelet/apis/config/v1beta1/defaults.go,
# pkg/kubelet/kubelet.go nodeLeaseRenewIntervalFraction 0.25).
HEARTBEAT_SECONDS = 10.0
LEASE_DURATION_SECONDS = 40
NODE_LEASE_NAMESPACE = "kube-node-lease"


def micro_time(at: datetime.datetime | None = None) -> str:
    """metav1.MicroTime's JSON form (RFC 3339 with microseconds)."""
    at = at or datetime.datetime.now(datetime.timezone.utc)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def heartbeat(cluster: Cluster, name: str) -> NodeInfo | None:
    """One kubelet's heartbeat when it is due: read its node, renew its lease."""
    kubelet = cluster.kubelets[name]
    clock = time.monotonic()
    if clock - kubelet.heartbeat_at < cluster.heartbeat:
        return kubelet.node_info
    kubelet.heartbeat_at = clock
    info = cluster.backend.node_info(name)
    if info is not None:
        kubelet.node_info = info
        renew_lease(cluster, name)
    return kubelet.node_info


def renew_lease(cluster: Cluster, name: str) -> None:
    registry, leases = cluster.registry, R["Lease"]
    lease = registry.find(leases, NODE_LEASE_NAMESPACE, name)
    spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": micro_time()}
    if lease is not None:
        registry.replace(leases, NODE_LEASE_NAMESPACE, name, {
            **lease, "spec": {**(lease.get("spec") or {}), **spec}})
        return
    meta: dict = {"name": name, "namespace": NODE_LEASE_NAMESPACE}
    node = registry.find(NODES, "", name)
    if node is not None:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name,
                                    "uid": node["metadata"]["uid"]}]
    try:
        registry.create(leases, NODE_LEASE_NAMESPACE, {"metadata": meta, "spec": spec})
    except ApiError as err:  # no kube-node-lease namespace (deleted): renewed at the next beat
        if err.code not in (403, 404, 409):
            raise


def apply_node_info(status: dict, info: NodeInfo) -> None:
    """status.nodeInfo from what the kubelet read on its node."""
    status["nodeInfo"] = {**(status.get("nodeInfo") or {}),
                          "osImage": info.os_image, "kernelVersion": info.kernel_version,
                          "containerRuntimeVersion": info.container_runtime_version,
                          "bootID": info.boot_id, "machineID": info.machine_id,
                          "systemUUID": info.system_uuid}


def sync_nodes(cluster: Cluster) -> None:
    registry = cluster.registry
    pods = registry.list(PODS)[0]
    for name, kubelet in cluster.kubelets.items():
        node = registry.find(NODES, "", name)
        if node is None:
            continue
        info = heartbeat(cluster, name)
        not_ready = not_ready_message(cluster, name, info)
        ready = not_ready is None
        status = copy.deepcopy(node.get("status") or {})
        if info is not None:
            old_boot = (status.get("nodeInfo") or {}).get("bootID")
            apply_node_info(status, info)
            if old_boot and old_boot != info.boot_id:
                cluster.event(node, "Rebooted", f"Node {name} has been rebooted, boot id: "
                              f"{info.boot_id}", "Warning")
        conds = status.get("conditions") or []
        if node_ready(node) != ready or (not ready and _ready_message(node) != not_ready):
            conds = [c for c in conds if c.get("type") != "Ready"]
            conds += [c for c in node_conditions(ready, not_ready) if c["type"] == "Ready"]
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


def node_object(spec: NodeSpec, info: NodeInfo | None = None) -> dict:
    """The Node a node's kubelet registers (with what it read on its node, when it could)."""
    resources = {"cpu": spec.cpu, "memory": spec.memory, "pods": "110",
                 "ephemeral-storage": "100Gi"}
    node = {
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
                "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "",
                "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": GIT_VERSION,
                "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""},
        },
    }
    if info is not None:
        apply_node_info(node["status"], info)
    return node


def not_ready_message(cluster: Cluster, name: str, info: NodeInfo | None) -> str | None:
    """Why the node's kubelet reports it NotReady, None where it is Ready: the node-notready
    fault, or a runtime that does not answer. The kubelet's words for the latter are
    "container runtime is down" (pkg/kubelet/runtime.go runtimeErrors); the lab adds why."""
    if "node-notready" in cluster.faults(name):
        return NOT_READY_FAULT_MESSAGE
    if info is not None and info.runtime_error:
        return f"container runtime is down: {info.runtime_error}"
    return None


def _ready_message(node: dict) -> str | None:
    return next((c.get("message") for c in (node.get("status") or {}).get("conditions") or []
                 if c.get("type") == "Ready"), None)


NOT_READY_FAULT_MESSAGE = "container runtime network not ready (fault node-notready)"


def node_conditions(ready: bool, message: str | None = None) -> list[dict]:
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
                  else message or NOT_READY_FAULT_MESSAGE,
                  "lastHeartbeatTime": stamp, "lastTransitionTime": stamp})
    return conds
