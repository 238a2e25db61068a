"""`ansible-playbook site.yml` on the lab, over real SSH: what the admins run."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

EXPECTED_BRANCH = {"gpu-kepler": 470, "gpu-pascal": 535, "gpu-hopper": 535, "cpu-only": None}


@pytest.fixture(scope="module")
def run_site(lab, repo_root, tool):
    def _run(*extra: str) -> tuple[int, dict]:
        env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
                   ANSIBLE_CONFIG=str(repo_root / "ansible.cfg"))
        proc = subprocess.run(
            [tool("ansible-playbook"), "-i", str(lab.inventory_path), "site.yml", *extra],
            cwd=repo_root, env=env, capture_output=True, text=True, timeout=600,
        )
        return proc.returncode, json.loads(proc.stdout)

    return _run


def _host_results(doc: dict, task_name: str) -> dict[str, dict]:
    for play in doc["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] == task_name:
                return task["hosts"]
    raise AssertionError(f"task {task_name!r} did not run")


def test_preflight_reports_each_node_and_its_branch(run_site):
    rc, doc = run_site()
    assert rc == 0
    stats = doc["stats"]
    assert set(stats) == set(EXPECTED_BRANCH)
    for host, s in stats.items():
        assert (s["failures"], s["unreachable"], s["changed"]) == (0, 0, 0), host
    reports = _host_results(doc, "gpu_preflight : Report the node's GPUs and driver branch")
    for host, branch in EXPECTED_BRANCH.items():
        msg = reports[host]["msg"]
        if branch is None:
            assert msg == f"{host}: no NVIDIA GPU on PCI -> no driver; the GPU roles skip this node"
        else:
            assert msg.startswith(f"{host}: ") and f"-> driver branch {branch} " in msg
    assert "4x Tesla P100-PCIE-16GB (pascal, cc 6.0)" in reports["gpu-pascal"]["msg"]
    assert "8x NVIDIA H100 80GB HBM3 (hopper, cc 9.0)" in reports["gpu-hopper"]["msg"]
    assert "2x Tesla K80 (kepler, cc 3.7)" in reports["gpu-kepler"]["msg"]


def test_check_mode_with_diff_changes_nothing(run_site):
    rc, doc = run_site("--check", "--diff")
    assert rc == 0
    assert all(s["changed"] == 0 and s["failures"] == 0 for s in doc["stats"].values())
