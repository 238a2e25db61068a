"""Ansible filters that read what the roles' node reads print, for the roles to decide from.

The nvidia_driver role runs roles/nvidia_driver/files/driver-state.sh on the node, the
nvidia_container_toolkit role a `find` of the files it writes (one command each, reads only);
these filters turn the output into what the roles decide from, on the controller.
dpkg-query's lines are parsed by gpuprov's probe (gpuprov.probe.packages), the same reading
`gpuprov verify` makes of the node's packages. Nothing here is shipped to nodes.

    stdout | gpuprov_node_read
        -> {"interrupted": [why, ...], "packages": {name: {"version", "state", "held"}},
            "nouveau_loaded": bool, "module_version": "535.261.03" | None,
            "persistenced": {"enabled": "enabled" | "disabled" | "", "active": "active" | ...},
            "files": [{"path", "checksum", "mode", "uid", "gid"}],
            "version": {"rc": int, "output": str} | None, "contents": {path: text},
            "unreadable": [path, ...]}
        (lines tagged pkg, interrupted, module, unit, file, version, content, error; the
        scripts, roles/*/files/*-state.sh, say what each is)
    files | gpuprov_file_current(path, content, mode="0644")
        -> whether the node's file (in the "files" above) has this content (sha1), mode and
           root ownership already: a role then skips the template/copy task, which costs
           two module runs even when it changes nothing
    ansible_facts['packages'] | gpuprov_package_facts
        -> the same {name: {"version", "state", "held"}} from package_facts (rpm nodes, where
           the script reads no package database); version "[epoch:]version-release"
    names | gpuprov_packages_missing(packages, version=None)
        -> the names that the packages (by name, or the probe's list of them) do not satisfy:
           not installed, or installed at a version that does not match `version` (fnmatch,
           as the apt module matches name=version)
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

INSTALL_HINT = (
    "gpuprov is not importable by the Python that runs ansible ({error}): "
    "install gpuprov in the Python that runs ansible: pip install -e ."
)
# /proc/driver/nvidia/version's first line: "NVRM version: NVIDIA UNIX x86_64 Kernel Module
# 535.261.03  <date>" (proprietary) or "... UNIX Open Kernel Module for x86_64  535.261.03 ...".
_MODULE_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+([0-9][0-9.]+)")


def _packages_module() -> Any:
    # Imported on first use: Ansible loads every filter plugin for every template.
    try:
        from gpuprov.probe import packages
    except ImportError as exc:
        raise AnsibleFilterError(INSTALL_HINT.format(error=exc)) from None
    return packages


def _file_line(fields: list[str]) -> dict | None:
    """`find FILE... -printf 'file\\t%p\\t%#m\\t%U\\t%G\\t' -exec sha1sum {} \\;` fields."""
    if len(fields) != 5 or not (fields[2].isdigit() and fields[3].isdigit()):
        return None
    try:
        mode = f"{int(fields[1], 8):04o}"
    except ValueError:
        return None
    checksum = fields[4].split(" ", 1)[0]
    return {"path": fields[0], "checksum": checksum, "mode": mode, "uid": int(fields[2]),
            "gid": int(fields[3])}


def node_read(text: Any) -> dict:
    if not isinstance(text, str):
        raise AnsibleFilterError(
            f"gpuprov_node_read expects the script's stdout, got {text!r}")
    state: dict = {"interrupted": [], "packages": {}, "nouveau_loaded": False,
                   "module_version": None, "persistenced": {"enabled": "", "active": ""},
                   "files": [], "version": None, "contents": {}, "unreadable": []}
    dpkg_lines = []
    for line in text.splitlines():
        tag, _, rest = line.partition("\t")
        fields = rest.split("\t")
        if tag == "pkg":
            dpkg_lines.append(rest)
        elif tag == "interrupted":
            state["interrupted"].append(rest)
        elif tag == "module":
            _module_line(state, fields[0], rest)
        elif tag == "unit" and len(fields) == 3 and fields[0] == "nvidia-persistenced":
            state["persistenced"] = {"enabled": fields[1], "active": fields[2]}
        elif tag == "file":
            found = _file_line(fields)
            if found is not None:
                state["files"].append(found)
        elif tag == "version" and len(fields) == 2 and fields[0].isdigit():
            state["version"] = {"rc": int(fields[0]), "output": fields[1]}
        elif tag == "content" and len(fields) == 2:
            _content_line(state, fields[0], fields[1])
        elif tag == "error":
            state["unreadable"].append(rest)
    for package in _packages_module().parse_dpkg_query("\n".join(dpkg_lines)):
        state["packages"][package.pop("name")] = package
    return state


def _module_line(state: dict, module: str, line: str) -> None:
    """`module` lines: nouveau loaded, or nvidia's /proc/driver/nvidia/version line."""
    if module == "nouveau":
        state["nouveau_loaded"] = True
    elif module == "nvidia":
        match = _MODULE_VERSION.search(line)
        state["module_version"] = match.group(1) if match else None


def _content_line(state: dict, path: str, encoded: str) -> None:
    """`content` lines: a file's text, base64; one that does not decode is unreadable."""
    try:
        text = base64.b64decode(encoded, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        state["unreadable"].append(path)
    else:
        state["contents"][path] = text


def package_facts(value: Any) -> dict:
    if not isinstance(value, Mapping):
        raise AnsibleFilterError(
            f"gpuprov_package_facts expects ansible_facts['packages'], got {value!r}")
    packages = {}
    for name, versions in value.items():
        first = versions[0] if versions else {}
        version = str(first.get("version", ""))
        if first.get("release"):
            version += f"-{first['release']}"
        if first.get("epoch"):
            version = f"{first['epoch']}:{version}"
        packages[name] = {"version": version, "state": "installed", "held": False}
    return packages


def packages_missing(names: Any, packages: Any, version: Any = None) -> list[str]:
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise AnsibleFilterError(
            f"gpuprov_packages_missing expects a list of package names, got {names!r}")
    if not isinstance(packages, Mapping):
        # The probe's report lists them: [{"name", "version", "state", "held"}, ...].
        if isinstance(packages, (str, bytes)) or not isinstance(packages, Iterable):
            raise AnsibleFilterError("gpuprov_packages_missing expects packages by name or the "
                                     f"probe's list, got {packages!r}")
        packages = {p.get("name"): p for p in packages if isinstance(p, Mapping)}
    missing = []
    for name in names:
        package = packages.get(name) or {}
        installed = package.get("state") == "installed"
        if not installed or (version and not fnmatch.fnmatchcase(str(package.get("version")),
                                                                 str(version))):
            missing.append(name)
    return missing


def file_current(files: Any, path: Any, content: Any, mode: str = "0644") -> bool:
    if isinstance(files, (str, bytes, Mapping)) or not isinstance(files, Iterable):
        raise AnsibleFilterError(f"gpuprov_file_current expects a list of files, got {files!r}")
    checksum = hashlib.sha1(str(content).encode()).hexdigest()
    for found in files:
        if isinstance(found, Mapping) and found.get("path") == path:
            return (found.get("checksum") == checksum and str(found.get("mode")) == mode
                    and found.get("uid") == 0 and found.get("gid") == 0)
    return False


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpuprov_node_read": node_read,
            "gpuprov_package_facts": package_facts,
            "gpuprov_packages_missing": packages_missing,
            "gpuprov_file_current": file_current,
        }
