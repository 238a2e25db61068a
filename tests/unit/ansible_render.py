"""Render a gpuprov template the way its role does (Ansible's template lookup on localhost) and
return the objects, for the tests that hold manifests.py's Python rendering to it
(test_manifests.py: the device plugin; test_manifests_dra.py: the DRA driver)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def objects_by_ansible(tmp_path: Path, template: Path, defaults: Path, values: Path) -> list:
    ansible = Path(sys.executable).parent / "ansible"
    if not ansible.exists():
        pytest.skip("ansible is not installed next to this Python")
    out = tmp_path / "rendered.json"
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"}
    proc = subprocess.run(
        [str(ansible), "localhost", "-c", "local", "-m", "ansible.builtin.copy",
         "-e", f"@{defaults}", "-e", f"@{values}",
         "-e", f"ansible_python_interpreter={sys.executable}",
         "-a", f"dest={out} content={{{{ lookup('ansible.builtin.template', '{template}')"
               " | ansible.builtin.from_yaml_all | select | list | to_json }}"],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())
