"""The gpuprov_stage_settings lookup: a role's settings read from its variables by the stage
module's SETTING_VARS table (plugins/lookup/gpuprov_stage_settings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleLookupError
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

from gpuprov.stages import nvidia_container_toolkit, nvidia_driver

ROLES = Path(__file__).resolve().parents[2] / "roles"


@pytest.fixture(scope="module")
def lookup(ansible_plugin):
    module = ansible_plugin("lookup/gpuprov_stage_settings.py")
    instance = module.LookupModule(loader=DataLoader(), templar=Templar(loader=DataLoader()))
    return instance


def _variables(**values) -> dict:
    facts = {"distribution": "Debian", "distribution_major_version": "12"}
    return {"inventory_hostname": "gpu-a", "ansible_facts": facts, **values}


def test_the_settings_come_from_the_variables_the_table_names(lookup):
    (settings,) = lookup.run(["nvidia_container_toolkit"], _variables(
        nvidia_container_toolkit_hold="no", nvidia_container_toolkit_runtime="crio"))
    assert settings == {"host": "gpu-a", "os_name": "Debian", "os_version": "12",
                        "hold": "no", "runtime": "crio"}
    # Read as the role's `| bool` read them.
    parsed = nvidia_container_toolkit.Settings.from_vars(settings)
    assert parsed.hold is False and parsed.runtime == "crio"


def test_a_setting_without_a_default_must_be_set(lookup):
    with pytest.raises(AnsibleLookupError, match="needs gpu_preflight_driver_branch"):
        lookup.run(["nvidia_driver"], _variables())


def test_only_a_stage_with_a_table(lookup):
    with pytest.raises(AnsibleLookupError, match="gpu_mig.py has no SETTING_VARS"):
        lookup.run(["gpu_mig"], _variables())
    with pytest.raises(AnsibleLookupError, match="one term"):
        lookup.run([], _variables())


def _defined(role: str) -> str:
    """The text of the files a role's variables are defined in (defaults, vars, set_fact)."""
    return "\n".join(path.read_text() for folder in ("defaults", "vars", "tasks")
                     for path in sorted((ROLES / role / folder).glob("*.yml")))


@pytest.mark.parametrize("stage", [nvidia_driver, nvidia_container_toolkit],
                         ids=lambda s: s.__name__.rsplit(".", 1)[1])
def test_settings_fields_are_the_ones_the_role_passes(stage):
    """Every Settings field is read from a variable (SETTING_VARS), and each variable is one the
    role defines (defaults, vars), one the preflight sets, the host's name or a gathered fact:
    so a setting cannot be added to one side only, and none is read from a misspelt name."""
    role = stage.__name__.rsplit(".", 1)[1]
    assert set(stage.SETTING_VARS) == set(stage.Settings.__dataclass_fields__)
    for variable in stage.SETTING_VARS.values():
        if variable == "inventory_hostname" or variable.startswith("ansible_facts."):
            continue
        owner = "gpu_preflight" if variable.startswith("gpu_preflight_") else role
        assert f"{variable}:" in _defined(owner), variable
