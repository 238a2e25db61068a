"""Ansible lookup: a role's settings as its stage module names them, read from the role's
variables (the table is the stage module's SETTING_VARS, next to its Settings).

    lookup('gpuprov_stage_settings', 'nvidia_driver') | gpuprov_driver_plan

Adding a setting is then one line in gpuprov/stages/<role>.py, not one in Python and one in a
Jinja literal in the role's tasks.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.gpuprov.cluster.plugins.plugin_utils.gpuprov_support import INSTALL_HINT

DOCUMENTATION = r"""
name: gpuprov_stage_settings
author: gpuprov maintainers
short_description: a role's settings, as its gpuprov stage module names them
description:
  - Returns one mapping of the stage's Settings fields to their values, read from the
    variables the stage module's C(SETTING_VARS) names (C(ansible_facts.KEY) is a gathered
    fact), templated as the role's tasks would see them.
  - A variable that is not set leaves its field out (the field's default applies); a field
    without a default whose variable is not set fails, naming the variable.
  - Needs gpuprov importable by the Python that runs Ansible.
options:
  _terms:
    description: The role, e.g. C(nvidia_driver) (C(gpuprov/stages/nvidia_driver.py)).
    required: true
"""

EXAMPLES = r"""
- name: Plan the driver packages for the node's GPUs and OS
  ansible.builtin.set_fact:
    __nvidia_driver_plan: >-
      {{ lookup('gpuprov_stage_settings', 'nvidia_driver') | gpuprov_driver_plan }}
"""

RETURN = r"""
_raw:
  description: The settings, one mapping.
  type: list
  elements: dict
"""

_UNSET = object()


def _read(variables: dict, source: str) -> Any:
    """The variable, or the gathered fact for "ansible_facts.<key>"; _UNSET where neither is."""
    if source.startswith("ansible_facts."):
        return (variables.get("ansible_facts") or {}).get(source.split(".", 1)[1], _UNSET)
    return variables.get(source, _UNSET)


class LookupModule(LookupBase):
    def run(self, terms: list, variables: Any = None, **kwargs: Any) -> list[dict]:
        if kwargs or len(terms) != 1:
            raise AnsibleLookupError("gpuprov_stage_settings takes one term, the role's name")
        role = str(terms[0])
        try:
            module = importlib.import_module(f"gpuprov.stages.{role}")
        except ImportError as exc:
            raise AnsibleLookupError(
                "gpuprov_stage_settings: " + INSTALL_HINT.format(error=exc)) from None
        table = getattr(module, "SETTING_VARS", None)
        if table is None:
            raise AnsibleLookupError(f"gpuprov_stage_settings: gpuprov/stages/{role}.py has no "
                                     "SETTING_VARS")
        required = {f.name for f in dataclasses.fields(module.Settings)
                    if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING}
        variables = variables or {}
        settings = {}
        for field, source in table.items():
            value = _read(variables, source)
            if value is not _UNSET:
                settings[field] = self._templar.template(value)
            elif field in required:
                raise AnsibleLookupError(f"gpuprov_stage_settings: the {role} role needs {source}, "
                                         "which is not set")
        return [settings]
