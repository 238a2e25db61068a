"""Filters of the gpu_node_labels role: the labels a node gets (gpuprov/nvidia/labels.py, the one
computation, which `gpuprov verify` uses too) and the role's work on the Node
(gpuprov/stages/gpu_node_labels.py).

    probe_report | gpuprov_node_labels(series_key='gputype', mig_strategy='none')
        -> {"gputype": "p100", "nvidia.com/gpu.product": "Tesla-P100-PCIE-16GB", ...}
    key | gpuprov_label_owned(series_key='gputype')  -> bool
    nodes | gpuprov_label_node_plan(node_name, expected, series_key='gputype')
        -> {"found", "patch", "removed"}: the role's work on the node
    taints | gpuprov_taint_plan(key, value, effect)
        -> {"tainted", "taints"}: the node's taints with gpuprov's
    swarm_labels | gpuprov_label_swarm_plan(expected, series_key='gputype')
        -> {"patch", "removed", "args"}: `docker node update` arguments for a Swarm node
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuprov.cluster.plugins.plugin_utils import gpuprov_support as support


def gpuprov_node_labels(report: Any, series_key: str = "gputype",
                        mig_strategy: str = "none") -> dict[str, str]:
    """The labels gpuprov owns for the node a probe report describes."""
    labels = support.gpuprov("nvidia.labels")
    report = support.mapping(report, "gpuprov_node_labels", "a gpuprov probe report (a dict)")
    return support.reported("gpuprov_node_labels", lambda: labels.compute_labels(
        report, str(series_key), str(mig_strategy)), (Exception,))


def gpuprov_label_owned(key: Any, series_key: str = "gputype") -> bool:
    labels = support.gpuprov("nvidia.labels")
    return support.reported("gpuprov_label_owned",
                            lambda: labels.is_owned(str(key), str(series_key)), (Exception,))


def gpuprov_label_node_plan(nodes: Any, node_name: Any, expected: Any,
                            series_key: str = "gputype") -> dict:
    if isinstance(nodes, (str, bytes, Mapping)) or not isinstance(nodes, list):
        raise AnsibleFilterError(f"gpuprov_label_node_plan expects a list of Node objects, "
                                 f"got {nodes!r}")
    expected = support.mapping(expected, "gpuprov_label_node_plan", "the computed labels (a dict)")
    labels = support.stage("gpu_node_labels")
    return support.reported("gpuprov_label_node_plan", lambda: labels.node_plan(
        [n for n in nodes if isinstance(n, Mapping)], str(node_name), expected, str(series_key)),
        (Exception,))


def gpuprov_taint_plan(taints: Any, key: Any, value: Any, effect: Any) -> dict:
    if not isinstance(taints, list):
        raise AnsibleFilterError(f"gpuprov_taint_plan expects the node's taints, got {taints!r}")
    return support.stage("gpu_node_labels").taint_plan(
        [t for t in taints if isinstance(t, Mapping)], str(key), str(value), str(effect))


def gpuprov_label_swarm_plan(labels: Any, expected: Any, series_key: str = "gputype") -> dict:
    expected = support.mapping(expected, "gpuprov_label_swarm_plan", "the computed labels (a dict)")
    current = labels if isinstance(labels, Mapping) else {}
    return support.reported("gpuprov_label_swarm_plan", lambda: support.stage(
        "gpu_node_labels").swarm_plan(current, expected, str(series_key)), (Exception,))


FilterModule = support.filter_module(gpuprov_node_labels, gpuprov_label_owned,
                                     gpuprov_label_node_plan, gpuprov_taint_plan,
                                     gpuprov_label_swarm_plan)
