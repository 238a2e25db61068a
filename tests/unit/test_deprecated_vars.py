"""Renamed settings: the gpuprov_deprecated_vars action (plugins/action/) and the gpu_node_upgrade
role's fallbacks to the names its settings had before it (upgrade_*).

The action runs through the real `ansible-playbook` with the default stdout callback, on
local hosts in several batches, so that what an admin sees is what is checked: each deprecated
name once per run, whatever the number of hosts and batches.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ansible.template
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "gpu_node_upgrade"
PLAYBOOK_BIN = Path(sys.executable).parent / "ansible-playbook"
# ansible-core 2.19 renders only strings marked as trusted templates (a playbook's are).
_trusted = getattr(ansible.template, "trust_as_template", lambda value: value)

RENAMED = {"old_timeout": "new_timeout", "old_force": "new_force", "old_unused": "new_unused"}
HOSTS = {  # what each host's inventory sets under the old names
    "node-1": {"old_timeout": 20},
    "node-2": {"old_timeout": 20, "old_force": True},
    "node-3": {},
}


def _run(tmp_path: Path, renamed: object = RENAMED, **env: str) -> subprocess.CompletedProcess:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": HOSTS, "vars": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Warn about renamed settings", "hosts": "all", "gather_facts": False,
        "serial": 1,  # three batches: the warnings must not come back with each
        "tasks": [{"name": "Warn", "gpuprov.cluster.gpuprov_deprecated_vars": {"renamed": renamed,
                                                               "until": "9.9.9"}}]}]))
    return subprocess.run(
        [str(PLAYBOOK_BIN), "-i", str(inventory), str(playbook)], capture_output=True,
        text=True, timeout=120, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_FORCE_COLOR": "0", **env})


def _shown(proc: subprocess.CompletedProcess, old: str) -> int:
    text = " ".join((proc.stdout + proc.stderr).split())
    return text.count(f"[DEPRECATION WARNING]: The setting {old} is deprecated: rename it "
                      f"{RENAMED[old]}")


@pytest.fixture(scope="module")
def warned(tmp_path_factory):
    if not PLAYBOOK_BIN.exists():
        pytest.skip("ansible-playbook is not installed next to this Python")
    return _run(tmp_path_factory.mktemp("deprecated"))


def test_each_deprecated_name_that_is_set_is_shown_once_per_run(warned):
    assert warned.returncode == 0, warned.stdout[-2000:] + warned.stderr[-2000:]
    # Set on two hosts and one host: each shown once, although three batches ran the task.
    assert _shown(warned, "old_timeout") == 1, warned.stderr
    assert _shown(warned, "old_force") == 1, warned.stderr
    assert _shown(warned, "old_unused") == 0
    assert "read until gpuprov 9.9.9" in " ".join(warned.stderr.split())


def test_deprecation_warnings_off_silences_them(tmp_path):
    if not PLAYBOOK_BIN.exists():
        pytest.skip("ansible-playbook is not installed next to this Python")
    proc = _run(tmp_path, ANSIBLE_DEPRECATION_WARNINGS="false")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _shown(proc, "old_timeout") == 0 and _shown(proc, "old_force") == 0


def test_the_action_refuses_arguments_it_cannot_use(tmp_path):
    if not PLAYBOOK_BIN.exists():
        pytest.skip("ansible-playbook is not installed next to this Python")
    proc = _run(tmp_path, renamed=["old_timeout"])
    assert proc.returncode == 2
    assert "renamed" in proc.stdout + proc.stderr


# -- the role's fallbacks ---------------------------------------------------------------


def _templar(variables: dict):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    return Templar(loader=DataLoader(), variables=variables)


def _render(expression: str, variables: dict) -> object:
    return _templar(variables).template(_trusted(expression))


def _role_yaml(path: str) -> dict:
    return yaml.safe_load((ROLE / path).read_text())


def _renamed() -> dict[str, str]:
    return _role_yaml("vars/main.yml")["__gpu_node_upgrade_renamed"]


def test_every_role_setting_falls_back_to_its_old_name():
    defaults = _role_yaml("defaults/main.yml")
    options = _role_yaml("meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    role_settings = {old: new for old, new in _renamed().items() if new in options}
    assert sorted(role_settings.values()) == sorted(
        name for name in defaults if name.startswith("gpu_node_upgrade_drain_"))
    for old, new in role_settings.items():
        # Unset: the documented default; set: the old name's value, whatever it is.
        assert _render(defaults[new], {}) == options[new]["default"], new
        for value in ("17", True, "yes"):
            assert _render(defaults[new], {old: value}) == value, (new, value)


def test_the_play_reads_the_old_serial_and_the_new_one_wins():
    renamed = {new: old for old, new in _renamed().items()}
    (play,) = yaml.safe_load((ROOT / "playbooks" / "upgrade-driver.yml").read_text())
    serial = play["serial"]
    old = renamed["gpu_node_upgrade_serial"]
    assert str(_render(serial, {})) == "1"
    assert _render(serial, {old: "25%"}) == "25%"
    assert str(_render(serial, {old: "25%", "gpu_node_upgrade_serial": 3})) == "3"
