"""Filters of the gpu_node_maintenance role (gpuprov/stages/gpu_node_maintenance.py decides,
with gpuprov/cordon.py).

    node | gpuprov_maintenance_take(owner, reason, extra=None)     -> merge patch
    node | gpuprov_maintenance_give_back(owner, extra=None)        -> merge patch
    ansible_failed_task | gpuprov_maintenance_failure(ansible_failed_result, owner, extra=None)
        -> {"reason", "annotation", "patch"}
    stdout | gpuprov_maintenance_clients(units=None, started_elsewhere=[])
        -> {"stop": [unit, ...], "start": [unit, ...]}
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpuprov.cluster.plugins.plugin_utils import gpuprov_support as support

_ERRORS = (ValueError, TypeError)


def _extra(value: Any, name: str) -> Any:
    return None if value is None else support.mapping(value, name, "a merge patch (a mapping)")


def gpuprov_maintenance_take(node: Any, owner: Any, reason: Any, extra: Any = None) -> dict:
    name = "gpuprov_maintenance_take"
    node = support.mapping(node, name, "the Node object (k8s_info's resources[0])")
    stage = support.stage("gpu_node_maintenance")
    return support.reported(name, lambda: stage.take(node, owner, str(reason),
                                                     _extra(extra, name)), _ERRORS)


def gpuprov_maintenance_give_back(node: Any, owner: Any, extra: Any = None) -> dict:
    name = "gpuprov_maintenance_give_back"
    node = support.mapping(node, name, "the Node object (k8s_info's resources[0])")
    stage = support.stage("gpu_node_maintenance")
    return support.reported(name, lambda: stage.give_back(node, owner, _extra(extra, name)),
                            _ERRORS)


def gpuprov_maintenance_failure(task: Any, result: Any, owner: Any, extra: Any = None) -> dict:
    name = "gpuprov_maintenance_failure"
    stage = support.stage("gpu_node_maintenance")
    return support.reported(name, lambda: stage.failure(task, result, owner, _extra(extra, name)),
                            _ERRORS)


def gpuprov_maintenance_clients(stdout: Any, units: Any = None,
                                started_elsewhere: Any = ()) -> dict[str, list[str]]:
    name = "gpuprov_maintenance_clients"
    units = None if units is None else support.items(units, name, "unit names")
    elsewhere = support.items(started_elsewhere, name, "unit names")
    stage = support.stage("gpu_node_maintenance")
    return support.reported(name, lambda: stage.clients(stdout, units, elsewhere), _ERRORS)


FilterModule = support.filter_module(gpuprov_maintenance_take, gpuprov_maintenance_give_back,
                                     gpuprov_maintenance_failure, gpuprov_maintenance_clients)
