"""Filters of the gpu_preflight role: the hardware table, the probe it runs on a node and the
driver branch each node gets (gpuprov/stages/gpu_preflight.py decides, with
gpuprov/nvidia/hardware.py and driver_branches.py). gpu_node_labels and gpu_mig probe again
with the same filters, and the roles and `gpuprov verify` agree on GPUs and branches because
both call gpuprov.

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
    gpu_allocation | gpuprov_allocation_problem(host, report, api_server=..., kubelet=...,
                     runtime=..., branch=..., toolkit_mode=..., has_gpu=...)
        -> why the node cannot have its allocation mode (device-plugin | dra), or none
    hosts | gpuprov_dra_asked(hostvars)                  -> whether a host asks for dra
    cluster_info | gpuprov_cluster_versions(nodes, name) -> {"api_server", "kubelet"}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuprov.cluster.plugins.plugin_utils import gpuprov_support as support

PCI_IDS = "PCI IDs like ['10de:15f8']"


def gpuprov_classify(devices: Any) -> list[dict]:
    """Each item a PCI ID ("10de:15f8") or a device as a dict ({"pci_id", "subsystem_id"})."""
    preflight = support.stage("gpu_preflight")
    devices = support.items(devices, "gpuprov_classify", PCI_IDS)
    return support.reported("gpuprov_classify", lambda: preflight.classify(devices), (Exception,))


def gpuprov_probe_gpus(pci: Any) -> list[dict]:
    what = "devices, the probe report's pci"
    devices = support.items(pci, "gpuprov_probe_gpus", what)
    if not all(isinstance(device, Mapping) for device in devices):
        raise AnsibleFilterError(f"gpuprov_probe_gpus expects a list of {what}, got {pci!r}")
    return support.stage("gpu_preflight").probe_gpus(devices)


def gpuprov_choose_branch(
    pci_ids: Any, os_id: str, os_version: str, pinned_branch: Any = None, source: Any = None,
    chip_names: Any = None, allow_vulnerable: Any = None,
) -> dict:
    """The driver branch for a node with these GPUs on this OS, from the driver source
    (nvidia_driver_source; None: the OS's default). chip_names: PCI ID -> the node's pci.ids
    name, for GPUs the hardware table lacks. allow_vulnerable: nvidia_driver_allow_vulnerable
    (a branch whose version from the source lacks NVIDIA's fixes is refused without it)."""
    branches = support.gpuprov("nvidia.driver_branches")
    ids = [str(i) for i in support.items(pci_ids, "gpuprov_choose_branch", PCI_IDS)]
    # Inventory values arrive as Ansible's own str/int subclasses; gpuprov wants plain ones.
    choice = support.reported("gpuprov_choose_branch", lambda: branches.choose_branch(
        ids, str(os_id), str(os_version), pinned_branch=support.text(pinned_branch),
        source=support.text(source),
        chip_names={str(k): support.text(v) for k, v in dict(chip_names or {}).items()},
        allow_vulnerable=None if allow_vulnerable is None
        else support.flag(allow_vulnerable, "nvidia_driver_allow_vulnerable")),
        (Exception,))
    return support.stage("gpu_preflight").as_dict(choice)


def gpuprov_node_python(interpreter: Any, discovered: Any = None) -> str:
    return support.stage("gpu_preflight").node_python(interpreter, discovered)


def gpuprov_probe_outcome(run: Any, reprobe: Any = True, earlier_report: Any = None) -> dict:
    if run is not None and not isinstance(run, Mapping):
        raise AnsibleFilterError(f"gpuprov_probe_outcome expects a command result, got {run!r}")
    return support.stage("gpu_preflight").probe_outcome(run, reprobe=bool(reprobe),
                                                        earlier_report=earlier_report)


def gpuprov_gpu_summary(gpus: Any) -> str:
    listed = support.items(gpus, "gpuprov_gpu_summary", "GPUs (gpu_preflight_gpus)")
    return support.stage("gpu_preflight").gpu_summary(g for g in listed if isinstance(g, Mapping))


def gpuprov_choice_text(choice: Any) -> str:
    return support.stage("gpu_preflight").choice_text(choice if isinstance(choice, Mapping) else {})


def gpuprov_os_problem(supported: Any, host: Any, distribution: Any, major: Any,
                       os_id: Any = None) -> str | None:
    return support.stage("gpu_preflight").os_problem(
        host=str(host), distribution=str(distribution), major=str(major), os_id=os_id,
        supported=[str(s) for s in support.items(supported, "gpuprov_os_problem", "OS names")])


def gpuprov_allocation_problem(setting: Any, host: Any, report: Any = None, api_server: Any = None,
                               kubelet: Any = None, runtime: Any = "containerd",
                               branch: Any = None, toolkit_mode: Any = None,
                               has_gpu: Any = True) -> str | None:
    if report is not None and not isinstance(report, Mapping):
        raise AnsibleFilterError(f"gpuprov_allocation_problem expects the probe report as a "
                                 f"mapping, got {report!r}")
    return support.stage("gpu_preflight").allocation_problem(
        str(host), support.text(setting), report, api_server=support.text(api_server),
        kubelet=support.text(kubelet), runtime=str(runtime or "containerd"),
        branch=support.text(branch), toolkit_mode=support.text(toolkit_mode),
        has_gpu=support.truthy(has_gpu))


def gpuprov_dra_asked(hosts: Any, hostvars: Mapping[str, Any]) -> bool:
    return support.stage("gpu_preflight").dra_asked(
        support.items(hosts, "gpuprov_dra_asked", "host names"), hostvars)


def gpuprov_cluster_versions(info: Any, nodes: Any, name: Any) -> dict:
    return support.stage("gpu_preflight").cluster_versions(
        info if isinstance(info, Mapping) else None,
        support.objects(nodes or [], "gpuprov_cluster_versions", "Node objects"), str(name))


FilterModule = support.filter_module(
    gpuprov_classify, gpuprov_probe_gpus, gpuprov_choose_branch, gpuprov_node_python,
    gpuprov_probe_outcome, gpuprov_gpu_summary, gpuprov_choice_text, gpuprov_os_problem,
    gpuprov_allocation_problem, gpuprov_dra_asked, gpuprov_cluster_versions)
