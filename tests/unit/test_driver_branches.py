"""Driver branch choice per node: pinned, fallback, impossible mixes, OS support."""

from __future__ import annotations

import datetime
from unittest import mock

import pytest

from gpuprov.nvidia import driver_branches
from gpuprov.nvidia.driver_branches import choose_branch

K80, P100, H100, H200, B200, GRID_K2 = (
    "10de:102d", "10de:15f8", "10de:2330", "10de:2335", "10de:2901", "10de:11bf"
)
BMC_VGA = "102b:0522"  # Matrox G200eR on a server's BMC: not a GPU gpuprov drives
# The day the branch tables below were checked against NVIDIA's lifecycle (driver_lifecycle).
TODAY = datetime.date(2026, 11, 26)


@pytest.mark.parametrize(
    ("gpus", "branch"),
    [([K80, K80], 470), ([P100] * 4, 535), ([H100] * 8, 535), ([P100, H100], 535)],
    ids=["gpu-kepler", "gpu-pascal", "gpu-hopper", "pascal+hopper"],
)
def test_lab_profiles_on_debian_12(gpus: list[str], branch: int) -> None:
    choice = choose_branch(gpus, "Debian", "12")
    assert (choice.ok, choice.branch) == (True, branch)
    assert "newest branch installable on debian 12" in choice.reason
    assert len(choice.gpus) == len(gpus)


def test_pinned_branch_that_supports_every_gpu_is_used() -> None:
    choice = choose_branch([H100], "Ubuntu", "22.04", pinned_branch="595", source="nvidia")
    assert (choice.ok, choice.branch) == (True, 595)
    assert choice.reason.startswith("pinned branch 595")


@pytest.mark.parametrize("pin", [535, 550, 570])
def test_ubuntu_transitional_branch_pin_is_refused_naming_the_branch_it_installs(pin) -> None:
    # Ubuntu's 535-server, 550 and 570-server packages now install 580 (driver_branches [ubuntu]).
    choice = choose_branch([H100], "Ubuntu", "24.04", pinned_branch=pin)
    assert (choice.ok, choice.branch) == (False, None)
    assert f"packages of branch {pin} are transitional and install 580" in choice.reason
    assert "pin 580" in choice.reason
    assert choose_branch([H100], "Ubuntu", "24.04", pinned_branch=580).branch == 580


def test_pinned_branch_that_misses_a_gpu_falls_back_with_reason() -> None:
    choice = choose_branch([H100], "Debian", "12", pinned_branch=470)
    assert (choice.ok, choice.branch) == (True, 535)
    assert "pinned 470 cannot be used" in choice.reason
    assert any("does not support NVIDIA H100 80GB HBM3" in note for note in choice.notes)


def test_pinned_branch_not_offered_by_the_os_falls_back() -> None:
    choice = choose_branch([P100], "Debian", "12", pinned_branch=580)
    assert (choice.ok, choice.branch) == (True, 535)
    assert any("not installable on debian 12" in note for note in choice.notes)


def test_kepler_and_hopper_cannot_share_a_node() -> None:
    choice = choose_branch([K80, H100], "Debian", "12")
    assert (choice.ok, choice.branch) == (False, None)
    assert choice.reason == (
        "Tesla K80 (10de:102d) needs branch <= 470 and NVIDIA H100 80GB HBM3 (10de:2330) "
        "needs >= 535: no single driver branch drives both; split these GPUs across nodes"
    )


def test_gpu_newer_than_the_os_offers_says_where_to_go() -> None:
    choice = choose_branch([H200], "Debian", "12")
    assert not choice.ok
    assert "need driver branch >= 550 but debian 12 offers 470, 535" in choice.reason
    assert "ubuntu 24.04" in choice.reason


def test_kepler_on_rhel_9_has_no_branch() -> None:
    choice = choose_branch([K80], "Rocky", "9.4")
    assert not choice.ok and choice.os == "rhel 9"
    assert "rhel 8" in choice.reason


def test_blackwell_gets_open_modules() -> None:
    choice = choose_branch([B200] * 8, "Ubuntu", "24.04")
    assert (choice.ok, choice.branch) == (True, 580)
    assert choice.open_kernel_modules and choice.open_kernel_modules_required


def test_pre_turing_gets_proprietary_modules() -> None:
    choice = choose_branch([P100], "Ubuntu", "24.04")
    assert choice.branch == 580 and not choice.open_kernel_modules


def test_legacy_gpu_fails_the_node() -> None:
    choice = choose_branch([GRID_K2], "Ubuntu", "22.04")
    assert not choice.ok
    assert "GRID K2 (10de:11bf): legacy GPU served only by driver branch 340.xx" in choice.reason


@pytest.mark.parametrize("pci_ids", [[], [BMC_VGA]], ids=["no-devices", "bmc-vga-only"])
def test_cpu_only_node(pci_ids: list[str]) -> None:
    choice = choose_branch(pci_ids, "Debian", "12")
    assert (choice.ok, choice.branch, choice.reason) == (True, None, "no NVIDIA GPU")


def test_other_vendors_are_ignored_beside_gpus() -> None:
    assert choose_branch([BMC_VGA, P100], "Debian", "12").branch == 535


@pytest.mark.parametrize(("os_id", "version"), [("Fedora", "40"), ("Debian", "11"),
                                                ("Ubuntu", "20.04")])
def test_unsupported_os(os_id: str, version: str) -> None:
    choice = choose_branch([P100], os_id, version)
    assert not choice.ok
    assert choice.reason.startswith(f"{os_id} {version} is not supported")
    assert "debian 12" in choice.reason


def test_unknown_gpu_needs_a_pin() -> None:
    unpinned = choose_branch(["10de:ffff"], "Debian", "12")
    assert not unpinned.ok and "pin one NVIDIA lists" in unpinned.reason
    pinned = choose_branch(["10de:ffff"], "Debian", "12", pinned_branch=535)
    assert (pinned.ok, pinned.branch) == (True, 535)
    assert any("support not checked" in note for note in pinned.notes)


def test_bad_input_raises_value_error() -> None:
    with pytest.raises(ValueError, match="not a PCI ID"):
        choose_branch(["xyz"], "Debian", "12")
    with pytest.raises(ValueError, match="not a number"):
        choose_branch([P100], "Debian", "12", pinned_branch="latest")


def test_to_dict_is_json_ready() -> None:
    import json

    doc = choose_branch([P100, P100], "Debian", "12.7").to_dict()
    assert json.loads(json.dumps(doc)) == doc
    assert (doc["ok"], doc["branch"], doc["os"]) == (True, 535, "debian 12")
    assert [gpu["series"] for gpu in doc["gpus"]] == ["p100", "p100"]


def test_os_normalisation_and_table() -> None:
    assert driver_branches.normalise_os("RedHat", "8.10") == ("rhel", "8")
    assert driver_branches.normalise_os("Ubuntu", "24.04") == ("ubuntu", "24.04")
    debian = [b.branch for b in driver_branches.installable_branches("debian", "12")]
    assert debian == [470, 535]
    assert driver_branches.installable_branches("debian", "14") == ()
    for branches in driver_branches.OS_BRANCHES.values():
        numbers = [b.branch for b in branches]
        assert numbers == sorted(set(numbers))


# Sources: Debian's archive and NVIDIA's CUDA repository offer different branches per release
# (bookworm 470/535, trixie 550; NVIDIA's debian12 repository 550-620, debian13 580-620). Where
# no branch is pinned the newest one NVIDIA supports wins (R620 LTSB to 2029-09); Pascal's last
# is R580 (LTSB to 2028-06); Debian's own archive has only ended branches.
@pytest.mark.parametrize(
    ("gpus", "os_version", "source", "branch"),
    [
        ([H100] * 8, "13", "nvidia", 620),
        ([H100] * 8, "13", None, 550),
        ([H100] * 8, "12", "nvidia", 620),
        ([P100] * 4, "13", "nvidia", 580),  # Pascal ends with R580
        ([P100] * 4, "12", "distro", 535),
        ([B200] * 8, "12", "nvidia", 620),
    ],
    ids=["hopper-13-nvidia", "hopper-13-distro", "hopper-12-nvidia", "pascal-13-nvidia",
         "pascal-12-distro", "blackwell-12-nvidia"],
)
def test_branch_per_debian_release_and_source(gpus, os_version, source, branch) -> None:
    choice = choose_branch(gpus, "Debian", os_version, source=source, today=TODAY)
    assert (choice.ok, choice.branch) == (True, branch), choice.reason


def test_supported_branch_beats_a_newer_feature_branch() -> None:
    # R620 LTSB is the newest supported branch; in a table without it R595 PB (to 2027-03)
    # beats the newer feature branches 610 and 615, and after that R580 LTSB (to 2028-06).
    offered = driver_branches.OS_BRANCHES[("rhel", "9", "nvidia")]
    assert [b.branch for b in offered][-5:] == [590, 595, 610, 615, 620]
    choice = choose_branch([H100], "rhel", "9", today=TODAY)
    assert choice.branch == 620
    assert "newest branch NVIDIA supports (LTSB to 2029-09)" in choice.reason
    without_620 = {**driver_branches.OS_BRANCHES,
                   ("rhel", "9", "nvidia"): tuple(b for b in offered if b.branch != 620)}
    with mock.patch.dict(driver_branches.OS_BRANCHES, without_620):
        assert choose_branch([H100], "rhel", "9", today=TODAY).branch == 595
        # After R595's end of life the older R580 LTSB, still supported, beats the NFBs.
        assert choose_branch([H100], "rhel", "9", today=datetime.date(2027, 4, 1)).branch == 580
        # After R580's too only feature branches are left: the newest one, said so.
        late = choose_branch([H100], "rhel", "9", today=datetime.date(2028, 7, 1))
        assert late.branch == 615 and "none that NVIDIA still supports does" in late.reason


def test_ended_branch_gets_a_note_with_the_way_out() -> None:
    choice = choose_branch([P100] * 4, "Debian", "12", today=TODAY)
    assert choice.branch == 535
    assert ("R535 (long term support branch) reached NVIDIA's end of life 2026-06: move to "
            "R580 (LTSB, to 2028-06)") in choice.notes  # Pascal: no branch after 580
    hopper = choose_branch([H100], "Debian", "12", today=TODAY)
    assert any("move to R620 (LTSB, to 2029-09) or R595 (PB, to 2027-03) or R580" in n
               for n in hopper.notes)
    assert not choose_branch([H100], "Debian", "13", source="nvidia", today=TODAY).notes


def test_pin_580_from_nvidia_on_debian_13() -> None:
    choice = choose_branch([H100] * 8, "debian", "13", pinned_branch=580, source="nvidia")
    assert (choice.ok, choice.branch, choice.os) == (True, 580, "debian 13 (nvidia)")
    assert "nvidia-driver-pinning-580" in choice.packages
    assert choice.open_kernel_modules


def test_kepler_on_debian_13_points_at_debian_12() -> None:
    choice = choose_branch([K80, K80], "Debian", "13")
    assert not choice.ok
    assert "debian 13 offers 550" in choice.reason and "debian 12" in choice.reason


def test_blackwell_is_not_in_debians_archive_but_in_nvidias_repository() -> None:
    choice = choose_branch([B200], "Debian", "12")
    assert not choice.ok
    assert "debian 12 (nvidia)" in choice.reason


def test_rhel_defaults_to_nvidias_repository_and_has_no_distro_source() -> None:
    assert choose_branch([H100], "Rocky", "9.4").os == "rhel 9"
    choice = choose_branch([H100], "Rocky", "9.4", source="distro")
    assert not choice.ok
    assert "set nvidia_driver_source to nvidia" in choice.reason


def test_unknown_source_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="'cuda' is not one of distro, nvidia"):
        choose_branch([H100], "Debian", "12", source="cuda")


def test_every_supported_os_has_each_roles_data_and_branches() -> None:
    """gpu_preflight's OS list, the roles' per-OS vars and this table name the same releases:
    a release in one and not the others fails at run time on that OS only."""
    from pathlib import Path

    import yaml

    roles = Path(__file__).resolve().parents[2] / "roles"
    accepted = yaml.safe_load((roles / "gpu_preflight/defaults/main.yml").read_text())
    files = {f"{'RedHat' if d == 'Rocky' else d}_{v}"
             for d, v in (entry.split() for entry in accepted["gpu_preflight_supported_os"])}
    for role in ("gpu_preflight", "nvidia_driver", "nvidia_container_toolkit"):
        have = {p.stem for p in (roles / role / "vars").glob("*_*.yml")}
        assert have == files, role
    named = set()
    for name in files:
        ids = yaml.safe_load((roles / f"gpu_preflight/vars/{name}.yml").read_text())
        os_id, version = ids["__gpu_preflight_os_id"], ids["__gpu_preflight_os_version"]
        named.add((os_id, version))
        assert driver_branches.installable_branches(os_id, version), name
        # NVIDIA's apt repository where the table offers it as a source, and only there.
        driver = yaml.safe_load((roles / f"nvidia_driver/vars/{name}.yml").read_text())
        cuda_apt = driver["__nvidia_driver_package_manager"] == "apt" and bool(
            driver.get("__nvidia_driver_cuda_distro"))
        offered = (os_id, version, "nvidia") in driver_branches.OS_BRANCHES
        assert cuda_apt == offered or driver["__nvidia_driver_package_manager"] == "dnf", name
    assert named == {(os_id, version) for os_id, version, _ in driver_branches.OS_BRANCHES}


def test_a_gpu_the_table_lacks_is_driven_by_its_chips_architecture_with_a_warning() -> None:
    # H100 variant 10de:2336, named "GH100 [H100]" by pci.ids, next to a listed H100.
    names = {"10de:2336": "GH100 [H100]"}
    choice = choose_branch(["10de:2336", H100], "Debian", "13", source="nvidia",
                           today=TODAY, chip_names=names)
    assert (choice.ok, choice.branch, choice.open_kernel_modules) == (True, 620, True)
    assert any(n.startswith("warning: 10de:2336 (GH100 [H100]): not in gpuprov's hardware "
                            "table; hopper") for n in choice.notes)
    # The same GPU without its pci.ids name: unknown, a pin is needed as before.
    assert not choose_branch(["10de:2336"], "Debian", "13", source="nvidia").ok
    # Maxwell's Tesla M10 (GM107GL) keeps Maxwell's last branch, 580.
    m10 = choose_branch(["10de:13bd"], "Debian", "13", source="nvidia", today=TODAY,
                        chip_names={"10de:13BD": "GM107GL [Tesla M10]"})
    assert (m10.ok, m10.branch) == (True, 580)


# The decision table for every supported OS and source, on the tests' day, from NVIDIA's facts:
# Kepler's last branch is 470 (offered by Debian 12's and Ubuntu 22.04's archives and RHEL 8's
# repository only); Pascal works only with the proprietary modules and Blackwell only with the
# open ones, so no node drives both; Hopper and Blackwell (570+) get the newest supported
# branch the source offers: R620 LTSB from NVIDIA, R580 from Ubuntu, nothing new enough for
# Blackwell in Debian's archive (535, 550).
MIXES = {"kepler+pascal": [K80, P100], "pascal+blackwell": [P100, B200], "hopper": [H100],
         "blackwell": [B200]}
DECISIONS = {
    ("debian", "12", "distro"): (470, None, 535, None),
    ("debian", "13", "distro"): (None, None, 550, None),
    ("debian", "12", "nvidia"): (None, None, 620, 620),
    ("debian", "13", "nvidia"): (None, None, 620, 620),
    ("ubuntu", "22.04", "distro"): (470, None, 580, 580),
    ("ubuntu", "24.04", "distro"): (None, None, 580, 580),
    ("ubuntu", "26.04", "distro"): (None, None, 580, 580),
    ("ubuntu", "22.04", "nvidia"): (None, None, 620, 620),
    ("ubuntu", "24.04", "nvidia"): (None, None, 620, 620),
    ("ubuntu", "26.04", "nvidia"): (None, None, 620, 620),
    ("rhel", "8", "nvidia"): (470, None, 620, 620),
    ("rhel", "9", "nvidia"): (None, None, 620, 620),
    ("rhel", "10", "nvidia"): (None, None, 620, 620),
}


def test_the_decision_table_covers_every_os_and_source() -> None:
    assert set(DECISIONS) == set(driver_branches.OS_BRANCHES)


@pytest.mark.parametrize("key", sorted(DECISIONS), ids=lambda k: "-".join(k))
def test_decision_table(key) -> None:
    os_id, version, source = key
    for (mix, gpus), expected in zip(MIXES.items(), DECISIONS[key], strict=True):
        choice = choose_branch(gpus, os_id, version, source=source, today=TODAY)
        assert (choice.ok, choice.branch) == (expected is not None, expected), (mix,
                                                                                choice.reason)
        if mix == "pascal+blackwell":
            assert "only with NVIDIA's open kernel modules" in choice.reason
        if mix in ("hopper", "blackwell") and expected:
            assert choice.open_kernel_modules


def _source_with(*rows: tuple) -> dict:
    """A driver source for Debian 12 whose versions are known (as Debian's archive is)."""
    return {**driver_branches.OS_BRANCHES,
            ("debian", "12", "distro"): driver_branches._branches(*rows)}


def test_unpinned_a_branch_below_its_fixes_gives_way_to_a_fixed_one():
    # A source whose newest branch (R595 at 595.71.05) lacks bulletin 5861's fix while R580
    # there has it: R580 is chosen, and a note says why.
    rows = ((580, "r580", True, "580.178.04"), (595, "r595", True, "595.71.05"))
    with mock.patch.dict(driver_branches.OS_BRANCHES, _source_with(*rows)):
        choice = choose_branch([H100], "Debian", "12", today=TODAY, allow_vulnerable=False)
        assert choice.ok and choice.branch == 580
        assert choice.reason.startswith("newest branch with NVIDIA's security fixes")
        assert any(n.startswith("security: debian 12's R595 is 595.71.05, below its fixed "
                                "version 595.91.07 (bulletin 5861") and n.endswith("chose R580, "
                                "the newest supported branch with NVIDIA's fixes")
                   for n in choice.notes), choice.notes
        # A pin is the admin's: kept, and refused for its version without the opt-in.
        pinned = choose_branch([H100], "Debian", "12", pinned_branch=595, today=TODAY,
                               allow_vulnerable=False)
        assert not pinned.ok and pinned.reason.startswith("debian 12's R595 is 595.71.05")
        accepted = choose_branch([H100], "Debian", "12", pinned_branch=595, today=TODAY,
                                 allow_vulnerable=True)
        assert accepted.ok and accepted.branch == 595


def test_a_known_version_at_its_fixes_is_chosen_without_a_security_note():
    rows = ((580, "r580", True, "580.178.04"),)
    with mock.patch.dict(driver_branches.OS_BRANCHES, _source_with(*rows)):
        choice = choose_branch([H100], "Debian", "12", today=TODAY, allow_vulnerable=False)
    assert choice.ok and choice.branch == 580
    assert not any(n.startswith("security:") for n in choice.notes)
