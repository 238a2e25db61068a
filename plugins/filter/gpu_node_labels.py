"""Ansible filters that give the gpu_node_labels role gpuprov's label computation.

The role and `gpuprov verify` must agree on a node's labels, so the computation exists once,
in gpuprov.nvidia.labels; these filters call the gpuprov package the controller's Python has
installed (`pip install -e .`). They run on the controller, like every filter.

    probe_report | gpuprov_node_labels(series_key='gputype')
        -> {"gputype": "p100", "nvidia.com/gpu.product": "Tesla-P100-PCIE-16GB", ...}
    key | gpuprov_label_owned(series_key='gputype')  -> bool
    nodes | gpuprov_label_node_plan(node_name, expected, series_key='gputype')
        -> {"found", "patch", "removed"}: the role's work on the node (gpuprov.nvidia.labels.node_plan)
    taints | gpuprov_taint_plan(key, value, effect)
        -> {"tainted", "taints"}: the node's taints with gpuprov's (gpuprov.nvidia.labels.taint_plan)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

INSTALL_HINT = (
    "gpuprov is not importable by the Python that runs ansible ({error}): "
    "install gpuprov in the Python that runs ansible: pip install -e ."
)


def _labels() -> Any:
    # Imported on first use: Ansible loads every filter plugin for every template.
    try:
        from gpuprov.nvidia import labels
    except ImportError as exc:
        raise AnsibleFilterError(INSTALL_HINT.format(error=exc)) from None
    return labels


def _mapping(value: Any, filter_name: str, what: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise AnsibleFilterError(f"{filter_name} expects {what}, got {value!r}")
    return value


def gpuprov_node_labels(report: Any, series_key: str = "gputype",
                        mig_strategy: str = "none") -> dict[str, str]:
    """The labels gpuprov owns for the node a probe report describes (gpuprov.nvidia.labels)."""
    labels = _labels()
    _mapping(report, "gpuprov_node_labels", "a gpuprov probe report (a dict)")
    try:
        return labels.compute_labels(report, str(series_key), str(mig_strategy))
    except Exception as exc:  # one line for the admin instead of a traceback
        raise AnsibleFilterError(f"gpuprov_node_labels: {exc}") from exc


def gpuprov_label_owned(key: Any, series_key: str = "gputype") -> bool:
    labels = _labels()
    try:
        return labels.is_owned(str(key), str(series_key))
    except Exception as exc:
        raise AnsibleFilterError(f"gpuprov_label_owned: {exc}") from exc


def gpuprov_label_node_plan(nodes: Any, node_name: Any, expected: Any,
                            series_key: str = "gputype") -> dict:
    labels = _labels()
    if isinstance(nodes, (str, bytes, Mapping)) or not isinstance(nodes, list):
        raise AnsibleFilterError(f"gpuprov_label_node_plan expects a list of Node objects, "
                                 f"got {nodes!r}")
    expected = _mapping(expected, "gpuprov_label_node_plan", "the computed labels (a dict)")
    try:
        return labels.node_plan([n for n in nodes if isinstance(n, Mapping)], str(node_name),
                                expected, str(series_key))
    except Exception as exc:
        raise AnsibleFilterError(f"gpuprov_label_node_plan: {exc}") from exc


def gpuprov_taint_plan(taints: Any, key: Any, value: Any, effect: Any) -> dict:
    if not isinstance(taints, list):
        raise AnsibleFilterError(f"gpuprov_taint_plan expects the node's taints, got {taints!r}")
    return _labels().taint_plan([t for t in taints if isinstance(t, Mapping)], str(key),
                                str(value), str(effect))


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpuprov_label_owned": gpuprov_label_owned,
            "gpuprov_node_labels": gpuprov_node_labels,
            "gpuprov_label_node_plan": gpuprov_label_node_plan,
            "gpuprov_taint_plan": gpuprov_taint_plan,
        }
