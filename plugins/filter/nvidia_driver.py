"""Filters of the nvidia_driver role (gpuprov/stages/nvidia_driver.py decides).

    lookup('gpuprov_stage_settings', 'nvidia_driver') | gpuprov_driver_plan
        -> the plan before the node is read: flavour, driver_packages, extra_packages,
           install_names, held_packages, dnf_module_stream, written_files, problem
    state | gpuprov_driver_work(plan, host=..., hold=..., headers=[...],
                                forbidden=[...], check_mode=..., apt_sources=text|None,
                                package_manager=...)
        -> what is left to do, from the node's read (the gpuprov_node_state module):
           installed_version, apt_sources_current, repo_pending, apt_work, install_names (what
           apt is asked for), removed_packages, stale_files, unselected, apt_converged,
           installed_problem
    files | gpuprov_file_current(path, content, mode="0644")
        -> whether the node's file (in the read's "files") has this content (sha1), mode and
           root ownership already: a role then skips the template/copy task, which costs two
           module runs even when it changes nothing (nvidia_container_toolkit's too)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuprov.cluster.plugins.plugin_utils import gpuprov_support as support


def gpuprov_driver_plan(settings: Any) -> dict:
    return support.stage_plan("nvidia_driver", "gpuprov_driver_plan", settings)


def gpuprov_driver_work(state: Any, plan: Any, **options: Any) -> dict:
    if not isinstance(state, Mapping) or not isinstance(plan, Mapping):
        raise AnsibleFilterError("gpuprov_driver_work expects the node's read and the plan, got "
                                 f"{state!r} and {plan!r}")
    options["headers"] = tuple(options.get("headers") or ())
    options["forbidden"] = tuple(options.get("forbidden") or ())
    driver = support.stage("nvidia_driver")
    return support.reported("gpuprov_driver_work", lambda: driver.work(plan, state, **options),
                            (TypeError,))


def gpuprov_file_current(files: Any, path: Any, content: Any, mode: str = "0644") -> bool:
    listed = support.items(files, "gpuprov_file_current", "files")
    return support.stage("_node_read").file_current(listed, path, content, mode)


FilterModule = support.filter_module(gpuprov_driver_plan, gpuprov_driver_work, gpuprov_file_current)
