"""gpu_preflight's decisions about the probe run and what it found (gpuprov/stages/
gpu_preflight.py), through plugins/filter/gpu_preflight.py: gpu_node_labels and gpu_mig probe
again with the same filters. The labels role's node and taint plans are in
test_stage_gpu_node_labels.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

PROBES = Path(__file__).resolve().parents[1] / "fixtures" / "verify" / "probe"
TOO_OLD = "gpuprov probe needs python3 >= 3.9, this node has 3.6.8"


@pytest.fixture(scope="module")
def gpuprov(ansible_plugin):
    return ansible_plugin("filter/gpu_preflight.py")


@pytest.mark.parametrize("interpreter, discovered, expected", [
    ("/usr/bin/python3.11", "/usr/bin/python3", "/usr/bin/python3.11"),
    ("auto_silent", "/usr/bin/python3", "/usr/bin/python3"),
    (None, None, "python3"),
])
def test_the_probe_runs_with_ansibles_python(gpuprov, interpreter, discovered, expected):
    assert gpuprov.gpuprov_node_python(interpreter, discovered) == expected


def test_a_probe_run_gives_its_report_or_one_line_why_not(gpuprov):
    report = (PROBES / "gpu-pascal.json").read_text()
    ok = gpuprov.gpuprov_probe_outcome({"rc": 0, "stdout": report, "stderr": ""})
    assert ok == {"ok": True, "report": json.loads(report), "error": None}
    old = gpuprov.gpuprov_probe_outcome({"rc": 2, "stdout": "", "stderr": f"\n{TOO_OLD}\n"})
    assert old == {"ok": False, "report": None, "error": TOO_OLD}
    missing = gpuprov.gpuprov_probe_outcome({"rc": 127, "msg": "[Errno 2] No such file"})
    assert missing["error"] == "[Errno 2] No such file"
    assert gpuprov.gpuprov_probe_outcome({"rc": 0, "stdout": "{oops"})["error"].startswith(
        "the report is not JSON")


def test_without_a_new_probe_the_earlier_report_is_used(gpuprov):
    earlier = json.loads((PROBES / "gpu-hopper.json").read_text())
    skipped = {"changed": False, "skipped": True}
    assert gpuprov.gpuprov_probe_outcome(skipped, False, earlier)["report"] == earlier
    assert not gpuprov.gpuprov_probe_outcome(skipped, False, None)["ok"]
    with pytest.raises(AnsibleFilterError, match="expects a command result"):
        gpuprov.gpuprov_probe_outcome("stdout")


def test_the_gpu_summary_groups_by_pci_id(gpuprov):
    gpus = [{"pci_id": "10de:2330", "name": "NVIDIA H100 80GB HBM3", "architecture": "hopper",
             "compute_capability": "9.0"},
            {"pci_id": "10de:102d", "name": "Tesla K80", "architecture": "kepler",
             "compute_capability": "3.7"},
            {"pci_id": "10de:102d", "name": "Tesla K80", "architecture": "kepler",
             "compute_capability": "3.7"},
            {"pci_id": "10de:2336", "name": None, "architecture": None,
             "compute_capability": None}]
    assert gpuprov.gpuprov_gpu_summary(gpus) == (
        "2x Tesla K80 (kepler, cc 3.7), 1x NVIDIA H100 80GB HBM3 (hopper, cc 9.0), "
        "1x unknown GPU 10de:2336 (unknown architecture, cc ?)")


def test_the_choice_text_has_the_reason_and_each_note_once(gpuprov):
    choice = {"reason": "newest branch supporting all GPUs", "notes": ["a", "b", "a"]}
    assert gpuprov.gpuprov_choice_text(choice) == "newest branch supporting all GPUs; a; b"
    assert gpuprov.gpuprov_choice_text({"reason": "r", "notes": []}) == "r"


def test_os_problems_name_the_os_and_what_to_do(gpuprov):
    supported = ["Debian 12", "Ubuntu 24"]
    problem = gpuprov.gpuprov_os_problem(supported, "gpu-a", "Debian", "11", "debian")
    assert problem.startswith("Debian 11 is not a supported OS for GPU nodes (supported: "
                              "Debian 12, Ubuntu 24). Install a supported OS on gpu-a")
    problem = gpuprov.gpuprov_os_problem(supported, "gpu-a", "Ubuntu", "24", None)
    assert "add roles/gpu_preflight/vars/Ubuntu_24.yml" in problem
    assert gpuprov.gpuprov_os_problem(supported, "gpu-a", "Debian", "12", "debian") is None
