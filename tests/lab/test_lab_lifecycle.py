"""The lab itself: nodes up, SSH with host key checking, inventory, status, up twice, down."""

from __future__ import annotations

import json
import subprocess

import yaml

from gpuprov.cli import main
from gpuprov.lab import profiles
from gpuprov.lab.lab import Lab


def test_default_lab_has_the_four_reference_nodes(lab_state):
    assert [(n.name, n.profile) for n in lab_state.nodes] == [
        ("gpu-kepler", "gpu-kepler"),
        ("gpu-pascal", "gpu-pascal"),
        ("gpu-hopper", "gpu-hopper"),
        ("cpu-only", "cpu-only"),
    ]
    assert len({n.ssh_port for n in lab_state.nodes}) == 4


# Written out: the mixed lab the issue asks for (Debian 12 with its containerd 1.6, Debian 13
# with containerd 2.x from unstable).
NODE_OS = {"gpu-kepler": ("12", "1.6."), "gpu-pascal": ("12", "1.6."),
           "gpu-hopper": ("13", "2."), "cpu-only": ("12", "1.6.")}


def test_each_node_runs_its_profiles_os_and_containerd(lab, lab_state):
    for node in lab_state.nodes:
        proc = subprocess.run(
            lab.ssh_command(node, ". /etc/os-release; echo $VERSION_ID; containerd --version"),
            capture_output=True, text=True, timeout=60, check=False)
        version_id, containerd = proc.stdout.splitlines()
        want_os, want_containerd = NODE_OS[node.name]
        assert version_id == want_os and node.os == f"debian-{want_os}", (node.name, version_id)
        assert containerd.split()[2].startswith(want_containerd), (node.name, containerd)


def test_nodes_answer_ssh_with_host_key_checking_and_run_systemd(lab, lab_state):
    for node in lab_state.nodes:
        proc = subprocess.run(
            lab.ssh_command(node, "hostname; systemctl is-system-running --wait; "
                                  "systemctl --failed --no-legend --plain"),
            capture_output=True, text=True, timeout=60, check=False,
        )
        # Later tests (site.yml) install services: none of them may leave a failed unit.
        assert proc.stdout.split() == [node.name, "running"], proc.stdout + proc.stderr


def test_a_wrong_host_key_is_refused(lab, lab_state, tmp_path):
    node = lab_state.nodes[0]
    other = lab_state.nodes[1]
    wrong = tmp_path / "known_hosts"
    key = (lab.node_dir(other.name) / "ssh_host_ed25519_key.pub").read_text().split()
    wrong.write_text(f"[127.0.0.1]:{node.ssh_port} {key[0]} {key[1]}\n")
    cmd = lab.ssh_command(node, "true")
    cmd[cmd.index(f"UserKnownHostsFile={lab.known_hosts_path}")] = f"UserKnownHostsFile={wrong}"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255
    assert "host key" in proc.stderr.lower()


def test_inventory_groups_and_connection(lab, lab_state):
    doc = yaml.safe_load(lab.inventory_path.read_text())
    groups = doc["all"]["children"]["k8s_cluster"]["children"]
    assert set(groups["gpu_nodes"]["hosts"]) == {"gpu-kepler", "gpu-pascal", "gpu-hopper"}
    assert set(groups["cpu_nodes"]["hosts"]) == {"cpu-only"}
    ports = {n.name: n.ssh_port for n in lab_state.nodes}
    for group in groups.values():
        for name, hostvars in group["hosts"].items():
            assert hostvars["ansible_port"] == ports[name]
    gpu = groups["gpu_nodes"]["hosts"]
    assert [gpu[n].get("nvidia_driver_source") for n in ("gpu-kepler", "gpu-pascal")] == \
        ["distro", "distro"]
    assert (gpu["gpu-hopper"]["nvidia_driver_source"],
            gpu["gpu-hopper"]["nvidia_driver_branch"]) == ("nvidia", "580")
    common = doc["all"]["vars"]["ansible_ssh_common_args"]
    assert "StrictHostKeyChecking=yes" in common
    assert str(lab.known_hosts_path) in common


def test_ansible_reaches_every_node(lab, repo_root, tool):
    proc = subprocess.run(
        [tool("ansible"), "-i", str(lab.inventory_path), "all", "-m", "ansible.builtin.ping", "-o"],
        capture_output=True, text=True, cwd=repo_root, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == 4


def test_pci_devices_are_simulated_per_profile(lab, lab_state):
    for node in lab_state.nodes:
        expected = len(profiles.NODE_PROFILES[node.profile].gpus)
        out = subprocess.run(
            lab.ssh_command(node, "grep -l 0x10de /sys/bus/pci/devices/*/vendor | wc -l"),
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
        assert int(out) == expected


def test_status_json(lab, lab_state, capsys):
    assert main(["lab", "--dir", str(lab.project_dir), "status", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["up"] is True
    assert [n["name"] for n in doc["nodes"]] == [n.name for n in lab_state.nodes]
    for entry, node in zip(doc["nodes"], lab_state.nodes, strict=True):
        assert entry["state"] == "running"
        assert entry["ssh"] == f"127.0.0.1:{node.ssh_port}"
        assert entry["profile"] == node.profile
        assert entry["faults"] == []


def test_up_twice_is_safe_and_keeps_the_nodes(lab, lab_state):
    before = {n.name: (n.container, n.ssh_port) for n in lab_state.nodes}
    again = lab.up()
    assert {n.name: (n.container, n.ssh_port) for n in again.nodes} == before


def test_up_with_other_nodes_on_a_running_lab_is_refused(lab, capsys):
    code = main(["lab", "--dir", str(lab.project_dir), "up", "--nodes", "cpu-only"])
    assert code == 2
    assert "lab down" in capsys.readouterr().err


def test_unknown_profile_is_a_usage_error(tmp_path, capsys):
    code = main(["lab", "--dir", str(tmp_path), "up", "--nodes", "gpu-nope"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpuprov: error: unknown lab node profile 'gpu-nope'")
    assert len(err.splitlines()) == 1
    assert not (tmp_path / ".lab").exists()


def test_down_removes_its_own_lab_and_nothing_else(lab, lab_state, tmp_path):
    other = Lab(tmp_path)
    state = other.up(["spare=cpu-only"])
    container = state.nodes[0].container
    assert other.status()["nodes"][0]["state"] == "running"
    removed = other.down()
    assert removed == [container]
    assert not (tmp_path / "inventory" / "lab" / "hosts.yml").exists()
    assert other.load() is None
    # the session's lab is untouched
    assert all(n["state"] == "running" for n in lab.status()["nodes"])
