"""Filters of the nvidia_dra_driver role: the allocation mode of each host and the switch of a
node between NVIDIA's device plugin and NVIDIA's DRA driver (gpuprov/stages/nvidia_dra_driver.py
says what each means). Lists are k8s_info's resources.

    gpu_allocation | gpuprov_allocation_mode                  -> device-plugin | dra
    hosts | gpuprov_dra_nodes(hostvars)                       -> [node name, ...]
    node_list | gpuprov_allocation_plan(name, gpu_allocation)
        -> {"found", "from", "to", "switch", "patch", "reason"}
    pods | gpuprov_allocation_gpu_pods(claims)                -> [{"namespace", "name"}, ...]
    node_names | gpuprov_without_slice(slices)                -> [node name, ...]
    name | gpuprov_allocation_switched(to, nodes=..., slices=...)   -> bool
    name | gpuprov_allocation_switch_problem(to, wait_s)      -> text
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible_collections.gpuprov.cluster.plugins.plugin_utils import gpuprov_support as support


def _stage():
    return support.stage("nvidia_dra_driver")


def gpuprov_allocation_mode(setting: Any) -> str:
    return support.reported(None, lambda: _stage().mode(support.text(setting)))


def gpuprov_dra_nodes(hosts: Any, hostvars: Mapping[str, Any]) -> list[str]:
    return support.reported(None, lambda: _stage().dra_nodes(
        support.items(hosts, "gpuprov_dra_nodes", "host names"), hostvars))


def gpuprov_allocation_plan(node_list: Any, name: Any, setting: Any) -> dict:
    return support.reported(None, lambda: _stage().plan(
        support.objects(node_list, "gpuprov_allocation_plan", "Node objects"), str(name),
        support.text(setting)))


def gpuprov_allocation_gpu_pods(pods: Any, claims: Any = None) -> list[dict]:
    return _stage().gpu_pods(
        support.objects(pods, "gpuprov_allocation_gpu_pods", "Pod objects"),
        support.objects(claims or [], "gpuprov_allocation_gpu_pods", "ResourceClaim objects"))


def gpuprov_without_slice(names: Any, slices: Any) -> list[str]:
    return _stage().without_slice(
        support.items(names, "gpuprov_without_slice", "node names"),
        support.objects(slices, "gpuprov_without_slice", "ResourceSlice objects"))


def gpuprov_allocation_switched(name: Any, to: Any, nodes: Any = None, slices: Any = None) -> bool:
    return support.reported(None, lambda: _stage().switched(
        str(name), support.text(to),
        support.objects(nodes or [], "gpuprov_allocation_switched", "Node objects"),
        support.objects(slices or [], "gpuprov_allocation_switched", "ResourceSlice objects")))


def gpuprov_allocation_switch_problem(name: Any, to: Any, wait_s: Any = 0) -> str:
    return support.reported(None, lambda: _stage().switch_problem(
        str(name), support.text(to), int(wait_s)))


FilterModule = support.filter_module(
    gpuprov_allocation_mode, gpuprov_dra_nodes, gpuprov_allocation_plan,
    gpuprov_allocation_gpu_pods, gpuprov_without_slice, gpuprov_allocation_switched,
    gpuprov_allocation_switch_problem)
