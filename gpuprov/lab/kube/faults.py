"""Fault switches of the simulated cluster, one file per node and fault under the state dir.

`gpuprov lab fault NODE FAULT [--clear]` toggles them with these functions; the running
emulator reads them on every controller pass, so a switch takes effect within a second.
"""

from __future__ import annotations

from pathlib import Path

from gpuprov.lab.faults import FAULTS as LAB_FAULTS

# The lab's one fault registry (gpuprov/lab/faults.py) holds these too, as layer "kube".
FAULTS: dict[str, str] = {f.name: f.description for f in LAB_FAULTS.values() if f.layer == "kube"}


def _path(state_dir: Path, node: str, fault: str) -> Path:
    if fault not in FAULTS:
        raise ValueError(f"unknown Kubernetes fault {fault!r}; known: {', '.join(FAULTS)}")
    return Path(state_dir) / "faults" / node / fault


def set_fault(state_dir: Path, node: str, fault: str) -> None:
    path = _path(state_dir, node, fault)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("on\n")


def clear_fault(state_dir: Path, node: str, fault: str) -> None:
    _path(state_dir, node, fault).unlink(missing_ok=True)


def active_faults(state_dir: Path | None, node: str) -> list[str]:
    if state_dir is None:
        return []
    folder = Path(state_dir) / "faults" / node
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.name in FAULTS)
