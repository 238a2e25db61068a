"""Ansible filter that sets the NVIDIA container toolkit's GPU-access keys in its config.toml.

    text | gpuprov_toolkit_config(settings, path=...)
        -> {"text", "changed"}   (gpuprov.toolkit_config.merge; the admin's keys and comments
                                  kept; text none: the file is missing)
    strategy | gpuprov_device_list_problems(hosts, hostvars)
        -> [line, ...]           (gpuprov.toolkit_config.strategy_problems: the device
                                  plugin's strategy against the toolkit settings of each
                                  host that has GPUs, gpu_preflight_has_gpu; settings the
                                  inventory does not set are the toolkit role's defaults)

Computed on the controller from the file the role read; the role writes the result back with
ansible.builtin.copy (backup, diff, check mode). Nothing here is shipped to nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

INSTALL_HINT = (
    "gpuprov is not importable by the Python that runs ansible ({error}): "
    "install gpuprov in the Python that runs ansible: pip install -e ."
)


def _module() -> Any:
    # Imported on first use: Ansible loads every filter plugin for every template.
    try:
        from gpuprov import toolkit_config
    except ImportError as exc:
        raise AnsibleFilterError(INSTALL_HINT.format(error=exc)) from None
    return toolkit_config


def toolkit_config(text: Any, settings: Mapping[str, Any], path: str | None = None) -> dict:
    tc = _module()
    try:
        return tc.merge(None if text is None else str(text), dict(settings),
                        **({"path": path} if path else {}))
    except tc.ToolkitConfigError as exc:
        raise AnsibleFilterError(str(exc)) from None


# The nvidia_container_toolkit role's settings and the toolkit keys they set.
_ROLE_SETTINGS = {
    "nvidia_container_toolkit_accept_envvar_unprivileged":
        "accept-nvidia-visible-devices-envvar-when-unprivileged",
    "nvidia_container_toolkit_accept_volume_mounts":
        "accept-nvidia-visible-devices-as-volume-mounts",
}


def device_list_problems(strategy: Any, hosts: Any, hostvars: Mapping[str, Any]) -> list[str]:
    tc = _module()
    nodes = {}
    for host in hosts:
        values = hostvars[host]
        if not _bool(values.get("gpu_preflight_has_gpu", True)):
            continue
        nodes[str(host)] = {key: _bool(values[var]) if var in values else tc.SECURE[key]
                            for var, key in _ROLE_SETTINGS.items()}
    return tc.strategy_problems(str(strategy), nodes)


def _bool(value: Any) -> bool:
    """Ansible's `| bool` for the values an inventory gives (true, "yes", "false", 0 ...)."""
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "on", "1", "true", "y", "t")
    return bool(value)


class FilterModule:
    def filters(self) -> dict:
        return {"gpuprov_toolkit_config": toolkit_config,
                "gpuprov_device_list_problems": device_list_problems}
