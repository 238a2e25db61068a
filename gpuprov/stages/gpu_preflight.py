"""The gpu_preflight and gpu_node_labels roles' decisions about the probe they run on a node
and what it found, called through plugins/filter/gpu_preflight.py:

    node_python(interpreter, discovered)  the python3 Ansible runs modules with on the node
    probe_outcome(run, ...)               the probe's report, or why there is none
    gpu_summary(gpus)                     "2x Tesla K80 (kepler, cc 3.7), ..."
    choice_text(choice)                   the branch chooser's reason and its notes
    os_problem(...)                       what is wrong with the node's OS for gpu_preflight
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


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
