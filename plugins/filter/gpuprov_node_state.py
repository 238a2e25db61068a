"""Ansible filters over a node's state as the gpuprov_node_state module reads it.

The nvidia_driver and nvidia_container_toolkit roles read each node once with the
gpuprov_node_state module (plugins/modules/gpuprov_node_state.py: gpuprov's probe collectors,
run on the node); these filters answer the roles' questions about that state.

    names | gpuprov_packages_missing(packages, version=None)
        -> the names that the packages (the state's {name: {...}}, or the probe report's list
           of them) do not satisfy: not installed, or installed at a version that does not
           match `version` (fnmatch, as the apt module matches name=version)
    files | gpuprov_file_current(path, content, mode="0644")
        -> whether the node's file (in the state's "files") has this content (sha1), mode and
           root ownership already: a role then skips the template/copy task, which costs
           two module runs even when it changes nothing
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError


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
            "gpuprov_packages_missing": packages_missing,
            "gpuprov_file_current": file_current,
        }
