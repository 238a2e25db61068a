"""The nvidia_dra_driver role's decisions, from the inventory (gpu_allocation per host) and what
the Kubernetes API answered (k8s_info's resources), called through the filters in
plugins/filter/nvidia_dra_driver.py:

    mode            a host's allocation mode (device-plugin | dra) from its gpu_allocation
    dra_nodes       Kubernetes names of the play's GPU hosts whose gpu_allocation is dra
    node_mode       the mode a Node is in now, from its deploy labels (labels.allocation_labels)
    plan            per node: whether its mode changes, why, and the label patch of the new mode
    gpu_pods        the pods to evict before a switch: those asking for a device plugin's GPU
                    resource (gpu_mig.gpu_pods) and those holding a gpu.nvidia.com claim
    without_slice   DRA nodes without the DRA driver's ResourceSlice
    switched        whether a switched node offers its GPUs in its new mode: the DRA driver's
                    ResourceSlice for the node, or allocatable nvidia.com/gpu (or MIG devices)
    switch_problem  the line to fail with when a switch's wait ran out

A node is in one mode, never both (gpuprov/gpu_allocation.py says why and cites the sources);
only the two deploy labels say which, so that the device plugin's DaemonSet leaves a DRA node
out and the DRA driver's DaemonSet selects it (templates/nvidia-device-plugin.yml.j2,
templates/nvidia-dra-driver.yml.j2).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuprov import gpu_allocation
from gpuprov.nvidia import labels
from gpuprov.stages import gpu_mig, nvidia_device_plugin
from gpuprov.stages._node_read import truthy

# gpu_node_maintenance's owner for a switch: annotations gpuprov.io/gpu-allocation-*.
OWNER = "gpu-allocation"


def mode(value: Any) -> str:
    """gpu_allocation.mode(), whose SettingError is the one line validate.yml fails with."""
    return gpu_allocation.mode(value)


def _gpu_hosts(hosts: Iterable[str], hostvars: Mapping[str, Any]):
    for host in hosts:
        values = hostvars.get(host) or {}
        # Hosts the preflight found no GPU on have no allocation mode.
        if truthy(values.get("gpu_preflight_has_gpu", True)):
            yield host, values


def dra_nodes(hosts: Iterable[str], hostvars: Mapping[str, Any]) -> list[str]:
    """Kubernetes names (gpu_node_labels_node_name, else the host's name) of the GPU hosts
    whose gpu_allocation is dra."""
    return [str(values.get("gpu_node_labels_node_name") or host)
            for host, values in _gpu_hosts(hosts, hostvars)
            if mode(values.get(gpu_allocation.SETTING)) == gpu_allocation.DRA]


def _labels(node: Mapping) -> Mapping:
    return (node.get("metadata") or {}).get("labels") or {}


def node_mode(node: Mapping) -> str:
    """The node's mode now: dra where the DRA driver's deploy label is on it."""
    on = _labels(node).get(labels.DEPLOY_DRA_DRIVER) == "true"
    return gpu_allocation.DRA if on else gpu_allocation.DEVICE_PLUGIN


def plan(node_list: Iterable[Mapping], name: str, setting: Any) -> dict[str, Any]:
    """What the node needs: {"found", "from", "to", "switch", "patch", "reason"}.

    A DRA node must carry both deploy labels as labels.allocation_labels("dra") has them (a
    run stopped midway left one: switch again). A device-plugin node must not carry the DRA
    key; the device plugin's key is then left alone, since gpu_mig pauses the plugin with it
    during a MIG change and gives its value back after."""
    wanted = mode(setting)
    node = next((n for n in node_list if (n.get("metadata") or {}).get("name") == name), None)
    if node is None:
        return {"found": False, "from": None, "to": wanted, "switch": False, "patch": {},
                "reason": ""}
    now = node_mode(node)
    have = _labels(node)
    want = labels.allocation_labels(wanted)
    if wanted == gpu_allocation.DRA:
        switch = any(have.get(key) != value for key, value in want.items())
    else:
        switch = labels.DEPLOY_DRA_DRIVER in have
    return {"found": True, "from": now, "to": wanted, "switch": switch,
            "patch": {"metadata": {"labels": want}} if switch else {},
            "reason": f"GPU allocation {now} -> {wanted} (gpu_allocation)" if switch else ""}


def _claim_names(pod: Mapping) -> set[str]:
    """The ResourceClaims the pod holds: the generated ones in status.resourceClaimStatuses
    and the ones named directly in spec.resourceClaims (resourceClaimName)."""
    names = {str(s.get("resourceClaimName")) for s in
             (pod.get("status") or {}).get("resourceClaimStatuses") or []
             if isinstance(s, Mapping) and s.get("resourceClaimName")}
    names |= {str(c.get("resourceClaimName")) for c in
              (pod.get("spec") or {}).get("resourceClaims") or []
              if isinstance(c, Mapping) and c.get("resourceClaimName")}
    return names


def _gpu_claims(claims: Iterable[Mapping]) -> set[tuple[str, str]]:
    """(namespace, name) of the claims with a device of NVIDIA's GPU driver allocated."""
    found = set()
    for claim in claims:
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices")
                   or {}).get("results") or []
        if any(isinstance(r, Mapping) and r.get("driver") == gpu_allocation.DRA_DRIVER
               for r in results):
            meta = claim.get("metadata") or {}
            found.add((str(meta.get("namespace") or "default"), str(meta.get("name"))))
    return found


def gpu_pods(pods: Iterable[Mapping], claims: Iterable[Mapping] = ()) -> list[dict[str, str]]:
    """The pods to evict before a switch, in either direction, or before a MIG change:
    gpu_mig.gpu_pods' (running, not a DaemonSet's, asking for nvidia.com/gpu or a MIG
    resource) and those holding a claim allocated a gpu.nvidia.com device. A claim's devices
    stay prepared on the node while a pod holds it, so the DRA driver must not leave before
    those pods do (NVIDIA's GPU Operator keeps its deploy label while such pods remain:
    NVIDIA/gpu-operator v26.7.0 controllers/nodelabeling_controller.go, read 2026-11-26)."""
    held = _gpu_claims(claims)

    def holds_claim(pod: Mapping) -> bool:
        namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
        return any((namespace, name) in held for name in _claim_names(pod))

    return gpu_mig.gpu_pods(pods, holds_claim)


def _has_slice(slices: Iterable[Mapping], name: str) -> bool:
    return any((s.get("spec") or {}).get("nodeName") == name
               and (s.get("spec") or {}).get("driver") == gpu_allocation.DRA_DRIVER
               for s in slices)


def without_slice(names: Iterable[str], slices: Iterable[Mapping]) -> list[str]:
    """The nodes no ResourceSlice of NVIDIA's GPU driver names (spec.nodeName, spec.driver)."""
    slices = list(slices)
    return [str(name) for name in names if not _has_slice(slices, str(name))]


def switched(name: str, to: str, nodes: Iterable[Mapping] = (),
             slices: Iterable[Mapping] = ()) -> bool:
    """Whether the node offers its GPUs in its new mode: the DRA driver published the node's
    ResourceSlice, or the device plugin advertises its GPUs again (allocatable nvidia.com/gpu,
    or nvidia.com/mig-<profile> under the mixed strategy)."""
    if mode(to) == gpu_allocation.DRA:
        return _has_slice(slices, name)
    return nvidia_device_plugin.without_gpus([name], list(nodes)) == []


def switch_problem(name: str, to: str, wait_s: int) -> str:
    """Why a switch's wait ran out, with where to look."""
    if mode(to) == gpu_allocation.DRA:
        return (f"{name}: switched to DRA, but NVIDIA's DRA driver published no ResourceSlice "
                f"for it in {wait_s} s (kubectl get resourceslices --field-selector "
                f"spec.nodeName={name}; the kubelet plugin's pod: kubectl get pods -A "
                f"--field-selector spec.nodeName={name}). The node stays cordoned")
    return (f"{name}: switched back to the device plugin, but it advertises no nvidia.com/gpu "
            f"after {wait_s} s (kubectl describe node {name}; the device plugin's pod on it). "
            "The node stays cordoned")
