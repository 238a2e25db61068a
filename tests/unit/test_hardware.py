"""The hardware table against its sources (a trimmed, vendored copy) and the classify() API."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.nvidia import hardware

FIXTURE = Path(__file__).parent.parent / "fixtures" / "hardware" / "datacenter-ids.tsv"
LIST_BRANCHES = (340, 390, 418, 450, 460, 470, 535, 550)

# IDs in the fixture that the table leaves out on purpose (they classify as "unknown").
EXCLUDED = {
    # in no driver README list: pre-production, OEM-only, vGPU/USM or never-listed boards
    0x0FF5, 0x101E, 0x101F, 0x1020, 0x102E, 0x102F, 0x103F, 0x118B, 0x11B1, 0x1389, 0x13BD,
    0x15FC, 0x1613, 0x1789, 0x1B39, 0x1DB0, 0x1DB2, 0x1DBD, 0x1E35, 0x1E38, 0x20B8, 0x20B9,
    0x230C, 0x230E, 0x2313, 0x2328, 0x2336, 0x2337, 0x2338, 0x233D, 0x2345, 0x237E, 0x26B7,
    0x26BB, 0x26F5, 0x27B7, 0x2900, 0x290A, 0x2920, 0x2940, 0x2980, 0x29BB, 0x29BC, 0x29C0,
    0x3180, 0x31A1, 0x31C0,
    # engineering-board names (PG5xx) in the README lists, not products
    0x1DF0, 0x1DF2, 0x20B3, 0x20F0, 0x20F2,
}
# Listed by no Debian list but by NVIDIA's README (open-gpu-kernel-modules) or release notes.
NEWER_THAN_DEBIAN = {0x233B, 0x2348, 0x2901, 0x2909, 0x2941, 0x2BB5, 0x3182, 0x31C2, 0x31C3}
# Missing from the 535/550 README lists although NVIDIA's deprecation notice keeps their
# architecture supported through 580 (see hardware.py).
DROPPED_FROM_LISTS = {0x1BB3, 0x1DF5}


def _fixture() -> dict[int, tuple[str, tuple[int, ...]]]:
    rows = {}
    for line in FIXTURE.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        device, name, lists = line.split("\t")
        branches = () if lists == "-" else tuple(int(b) for b in lists.split(","))
        rows[int(device, 16)] = (name, branches)
    return rows


SOURCE = _fixture()
TABLE_IDS = {m.device_id for m in hardware.models()}


def test_fixture_is_the_trimmed_source() -> None:
    assert len(SOURCE) > 100
    assert SOURCE[0x102D] == ("GK210GL [Tesla K80]", (390, 418, 450, 460, 470))


@pytest.mark.parametrize("device_id", sorted(SOURCE), ids=lambda d: f"{d:04x}")
def test_every_source_id_is_in_the_table_or_excluded_on_purpose(device_id: int) -> None:
    in_table = device_id in TABLE_IDS
    assert in_table != (device_id in EXCLUDED), f"{device_id:04x}: {SOURCE[device_id][0]}"
    if not in_table:
        assert hardware.classify(f"10de:{device_id:04x}").status == "unknown"


@pytest.mark.parametrize("model", hardware.models(), ids=lambda m: f"{m.device_id:04x}-{m.series}")
def test_table_branches_agree_with_the_debian_lists(model: hardware.GpuModel) -> None:
    name, branches = SOURCE.get(model.device_id, ("", ()))
    if model.device_id in NEWER_THAN_DEBIAN:
        assert branches == () and model.min_branch > 550
        return
    assert branches, f"{model.name} has no source row"
    assert model.min_branch == branches[0]
    for branch in branches:
        assert model.supports_branch(branch), f"{model.name} is listed for {branch}"
    for branch in LIST_BRANCHES:
        if branch > branches[-1] and model.device_id not in DROPPED_FROM_LISTS:
            # the ID left the lists: the table must say so, or the list predates the branch
            assert model.max_branch == branches[-1] or branches[-1] == LIST_BRANCHES[-1]


@pytest.mark.parametrize("model", hardware.models(), ids=lambda m: f"{m.device_id:04x}-{m.series}")
def test_architecture_facts_hold_for_every_model(model: hardware.GpuModel) -> None:
    arch = hardware.architecture_of(model.architecture)
    assert model.open_kernel_modules is arch.open_kernel_modules
    if model.status == "supported":
        assert model.max_branch == arch.max_branch
    assert model.series == model.series.lower() and " " not in model.series
    major, minor = model.compute_capability.split(".")
    assert major.isdigit() and minor.isdigit()


def test_every_architecture_has_models() -> None:
    assert {m.architecture for m in hardware.models()} == set(hardware.ARCHITECTURES)


@pytest.mark.parametrize(
    ("pci_id", "name", "architecture", "cc", "min_branch", "max_branch", "open_modules",
     "series"),
    [
        ("10de:102d", "Tesla K80", "kepler", "3.7", 390, 470, False, "k80"),
        ("10de:118f", "Tesla K10", "kepler", "3.0", 340, 470, False, "k10"),
        ("10de:17fd", "Tesla M40", "maxwell", "5.2", 390, 580, False, "m40"),
        ("10de:15f8", "Tesla P100-PCIE-16GB", "pascal", "6.0", 390, 580, False, "p100"),
        ("10de:1db6", "Tesla V100-PCIE-32GB", "volta", "7.0", 390, 580, False, "v100"),
        ("10de:1eb8", "Tesla T4", "turing", "7.5", 418, None, True, "t4"),
        ("10de:20b2", "NVIDIA A100-SXM4-80GB", "ampere", "8.0", 450, None, True, "a100"),
        ("10de:2236", "NVIDIA A10", "ampere", "8.6", 460, None, True, "a10"),
        ("10de:27b8", "NVIDIA L4", "ada-lovelace", "8.9", 535, None, True, "l4"),
        ("10de:2330", "NVIDIA H100 80GB HBM3", "hopper", "9.0", 535, None, True, "h100"),
        ("10de:2335", "NVIDIA H200", "hopper", "9.0", 550, None, True, "h200"),
        ("10de:2901", "NVIDIA B200", "blackwell", "10.0", 570, None, True, "b200"),
        ("10de:2bb5", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "blackwell", "12.0", 575,
         None, True, "rtx-pro-6000"),
    ],
)
def test_one_model_per_architecture(pci_id, name, architecture, cc, min_branch, max_branch,
                                    open_modules, series) -> None:
    result = hardware.classify(pci_id)
    assert result.to_dict() == {
        "pci_id": pci_id,
        "name": name,
        "architecture": architecture,
        "compute_capability": cc,
        "min_branch": min_branch,
        "max_branch": max_branch,
        "recommended_branch": 470 if architecture == "kepler" else 580,
        "open_kernel_modules": open_modules,
        "status": "supported",
        "series": series,
        "source": "table",
        "chip_name": None,
    }


@pytest.mark.parametrize("pci_id", ["10de:11bf", "10de:0ff2", "10de:0fef"])
def test_grid_k1_k2_are_legacy_340(pci_id: str) -> None:
    result = hardware.classify(pci_id)
    assert result.status == "legacy"
    assert result.max_branch == 340
    assert "340" in result.message and "legacy" in result.message


def test_grid_k520_is_not_legacy() -> None:
    assert hardware.classify("10de:118a").status == "supported"


def test_blackwell_and_grace_hopper_require_open_modules() -> None:
    assert hardware.lookup(0x2941).open_kernel_modules_required
    assert hardware.lookup(0x2342).open_kernel_modules_required
    assert not hardware.lookup(0x2330).open_kernel_modules_required


@pytest.mark.parametrize("text", ["10de:15f8", "0x15f8", "15F8", " 10DE:15F8 ", "0x10de:0x15f8"])
def test_accepted_spellings(text: str) -> None:
    assert hardware.classify(text).pci_id == "10de:15f8"


def test_unknown_id_is_reported_not_raised() -> None:
    result = hardware.classify("10de:ffff")
    assert result.status == "unknown"
    assert set(result.to_dict()) == {
        "pci_id", "name", "architecture", "compute_capability", "min_branch", "max_branch",
        "recommended_branch", "open_kernel_modules", "status", "series", "source", "chip_name",
    }
    assert "unknown" in result.message


@pytest.mark.parametrize("text", ["xyz", "10de:", "", "10de:15f8:1", "10de:15f8a", "g0de:15f8"])
def test_malformed_ids_raise(text: str) -> None:
    with pytest.raises(hardware.InvalidPciId, match="not a PCI ID"):
        hardware.classify(text)


def test_other_vendor_raises_not_nvidia() -> None:
    with pytest.raises(hardware.InvalidPciId, match="not an NVIDIA GPU"):
        hardware.classify("8086:1234")


def test_subsystem_tells_a2_from_a16() -> None:
    assert hardware.classify("10de:25b6", subsystem_device=0x157E).series == "a2"
    assert hardware.classify("10de:25b6", subsystem_device=0x14A9).series == "a16"
    assert hardware.classify("10de:25b6").series == "a2-a16"
    assert hardware.classify("10de:15f8", subsystem_device=0x118F).series == "p100"


def test_lookup_and_nvml_architectures() -> None:
    assert hardware.lookup(0x15F8).name == "Tesla P100-PCIE-16GB"
    assert hardware.lookup(0xFFFF) is None
    assert [hardware.architecture_from_nvml(i) for i in range(2, 11)] == list(
        hardware.ARCHITECTURES
    )
    assert hardware.architecture_from_nvml(99) is None
    assert hardware.architecture_of("Ada Lovelace").name == "ada-lovelace"
    with pytest.raises(ValueError, match="unknown GPU architecture"):
        hardware.architecture_of("fermi")


def test_table_has_no_duplicate_keys() -> None:
    keys = [(m.device_id, m.subsystem_device) for m in hardware.models()]
    assert len(keys) == len(set(keys))


def test_hardware_module_is_stdlib_only() -> None:
    import ast
    import sys

    tree = ast.parse(Path(hardware.__file__).read_text())
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


# -- GPUs the table lacks: classified by the chip of their pci.ids name ------------------------

def test_the_chip_rule_agrees_with_the_table_on_every_listed_id() -> None:
    """The pci.ids name of every ID the table has (the fixture's column, pci.ids 2026.10.24)
    gives the table's architecture, and its compute capability where the chip names one:
    the rule that classifies the missing IDs is held to the curated ones."""
    checked = 0
    for device_id, (name, _) in SOURCE.items():
        model = hardware.lookup(device_id)
        if model is None:
            continue
        inferred = hardware.model_from_chip(device_id, name)
        assert inferred is not None, f"{device_id:04x} {name}"
        assert inferred.architecture == model.architecture, f"{device_id:04x} {name}"
        if inferred.compute_capability:
            assert inferred.compute_capability == model.compute_capability, f"{device_id:04x}"
        assert inferred.status == model.status, f"{device_id:04x} {name}"
        checked += 1
    assert checked == len(TABLE_IDS & set(SOURCE))


def test_every_datacenter_id_of_the_lists_is_classified_with_its_pci_ids_name() -> None:
    before = [d for d in SOURCE if hardware.classify(f"10de:{d:04x}").status != "unknown"]
    after = [d for d, (name, _) in SOURCE.items()
             if hardware.classify(f"10de:{d:04x}", chip_name=name).status != "unknown"]
    assert len(before) == len(SOURCE) - len(EXCLUDED)
    assert sorted(after) == sorted(SOURCE)  # every one: the excluded ones by their chip
    for device_id in EXCLUDED:
        result = hardware.classify(f"10de:{device_id:04x}", chip_name=SOURCE[device_id][0])
        assert result.source == "pci.ids"
        assert result.status == "legacy" or "not in gpuprov's hardware table" in result.message


def _system_pci_ids() -> str:
    for path in hardware.PCI_IDS_PATHS:
        if Path(path).exists():
            return Path(path).read_text(encoding="utf-8", errors="replace")
    pytest.fail("no pci.ids on this machine: apt-get install pci.ids "
                "(scripts/install-system-deps.sh does)")


@pytest.mark.parametrize(("device_id", "architecture", "cc", "branches", "series"), [
    (0x1020, "kepler", "3.5", (390, 470), "k20x"),  # Tesla K20X
    (0x13BD, "maxwell", "5.0", (390, 580), "m10"),  # Tesla M10
    (0x1DB2, "volta", "7.0", (450, 580), "v100"),  # Tesla V100 DGXS 16GB
    (0x20B8, "ampere", "8.0", (535, None), "a100x"),  # A100X
    (0x2336, "hopper", "9.0", (570, None), "h100"),  # H100
])
def test_pci_ids_fallback_on_the_systems_real_file(device_id, architecture, cc, branches, series):
    text = _system_pci_ids()
    name = hardware.pci_ids_name(device_id, text)
    assert name is not None and hardware.lookup(device_id) is None
    result = hardware.classify(f"10de:{device_id:04x}", chip_name=name)
    assert (result.status, result.source, result.chip_name) == ("supported", "pci.ids", name)
    assert (result.architecture, result.compute_capability) == (architecture, cc)
    assert (result.min_branch, result.max_branch, result.series) == (*branches, series)
    # The floor is the newest first branch of a known board of the architecture.
    assert result.min_branch == max(m.min_branch for m in hardware.models()
                                    if m.architecture == architecture)


def test_pci_ids_names_that_name_no_known_chip_stay_unknown() -> None:
    text = _system_pci_ids()
    assert hardware.pci_ids_name(0x1AD6, text) is not None  # TU102 USB 3.1 Host Controller
    assert hardware.classify("10de:9999", chip_name="Some Future Chip").status == "unknown"
    assert hardware.pci_ids_name(0x0001, text) is None
    # GRID K1/K2 boards stay legacy, as NVIDIA's legacy list has them.
    assert hardware.classify("10de:0ff5", chip_name="GK107GL [GRID K1 Tesla USM]").status \
        == "legacy"
