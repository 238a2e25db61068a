"""`gpuprov probe [--json]`, called in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprov import cli
from gpuprov.commands import probe as probe_command

ROOTS = Path(__file__).parent.parent / "fixtures" / "probe" / "roots"


@pytest.fixture(autouse=True)
def _only_probe_command(monkeypatch):
    # cli.py also registers commands other engineers own; this tests only `probe`.
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("probe",))


def test_json_is_the_probe_report(capsys):
    assert cli.main(["probe", "--json", "--root", str(ROOTS / "gpu-node")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema_version"] == 1
    assert [d["device_id"] for d in report["pci"]] == ["10de:15f8", "10de:2330"]
    assert report["host"]["hostname"] == "gpu-node-01"


def test_summary_on_a_gpu_node(capsys):
    assert cli.main(["probe", "--root", str(ROOTS / "gpu-node")]) == 0
    out = capsys.readouterr().out
    assert "gpu-node-01" in out and "Ubuntu 22.04.4 LTS" in out
    assert "module   535.161.08 (open)" in out
    assert "containerd (nvidia runtime yes)" in out
    lines = [line for line in out.splitlines() if line.startswith("0000:")]
    assert [line.split()[:2] for line in lines] == [
        ["0000:3b:00.0", "10de:15f8"],
        ["0000:86:00.0", "10de:2330"],
    ]


def test_cpu_only_node_says_no_gpu_and_exits_0(capsys):
    assert cli.main(["probe", "--root", str(ROOTS / "cpu-only")]) == 0
    out = capsys.readouterr().out
    assert "no NVIDIA GPU on PCI" in out
    assert "NVML     unavailable:" in out


def test_summary_joins_nvml_and_pci_by_bus_id():
    report = {
        "host": {"hostname": "n1"},
        "pci": [
            {
                "address": "0000:3b:00.0",
                "device_id": "10de:15f8",
                "classification": {"name": "Tesla P100-PCIE-16GB", "architecture": "pascal"},
            },
            {"address": "0000:86:00.0", "device_id": "10de:2330", "classification": None},
        ],
        "nvml": {
            "available": True,
            "driver_version": "535.1",
            "cuda_driver_version": "12.2",
            "device_count": 1,
            "gpus": [
                {
                    "index": 0,
                    "error": None,
                    "pci_bus_id": "00000000:3B:00.0",
                    "name": "Tesla P100-PCIE-16GB",
                    "memory": {"total": 17179869184},
                    "temperature": {"current": 40},
                }
            ],
        },
    }
    rows = probe_command.summary(report).splitlines()[-2:]
    assert rows[0].split()[-4:] == ["0", "16.0", "40", "ok"]
    assert rows[1].endswith("not in NVML")


def test_summary_places_a_lost_gpu_at_its_pci_address():
    lost = {"code": 15, "name": "NVML_ERROR_GPU_IS_LOST", "message": "GPU is lost"}
    report = {
        "pci": [{"address": f"0000:{bus}:00.0", "device_id": "10de:15f8"} for bus in ("18", "2a")],
        "nvml": {
            "available": True,
            "gpus": [
                {"index": 0, "error": None, "pci_bus_id": "00000000:18:00.0"},
                {"index": 1, "error": lost},
            ],
        },
    }
    rows = probe_command.summary(report).splitlines()[-2:]
    assert rows[0].endswith("ok")
    assert rows[1].startswith("0000:2a:00.0") and "NVML_ERROR_GPU_IS_LOST (15)" in rows[1]
