"""The gpu_node_maintenance role's decisions: take a node out and give it back, for the roles
that change a node's GPUs (gpu_node_upgrade, gpu_mig). What is decided is gpuprov/cordon.py's;
this module fits it to the role: the caller's own labels and annotations merged into the same
patch (one API request per step), and the failed task named in the reason. Called through
plugins/filter/gpu_node_maintenance.py.

    take(node, owner, reason, extra=None)          merge patch
    give_back(node, owner, extra=None)             merge patch
    failure(task, result, owner, extra=None)       {"reason", "annotation", "patch"}
    clients(stdout, units=None, started_elsewhere=())
                                                   {"stop": [...], "start": [...]}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuprov import cordon
from gpuprov.stages import _task_failure


def merged(base: Mapping[str, Any], extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """`extra` merged into `base` as a JSON merge patch would apply it (RFC 7386: mappings
    merge, anything else replaces), so that two patches are sent as one."""
    out = dict(base)
    for key, value in (extra or {}).items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def take(node: Mapping[str, Any], owner: str, reason: str,
         extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return merged(cordon.take(node, owner, reason), extra)


def give_back(node: Mapping[str, Any], owner: str,
              extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return merged(cordon.give_back(node, owner), extra)


def failure(task: Any, result: Any, owner: str,
            extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """In a rescue: the failed task and its message (one line), and the patch that keeps the
    node cordoned with it."""
    reason = _task_failure.reason(task, result)
    return {"reason": reason, "annotation": cordon.keys(owner).failed,
            "patch": merged(cordon.failed(owner, reason), extra)}


def clients(stdout: str, units: Iterable[str] | None = None,
            started_elsewhere: Iterable[str] = ()) -> dict[str, list[str]]:
    return cordon.host_clients(stdout, cordon.HOST_GPU_CLIENTS if units is None else units,
                               started_elsewhere)
