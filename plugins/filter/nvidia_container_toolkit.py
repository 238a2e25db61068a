"""Filters of the nvidia_container_toolkit role: its plan and the work the node's read leaves
(gpuprov/stages/nvidia_container_toolkit.py), the toolkit's config.toml merge
(gpuprov/stages/_toolkit_config.py) and NVIDIA's runtime merged into containerd's, Docker's or
CRI-O's config (gpuprov/stages/_runtime_config.py; containerd's import rules are the probe's,
gpuprov.node.probe.runtime).

    lookup('gpuprov_stage_settings', 'nvidia_container_toolkit') | gpuprov_toolkit_plan
        -> the plan before the node is read (install_names, runtime, written_files,
           read_configs, key_source, gpu_access, problem)
    state | gpuprov_toolkit_work(plan, probe_packages, apt_sources=text|None, check_mode=...)
        -> what the node's read leaves to do (runtime_problem, keyring_found, keyring_ok,
           apt_sources_current, repo_pending, missing, unheld, containerd_text, docker:
           daemon.json merged, config: the toolkit's config.toml merged as
           gpuprov_toolkit_config does)
    work | gpuprov_toolkit_repository(manage_repo=..., key_changed=...)
        -> {"dearmor_needed", "work"}: the repository steps after the key was fetched
    text | gpuprov_toolkit_config(settings, path=...)
        -> {"text", "changed"} (the admin's keys and comments kept; text none: no file)
    main_text | gpuprov_containerd_import_dirs(main_path)
        -> [{"path": dir, "pattern": glob}]         what the main config imports from
    main_text | gpuprov_containerd_nvidia(files, main_path=..., drop_in_path=...,
                runtime_name=..., binary=..., set_default=..., containerd_version=...)
        -> {"main", "main_changed", "drop_in", "plugin", "version", "merge", "effective"}
    text | gpuprov_docker_nvidia(runtime_name=..., binary=..., set_default=...)
        -> {"text", "changed", "config"}

Computed on the controller from the files the role read; the role writes the results back with
ansible.builtin.copy (backup, diff, check mode). A configuration that cannot be merged safely
(invalid TOML/JSON, a missing import, a later drop-in that would replace the NVIDIA runtime's
table) fails the task with what to change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuprov.cluster.plugins.plugin_utils import gpuprov_support as support


def gpuprov_toolkit_plan(settings: Any) -> dict:
    return support.stage_plan("nvidia_container_toolkit", "gpuprov_toolkit_plan", settings)


def gpuprov_toolkit_work(state: Any, plan: Any, probe_packages: Any, apt_sources: Any = None,
                         nvml: Any = None, driver_changed: Any = False,
                         check_mode: Any = False) -> dict:
    if not (isinstance(state, Mapping) and isinstance(plan, Mapping)
            and isinstance(probe_packages, list)):
        raise AnsibleFilterError("gpuprov_toolkit_work expects the node's read, the plan and the "
                                 f"probe's package list, got {state!r}, {plan!r}, "
                                 f"{probe_packages!r}")
    toolkit = support.stage("nvidia_container_toolkit")
    return support.reported(None, lambda: toolkit.work(
        plan, state, probe_packages, apt_sources=apt_sources,
        nvml=nvml if isinstance(nvml, Mapping) else None,
        driver_changed=support.truthy(driver_changed), check_mode=support.truthy(check_mode)),
        (support.stage("_toolkit_config").ToolkitConfigError,
         support.stage("_runtime_config").RuntimeConfigError))


def gpuprov_toolkit_repository(work: Any, manage_repo: Any, key_changed: Any) -> dict:
    work = support.mapping(work, "gpuprov_toolkit_repository", "the work")
    return support.stage("nvidia_container_toolkit").repository(
        work, manage_repo=support.truthy(manage_repo), key_changed=support.truthy(key_changed))


def gpuprov_toolkit_config(content: Any, settings: Mapping[str, Any],
                           path: str | None = None) -> dict:
    config = support.stage("_toolkit_config")
    return support.reported(None, lambda: config.merge(support.text(content), dict(settings),
                                                       **({"path": path} if path else {})),
                            (config.ToolkitConfigError,))


def _major(version: Any) -> int | None:
    """'1.6.20~ds1-1+deb12u3' or 'containerd ... v2.0.4 ...' -> 1 / 2; None when unknown."""
    match = re.search(r"(?:^|[\sv])(\d+)\.\d+", str(version or ""))
    return int(match.group(1)) if match else None


def gpuprov_containerd_import_dirs(main_text: Any,
                                   main_path: str = "/etc/containerd/config.toml") -> list:
    runtime = support.stage("_runtime_config")
    return support.reported(None, lambda: runtime.containerd_import_dirs(
        support.text(main_text), main_path), (runtime.RuntimeConfigError,))


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
    runtime = support.stage("_runtime_config")
    if files is not None and not isinstance(files, Mapping):
        raise AnsibleFilterError(f"gpuprov_containerd_nvidia: files must be a dict, got {files!r}")
    return support.reported(None, lambda: runtime.containerd_nvidia(
        support.text(main_text), {str(k): str(v) for k, v in (files or {}).items()},
        main_path=main_path, drop_in_path=drop_in_path, runtime_name=runtime_name, binary=binary,
        set_default=bool(set_default), containerd_major=_major(containerd_version),
        cdi=bool(cdi)), (runtime.RuntimeConfigError,))


def gpuprov_docker_nvidia(
    content: Any,
    runtime_name: str = "nvidia",
    binary: str = "/usr/bin/nvidia-container-runtime",
    set_default: bool = False,
) -> dict:
    runtime = support.stage("_runtime_config")
    return support.reported(None, lambda: runtime.docker_nvidia(
        support.text(content), runtime_name=runtime_name, binary=binary,
        set_default=bool(set_default)), (runtime.RuntimeConfigError,))


FilterModule = support.filter_module(
    gpuprov_toolkit_plan, gpuprov_toolkit_work, gpuprov_toolkit_repository,
    gpuprov_toolkit_config, gpuprov_containerd_import_dirs, gpuprov_containerd_nvidia,
    gpuprov_docker_nvidia)
