"""Helpers on API objects that the controllers, the kubelet and the cluster share: status
conditions, owner references, node readiness and taints, and how NVIDIA's device plugin pod is
recognised. Plain functions of the objects' dicts; nothing here reads or writes the registry.
"""

from __future__ import annotations

from gpuprov.lab.kube.store import now

# How NVIDIA's device plugin is recognised: its container image (nvcr.io/nvidia/k8s-device-
# plugin:<version> upstream; mirrors keep the repository name).
DEVICE_PLUGIN_IMAGE = "k8s-device-plugin"
# How NVIDIA's DRA kubelet plugin is recognised: its image (registry.k8s.io/dra-driver-nvidia-
# gpu/... since the move to kubernetes-sigs; mirrors keep the repository name).
DRA_PLUGIN_IMAGE = "dra-driver-nvidia-gpu"
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def is_device_plugin(pod: dict) -> bool:
    return any(DEVICE_PLUGIN_IMAGE in str(c.get("image", ""))
               for c in pod["spec"].get("containers") or [])


def is_dra_plugin(pod: dict) -> bool:
    return any(DRA_PLUGIN_IMAGE in str(c.get("image", ""))
               for c in pod["spec"].get("containers") or [])


def device_plugin_container(pod: dict) -> dict:
    """The container that runs the plugin itself (not NVIDIA's config-manager sidecar, which
    comes in the same image)."""
    containers = pod["spec"].get("containers") or []
    return next((c for c in containers if DEVICE_PLUGIN_IMAGE in str(c.get("image", ""))
                 and "config-manager" not in (c.get("command") or [])), containers[0])


def owned_by(obj: dict, uid: str) -> bool:
    return any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])


def owner_ref(owner: dict) -> dict:
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"],
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


def condition(type_: str, status: bool, reason: str = "", message: str = "") -> dict:
    cond = {"type": type_, "status": "True" if status else "False",
            "lastTransitionTime": now()}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def set_condition(conditions: list[dict], new: dict) -> list[dict]:
    """Replace the condition of new's type; keep its transition time when status is equal."""
    out = []
    for cond in conditions:
        if cond.get("type") == new["type"]:
            if cond.get("status") == new["status"]:
                new = {**new, "lastTransitionTime": cond.get("lastTransitionTime", now())}
            continue
        out.append(cond)
    out.append(new)
    return out


def condition_true(obj: dict, type_: str) -> bool:
    """The object's status condition of this type is "True" (absent: False)."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cond.get("status") == "True"
    return False


def node_ready(node: dict) -> bool:
    return condition_true(node, "Ready")


def node_taints(node: dict) -> list[dict]:
    taints = list((node.get("spec") or {}).get("taints") or [])
    if node.get("spec", {}).get("unschedulable"):
        taints.append(UNSCHEDULABLE_TAINT)
    return taints
