"""Ansible filters: the nvidia_device_plugin role's decisions from what the Kubernetes API
answered (gpuprov/stages/nvidia_device_plugin.py says what each means).

    node_list | gpuprov_plugin_node_problem(gpu_nodes, selector, check_mode)  -> text | None
    applied | gpuprov_plugin_daemonset                  -> the DaemonSet the apply answered
    daemonset | gpuprov_plugin_settled(gpu_nodes, node_list)                  -> bool
    ds_resources | gpuprov_ds_generation                                      -> int
    pods | gpuprov_plugin_without_pod(gpu_nodes, generation)                  -> [node, ...]
    node_names | gpuprov_allocatable_gpus(nodes)        -> {name: "4"} ("0" when none)
    node_names | gpuprov_without_gpus(nodes)                                  -> [node, ...]

Lists are k8s_info's resources; nothing here is shipped to nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

INSTALL_HINT = (
    "gpuprov is not importable by the Python that runs ansible ({error}): "
    "install gpuprov in the Python that runs ansible: pip install -e ."
)


def _rollout() -> Any:
    # Imported on first use: Ansible loads every filter plugin for every template.
    try:
        from gpuprov.stages import nvidia_device_plugin
    except ImportError as exc:
        raise AnsibleFilterError(INSTALL_HINT.format(error=exc)) from None
    return nvidia_device_plugin


def _names(filter_name: str, names: Any) -> list:
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise AnsibleFilterError(f"{filter_name} expects a list of node names, got {names!r}")
    return list(names)


def _objects(filter_name: str, objects: Any, kind: str = "Node") -> list:
    if isinstance(objects, (str, bytes, Mapping)) or not isinstance(objects, Iterable):
        raise AnsibleFilterError(f"{filter_name} expects a list of {kind} objects, got {objects!r}")
    return [o for o in objects if isinstance(o, Mapping)]


def plugin_node_problem(node_list: Any, gpu_nodes: Any, selector: Any,
                        check_mode: Any = False) -> str | None:
    if not isinstance(selector, Mapping):
        raise AnsibleFilterError(f"gpuprov_plugin_node_problem expects the nodeSelector as a "
                                 f"mapping, got {selector!r}")
    return _rollout().node_problem(_objects("gpuprov_plugin_node_problem", node_list),
                                   _names("gpuprov_plugin_node_problem", gpu_nodes), selector,
                                   bool(check_mode))


def plugin_daemonset(applied: Any) -> dict:
    return _rollout().applied_daemonset(applied if isinstance(applied, Mapping) else {})


def plugin_settled(daemonset: Any, gpu_nodes: Any, node_list: Any) -> bool:
    return _rollout().settled(daemonset if isinstance(daemonset, Mapping) else {},
                              _names("gpuprov_plugin_settled", gpu_nodes),
                              _objects("gpuprov_plugin_settled", node_list))


def ds_generation(resources: Any) -> int:
    return _rollout().ds_generation(_objects("gpuprov_ds_generation", resources, "DaemonSet"))


def plugin_without_pod(pods: Any, gpu_nodes: Any, generation: Any) -> list:
    return _rollout().without_pod(_objects("gpuprov_plugin_without_pod", pods, "Pod"),
                                  _names("gpuprov_plugin_without_pod", gpu_nodes),
                                  int(generation))


def allocatable_gpus(names: Any, nodes: Any) -> dict[str, str]:
    return _rollout().allocatable_gpus(_names("gpuprov_allocatable_gpus", names),
                                       _objects("gpuprov_allocatable_gpus", nodes))


def without_gpus(names: Any, nodes: Any) -> list:
    return _rollout().without_gpus(_names("gpuprov_without_gpus", names),
                                   _objects("gpuprov_without_gpus", nodes))


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpuprov_plugin_node_problem": plugin_node_problem,
            "gpuprov_plugin_daemonset": plugin_daemonset,
            "gpuprov_plugin_settled": plugin_settled,
            "gpuprov_ds_generation": ds_generation,
            "gpuprov_plugin_without_pod": plugin_without_pod,
            "gpuprov_allocatable_gpus": allocatable_gpus,
            "gpuprov_without_gpus": without_gpus,
        }
