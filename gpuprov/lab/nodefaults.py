"""SIMULATION: the lab's faults in a node's own files (layer "node" of lab/faults.py).

`next-kernel-no-module`: a kernel upgrade whose module was never built. The node gets
/boot/vmlinuz-NEXT_KERNEL (an empty placeholder, not a kernel) and /lib/modules/NEXT_KERNEL/
with a modules.dep that lists no nvidia module, as a Debian kernel package leaves them when
DKMS had no headers to build with. What it does not do: install a real kernel package, run the
kernel's postinst hooks or DKMS, or change what the node boots (a container boots nothing).
A real kernel package and a DKMS build of the 535 module would add minutes of downloads and
compiling to every CI run, so the lab switches the result instead (issue 19 allows it).

The switch is written into the container with `podman exec` and recorded in the node's
directory, so `lab status` lists it and clearing it removes exactly what it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuprov.lab import podman

NEXT_KERNEL = "6.1.0-999-amd64"
STATE_FILE = "node-faults.json"
_SET = {
    "next-kernel-no-module": (
        f"mkdir -p /boot /lib/modules/{NEXT_KERNEL}/kernel && : > /boot/vmlinuz-{NEXT_KERNEL}"
        f" && : > /lib/modules/{NEXT_KERNEL}/modules.dep"),
}
_CLEAR = {
    "next-kernel-no-module": f"rm -rf /boot/vmlinuz-{NEXT_KERNEL} /lib/modules/{NEXT_KERNEL}",
}


def active_faults(node_dir: Path) -> list[str]:
    try:
        return list(json.loads((node_dir / STATE_FILE).read_text()))
    except (OSError, ValueError):
        return []


def _record(node_dir: Path, faults: list[str]) -> None:
    (node_dir / STATE_FILE).write_text(json.dumps(faults))


def set_fault(node_dir: Path, container: str, fault: str) -> None:
    podman.podman("exec", container, "sh", "-c", _SET[fault])
    active = active_faults(node_dir)
    if fault not in active:
        _record(node_dir, [*active, fault])


def clear_fault(node_dir: Path, container: str, fault: str) -> None:
    podman.podman("exec", container, "sh", "-c", _CLEAR[fault])
    _record(node_dir, [f for f in active_faults(node_dir) if f != fault])
