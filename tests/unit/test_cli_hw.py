"""`gpuprov hw classify` called in-process."""

from __future__ import annotations

import json

import pytest

from gpuprov import cli


@pytest.fixture(autouse=True)
def only_hw_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # probe and lab are written in parallel; this test needs only hw.
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("hw",))


# A pci.ids excerpt in the file's own format (the real file is tested in test_hardware).
PCI_IDS = "10de  NVIDIA Corporation\n\t2336  GH100 [H100]\n10df  Emulex Corporation\n"


@pytest.fixture(autouse=True)
def system_pci_ids(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """The machine's pci.ids, as hw looks for it: two paths, none there unless a test writes
    the second (whatever the machine running the tests has)."""
    from gpuprov.commands import hw

    paths = (tmp_path / "misc" / "pci.ids", tmp_path / "hwdata" / "pci.ids")
    monkeypatch.setattr(hw, "SYSTEM_PCI_IDS", tuple(map(str, paths)))
    return paths


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
        "series": "k80", "source": "table", "chip_name": None, "pci_ids_file": None,
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


# -- gpuprov hw choose: gpu_preflight's decision, from the command line ------------------------

def _choose(capsys, *argv: str) -> tuple[int, dict | str, str]:
    rc = cli.main(["hw", "choose", *argv])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if "--json" in argv and out else out), err


@pytest.mark.parametrize(("argv", "branch", "open_modules"), [
    # Hopper on Debian 13: Debian's archive (550), NVIDIA's repository (the newest supported
    # branch: R620 LTSB, to 2029-09).
    (["--os", "debian-13", "--pci-id", "10de:2330"], 550, True),
    (["--os", "debian-13", "--source", "nvidia", "--pci-id", "10de:2330"], 620, True),
    (["--os", "debian-13", "--source", "nvidia", "--pci-id", "10de:2330", "--pin", "580"], 580,
     True),
    # Kepler + Pascal in one node: 470, the last branch for Kepler, without open modules.
    (["--os", "debian-12", "--pci-id", "10de:102d", "--pci-id", "10de:15f8"], 470, False),
])
def test_choose_prints_the_preflights_branch(capsys, argv, branch, open_modules):
    from gpuprov.nvidia import driver_branches

    rc, doc, _ = _choose(capsys, *argv, "--json")
    assert rc == 0
    assert set(doc) == {"ok", "branch", "open_kernel_modules", "packages", "reason", "notes",
                        "minimum_version", "security", "pci_ids_file"}
    assert (doc["ok"], doc["branch"], doc["open_kernel_modules"]) == (True, branch, open_modules)
    os_id, version = argv[1].rsplit("-", 1)
    source = argv[argv.index("--source") + 1] if "--source" in argv else None
    pin = argv[argv.index("--pin") + 1] if "--pin" in argv else None
    ids = [argv[i + 1] for i, a in enumerate(argv) if a == "--pci-id"]
    same = driver_branches.choose_branch(ids, os_id, version, pinned_branch=pin, source=source)
    assert doc["branch"] == same.branch and doc["reason"] == same.reason  # one decision


def test_choose_exits_1_when_no_branch_drives_the_gpus(capsys):
    # Kepler (470 at most) and Hopper (525 at least) cannot share one driver.
    rc, doc, err = _choose(capsys, "--os", "debian-12", "--pci-id", "10de:102d",
                           "--pci-id", "10de:2330", "--json")
    assert rc == 1 and doc["ok"] is False and doc["branch"] is None
    assert doc["reason"] and err.startswith("gpuprov: ") and err.count("\n") == 1


@pytest.mark.parametrize(("argv", "words"), [
    (["--os", "debian12", "--pci-id", "10de:2330"], "is not ID-VERSION"),
    (["--os", "debian-13", "--pci-id", "10de:2330", "--pin", "5x5"], "is not a number"),
    (["--os", "debian-13", "--pci-id", "zz"], "is not a PCI ID"),
    (["--os", "debian-13", "--pci-id", "10de:2330", "--source", "ppa"], "invalid choice"),
])
def test_choose_refuses_bad_input_with_exit_2(capsys, argv, words):
    rc, out, err = _choose(capsys, *argv)
    assert rc == 2 and words in err and "Traceback" not in err


def test_choose_notes_a_branch_past_nvidias_end_of_life(capsys):
    # Pascal on Debian 12's archive: 535, whose end of life was June 2026.
    rc, doc, _ = _choose(capsys, "--os", "debian-12", "--pci-id", "10de:15f8",
                         "--allow-vulnerable", "--json")
    assert rc == 0 and doc["branch"] == 535
    assert any("R535 (long term support branch) reached NVIDIA's end of life 2026-06" in note
               and "R580 (LTSB, to 2028-06)" in note for note in doc["notes"])


def test_choose_classifies_a_gpu_the_table_lacks_from_a_pci_ids_file(capsys, tmp_path):
    ids = tmp_path / "pci.ids"
    ids.write_text(PCI_IDS)
    rc, doc, err = _choose(capsys, "--os", "debian-13", "--source", "nvidia", "--pci-id",
                           "10de:2336", "--pci-ids", str(ids), "--json")
    assert rc == 0 and doc["ok"] is True and doc["open_kernel_modules"] is True
    assert any("hopper by its chip in pci.ids" in note for note in doc["notes"])
    rc, _, err = _choose(capsys, "--os", "debian-13", "--pci-id", "10de:2336", "--pci-ids",
                         str(tmp_path / "missing"))
    assert rc == 2 and "--pci-ids" in err and err.count("\n") == 1
    assert cli.main(["hw", "classify", "--pci-id", "10de:2336", "--pci-ids", str(ids)]) == 0
    assert "warning: 10de:2336 (GH100 [H100])" in capsys.readouterr().err


def test_classify_reads_the_machines_pci_ids_by_default(capsys, system_pci_ids):
    system = system_pci_ids[1]  # /usr/share/hwdata/pci.ids (RHEL's place)
    system.parent.mkdir()
    system.write_text(PCI_IDS)
    assert cli.main(["hw", "classify", "--pci-id", "10de:2336"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[1].split()[:3] == ["10de:2336", "H100", "hopper"]
    assert out.splitlines()[-1] == f"pci.ids: {system}"
    assert "warning: 10de:2336 (GH100 [H100])" in err
    assert cli.main(["hw", "classify", "--pci-id", "10de:2336", "--json"]) == 0
    (doc,) = json.loads(capsys.readouterr().out)
    assert (doc["status"], doc["source"], doc["pci_ids_file"]) == ("supported", "pci.ids",
                                                                   str(system))


def test_classify_without_a_system_pci_ids_says_so(capsys):
    assert cli.main(["hw", "classify", "--pci-id", "10de:2336"]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[1].split()[:2] == ["10de:2336", "unknown"]
    assert out.splitlines()[-1].startswith("pci.ids: none (no ")
    assert "--pci-ids FILE" in out.splitlines()[-1]


def test_pci_ids_overrides_the_machines(capsys, system_pci_ids, tmp_path):
    system_pci_ids[0].parent.mkdir()
    system_pci_ids[0].write_text("10de  NVIDIA Corporation\n")  # no 2336 in it
    assert cli.main(["hw", "classify", "--pci-id", "10de:2336"]) == 1
    capsys.readouterr()
    given = tmp_path / "given.ids"
    given.write_text(PCI_IDS)
    rc, doc, _ = _choose(capsys, "--os", "debian-13", "--source", "nvidia", "--pci-id",
                         "10de:2336", "--pci-ids", str(given), "--json")
    assert rc == 0 and doc["pci_ids_file"] == str(given)


def test_choose_names_the_branchs_security_floor(capsys):
    rc, doc, _ = _choose(capsys, "--os", "debian-13", "--source", "nvidia", "--pci-id",
                         "10de:2330", "--pin", "580", "--json")
    assert rc == 0 and doc["minimum_version"] == "580.178.04"
    assert doc["security"]["bulletin"] == 5861 and doc["security"]["missed"] == []
    # Debian 12's archive: R535, whose last fixes (5821) the archive's 535.261.03 lacks, and
    # which no later bulletin lists.
    rc, out, _ = _choose(capsys, "--os", "debian-12", "--pci-id", "10de:15f8",
                         "--allow-vulnerable")
    assert rc == 0
    assert "security: debian 12's R535 is 535.261.03, below its fixed version 535.309.01 " \
           "(bulletin 5703" in out and "(accepted: nvidia_driver_allow_vulnerable)" in out
    assert "security: install 535.309.01 or newer (R535's fixes up to NVIDIA bulletin 5821, " \
           "2026-05-19)" in out
    assert "security: R535 gets no fixes from NVIDIA bulletin 5861 (2026-09-30)" in out


def test_choose_refuses_a_source_version_below_nvidias_fixes(capsys):
    # Debian 12's archive offers R535 only at 535.261.03: refused, with the way out (NVIDIA's
    # repository for Debian 12 has R580 at its fixed version) and the opt-in.
    rc, doc, err = _choose(capsys, "--os", "debian-12", "--pci-id", "10de:2330", "--json")
    assert rc == 1 and doc["ok"] is False and doc["branch"] is None
    assert doc["reason"].startswith("debian 12's R535 is 535.261.03, below its fixed version "
                                    "535.309.01 (bulletin 5703 (2025-10-09")
    assert "set nvidia_driver_source: nvidia (it offers R" in doc["reason"]
    assert err.count("\n") == 1 and doc["reason"] in err
    # From NVIDIA's repository the version is not known in advance: chosen, nothing refused.
    rc, doc, _ = _choose(capsys, "--os", "debian-12", "--source", "nvidia", "--pci-id",
                         "10de:2330", "--json")
    assert rc == 0 and doc["ok"] and not any(n.startswith("security: debian 12")
                                             for n in doc["notes"])
    # Debian 13's archive has R550 at 550.163.01, its last fix: not below it, but R550 ended:
    # said, not refused.
    rc, doc, _ = _choose(capsys, "--os", "debian-13", "--pci-id", "10de:2330", "--json")
    assert rc == 0 and doc["branch"] == 550
    assert doc["security"]["missed"] == [5670, 5703, 5747, 5821, 5861]
