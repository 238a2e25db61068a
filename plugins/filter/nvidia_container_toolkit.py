"""Ansible filters: the nvidia_container_toolkit role's decisions (gpuprov/stages/nvidia_container_toolkit.py) and
its config.toml merge (gpuprov/stages/_toolkit_config.py).

    settings | gpuprov_toolkit_plan
        -> the plan before the node is read (gpuprov.stages.nvidia_container_toolkit.plan: install_names,
           runtime, written_files, read_configs, key_source, gpu_access, problem)
    state | gpuprov_toolkit_work(plan, probe_packages, apt_sources=text|None)
        -> what the node's read leaves to do (runtime_problem, keyring_found, keyring_ok,
           apt_sources_current, missing, unheld, containerd_text, config: the toolkit's
           config.toml merged as gpuprov_toolkit_config does)
    work | gpuprov_toolkit_repository(manage_repo=..., key_changed=...)
        -> {"dearmor_needed", "work"}: the repository steps after the key was fetched

    text | gpuprov_toolkit_config(settings, path=...)
        -> {"text", "changed"}   (gpuprov.stages._toolkit_config.merge; the admin's keys and comments
                                  kept; text none: the file is missing)
    strategy | gpuprov_device_list_problems(hosts, hostvars)
        -> [line, ...]           (gpuprov.stages._toolkit_config.strategy_problems: the device
                                  plugin's strategy against the toolkit settings of each
                                  host that has GPUs, gpu_preflight_has_gpu; settings the
                                  inventory does not set are the toolkit role's defaults)

Computed on the controller from the file the role read; the role writes the result back with
ansible.builtin.copy (backup, diff, check mode). Nothing here is shipped to nodes.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

INSTALL_HINT = (
    "gpuprov is not importable by the Python that runs ansible ({error}): "
    "install gpuprov in the Python that runs ansible: pip install -e ."
)


def _module(name: str = "stages._toolkit_config") -> Any:
    # Imported on first use: Ansible loads every filter plugin for every template.
    try:
        return importlib.import_module(f"gpuprov.{name}")
    except ImportError as exc:
        raise AnsibleFilterError(INSTALL_HINT.format(error=exc)) from None


def toolkit_plan(settings: Any) -> dict:
    if not isinstance(settings, Mapping):
        raise AnsibleFilterError(
            f"gpuprov_toolkit_plan expects the role's settings, got {settings!r}")
    module = _module("stages.nvidia_container_toolkit")
    try:
        return module.plan(module.Settings.from_vars(settings))
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"gpuprov_toolkit_plan: {exc}") from None


def toolkit_work(state: Any, plan: Any, probe_packages: Any, apt_sources: Any = None,
                 nvml: Any = None, driver_changed: Any = False) -> dict:
    if not (isinstance(state, Mapping) and isinstance(plan, Mapping)
            and isinstance(probe_packages, list)):
        raise AnsibleFilterError("gpuprov_toolkit_work expects the node's read, the plan and the "
                                 f"probe's package list, got {state!r}, {plan!r}, "
                                 f"{probe_packages!r}")
    try:
        return _module("stages.nvidia_container_toolkit").work(
            plan, state, probe_packages, apt_sources=apt_sources,
            nvml=nvml if isinstance(nvml, Mapping) else None,
            driver_changed=_bool(driver_changed))
    except _module().ToolkitConfigError as exc:
        raise AnsibleFilterError(str(exc)) from None


def toolkit_repository(work: Any, manage_repo: Any, key_changed: Any) -> dict:
    if not isinstance(work, Mapping):
        raise AnsibleFilterError(f"gpuprov_toolkit_repository expects the work, got {work!r}")
    return _module("stages.nvidia_container_toolkit").repository(work, manage_repo=_bool(manage_repo),
                                              key_changed=_bool(key_changed))


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


def node_modes(hosts: Any, hostvars: Mapping[str, Any]) -> dict[str, str]:
    """{Kubernetes node name: cdi | legacy} of the GPU hosts: the mode the toolkit stage
    applied in this run, else the same decision from the inventory's setting and the runtime
    version the preflight's probe found (gpuprov/runtime_mode.py)."""
    rm = _module("runtime_mode")
    modes = {}
    for host in hosts:
        values = hostvars[host]
        if not _bool(values.get("gpu_preflight_has_gpu", True)):
            continue
        name = str(values.get("gpu_node_labels_node_name") or host)
        mode = values.get("nvidia_container_toolkit_mode_applied")
        if mode not in (rm.CDI, rm.LEGACY):
            probe = values.get("gpu_preflight_probe") or {}
            runtime = str(values.get("nvidia_container_toolkit_runtime") or "containerd")
            choice = rm.choose(values.get("nvidia_container_toolkit_mode"), runtime,
                               rm.packaged_version(runtime, (probe.get("packages") or {})))
            mode = choice.mode or rm.LEGACY
        modes[name] = mode
    return modes


def device_list_problems(strategy: Any, hosts: Any, hostvars: Mapping[str, Any]) -> list[str]:
    """The legacy strategy against the toolkit settings of the GPU hosts in legacy mode (CDI
    nodes get the plugin's cdi config, which the toolkit's access keys do not gate)."""
    tc = _module()
    modes = node_modes(hosts, hostvars)
    nodes = {}
    for host in hosts:
        values = hostvars[host]
        if not _bool(values.get("gpu_preflight_has_gpu", True)):
            continue
        if modes.get(str(values.get("gpu_node_labels_node_name") or host)) == "cdi":
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
                "gpuprov_runtime_modes": node_modes,
                "gpuprov_device_list_problems": device_list_problems,
                "gpuprov_toolkit_plan": toolkit_plan,
                "gpuprov_toolkit_work": toolkit_work,
                "gpuprov_toolkit_repository": toolkit_repository}
