"""gpuprov bom's dnf side (gpuprov/bom.py) on dnf and yum output recorded on real systems and
NVIDIA's own .repo files (tests/fixtures/bom/dnf/SOURCES.md names each source): no RHEL node
exists in the lab."""

from __future__ import annotations

from pathlib import Path

from gpuprov import bom

DNF = Path(__file__).resolve().parents[1] / "fixtures" / "bom" / "dnf"


def _read(name: str) -> str:
    return (DNF / name).read_text()


def _rows(text: str) -> list[list[str]]:
    """The table's package rows as whitespace fields, read independently of the parser: every
    indented line whose second field is an RPM architecture."""
    return [line.split() for line in text.splitlines()
            if line.startswith(" ") and len(line.split()) > 4
            and line.split()[1] in {"x86_64", "noarch", "i686"}]


def test_yum_el7_table_with_epochs_and_dependency_updates():
    got = bom.parse_dnf_transaction(_read("el7-yum-update-dbus.txt"))
    assert got == [
        {"name": "dbus", "version": "1:1.10.24-13.el7_6", "arch": "x86_64", "repository": "base"},
        {"name": "dbus-libs", "version": "1:1.10.24-13.el7_6", "arch": "x86_64",
         "repository": "base"},
    ]


def test_dnf4_rhel8_nvidia_driver_from_nvidias_repository():
    text = _read("rhel8-dnf-install-nvidia-driver.txt")
    got = bom.parse_dnf_transaction(text)
    assert [(p["name"], p["arch"], p["version"], p["repository"]) for p in got] == \
        [tuple(r[:4]) for r in _rows(text)]
    assert {p["repository"] for p in got} == {"cuda-rhel8-x86_64"}
    assert got[-1]["name"] == "dnf-plugin-nvidia"  # a dependency, under its section line
    assert got[0]["version"] == "3:515.48.07-1.el8"  # NVIDIA's epoch kept


def test_dnf4_table_header_and_rules_are_not_packages():
    got = bom.parse_dnf_transaction(_read("el8-dnf-upgrade-kmod-nvidia.txt"))
    assert [p["name"] for p in got] == ["kmod-nvidia", "nvidia-driver"]
    assert got[0]["repository"] == "@commandline"


def test_dnf5_drops_only_the_zero_epoch():
    got = {(p["name"], p["arch"]): p["version"] for p in
           bom.parse_dnf_transaction(_read("fedora44-dnf5-install-nvidia-driver.txt"))}
    assert got[("dkms", "noarch")] == "3.4.2-1.fc44"  # dnf 5's "0:" as dnf 4 writes it
    assert got[("egl-gbm", "i686")] == "2:1.1.3-2.fc44"
    assert got[("nvidia-driver", "x86_64")] == "3:610.57.04-1.fc44"
    assert len(got) == 10


def test_dnf5_replacing_lines_are_what_goes_not_what_comes():
    text = _read("fedora41-dnf5-upgrade-replacing.txt")
    got = bom.parse_dnf_transaction(text)
    assert len(got) == len([r for r in text.splitlines() if r.startswith(" ")
                            and not r.strip().startswith("replacing")])
    assert ("efi-filesystem", "5-13.fc41") in {(p["name"], p["version"]) for p in got}
    assert ("efi-filesystem", "5-12.fc41") not in {(p["name"], p["version"]) for p in got}
    assert [p["arch"] for p in got if p["name"] == "unbound-libs"] == ["i686", "x86_64"]


def test_removals_are_not_installs():
    # The rows of a "Removing:" section (dnf's word for what goes) are left out.
    text = _read("el7-yum-update-dbus.txt").replace("Updating for dependencies:", "Removing:")
    assert [p["name"] for p in bom.parse_dnf_transaction(text)] == ["dbus"]


def test_nvidias_repo_files():
    repos = bom.parse_repo_files(_read("cuda-rhel9.repo") + "\n"
                                 + _read("nvidia-container-toolkit.repo"), arch="aarch64")
    assert repos["cuda-rhel9-x86_64"] == {
        "name": "cuda-rhel9-x86_64",
        "url": "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64",
        "key": "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/D42D0685.pub",
        "enabled": True, "gpgcheck": True,
    }
    toolkit = repos["nvidia-container-toolkit"]
    assert toolkit["url"] == "https://nvidia.github.io/libnvidia-container/stable/rpm/aarch64"
    assert toolkit["key"] == "https://nvidia.github.io/libnvidia-container/gpgkey"
    assert toolkit["gpgcheck"] is False  # NVIDIA signs the metadata (repo_gpgcheck)
    assert repos["nvidia-container-toolkit-experimental"]["enabled"] is False


def test_a_dnf_node_lists_each_package_with_its_repository_and_key():
    # The RHEL 8 rows as they read from RHEL 9's repository id (the recorded pair of table and
    # .repo file is from two releases; only the id is changed).
    transaction = _read("rhel8-dnf-install-nvidia-driver.txt").replace("cuda-rhel8-x86_64",
                                                                       "cuda-rhel9-x86_64")
    materials = {"has_gpu": True, "os": "RedHat 9.4", "package_manager": "dnf", "branch": 580,
                 "driver_packages": ["nvidia-driver-580.126.09"], "toolkit_packages": [],
                 "dnf_transaction": transaction, "dnf_repos": _read("cuda-rhel9.repo")}
    record = bom.node_dnf(materials)
    url = "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64"
    assert {p["repository"] for p in record["packages"]} == {url}
    assert record["files"] == [f"{url}/D42D0685.pub"]
    assert [p["name"] for p in record["packages"] if p["named"]] == ["nvidia-driver"]
    # A repository id no .repo file names (the RHEL 8 id on this node), or @commandline: none.
    unknown = bom.node_dnf({**materials,
                            "dnf_transaction": _read("rhel8-dnf-install-nvidia-driver.txt")})
    assert {p["repository"] for p in unknown["packages"]} == {None} and unknown["files"] == []


def test_the_playbook_result_decides_dnf_nodes():
    materials = {"has_gpu": True, "os": "RedHat 9.4", "package_manager": "dnf",
                 "dnf_transaction": _read("el7-yum-update-dbus.txt"), "dnf_repos": ""}
    doc = {"plays": [{"tasks": [{"task": {"name": bom.RESULT_TASK},
                                 "hosts": {"rhel-node": {"msg": materials},
                                           "zypper-node": {"msg": {
                                               **materials, "dnf_transaction": None,
                                               "package_manager": "zypper"}}}}]}]}
    result = bom.from_playbook(doc, 0)
    assert [p["name"] for p in result["nodes"]["rhel-node"]["packages"]] == ["dbus", "dbus-libs"]
    assert result["undecided"] == {"zypper-node": "package manager 'zypper': no apt or dnf "
                                                  "answer for this node (gpuprov bom asks apt "
                                                  "and dnf only)"}
    assert {p["name"] for p in result["mirror"]["packages"]} == {"dbus", "dbus-libs"}
