"""Ansible filters that give roles gpuprov's hardware table and driver-branch choice.

The roles and `gpuprov verify` must agree on what a GPU is and which driver branch a
node gets, so neither is written down twice: these filters call the gpuprov package
that the controller's Python has installed (`pip install -e .`). They run on the
controller, like every filter; nothing here is shipped to nodes.

    devices | gpuprov_classify
        -> [{"pci_id", "name", "architecture", "compute_capability", "status", ...}, ...]
    probe_report.pci | gpuprov_probe_gpus
        -> [{"address", "pci_id", "class", ..., "name", "architecture", ...}, ...]
    pci_ids | gpuprov_choose_branch(os_id, os_version, nvidia_driver_branch, nvidia_driver_source)
        -> {"ok": bool, "branch": 535 | None, "reason": str, "notes": [str],
            "open_kernel_modules": bool, "open_kernel_modules_required": bool, ...}
    ansible_python_interpreter | gpuprov_node_python(discovered)   -> the node's python3
    run | gpuprov_probe_outcome(reprobe=true, earlier_report=none) -> {"ok", "report", "error"}
    gpus | gpuprov_gpu_summary          -> "2x Tesla K80 (kepler, cc 3.7), ..."
    choice | gpuprov_choice_text        -> the chooser's reason and notes
    supported_os | gpuprov_os_problem(host=..., distribution=..., major=..., os_id=...)
        -> what is wrong with the node's OS for gpu_preflight, or none
(gpuprov/stages/gpu_preflight.py says what each decides.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

INSTALL_HINT = (
    "gpuprov is not importable by the Python that runs ansible ({error}): "
    "install gpuprov in the Python that runs ansible: pip install -e ."
)


def _gpuprov() -> tuple[Any, Any]:
    # Imported on first use, not at load time: Ansible loads every filter plugin for every
    # template, and a playbook that never classifies a GPU must not fail on a missing gpuprov.
    try:
        from gpuprov.nvidia import driver_branches, hardware
    except ImportError as exc:
        raise AnsibleFilterError(INSTALL_HINT.format(error=exc)) from None
    return hardware, driver_branches


def _items(value: Any, filter_name: str, what: str = "PCI IDs like ['10de:15f8']") -> list:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise AnsibleFilterError(f"{filter_name} expects a list of {what}, got {value!r}")
    return list(value)


def _as_dict(record: Any) -> dict:
    return record.to_dict() if hasattr(record, "to_dict") else dict(record)


def _classify_one(hardware: Any, item: Any) -> dict:
    if isinstance(item, Mapping):
        pci_id = item.get("pci_id")
        subsystem = item.get("subsystem_id")
        # The subsystem device ID tells apart boards that share a device ID (A2 and A16).
        subsystem_device = int(str(subsystem).rsplit(":", 1)[-1], 16) if subsystem else None
    else:
        pci_id, subsystem_device = item, None
    classification = hardware.classify(str(pci_id), subsystem_device)
    return {**_as_dict(classification), "message": getattr(classification, "message", None)}


def gpuprov_classify(devices: Any) -> list[dict]:
    """Classify PCI devices with gpuprov's hardware table.

    Each item is a PCI ID ("10de:15f8") or a device as a dict
    ({"pci_id": "10de:15f8", "subsystem_id": "10de:118f", ...}).
    """
    hardware, _ = _gpuprov()
    items = _items(devices, "gpuprov_classify")
    try:
        return [_classify_one(hardware, item) for item in items]
    except Exception as exc:  # one line for the admin instead of a traceback
        raise AnsibleFilterError(f"gpuprov_classify: {exc}") from exc


def gpuprov_probe_gpus(pci: Any) -> list[dict]:
    """A probe report's "pci" list (gpuprov/node/probe/__init__.py) as flat GPU records for roles.

    Each GPU keeps its PCI fields, with "device_id" named "pci_id" as in the other filters,
    and the classification the probe made on the node merged in. A GPU the hardware table
    failed on (classification null, classification_error set) is "unknown", so that reports
    still name it.
    """
    hardware, _ = _gpuprov()
    gpus = []
    what = "devices, the probe report's pci"
    for device in _items(pci, "gpuprov_probe_gpus", what):
        if not isinstance(device, Mapping):
            raise AnsibleFilterError(f"gpuprov_probe_gpus expects a list of {what}, got {pci!r}")
        pci_id = device.get("device_id")
        classification = device.get("classification") or _as_dict(
            hardware.Classification(pci_id=pci_id, status="unknown")
        )
        fields = {k: v for k, v in device.items() if k not in ("device_id", "classification")}
        gpus.append({**fields, **classification, "pci_id": pci_id})
    return gpus


def gpuprov_choose_branch(
    pci_ids: Any, os_id: str, os_version: str, pinned_branch: Any = None, source: Any = None,
    chip_names: Any = None,
) -> dict:
    """The driver branch for a node with these GPUs on this OS, from the driver source
    (nvidia_driver_source; None: the OS's default) (see gpuprov.nvidia.driver_branches). chip_names:
    PCI ID -> the node's pci.ids name, for GPUs the hardware table lacks."""
    _, driver_branches = _gpuprov()
    ids = [str(i) for i in _items(pci_ids, "gpuprov_choose_branch")]
    # Inventory values arrive as Ansible's own str/int subclasses; gpuprov wants plain ones.
    pinned = pinned_branch if pinned_branch is None else str(pinned_branch)
    try:
        choice = driver_branches.choose_branch(
            ids, str(os_id), str(os_version), pinned_branch=pinned,
            source=None if source is None else str(source),
            chip_names={str(k): None if v is None else str(v)
                        for k, v in dict(chip_names or {}).items()},
        )
    except Exception as exc:  # one line for the admin instead of a traceback
        raise AnsibleFilterError(f"gpuprov_choose_branch: {exc}") from exc
    return _as_dict(choice)


def _stage_probe() -> Any:
    try:
        from gpuprov.stages import gpu_preflight
    except ImportError as exc:
        raise AnsibleFilterError(INSTALL_HINT.format(error=exc)) from None
    return gpu_preflight


def gpuprov_node_python(interpreter: Any, discovered: Any = None) -> str:
    return _stage_probe().node_python(interpreter, discovered)


def gpuprov_probe_outcome(run: Any, reprobe: Any = True, earlier_report: Any = None) -> dict:
    if run is not None and not isinstance(run, Mapping):
        raise AnsibleFilterError(f"gpuprov_probe_outcome expects a command result, got {run!r}")
    return _stage_probe().probe_outcome(run, reprobe=bool(reprobe),
                                        earlier_report=earlier_report)


def gpuprov_gpu_summary(gpus: Any) -> str:
    items = _items(gpus, "gpuprov_gpu_summary", "GPUs (gpu_preflight_gpus)")
    return _stage_probe().gpu_summary(g for g in items if isinstance(g, Mapping))


def gpuprov_choice_text(choice: Any) -> str:
    return _stage_probe().choice_text(choice if isinstance(choice, Mapping) else {})


def gpuprov_os_problem(supported: Any, host: Any, distribution: Any, major: Any,
                       os_id: Any = None) -> str | None:
    return _stage_probe().os_problem(
        host=str(host), distribution=str(distribution), major=str(major), os_id=os_id,
        supported=[str(s) for s in _items(supported, "gpuprov_os_problem", "OS names")])


def gpuprov_verify_host_vars(hosts: Any, hostvars: Any) -> dict:
    """{host: {var: value}} of the settings gpuprov verify reads (its SETTING_VARS), as
    Ansible resolved them for each host: what the gpu_verify role hands verify (--host-vars),
    so that a playbook's -e and the play's variables reach it, not only the inventory's."""
    try:
        from gpuprov.verify.inventory import SETTING_VARS
    except ImportError as exc:
        raise AnsibleFilterError(INSTALL_HINT.format(error=exc)) from None
    found = {}
    for host in _items(hosts, "gpuprov_verify_host_vars", "host names (ansible_play_hosts)"):
        values = hostvars[host]
        found[str(host)] = {key: values[key] for key in SETTING_VARS
                            if key in values and values[key] is not None}
    return found


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpuprov_classify": gpuprov_classify,
            "gpuprov_choose_branch": gpuprov_choose_branch,
            "gpuprov_probe_gpus": gpuprov_probe_gpus,
            "gpuprov_node_python": gpuprov_node_python,
            "gpuprov_probe_outcome": gpuprov_probe_outcome,
            "gpuprov_gpu_summary": gpuprov_gpu_summary,
            "gpuprov_choice_text": gpuprov_choice_text,
            "gpuprov_os_problem": gpuprov_os_problem,
            "gpuprov_verify_host_vars": gpuprov_verify_host_vars,
        }
