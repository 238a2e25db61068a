"""Ansible filters that merge NVIDIA's runtime into a node's container runtime config.

The nvidia_container_toolkit role reads the node's files (slurp), these filters compute
the new contents on the controller with gpuprov.stages._runtime_config (containerd's import rules
are the probe's, gpuprov.node.probe.runtime), and the role writes them back with
ansible.builtin.copy (backup, diff, check mode). Nothing here is shipped to nodes.

    main_text | gpuprov_containerd_import_dirs(main_path)
        -> [{"path": dir, "pattern": glob}]         what the main config imports from
    main_text | gpuprov_containerd_nvidia(files, main_path=..., drop_in_path=...,
                runtime_name=..., binary=..., set_default=..., containerd_version=...)
        -> {"main", "main_changed", "drop_in", "plugin", "version", "merge", "effective"}
    text | gpuprov_docker_nvidia(runtime_name=..., binary=..., set_default=...)
        -> {"text", "changed", "config"}

A configuration that cannot be merged safely (invalid TOML/JSON, a missing import, a later
drop-in that would replace the NVIDIA runtime's table) fails the task with what to change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

INSTALL_HINT = (
    "gpuprov is not importable by the Python that runs ansible ({error}): "
    "install gpuprov in the Python that runs ansible: pip install -e ."
)


def _runtime_config() -> Any:
    # Imported on first use: Ansible loads every filter plugin for every template.
    try:
        from gpuprov.stages import _runtime_config
    except ImportError as exc:
        raise AnsibleFilterError(INSTALL_HINT.format(error=exc)) from None
    return _runtime_config


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _major(version: Any) -> int | None:
    """'1.6.20~ds1-1+deb12u3' or 'containerd ... v2.0.4 ...' -> 1 / 2; None when unknown."""
    match = re.search(r"(?:^|[\sv])(\d+)\.\d+", str(version or ""))
    return int(match.group(1)) if match else None


def gpuprov_containerd_import_dirs(main_text: Any, main_path: str = "/etc/containerd/config.toml"):
    rc = _runtime_config()
    try:
        return rc.containerd_import_dirs(_text(main_text), main_path)
    except rc.RuntimeConfigError as exc:
        raise AnsibleFilterError(str(exc)) from None


def gpuprov_containerd_nvidia(
    main_text: Any,
    files: Mapping | None = None,
    main_path: str = "/etc/containerd/config.toml",
    drop_in_path: str = "/etc/containerd/conf.d/99-nvidia.toml",
    runtime_name: str = "nvidia",
    binary: str = "/usr/bin/nvidia-container-runtime",
    set_default: bool = False,
    containerd_version: Any = None,
    cdi: bool = False,
) -> dict:
    rc = _runtime_config()
    if files is not None and not isinstance(files, Mapping):
        raise AnsibleFilterError(f"gpuprov_containerd_nvidia: files must be a dict, got {files!r}")
    try:
        return rc.containerd_nvidia(
            _text(main_text),
            {str(k): str(v) for k, v in (files or {}).items()},
            main_path=main_path,
            drop_in_path=drop_in_path,
            runtime_name=runtime_name,
            binary=binary,
            set_default=bool(set_default),
            containerd_major=_major(containerd_version),
            cdi=bool(cdi),
        )
    except rc.RuntimeConfigError as exc:
        raise AnsibleFilterError(str(exc)) from None


def gpuprov_docker_nvidia(
    text: Any,
    runtime_name: str = "nvidia",
    binary: str = "/usr/bin/nvidia-container-runtime",
    set_default: bool = False,
) -> dict:
    rc = _runtime_config()
    try:
        return rc.docker_nvidia(
            _text(text), runtime_name=runtime_name, binary=binary, set_default=bool(set_default)
        )
    except rc.RuntimeConfigError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpuprov_containerd_import_dirs": gpuprov_containerd_import_dirs,
            "gpuprov_containerd_nvidia": gpuprov_containerd_nvidia,
            "gpuprov_docker_nvidia": gpuprov_docker_nvidia,
        }
