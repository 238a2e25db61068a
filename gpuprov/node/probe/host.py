"""The host, the NVIDIA kernel module, and NVIDIA XID events in the kernel log."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from collections.abc import Callable

from .fs import Root

_OS_RELEASE_KEYS = ("id", "id_like", "version_id", "version_codename", "pretty_name")


def parse_os_release(text: str) -> dict:
    """os-release(5): KEY=value lines, values optionally shell-quoted.

    Hand-written because platform.freedesktop_os_release() exists only from Python
    3.10 and reads only the real root.
    """
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        values[key.strip().lower()] = value
    return {key: values.get(key) for key in _OS_RELEASE_KEYS}


def running_kernel(root: Root) -> str:
    return root.read_line("/proc/sys/kernel/osrelease") or os.uname().release


def collect_host(root: Root) -> dict:
    os_release = root.read("/etc/os-release") or root.read("/usr/lib/os-release")
    # os.uname() rather than platform/socket: the probe starts on every node each run,
    # and those two imports were a tenth of its start-up.
    uname = os.uname()
    return {
        "hostname": root.read_line("/proc/sys/kernel/hostname") or uname.nodename,
        "os": parse_os_release(os_release) if os_release else None,
        "kernel": running_kernel(root),
        "machine": uname.machine,
        "boot_id": root.read_line("/proc/sys/kernel/random/boot_id"),
        "python": sys.version.split()[0],  # what platform.python_version() reads
    }


# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 ..." or
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build ..."
_PROC_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")
_NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nouveau")
_MODPROBE_DIRS = ("/etc/modprobe.d", "/run/modprobe.d", "/usr/lib/modprobe.d", "/lib/modprobe.d")
_BLACKLIST_NOUVEAU = re.compile(r"^\s*blacklist\s+nouveau\s*$", re.MULTILINE)


def _module_loaded(root: Root, name: str) -> bool:
    # /sys/module/<name> also exists for built-in code; initstate only for loaded modules.
    return root.read_line(f"/sys/module/{name}/initstate") in ("live", "coming")


def collect_kernel_module(root: Root) -> dict:
    proc_line = root.read_line("/proc/driver/nvidia/version")
    match = _PROC_VERSION.search(proc_line or "")
    version = root.read_line("/sys/module/nvidia/version") or (match.group(1) if match else None)
    flavor = None
    if proc_line:
        flavor = "open" if "Open Kernel Module" in proc_line else "proprietary"
    blacklisted = [
        path
        for directory in _MODPROBE_DIRS
        for path in root.glob(f"{directory}/*.conf")
        if _BLACKLIST_NOUVEAU.search(root.read(path) or "")
    ]
    modules = {name: _module_loaded(root, name) for name in _NVIDIA_MODULES}
    return {
        "loaded": modules["nvidia"],
        "version": version,
        "flavor": flavor,
        "proc_version": proc_line,
        "modules": modules,
        "nouveau_loaded": modules["nouveau"],
        "nouveau_blacklisted_in": blacklisted,
    }


def parse_systemctl_show(text: str) -> dict:
    """`systemctl show -p Id,UnitFileState,ActiveState UNIT...`: {unit: {"enabled", "active"}}.

    One block of Key=value lines per unit, blocks separated by an empty line, keys in
    systemd's order. "enabled" is what `systemctl is-enabled` prints (UnitFileState: enabled,
    disabled, static, masked, ...; "" for a unit that does not exist), "active" what
    `systemctl is-active` prints (ActiveState).
    """
    units = {}
    for block in text.split("\n\n"):
        values = dict(line.partition("=")[::2] for line in block.splitlines() if "=" in line)
        unit_id = values.get("Id", "")
        if unit_id:
            units[unit_id.removesuffix(".service")] = {"enabled": values.get("UnitFileState", ""),
                           "active": values.get("ActiveState", "")}
    return units


def collect_units(names: list, run: Callable[[list], tuple[int, str, str]]) -> dict:
    """The units' state in one systemctl call; units systemctl could not answer for (no
    systemd, or not booted with it) read as {"enabled": "", "active": ""}."""
    found = {}
    if names:
        try:
            rc, out, _ = run(["systemctl", "show", "-p", "Id,UnitFileState,ActiveState", *names])
        except (OSError, subprocess.SubprocessError):
            rc, out = -1, ""
        if rc == 0:
            found = parse_systemctl_show(out)
    unknown = {"enabled": "", "active": ""}
    return {name: found.get(name.removesuffix(".service"), unknown) for name in names}


# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.", and on
# a GPU in MIG mode with the GPU instance (and compute instance) the error belongs to:
# "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, ..." and "(PCI:0000:01:00 GPU-I:05 GPU-CI:01)"
# (krcReportXid's format strings in NVIDIA's open-gpu-kernel-modules,
# src/nvidia/src/kernel/gpu/rc/kernel_rc.c).
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)(?: GPU-I:(\d+))?(?: GPU-CI:(\d+))?\): "
                  r"(\d+),\s*(.*)")
MAX_XID_EVENTS = 100


def _read_all(path: str) -> bytes:
    """Everything readable now; /dev/kmsg gives one record per read and EAGAIN at the end."""
    chunks = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                chunk = os.read(fd, 16384)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten while reading: go on
                    continue
                if exc.errno == errno.EAGAIN:
                    break
                raise
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def collect_kernel_log(root: Root) -> dict:
    """NVIDIA XID events since boot from /dev/kmsg (needs root or dmesg_restrict=0)."""
    source = "/dev/kmsg"
    try:
        data = _read_all(str(root.path(source)))
    except OSError as exc:
        return {
            "readable": False,
            "source": source,
            "error": str(exc),
            "xid_events": [],
            "xid_count": 0,
        }
    events = []
    count = 0
    for line in data.decode("utf-8", "replace").splitlines():
        # kmsg record: "prio,seq,usec,flags;message"; continuation lines start with a space.
        header, sep, message = line.partition(";")
        if not sep:
            continue
        match = XID_LINE.search(message)
        if not match:
            continue
        count += 1
        if len(events) < MAX_XID_EVENTS:
            fields = header.split(",")
            events.append(
                {
                    "pci": match.group(1).lower(),
                    "xid": int(match.group(4)),
                    "message": match.group(5).strip(),
                    # MIG: the GPU and compute instance the driver attributes it to
                    "gpu_instance": int(match.group(2)) if match.group(2) else None,
                    "compute_instance": int(match.group(3)) if match.group(3) else None,
                    "usec_since_boot": int(fields[2])
                    if len(fields) > 2 and fields[2].isdigit()
                    else None,
                }
            )
    return {
        "readable": True,
        "source": source,
        "error": None,
        "xid_events": events,
        "xid_count": count,
    }
