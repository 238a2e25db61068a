"""The gpu_node_labels role's decisions about the Node it labels, from the cluster's answers
(called through plugins/filter/gpu_node_labels.py). Which labels a node gets is
gpuprov.nvidia.labels' (GPU Feature Discovery's rules), shared with `gpuprov verify`.

    node_plan(nodes, node_name, expected)   the label patch for one node, and what it removes
    taint_plan(taints, key, value, effect)   the node's taints with gpuprov's
    swarm_plan(labels, expected)             a Swarm node's labels: the `docker node update`
                                             arguments that make gpuprov's owned ones expected
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuprov.nvidia.labels import DEFAULT_SERIES_KEY, label_patch


def node_plan(nodes: Iterable[Mapping[str, Any]], node_name: str, expected: Mapping[str, str],
              series_key: str = DEFAULT_SERIES_KEY) -> dict[str, Any]:
    """The gpu_node_labels role's work on one node, from the cluster's LIST of nodes:
    {"found": is the node there, "expected": the labels computed from its probe report,
    "patch": label_patch() against its labels now, "removed": the owned keys the patch
    removes}."""
    node = next((n for n in nodes if (n.get("metadata") or {}).get("name") == node_name), None)
    current = ((node or {}).get("metadata") or {}).get("labels") or {}
    patch = label_patch(current, expected, series_key) if node is not None else {}
    return {"found": node is not None, "expected": dict(expected), "patch": patch,
            "removed": [key for key, value in patch.items() if value is None]}


def taint_plan(taints: Iterable[Mapping[str, Any]], key: str, value: str,
               effect: str) -> dict[str, Any]:
    """The node's taints with gpuprov's (replacing one of the same key and effect, as
    `kubectl taint --overwrite` does), and whether it is there already as wanted."""
    taints = list(taints)
    tainted = any(t.get("key") == key and t.get("effect") == effect and t.get("value") == value
                  for t in taints)
    wanted = [t for t in taints if not (t.get("key") == key and t.get("effect") == effect)]
    return {"tainted": tainted, "taints": [*wanted, {"key": key, "value": value, "effect": effect}]}


def swarm_plan(labels: Mapping[str, Any] | None, expected: Mapping[str, str],
               series_key: str = DEFAULT_SERIES_KEY) -> dict[str, Any]:
    """The same labels on a Swarm node (node.labels, which services are placed by:
    `--constraint node.labels.gputype==h100`), set through a manager: {"patch", "removed",
    "args"}, args being `docker node update`'s --label-add KEY=VALUE / --label-rm KEY for
    the owned keys that differ (labels gpuprov does not own are left alone)."""
    patch = label_patch(labels or {}, expected, series_key)
    args: list[str] = []
    for key, value in sorted(patch.items()):
        args += ["--label-rm", key] if value is None else ["--label-add", f"{key}={value}"]
    return {"expected": dict(expected), "patch": patch, "args": args,
            "removed": [key for key, value in patch.items() if value is None]}
