"""Ansible filter that reads Node objects for the nvidia_device_plugin role.

    node_names | gpuprov_allocatable_gpus(nodes)
        -> {name: "4"}: each named node's allocatable nvidia.com/gpu in a LIST of Node
           objects (k8s_info's resources), "0" when the node has none or is not in the list

Written in Python, not Jinja, because the role reads it from two LISTs (before the apply and
in its wait) and a Jinja loop would be written twice. Nothing here is shipped to nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

GPU_RESOURCE = "nvidia.com/gpu"


def allocatable_gpus(names: Any, nodes: Any) -> dict[str, str]:
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise AnsibleFilterError(
            f"gpuprov_allocatable_gpus expects a list of node names, got {names!r}")
    if isinstance(nodes, (str, bytes, Mapping)) or not isinstance(nodes, Iterable):
        raise AnsibleFilterError(
            f"gpuprov_allocatable_gpus expects a list of Node objects, got {nodes!r}")
    allocatable = {}
    for node in nodes:
        if isinstance(node, Mapping):
            name = (node.get("metadata") or {}).get("name")
            status = node.get("status") or {}
            allocatable[name] = str((status.get("allocatable") or {}).get(GPU_RESOURCE, "0"))
    return {name: allocatable.get(name, "0") for name in names}


class FilterModule:
    def filters(self) -> dict:
        return {"gpuprov_allocatable_gpus": allocatable_gpus}
