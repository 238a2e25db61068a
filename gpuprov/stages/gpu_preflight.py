"""The gpu_preflight role's decisions about the probe it runs on a node and what it found, called
through plugins/filter/gpu_preflight.py (gpu_node_labels and gpu_mig probe again with the same
filters). Which driver branch a node gets is gpuprov.nvidia.driver_branches.choose_branch.

    classify(devices)                     PCI IDs or devices -> the hardware table's records
    probe_gpus(pci)                       the probe report's "pci" list as flat GPU records
    node_python(interpreter, discovered)  the python3 Ansible runs modules with on the node
    probe_outcome(run, ...)               the probe's report, or why there is none
    gpu_summary(gpus)                     "2x Tesla K80 (kepler, cc 3.7), ..."
    choice_text(choice)                   the branch chooser's reason and its notes
    os_problem(...)                       what is wrong with the node's OS for gpu_preflight
    allocation_problem(host, setting, report, ...)
                                          why the node cannot have its gpu_allocation (DRA
                                          needs Kubernetes, CDI and a driver branch recent
                                          enough: gpuprov/gpu_allocation.py), or None
    dra_asked(hosts, hostvars)            whether a host of the play asks for dra (then the
                                          preflight reads the cluster's versions)
    cluster_versions(info, nodes, name)   the API server's version (k8s_cluster_info) and the
                                          node's kubelet version (its Node's nodeInfo)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from gpuprov import gpu_allocation
from gpuprov.nvidia import hardware


def as_dict(record: Any) -> dict:
    return record.to_dict() if hasattr(record, "to_dict") else dict(record)


def _classify_one(item: Any) -> dict:
    if isinstance(item, Mapping):
        pci_id = item.get("pci_id")
        subsystem = item.get("subsystem_id")
        # The subsystem device ID tells apart boards that share a device ID (A2 and A16).
        subsystem_device = int(str(subsystem).rsplit(":", 1)[-1], 16) if subsystem else None
    else:
        pci_id, subsystem_device = item, None
    classification = hardware.classify(str(pci_id), subsystem_device)
    return {**as_dict(classification), "message": getattr(classification, "message", None)}


def classify(devices: Iterable[Any]) -> list[dict]:
    """Each item a PCI ID ("10de:15f8") or a device as a dict ({"pci_id": "10de:15f8",
    "subsystem_id": "10de:118f", ...}), classified with gpuprov's hardware table."""
    return [_classify_one(item) for item in devices]


def probe_gpus(pci: Iterable[Mapping]) -> list[dict]:
    """A probe report's "pci" list (gpuprov/node/probe/__init__.py) as flat GPU records for
    roles. Each GPU keeps its PCI fields, with "device_id" named "pci_id" as in the other
    filters, and the classification the probe made on the node merged in. A GPU the hardware
    table failed on (classification null, classification_error set) is "unknown", so that
    reports still name it."""
    gpus = []
    for device in pci:
        pci_id = device.get("device_id")
        classification = device.get("classification") or as_dict(
            hardware.Classification(pci_id=pci_id, status="unknown"))
        fields = {k: v for k, v in device.items() if k not in ("device_id", "classification")}
        gpus.append({**fields, **classification, "pci_id": pci_id})
    return gpus


def node_python(interpreter: str | None, discovered: str | None) -> str:
    """ansible_python_interpreter when the inventory sets one (not "auto*"), else the one
    Ansible discovered: the probe runs with it, so a node whose plain python3 is too old
    (RHEL 8) is handled by the same setting as Ansible itself."""
    if interpreter and not str(interpreter).startswith("auto"):
        return str(interpreter)
    return str(discovered or "python3")


def probe_error(run: Mapping) -> str:
    """Why the probe gave no report, in one line: the last line it wrote on stderr (e.g.
    "gpuprov probe needs python3 >= 3.9, this node has 3.6.8"), else the module's message."""
    lines = str(run.get("stderr") or "").strip().splitlines()
    return lines[-1] if lines else str(run.get("msg") or "no report on stdout")


def probe_outcome(run: Mapping | None, *, reprobe: bool = True,
                  earlier_report: Mapping | None = None) -> dict:
    """{"ok", "report", "error"}: the report from the probe's run (the command module's
    result: rc, stdout, stderr), or, when the role did not probe again, the earlier one."""
    if not reprobe:
        if earlier_report is None:
            return {"ok": False, "report": None, "error": "no earlier probe report"}
        return {"ok": True, "report": dict(earlier_report), "error": None}
    run = run or {}
    stdout = str(run.get("stdout") or "")
    if run.get("rc", 1) == 0 and stdout.startswith("{"):
        try:
            return {"ok": True, "report": json.loads(stdout), "error": None}
        except ValueError as exc:
            return {"ok": False, "report": None, "error": f"the report is not JSON: {exc}"}
    return {"ok": False, "report": None, "error": probe_error(run)}


def gpu_summary(gpus: Iterable[Mapping]) -> str:
    """One entry per model, grouped by PCI ID (which every GPU has, even one the hardware
    table does not know), in PCI ID order."""
    groups: dict[str, list[Mapping]] = {}
    for gpu in gpus:
        groups.setdefault(str(gpu.get("pci_id")), []).append(gpu)
    parts = []
    for pci_id in sorted(groups):
        first = groups[pci_id][0]
        parts.append(f"{len(groups[pci_id])}x {first.get('name') or 'unknown GPU ' + pci_id} "
                     f"({first.get('architecture') or 'unknown architecture'}, "
                     f"cc {first.get('compute_capability') or '?'})")
    return ", ".join(parts)


def choice_text(choice: Mapping) -> str:
    """The chooser's reason, with its remarks (e.g. why a pinned branch was not used)."""
    notes = list(dict.fromkeys(choice.get("notes") or []))
    return str(choice.get("reason") or "") + (f"; {'; '.join(notes)}" if notes else "")


def os_problem(*, host: str, distribution: str, major: str, supported: Iterable[str],
               os_id: Any) -> str | None:
    """What is wrong with the node's OS for gpu_preflight, with what to do (None: nothing)."""
    name = f"{distribution} {major}"
    supported = list(supported)
    if name not in supported:
        return (f"{name} is not a supported OS for GPU nodes (supported: {', '.join(supported)}). "
                f"Install a supported OS on {host}, or take it out of the play's hosts (e.g. "
                f"--limit '!{host}').")
    if os_id is None:
        return (f"{name} is in gpu_preflight_supported_os but gpu_preflight has no data for it: "
                f"add roles/gpu_preflight/vars/{distribution}_{major}.yml and its driver "
                "packages to gpuprov.nvidia.driver_branches, or remove it from "
                "gpu_preflight_supported_os.")
    return None


def allocation_problem(host: str, setting: Any, report: Mapping | None, *, api_server: Any = None,
                       kubelet: Any = None, runtime: str = "containerd", branch: Any = None,
                       toolkit_mode: Any = None, has_gpu: bool = True) -> str | None:
    """One line when the node's gpu_allocation is not a mode, or is dra on a node that cannot
    have it (None: fine). The node's facts come from its probe report (runtime package,
    containerd's enable_cdi, NVML's driver version, else the branch chosen for it) and from the
    cluster (the API server's and the node's kubelet version). A host without GPUs has no
    allocation mode: only its value is checked (a group may set dra for all its hosts)."""
    if not has_gpu:
        try:
            gpu_allocation.mode(setting)
        except gpu_allocation.SettingError as exc:
            return f"{host}: {exc}"
        return None
    facts = gpu_allocation.from_report(
        report, api_server=api_server, kubelet=kubelet, runtime=runtime, branch=branch,
        toolkit_mode=toolkit_mode or "auto")
    return gpu_allocation.refusal(host, setting, facts)


def dra_asked(hosts: Iterable[str], hostvars: Mapping[str, Any]) -> bool:
    """Whether a host asks for dra; a value that is no mode is not (each host's own check
    refuses it with its line)."""
    for host in hosts:
        try:
            chosen = gpu_allocation.mode((hostvars.get(host) or {}).get(gpu_allocation.SETTING))
        except gpu_allocation.SettingError:
            continue
        if chosen == gpu_allocation.DRA:
            return True
    return False


def cluster_versions(info: Mapping | None, nodes: Iterable[Mapping], name: str) -> dict:
    """{"api_server", "kubelet"}: the API server's gitVersion, as kubernetes.core.k8s_cluster_info
    answers /version (version.server.kubernetes), and the node's status.nodeInfo.kubeletVersion
    in a LIST of Nodes; None where the answer lacks one (a node not in the cluster yet)."""
    server = ((((info or {}).get("version") or {}).get("server") or {}).get("kubernetes")
              or {})
    kubelet = next((((n.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion")
                    for n in nodes if (n.get("metadata") or {}).get("name") == name), None)
    return {"api_server": server.get("gitVersion"), "kubelet": kubelet}
