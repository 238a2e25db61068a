"""Filters of the nvidia_device_plugin role: its decisions from what the Kubernetes API
answered and from each GPU host's settings (gpuprov/stages/nvidia_device_plugin.py says what
each means). Lists are k8s_info's resources; results are k8s_info's registered results.

    node_list | gpuprov_plugin_node_problem(gpu_nodes, selector, check_mode)  -> text | None
    applied | gpuprov_plugin_daemonset                  -> the DaemonSet the apply answered
    daemonset | gpuprov_plugin_settled(gpu_nodes, node_list)                  -> bool
    ds_resources | gpuprov_ds_generation                                      -> int
    pods | gpuprov_plugin_without_pod(gpu_nodes, generation)                  -> [node, ...]
    node_names | gpuprov_allocatable_gpus(nodes)        -> {name: "4"} ("0" when none)
    node_names | gpuprov_without_gpus(nodes)                                  -> [node, ...]
    gpu_nodes | gpuprov_plugin_registration(daemonset=..., pods=..., nodes=...,
                nodes_before=..., settled=..., namespace=..., pod_label=..., wait_s=...)
        -> {"without_pod", "without_gpus", "allocatable", "summary", "problem"}
    hosts | gpuprov_runtime_modes(hostvars)             -> {node name: cdi | legacy}
    strategy | gpuprov_device_list_problems(hosts, hostvars)                   -> [line, ...]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuprov.cluster.plugins.plugin_utils import gpuprov_support as support

NODES = "node names"


def _read(value: Any) -> Mapping | None:
    """A registered k8s_info result, None where the task did not run."""
    return value if isinstance(value, Mapping) else None


def gpuprov_plugin_node_problem(node_list: Any, gpu_nodes: Any, selector: Any,
                                check_mode: Any = False) -> str | None:
    if not isinstance(selector, Mapping):
        raise AnsibleFilterError(f"gpuprov_plugin_node_problem expects the nodeSelector as a "
                                 f"mapping, got {selector!r}")
    return support.stage("nvidia_device_plugin").node_problem(
        support.objects(node_list, "gpuprov_plugin_node_problem", "Node objects"),
        support.items(gpu_nodes, "gpuprov_plugin_node_problem", NODES), selector, bool(check_mode))


def gpuprov_plugin_daemonset(applied: Any) -> dict:
    return support.stage("nvidia_device_plugin").applied_daemonset(
        applied if isinstance(applied, Mapping) else {})


def gpuprov_plugin_settled(daemonset: Any, gpu_nodes: Any, node_list: Any) -> bool:
    return support.stage("nvidia_device_plugin").settled(
        daemonset if isinstance(daemonset, Mapping) else {},
        support.items(gpu_nodes, "gpuprov_plugin_settled", NODES),
        support.objects(node_list, "gpuprov_plugin_settled", "Node objects"))


def gpuprov_ds_generation(resources: Any) -> int:
    return support.stage("nvidia_device_plugin").ds_generation(
        support.objects(resources, "gpuprov_ds_generation", "DaemonSet objects"))


def gpuprov_plugin_without_pod(pods: Any, gpu_nodes: Any, generation: Any) -> list:
    return support.stage("nvidia_device_plugin").without_pod(
        support.objects(pods, "gpuprov_plugin_without_pod", "Pod objects"),
        support.items(gpu_nodes, "gpuprov_plugin_without_pod", NODES), int(generation))


def gpuprov_allocatable_gpus(names: Any, nodes: Any) -> dict[str, str]:
    return support.stage("nvidia_device_plugin").allocatable_gpus(
        support.items(names, "gpuprov_allocatable_gpus", NODES),
        support.objects(nodes, "gpuprov_allocatable_gpus", "Node objects"))


def gpuprov_without_gpus(names: Any, nodes: Any) -> list:
    return support.stage("nvidia_device_plugin").without_gpus(
        support.items(names, "gpuprov_without_gpus", NODES),
        support.objects(nodes, "gpuprov_without_gpus", "Node objects"))


def gpuprov_plugin_registration(gpu_nodes: Any, daemonset: Any = None, pods: Any = None,
                                nodes: Any = None, nodes_before: Any = None, settled: Any = False,
                                namespace: Any = "", pod_label: Any = "", wait_s: Any = 0) -> dict:
    return support.stage("nvidia_device_plugin").registration(
        support.items(gpu_nodes, "gpuprov_plugin_registration", NODES), daemonset=_read(daemonset),
        pods=_read(pods), nodes=_read(nodes), nodes_before=_read(nodes_before),
        settled=support.flag(settled, "settled"), namespace=str(namespace),
        pod_label=str(pod_label), wait_s=int(wait_s))


def gpuprov_runtime_modes(hosts: Any, hostvars: Mapping[str, Any]) -> dict[str, str]:
    return support.stage("nvidia_device_plugin").node_modes(
        support.items(hosts, "gpuprov_runtime_modes", "host names"), hostvars)


def gpuprov_device_list_problems(strategy: Any, hosts: Any,
                                 hostvars: Mapping[str, Any]) -> list[str]:
    return support.stage("nvidia_device_plugin").device_list_problems(
        str(strategy), support.items(hosts, "gpuprov_device_list_problems", "host names"), hostvars)


FilterModule = support.filter_module(
    gpuprov_plugin_node_problem, gpuprov_plugin_daemonset, gpuprov_plugin_settled,
    gpuprov_ds_generation, gpuprov_plugin_without_pod, gpuprov_allocatable_gpus,
    gpuprov_without_gpus, gpuprov_plugin_registration, gpuprov_runtime_modes,
    gpuprov_device_list_problems)
