"""What the node boots next: its kernels, the nvidia module each has, and Secure Boot.

The most common GPU outage after an install is a node that reboots into a kernel without an
nvidia module (a kernel upgrade without the headers DKMS needs, a failed DKMS build) or with
one Secure Boot refuses to load. This section gives verify (driver.next-boot,
host.secure-boot) what it needs to say so before the reboot:

    kernels         the kernel images in /boot, oldest first (vmlinuz-<release>, rescue
                    images left out)
    running_kernel  the release the node runs now
    next_kernel     the one it boots next: the newest image in /boot. That is GRUB's default
                    entry on Debian, Ubuntu and RHEL (GRUB_DEFAULT=0, grubby's newest); a
                    saved or pinned default entry is not read. None: no image in /boot (a
                    container, as the lab's nodes are)
    modules         {release: {path, kind ("dkms" under updates/dkms, else "packaged"),
                    version, signer, sig_key, signed}} for the running and the next kernel,
                    or None where the kernel has no nvidia module; version and signed
                    read from the file (plain, xz, gz), signer and sig_key with kmod's
                    `modinfo FILE` (also for zst)
    secure_boot     True / False from the SecureBoot EFI variable; None where there is none
                    (legacy BIOS boot, or /sys/firmware hidden as in containers)
    trusted_keys    descriptions of the asymmetric keys the kernel trusts for modules
                    (/proc/keys: builtin, secondary, platform and machine keyrings, where MOK
                    keys land), read only with Secure Boot on
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .fs import Root

# EFI global variable GUID (UEFI spec): SecureBoot is 4 attribute bytes, then 1 = on.
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
# The nvidia module's file: nvidia.ko (NVIDIA's packages, Ubuntu's, RHEL's kmods), or Debian's
# renamed ones, nvidia-current.ko and nvidia-tesla-470.ko (their modprobe.d files say
# "install nvidia modprobe -i nvidia-current": /etc/nvidia/current/nvidia-modprobe.conf of
# nvidia-kernel-support 535.261.03-1, /etc/nvidia/tesla-470/ of nvidia-tesla-470-kernel-support
# 470.256.02-1~deb12u1), plain or compressed; not the -uvm, -modeset, -drm, -peermem ones.
_MODULE_FILE = re.compile(r"^nvidia(?:-current|-tesla-\d+|-legacy-\w+?xx)?"
                          r"\.ko(?:\.xz|\.zst|\.gz)?$")
_MODINFO_FIELD = re.compile(r"^(\w+):\s*(.*)$")


def version_key(release: str) -> list:
    """Natural order of kernel releases: 6.1.0-9-amd64 < 6.1.0-10-amd64."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", release) if part]


def installed_kernels(root: Root) -> list[str]:
    releases = []
    for path in root.glob("/boot/vmlinuz-*"):
        release = os.path.basename(path).removeprefix("vmlinuz-")
        if "rescue" not in release:
            releases.append(release)
    return sorted(releases, key=version_key)


def _module_file(root: Root, release: str) -> str | None:
    """The nvidia.ko modprobe would load for the release: depmod's default search order puts
    updates/ (DKMS) first, then the distribution's own."""
    base = root.path(f"/lib/modules/{release}")
    found = []
    for directory, _dirs, files in os.walk(base):
        found += [os.path.join(directory, f) for f in files if _MODULE_FILE.match(f)]
    if not found:
        return None
    found.sort(key=lambda p: (f"{os.sep}updates{os.sep}" not in p, p))
    return root.node_path(found[0])


# The .modinfo strings of a module file ("version=580.105.08\0"), and the marker the kernel's
# sign-file appends after a signature (include/linux/module_signature.h).
_VERSION = re.compile(rb"(?:^|\x00)version=([^\x00]+)\x00")
SIGNATURE_MARKER = b"~Module signature appended~\n"


def _contents(path: Path) -> bytes | None:
    """The module's bytes, decompressed (xz, gz); None where the stdlib cannot (zst)."""
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        import lzma

        return lzma.decompress(data)
    if path.name.endswith(".gz"):
        import gzip

        return gzip.decompress(data)
    return None if path.name.endswith(".zst") else data


def _modinfo(root: Root, path: str, run) -> dict:
    """version and signed from the file itself; signer and sig_key (inside the PKCS#7
    signature) from kmod's `modinfo`, which also reads what the stdlib cannot decompress."""
    info: dict = {"version": None, "signer": None, "sig_key": None, "signed": False,
                  "error": None}
    data = _contents(root.path(path))
    if data is not None:
        match = _VERSION.search(data)
        info["version"] = match.group(1).decode(errors="replace") if match else None
        info["signed"] = data.endswith(SIGNATURE_MARKER)
        if not info["signed"]:
            return info
    try:
        rc, out, err = run(["modinfo", str(root.path(path))])
    except OSError as exc:
        rc, out, err = 127, "", str(exc)
    fields: dict = {}
    for line in out.splitlines():
        match = _MODINFO_FIELD.match(line)
        if match and match.group(1) not in fields:
            fields[match.group(1)] = match.group(2).strip()
    info["signer"] = fields.get("signer") or None
    info["sig_key"] = fields.get("sig_key") or None
    if data is None:
        info["version"] = fields.get("version")
        info["signed"] = bool(fields.get("sig_id") or fields.get("signer"))
    if rc != 0:
        info["error"] = err.strip() or f"modinfo exited {rc}"
    return info


def module(root: Root, release: str, run) -> dict | None:
    path = _module_file(root, release)
    if path is None:
        return None
    kind = "dkms" if "/updates/dkms/" in path else "packaged"
    return {"path": path, "kind": kind, **_modinfo(root, path, run)}


def secure_boot(root: Root) -> bool | None:
    try:
        data = root.path(SECURE_BOOT_VAR).read_bytes()
    except OSError:
        return None
    return len(data) >= 5 and data[4] == 1


def trusted_keys(root: Root) -> list[str]:
    """`<id> <flags> <usage> <timeout> <perm> <uid> <gid> <type> <description>: <summary>`,
    the type cut to 9 characters ("asymmetri": proc_keys_show() in security/keys/proc.c)."""
    keys = []
    for line in (root.read("/proc/keys") or "").splitlines():
        parts = line.split(None, 8)
        if len(parts) == 9 and parts[7] == "asymmetri":
            keys.append(parts[8].strip())
    return keys


def collect(root: Root, running: str | None, run) -> dict:
    kernels = installed_kernels(root)
    following = kernels[-1] if kernels else None
    releases = dict.fromkeys(r for r in (running, following) if r)
    on = secure_boot(root)
    return {
        "kernels": kernels,
        "running_kernel": running,
        "next_kernel": following,
        "modules": {release: module(root, release, run) for release in releases},
        "secure_boot": on,
        "trusted_keys": trusted_keys(root) if on else [],
    }


def next_boot_problem(boot: dict, installed: str | None) -> str | None:
    """Why the kernel the node boots next would come up without a working driver: no nvidia
    module, or one of another version than the installed driver's. None where nothing is
    wrong or nothing can be judged (no image in /boot, no driver installed). One judgement for
    verify's driver.next-boot and the nvidia_driver role's rebuild
    (gpuprov.stages.nvidia_driver)."""
    kernel = boot.get("next_kernel")
    if kernel is None or installed is None:
        return None
    module = (boot.get("modules") or {}).get(kernel)
    if module is None:
        return f"kernel {kernel}, the one the node boots next, has no nvidia module"
    if module.get("version") != installed:
        return (f"kernel {kernel}, the one the node boots next, has nvidia "
                f"{module.get('version') or '(version unreadable)'} ({module['path']}) but the "
                f"installed driver is {installed}")
    return None
