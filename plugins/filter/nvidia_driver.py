"""Ansible filters: the nvidia_driver role's decisions (gpuprov/stages/nvidia_driver.py).

    settings | gpuprov_driver_plan
        -> the plan before the node is read: flavour, driver_packages, extra_packages,
           install_names, held_packages, dnf_module_stream, written_files, problem
           (settings: gpuprov.stages.nvidia_driver.Settings' fields, as roles/nvidia_driver/tasks/
           check.yml passes them)
    state | gpuprov_driver_work(plan, host=..., hold=..., headers=[...],
                                forbidden=[...], check_mode=..., apt_sources=text|None,
                                package_manager=...)
        -> what is left to do, from the node's read (the gpuprov_node_state module):
           installed_version, apt_sources_current, apt_work, install_names (what apt is
           asked for), removed_packages, stale_files, unselected, apt_converged,
           installed_problem
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

INSTALL_HINT = (
    "gpuprov is not importable by the Python that runs ansible ({error}): "
    "install gpuprov in the Python that runs ansible: pip install -e ."
)


def _driver_plan() -> Any:
    # Imported on first use: Ansible loads every filter plugin for every template.
    try:
        from gpuprov.stages import nvidia_driver
    except ImportError as exc:
        raise AnsibleFilterError(INSTALL_HINT.format(error=exc)) from None
    return nvidia_driver


def driver_plan(settings: Any) -> dict:
    if not isinstance(settings, Mapping):
        raise AnsibleFilterError(
            f"gpuprov_driver_plan expects the role's settings, got {settings!r}")
    module = _driver_plan()
    try:
        return module.plan(module.Settings.from_vars(settings))
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"gpuprov_driver_plan: {exc}") from None


def driver_work(state: Any, plan: Any, **options: Any) -> dict:
    if not isinstance(state, Mapping) or not isinstance(plan, Mapping):
        raise AnsibleFilterError("gpuprov_driver_work expects the node's read and the plan, got "
                                 f"{state!r} and {plan!r}")
    options["headers"] = tuple(options.get("headers") or ())
    options["forbidden"] = tuple(options.get("forbidden") or ())
    try:
        return _driver_plan().work(plan, state, **options)
    except TypeError as exc:
        raise AnsibleFilterError(f"gpuprov_driver_work: {exc}") from None


class FilterModule:
    def filters(self) -> dict:
        return {"gpuprov_driver_plan": driver_plan, "gpuprov_driver_work": driver_work}
