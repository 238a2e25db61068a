"""What gpuprov's filter plugins share: the gpuprov package imported on first use (with what to
do where it is missing), the checks of the values a role hands a filter, and the FilterModule
class Ansible looks for.

The filters live in plugins/filter/<role>.py, one file per role, and import this module as
ansible_collections.gpuprov.cluster.plugins.plugin_utils.gpuprov_support: the repository is the
Ansible collection gpuprov.cluster (galaxy.yml), which a clone finds through
collections/ansible_collections/gpuprov/cluster, a link to the repository root (ansible.cfg's
collections_path). Plain plugins cannot import each other (ansible/ansible#28770); plugins of
a collection import its plugin_utils. Controller side only, like every filter.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

INSTALL_HINT = (
    "gpuprov is not importable by the Python that runs ansible ({error}): "
    "install gpuprov in the Python that runs ansible: pip install -e ."
)


def gpuprov(name: str) -> ModuleType:
    """gpuprov.<name>, imported when a filter is called, not when Ansible loads the filter
    file: Ansible loads every filter file for every template that uses a filter of a file, and
    a playbook that never calls one must neither pay for the import nor fail on a missing
    gpuprov (or one of its dependencies)."""
    try:
        return importlib.import_module(f"gpuprov.{name}")
    except ImportError as exc:
        raise AnsibleFilterError(INSTALL_HINT.format(error=exc)) from None


def stage(role: str) -> ModuleType:
    """The role's decisions: gpuprov/stages/<role>.py."""
    return gpuprov(f"stages.{role}")


def reported(filter_name: str | None, call: Callable[[], Any],
             errors: tuple[type[BaseException], ...] = (ValueError, TypeError)) -> Any:
    """call(), with the errors gpuprov raises for bad settings or input as a one-line message
    instead of a traceback: the filter's name and gpuprov's message, or gpuprov's message alone
    where filter_name is None (messages that already name the setting to change). The cause
    stays in __cause__, shown with -vvv."""
    try:
        return call()
    except errors as exc:
        raise AnsibleFilterError(f"{filter_name}: {exc}" if filter_name else str(exc)) from exc


def stage_plan(role: str, filter_name: str, settings: Any) -> dict:
    """The role's plan before a node is read: its stage's plan() of the settings the
    gpuprov_stage_settings lookup read (the stage's Settings.from_vars checks them)."""
    settings = mapping(settings, filter_name, "the role's settings")
    module = stage(role)
    return reported(filter_name, lambda: module.plan(module.Settings.from_vars(settings)))


def items(value: Any, filter_name: str, what: str) -> list:
    """A list-like argument (not a string or a mapping), as a list."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise AnsibleFilterError(f"{filter_name} expects a list of {what}, got {value!r}")
    return list(value)


def objects(value: Any, filter_name: str, what: str) -> list[Mapping]:
    """A list of API objects or records; items that are not mappings are left out."""
    return [item for item in items(value, filter_name, what) if isinstance(item, Mapping)]


def mapping(value: Any, filter_name: str, what: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise AnsibleFilterError(f"{filter_name} expects {what}, got {value!r}")
    return value


def flag(value: Any, setting: str) -> bool:
    """A setting that must be a boolean (true, "yes", 0 ...), strictly: anything else fails
    naming the setting."""
    try:
        return boolean(value, strict=True)
    except TypeError:
        raise AnsibleFilterError(f"{setting} must be true or false, got {value!r}") from None


def truthy(value: Any) -> bool:
    """Ansible's `| bool`: true, "yes", "on", "1" ... are true, anything else false."""
    return boolean(value, strict=False)


def text(value: Any) -> str | None:
    return None if value is None else str(value)


def filter_module(*filters: Callable[..., Any]) -> type:
    """The FilterModule class Ansible looks for in a filter file: each function is the filter
    of its own name, so that a filter's name in a role and in Python is the same."""
    table = {function.__name__: function for function in filters}

    class FilterModule:
        def filters(self) -> dict[str, Callable[..., Any]]:
            return dict(table)

    return FilterModule
