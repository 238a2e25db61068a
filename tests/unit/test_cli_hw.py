"""`gpuprov hw classify` called in-process."""

from __future__ import annotations

import json

import pytest

from gpuprov import cli


@pytest.fixture(autouse=True)
def only_hw_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # probe and lab are written in parallel; this test needs only hw.
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("hw",))


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["hw", "classify", "--pci-id", "10de:15f8", "--pci-id", "0x2330"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["PCI", "ID", "NAME", "ARCHITECTURE", "CC", "BRANCHES",
                              "RECOMMENDED", "OPEN", "MODULES", "STATUS"]
    assert out[1].split() == ["10de:15f8", "Tesla", "P100-PCIE-16GB", "pascal", "6.0",
                              "390-580", "580", "no", "supported"]
    assert out[2].split()[-4:] == ["535-current", "580", "yes", "supported"]


def test_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["hw", "classify", "--json", "--pci-id", "102D"]) == 0
    assert json.loads(capsys.readouterr().out) == [{
        "pci_id": "10de:102d", "name": "Tesla K80", "architecture": "kepler",
        "compute_capability": "3.7", "min_branch": 390, "max_branch": 470,
        "recommended_branch": 470, "open_kernel_modules": False, "status": "supported",
        "series": "k80",
    }]


@pytest.mark.parametrize("pci_id", ["10de:ffff", "10de:11bf"], ids=["unknown", "legacy"])
def test_unknown_or_legacy_exits_1_after_printing_everything(
    pci_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["hw", "classify", "--json", "--pci-id", pci_id, "--pci-id", "15f8"]) == 1
    captured = capsys.readouterr()
    assert [r["status"] for r in json.loads(captured.out)][1] == "supported"
    assert captured.err.startswith("gpuprov: ")
    assert len(captured.err.splitlines()) == 1


@pytest.mark.parametrize(
    ("pci_id", "message"),
    [("xyz", "'xyz' is not a PCI ID"), ("10de:", "'10de:' is not a PCI ID"),
     ("8086:1234", "'8086:1234' is not an NVIDIA GPU")],
)
def test_malformed_or_foreign_id_exits_2(
    pci_id: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["hw", "classify", "--pci-id", "10de:15f8", "--pci-id", pci_id]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"gpuprov: error: {message}")
    assert len(captured.err.splitlines()) == 1


def test_missing_pci_id_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["hw", "classify"]) == 2
    assert "--pci-id" in capsys.readouterr().err
