"""What the roles read on a node before they decide, in one pass (no writes).

The nvidia_driver and nvidia_container_toolkit roles run this on each node through the
gpuprov_node_state module (plugins/modules/gpuprov_node_state.py), which Ansible ships with
this package as its module_utils. Each fact comes from the probe's own collector, so the roles
and `gpuprov probe`/`gpuprov verify` read a node the same way:

    packages      packages.query: the package manager and every installed package
                  {name: {"version", "state", "held"}}; dpkg_interrupted: why dpkg must
                  finish first ([] when it need not)
    kernel        host.collect_kernel_module: nouveau and nvidia loaded (by initstate), the
                  nvidia module's version
    units         host.collect_units: {unit: {"enabled", "active"}}
    files         Root.file_facts: the files a role writes (mode, owner, sha1), so that it
                  writes only the ones that differ
    configs       their text, for the roles that merge into config they do not own
    version       the container runtime's version command: {"rc", "output" (first line)}
    boot          boot.collect: the kernel the node boots next and the nvidia module it has
                  (None unless asked), so the driver role builds the module a kernel upgrade
                  left without one, as verify's driver.next-boot judges it

A converged node needs nothing but this read: each Ansible task costs a module start on the
node, so one read replaces a task per fact.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

from . import boot, host, packages
from .fs import BIN_DIRS, Root

Runner = Callable[..., "tuple[int, str, str]"]
# The runtime's version command is found where package and tarball installs put it.
RUNTIME_PATH = ":".join(BIN_DIRS)


def read(
    root: Root,
    run: Runner = packages.run_command,
    *,
    read_packages: bool = False,
    units: tuple = (),
    files: tuple = (),
    configs: tuple = (),
    version_command: tuple = (),
    read_boot: bool = False,
) -> dict:
    """The node's state as the roles decide from it; every key is there whatever was asked."""
    state: dict[str, Any] = {
        "package_manager": None, "packages": {}, "packages_error": None, "interrupted": [],
        "nouveau_loaded": False, "module_version": None, "units": host.collect_units(
            list(units), run), "files": [], "contents": {}, "unreadable": [], "version": None,
    }
    if read_packages:
        _read_packages(state, root, run)
    kernel = host.collect_kernel_module(root)
    state["nouveau_loaded"] = kernel["nouveau_loaded"]
    state["module_version"] = kernel["version"]
    state["files"] = [found for found in map(root.file_facts, files) if found is not None]
    for path in configs:
        _read_config(state, root, path)
    if version_command:
        state["version"] = _version(run, list(version_command))
    if read_boot:
        state["boot"] = boot.collect(root, host.running_kernel(root), run)
    return state


def _read_packages(state: dict, root: Root, run: Runner) -> None:
    # rpm: every package, not only the probe's NVIDIA/CUDA names (the roles ask for kernel
    # headers, dkms and the like too).
    found = packages.query(root, run, rpm_patterns=())
    state["package_manager"] = found["manager"]
    state["packages_error"] = found["error"]
    state["packages"] = {p.pop("name"): p for p in found["packages"]}
    if found["manager"] == "dpkg":
        state["interrupted"] = packages.dpkg_interrupted(root, run)


def _read_config(state: dict, root: Root, path: str) -> None:
    """A config's text; one that is there but cannot be read (or is not UTF-8) is named in
    "unreadable", so that the role refuses to merge into it rather than rewrite it."""
    target = root.path(path)
    if not target.is_file():
        return
    try:
        state["contents"][path] = target.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        state["unreadable"].append(path)


def _version(run: Runner, argv: list) -> dict:
    try:
        rc, out, err = run(argv, path=RUNTIME_PATH)
    except (OSError, subprocess.SubprocessError) as exc:
        rc, out, err = 126, "", str(exc)
    text = (out + err).strip()
    return {"rc": rc, "output": text.splitlines()[0] if text else ""}
