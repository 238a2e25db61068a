"""The roles' one-command reads of a node (roles/nvidia_driver/files/driver-state.sh,
roles/nvidia_container_toolkit/files/toolkit-state.sh) and the filters the roles decide from
(plugins/filter/gpuprov_node_state.py, gpuprov_kube.py).

The script runs for real with sh, against a directory that stands for / and with dpkg,
dpkg-query and systemctl replaced by stubs on PATH that print what a node would: so each
state it must notice (dpkg interrupted, a journal entry, nouveau, a loaded module, the unit)
is set up here, not taken from the machine running the tests.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from gpuprov.probe import packages as probe_packages

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles" / "nvidia_driver" / "files" / "driver-state.sh"
TOOLKIT_SCRIPT = REPO / "roles" / "nvidia_container_toolkit" / "files" / "toolkit-state.sh"
PROC_VERSION = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.261.03  "
                "Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Jul 31 23:10:09 UTC 2025\n")


@pytest.fixture(scope="module")
def packages(ansible_plugin):
    return ansible_plugin("filter/gpuprov_node_state.py")


@pytest.fixture(scope="module")
def kube(ansible_plugin):
    return ansible_plugin("filter/gpuprov_kube.py")


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def node(tmp_path):
    """A stand-in root and PATH: a node with two driver packages, one of them held."""
    root, bin_dir = tmp_path / "root", tmp_path / "bin"
    (root / "var/lib/dpkg/updates").mkdir(parents=True)
    bin_dir.mkdir()
    (tmp_path / "audit").write_text("")
    _stub(bin_dir, "dpkg", f'[ "$1" = --audit ] && cat {tmp_path / "audit"}')
    _stub(bin_dir, "dpkg-query", "\n".join([
        r"printf 'pkg\tnvidia-smi\t535.261.03-1~deb12u1\thold ok installed\n'",
        r"printf 'pkg\tlibcuda1\t535.261.03-1~deb12u1\tinstall ok unpacked\n'",
        r"printf 'pkg\told-thing\t1.0\tdeinstall ok config-files\n'"]))
    _stub(bin_dir, "systemctl", '[ "$1" = is-enabled ] && echo enabled || echo inactive')
    return root, bin_dir, tmp_path


def _read(packages, root: Path, bin_dir: Path, *files: Path) -> dict:
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    proc = subprocess.run(["sh", "-c", SCRIPT.read_text(), "driver-state.sh", str(root),
                           *map(str, files)],
                          capture_output=True, text=True, env=env, check=True)
    return packages.node_read(proc.stdout)


def test_a_quiet_node_reads_as_its_packages_and_unit(packages, node):
    root, bin_dir, _ = node
    state = _read(packages, root, bin_dir)
    assert state["interrupted"] == []
    assert state["packages"] == {
        "nvidia-smi": {"version": "535.261.03-1~deb12u1", "state": "installed", "held": True},
        "libcuda1": {"version": "535.261.03-1~deb12u1", "state": "unpacked", "held": False},
    }
    assert state["nouveau_loaded"] is False and state["module_version"] is None
    assert state["persistenced"] == {"enabled": "enabled", "active": "inactive"}


def test_dpkg_interrupted_by_audit_or_journal_is_noticed(packages, node):
    root, bin_dir, tmp_path = node
    (tmp_path / "audit").write_text("The following packages are only half configured\n")
    assert _read(packages, root, bin_dir)["interrupted"] == ["dpkg --audit lists packages"]
    (tmp_path / "audit").write_text("")
    (root / "var/lib/dpkg/updates/tmp.i").write_text("")  # dpkg's temporary file: no entry
    assert _read(packages, root, bin_dir)["interrupted"] == []
    (root / "var/lib/dpkg/updates/0003").write_text("Package: libcuda1\n")
    assert _read(packages, root, bin_dir)["interrupted"] == [
        "dpkg journal entries in /var/lib/dpkg/updates"]


def test_loaded_modules_are_read(packages, node):
    root, bin_dir, _ = node
    (root / "sys/module/nouveau").mkdir(parents=True)
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/version").write_text(PROC_VERSION + "GCC version: 12\n")
    state = _read(packages, root, bin_dir)
    assert state["nouveau_loaded"] is True
    assert state["module_version"] == "535.261.03"


def test_written_files_are_read_so_that_only_changed_ones_are_written(packages, node):
    root, bin_dir, tmp_path = node
    written, odd, absent = tmp_path / "sources", tmp_path / "blacklist", tmp_path / "absent"
    written.write_text("Types: deb\n")
    written.chmod(0o644)
    odd.write_text("blacklist nouveau\n")
    odd.chmod(0o600)
    files = _read(packages, root, bin_dir, written, odd, absent)["files"]
    assert [f["path"] for f in files] == [str(written), str(odd)]
    assert files[0]["mode"] == "0644" and files[1]["mode"] == "0600"
    uid_is_root = os.getuid() == 0 and os.getgid() == 0
    assert packages.file_current(files, str(written), "Types: deb\n") is uid_is_root
    assert not packages.file_current(files, str(written), "Types: deb-src\n")
    assert not packages.file_current(files, str(odd), "blacklist nouveau\n")  # mode 0600
    assert not packages.file_current(files, str(absent), "")


def test_the_toolkit_read_has_the_runtime_the_config_and_the_files(packages, node):
    _, bin_dir, tmp_path = node
    _stub(bin_dir, "containerd", 'echo "containerd containerd.io 1.6.20 2806fc1"')
    config, drop_in = tmp_path / "config.toml", tmp_path / "99-nvidia.toml"
    config.write_text('version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}

    def read(version_command: str, *args: Path | str) -> dict:
        proc = subprocess.run(["sh", "-c", TOOLKIT_SCRIPT.read_text(), "toolkit-state.sh",
                               version_command, *map(str, args)],
                              capture_output=True, text=True, env=env, check=True)
        return packages.node_read(proc.stdout)

    state = read("containerd --version", config, config, drop_in)
    assert state["version"] == {"rc": 0, "output": "containerd containerd.io 1.6.20 2806fc1"}
    assert state["contents"] == {str(config): config.read_text()}
    assert [f["path"] for f in state["files"]] == [str(config)]  # the drop-in is not there
    state = read("crio --version", tmp_path / "missing.toml")
    assert state["version"]["rc"] == 127 and "crio" in state["version"]["output"]
    assert state["contents"] == {} and state["unreadable"] == []


def test_the_dpkg_lines_are_parsed_as_the_probe_parses_them(packages):
    line = "nvidia-smi\t535.261.03-1\thold ok installed"
    state = packages.node_read(f"pkg\t{line}\n")
    assert [{"name": n, **p} for n, p in state["packages"].items()] == \
        probe_packages.parse_dpkg_query(line)


def test_missing_packages_honour_state_and_pinned_version(packages):
    installed = {"a": {"version": "535.261.03-1~deb12u1", "state": "installed"},
                 "b": {"version": "535.261.03-1~deb12u1", "state": "half-configured"}}
    assert packages.packages_missing(["a", "b", "c"], installed) == ["b", "c"]
    assert packages.packages_missing(["a"], installed, version="535.261.03-1~deb12u1") == []
    assert packages.packages_missing(["a"], installed, version="535.261.03*") == []
    assert packages.packages_missing(["a"], installed, version="535.261.03") == ["a"]
    assert packages.packages_missing(["a"], installed, version="470.256.02-1") == ["a"]


def test_missing_packages_read_the_probe_list_too(packages):
    probe_list = [{"name": "nvidia-container-toolkit", "version": "1.17.8-1",
                   "state": "installed", "held": False}]
    names = ["nvidia-container-toolkit", "libnvidia-container1"]
    assert packages.packages_missing(names, probe_list) == ["libnvidia-container1"]
    assert packages.packages_missing(names[:1], probe_list, version="1.17.7-1") == names[:1]


@pytest.mark.parametrize("names, pkgs", [("nvidia-smi", {}), (["a"], "text"), (["a"], 3)])
def test_missing_packages_refuse_bad_input(packages, names, pkgs):
    with pytest.raises(AnsibleFilterError, match="gpuprov_packages_missing expects"):
        packages.packages_missing(names, pkgs)


def test_package_facts_become_packages_by_name(packages):
    facts = {"nvidia-persistenced": [{"version": "535.154.05", "release": "1.el9", "epoch": 3}],
             "kernel": [{"version": "5.14.0", "release": "427.el9", "epoch": None}]}
    assert packages.package_facts(facts) == {
        "nvidia-persistenced": {"version": "3:535.154.05-1.el9", "state": "installed",
                                "held": False},
        "kernel": {"version": "5.14.0-427.el9", "state": "installed", "held": False},
    }


def test_driver_state_refuses_what_is_not_text(packages):
    with pytest.raises(AnsibleFilterError, match="expects the script's stdout"):
        packages.node_read(None)


def test_allocatable_gpus_per_named_node(kube):
    nodes = [{"metadata": {"name": "gpu-a"}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}},
             {"metadata": {"name": "gpu-b"}, "status": {"allocatable": {"cpu": "8"}}}]
    assert kube.allocatable_gpus(["gpu-a", "gpu-b", "gpu-c"], nodes) == {
        "gpu-a": "4", "gpu-b": "0", "gpu-c": "0"}
    with pytest.raises(AnsibleFilterError, match="list of Node objects"):
        kube.allocatable_gpus(["gpu-a"], {"items": nodes})
