"""kubernetes.core (k8s, k8s_info, k8s_log, k8s_drain) against the emulated API, unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov.lab.kube.app import write_kubeconfig
from gpuprov.lab.kube.testing import running_emulator

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "kube"
PLAYBOOK_BIN = Path(sys.executable).parent / "ansible-playbook"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if not PLAYBOOK_BIN.exists():
        pytest.skip("ansible-playbook is not installed next to this Python")
    tmp = tmp_path_factory.mktemp("ansible")
    with running_emulator() as emu:
        kubeconfig = write_kubeconfig(tmp / "kubeconfig", emu.url)
        out = tmp / "report.json"
        env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "False",
               "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"}
        proc = subprocess.run(
            [str(PLAYBOOK_BIN), "-i", "localhost,", str(FIXTURES / "playbook.yml"),
             "-e", f"kubeconfig={kubeconfig}", "-e", f"report={out}"],
            capture_output=True, text=True, env=env, timeout=300, check=False)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        yield json.loads(out.read_text())


def test_k8s_creates_then_is_idempotent(report):
    assert report["cm_first"] is True
    assert report["cm_second"] is False


def test_k8s_apply_patches(report):
    assert report["cm_applied"] is True
    assert report["cm_data"] == {"replicas": "3"}


def test_k8s_info_and_k8s_log_see_the_pod_output(report):
    assert report["log"].strip() == "hello-from-ansible"


def test_malformed_manifest_is_refused_with_422(report):
    status = json.loads(report["broken_msg"].split(":", 1)[1])
    assert status["code"] == 422 and status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == "datta"


def test_k8s_drain_cordons(report):
    assert report["unschedulable"] is True
    assert "marked unschedulable" in report["drained"]
