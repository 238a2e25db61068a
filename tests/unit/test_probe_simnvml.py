"""The shipped probe against the lab's simulated NVML: pynvml's normal loading path,
the payload in a bare python3, and the node profile as the expected answer."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuprov import payload
from gpuprov.lab import simhw
from gpuprov.lab.profiles import NODE_PROFILES, expected_gpus

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
pytestmark = pytest.mark.skipif(
    SYSTEM_PYTHON is None or shutil.which("gcc") is None, reason="needs python3 and gcc"
)


@pytest.fixture(scope="module")
def library_dir(tmp_path_factory) -> Path:
    return simhw.build_nvml_library(tmp_path_factory.mktemp("simnvml")).parent


def _node(tmp_path: Path, name: str) -> Path:
    node_dir = tmp_path / name
    simhw.write_node_state(node_dir, name, NODE_PROFILES[name])
    root = tmp_path / f"{name}-root"
    (root / "sys/bus/pci").mkdir(parents=True)
    (root / "sys/bus/pci/devices").symlink_to(node_dir / simhw.PCI_DIR)
    return node_dir


def probe(library_dir: Path, tmp_path: Path, name: str) -> dict:
    node_dir = tmp_path / name
    env = {
        "PATH": "/usr/bin:/bin",
        "LD_LIBRARY_PATH": str(library_dir),
        "GPUPROV_SIM_DIR": str(node_dir / simhw.SIM_DIR),
    }
    proc = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-", "--root", str(tmp_path / f"{name}-root")],
        input=payload.probe_script(),
        env=env,
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)


@pytest.mark.parametrize("name", ["gpu-kepler", "gpu-pascal", "gpu-hopper"])
def test_probe_reports_the_profile(library_dir, tmp_path, name):
    _node(tmp_path, name)
    report = probe(library_dir, tmp_path, name)
    nvml = report["nvml"]
    assert nvml["available"] is True, nvml["error"]
    expected = expected_gpus(name, NODE_PROFILES[name])
    assert nvml["device_count"] == len(expected) == len(report["pci"])
    assert nvml["driver_version"] == NODE_PROFILES[name].driver_version
    got = [
        (
            g["name"],
            g["uuid"],
            g["memory"]["total"],
            g["compute_capability"],
            g["architecture"],
            g["pci_bus_id"],
        )
        for g in nvml["gpus"]
    ]
    assert got == [
        (e.name, e.uuid, e.memory_total, e.compute_capability, e.architecture, e.pci_bus_id)
        for e in expected
    ]
    assert [d["classification"]["name"] for d in report["pci"]] == [e.name for e in expected]
    assert all(g["error"] is None for g in nvml["gpus"])


def test_cpu_only_node_reports_no_gpu(library_dir, tmp_path):
    _node(tmp_path, "cpu-only")
    report = probe(library_dir, tmp_path, "cpu-only")
    assert report["pci"] == [] and report["summary"]["gpu_node"] is False
    assert report["probe"]["errors"] == {}


def _holds(check, nvml: dict) -> bool:
    try:
        return bool(check(nvml))
    except (KeyError, TypeError, IndexError):  # the fields a check reads are absent
        return False


@pytest.mark.parametrize(
    ("fault", "check"),
    [
        ("version-mismatch", lambda n: n["error"]["name"] == "NVML_ERROR_LIB_RM_VERSION_MISMATCH"),
        ("nvml-init-fail", lambda n: n["error"]["name"] == "NVML_ERROR_DRIVER_NOT_LOADED"),
        ("gpu-lost", lambda n: n["gpus"][0]["error"]["name"] == "NVML_ERROR_GPU_IS_LOST"),
        ("ecc-uncorrectable", lambda n: n["gpus"][0]["ecc"]["volatile"]["uncorrected"] > 0),
        ("row-remap-pending", lambda n: n["gpus"][0]["remapped_rows"]["pending"] is True),
        (
            "hot-gpu",
            lambda n: (
                "hw_thermal_slowdown" in n["gpus"][0]["clock_event_reasons"]["names"]
                and n["gpus"][0]["temperature"]["current"] > n["gpus"][0]["temperature"]["slowdown"]
            ),
        ),
    ],
)
def test_faults_show_in_the_report(library_dir, tmp_path, fault, check):
    node_dir = _node(tmp_path, "gpu-hopper")
    healthy = probe(library_dir, tmp_path, "gpu-hopper")["nvml"]
    simhw.set_fault(node_dir, fault)
    faulty = probe(library_dir, tmp_path, "gpu-hopper")["nvml"]
    assert _holds(check, faulty)
    assert not _holds(check, healthy)
    if faulty["available"]:  # nothing else changes: the other GPUs are as before
        assert faulty["gpus"][1:] == healthy["gpus"][1:]
