"""Questions the roles ask about a node's state (gpuprov.node.probe.node_state's read), and
the roles' settings as plain Python.

Pure functions over the read, shared by the nvidia_driver and nvidia_container_toolkit stages
and by their gpuprov_file_current filter (plugins/filter/nvidia_driver.py).
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Iterable, Mapping


def packages_missing(names: Iterable[str], packages: Mapping | Iterable,
                     version: str | None = None) -> list[str]:
    """The names that the packages do not satisfy: not installed, or installed at a version
    that does not match `version` (fnmatch, as the apt module matches name=version).

    packages: {name: {"version", "state", ...}} (the node read), or the probe report's list
    of {"name", "version", "state", ...}.
    """
    if not isinstance(packages, Mapping):
        packages = {p.get("name"): p for p in packages if isinstance(p, Mapping)}
    missing = []
    for name in names:
        package = packages.get(name) or {}
        installed = package.get("state") == "installed"
        if not installed or (version and not fnmatch.fnmatchcase(str(package.get("version")),
                                                                 str(version))):
            missing.append(name)
    return missing


def file_current(files: Iterable[Mapping], path: str, content: str, mode: str = "0644") -> bool:
    """Whether the node's file (in the read's "files") has this content (sha1), mode and root
    ownership already: a role then skips its template/copy task, which costs two module runs
    even when it changes nothing."""
    checksum = hashlib.sha1(str(content).encode()).hexdigest()
    for found in files:
        if isinstance(found, Mapping) and found.get("path") == path:
            return (found.get("checksum") == checksum and str(found.get("mode")) == mode
                    and found.get("uid") == 0 and found.get("gid") == 0)
    return False


def plain(value: object) -> object:
    """Ansible's values as plain Python ones: dict, list, str, int, bool, None. Filters get
    Ansible's own lazy containers and str subclasses, which copy.deepcopy and
    dataclasses.asdict cannot rebuild."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return str(value)


# The Settings fields every role's plan reads from the host and its gathered facts (the stages'
# SETTING_VARS tables start with them; plugins/lookup/gpuprov_stage_settings.py reads them).
HOST_SETTING_VARS = {
    "host": "inventory_hostname",
    "os_name": "ansible_facts.distribution",
    "os_version": "ansible_facts.distribution_major_version",
}


# Ansible's `| bool` (ansible.module_utils.parsing.convert_bool): these are true, all else false.
_TRUE = frozenset(("y", "yes", "on", "1", "true", "t"))


def truthy(value: object) -> bool:
    """A setting as Ansible's `| bool` reads it: true, "yes", "on", 1 ... are true."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value == 1
    return isinstance(value, str) and value.strip().lower() in _TRUE


def settings_values(cls: type, values: Mapping, *, texts: tuple = (),
                    optional_texts: tuple = (), tuples: tuple = ()) -> dict:
    """A role's variables as the keyword arguments of its stage's Settings dataclass: unknown
    names refused (ValueError), plain Python, each bool field read as Ansible's `| bool`,
    `texts` as strings, `optional_texts` as strings unless None, `tuples` as tuples."""
    fields = cls.__dataclass_fields__
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"unknown settings {', '.join(unknown)}")
    values = plain(values)
    for name, spec in fields.items():
        if spec.type == "bool" and name in values:
            values[name] = truthy(values[name])
    values.update({name: str(values.get(name)) for name in texts})
    values.update({name: str(values[name]) for name in optional_texts
                   if values.get(name) is not None})
    values.update({name: tuple(values.get(name) or ()) for name in tuples})
    return values
