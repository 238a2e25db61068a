"""The inventory through Ansible's API: connection variables as Ansible resolves them,
--limit, and one-line errors for bad input."""

from __future__ import annotations

import getpass
import textwrap
from pathlib import Path

import pytest

from gpuprov.errors import ExitCode, GpuprovError
from gpuprov.verify import inventory

HOSTS = """\
all:
  vars:
    ansible_user: deploy
    k8s_kubeconfig: /etc/kubernetes/admin.conf
    nvidia_device_plugin_smoke_image: registry.example/cuda:12.4.1-base-ubuntu22.04
  children:
    k8s_cluster:
      children:
        gpu_nodes:
          hosts:
            gpu-a:
              ansible_host: 10.0.0.1
              ansible_port: 2222
              nvidia_driver_branch: 470
              ansible_ssh_private_key_file: /keys/id_ed25519
            gpu-b:
              ansible_ssh_common_args: "-oStrictHostKeyChecking=no"
        cpu_nodes:
          hosts:
            cpu-a:
              ansible_connection: local
    other:
      hosts:
        not-a-node: {}
"""
CONNECTION = """\
ansible_ssh_common_args: >-
  -o UserKnownHostsFile={{ inventory_dir }}/known_hosts -o StrictHostKeyChecking=yes
"""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "group_vars" / "all" / "connection.yml").write_text(CONNECTION)
    (tmp_path / "hosts.yml").write_text(HOSTS)
    return tmp_path / "hosts.yml"


def test_hosts_and_their_connection_settings(site):
    nodes = {n.name: n for n in inventory.load(str(site))}
    assert list(nodes) == ["gpu-a", "gpu-b", "cpu-a"]  # not-a-node is in neither group
    a = nodes["gpu-a"]
    assert (a.target.host, a.target.port, a.target.user, a.target.key_file) == (
        "10.0.0.1", 2222, "deploy", "/keys/id_ed25519")
    # group_vars templated as Ansible does ({{ inventory_dir }})
    assert a.target.known_hosts == str(site.parent / "known_hosts")
    assert a.target.check_host_keys is True
    assert (a.gpu_expected, a.driver_branch_pin, a.kubeconfig) == (
        True, "470", "/etc/kubernetes/admin.conf")
    # host vars override group vars: no known_hosts, checking explicitly off
    b = nodes["gpu-b"]
    assert (b.target.host, b.target.port, b.target.known_hosts, b.target.check_host_keys) == (
        "gpu-b", 22, None, False)
    assert nodes["cpu-a"].local and not nodes["cpu-a"].gpu_expected
    # The role's smoke test image is verify's default for its smoke pods (a mirror, a lab).
    assert {n.smoke_image for n in nodes.values()} == {
        "registry.example/cuda:12.4.1-base-ubuntu22.04"}


@pytest.mark.parametrize(("limit", "names"), [
    ("gpu_nodes", ["gpu-a", "gpu-b"]),
    ("gpu-b", ["gpu-b"]),
    ("*-a", ["gpu-a", "cpu-a"]),
    ("all:!gpu-a", ["gpu-b", "cpu-a"]),
])
def test_limit_uses_ansible_patterns(site, limit, names):
    assert [n.name for n in inventory.load(str(site), limit)] == names


@pytest.mark.parametrize(("content", "limit", "words"), [
    (None, None, "does not exist"),
    ("all:\n  hosts:\n    a: [\n", None, "cannot parse inventory"),
    ("all:\n  hosts:\n    lonely: {}\n", None,
     "has no group gpu_nodes, k8s_cluster or docker_hosts"),
    (HOSTS, "nothing-like-this", "--limit 'nothing-like-this' matches none of the 3 hosts"),
    (HOSTS.replace("2222", "twenty"), None, "ansible_port 'twenty' is not a number"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, content, limit, words):
    path = tmp_path / "hosts.yml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(GpuprovError) as err:
        inventory.load(str(path), limit)
    assert words in err.value.message and "\n" not in err.value.message
    assert err.value.code == ExitCode.USAGE
    assert capsys.readouterr().err == ""  # Ansible's multi-line warnings are not shown


def test_ini_inventory_works_too(tmp_path):
    path = tmp_path / "hosts"
    path.write_text(textwrap.dedent("""\
        [gpu_nodes]
        g1 ansible_host=192.0.2.7 ansible_user=ops

        [k8s_cluster:children]
        gpu_nodes
        """))
    (node,) = inventory.load(str(path))
    assert (node.name, node.target.host, node.target.user) == ("g1", "192.0.2.7", "ops")


@pytest.mark.parametrize(("args", "known_hosts", "checking"), [
    ("-o UserKnownHostsFile=/k -o StrictHostKeyChecking=yes", "/k", True),
    ("-oUserKnownHostsFile=/k -oStrictHostKeyChecking=no", "/k", False),
    ("-o 'UserKnownHostsFile /k /k2' -o StrictHostKeyChecking=accept-new", "/k", True),
    ("-o ControlMaster=auto", None, True),
])
def test_ssh_args(args, known_hosts, checking):
    node = inventory.node_from_vars("n", {"gpu_nodes"}, {"ansible_ssh_common_args": args})
    assert (node.target.known_hosts, node.target.check_host_keys) == (known_hosts, checking)
    assert node.target.user == getpass.getuser()  # ssh's default, as Ansible's


def test_known_hosts_paths_are_expanded_as_ssh_expands_them(monkeypatch, tmp_path):
    """OpenSSH expands ~, environment variables and %-tokens in UserKnownHostsFile (what
    Ansible hands it); gpuprov reads the file itself, so it must find the same file."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SITE", "prod")
    args = "-o UserKnownHostsFile=~/.ssh/${SITE}_%h_%p_%r_%%"
    node = inventory.node_from_vars("n", {"gpu_nodes"}, {
        "ansible_ssh_common_args": args, "ansible_host": "192.0.2.7", "ansible_port": 2222,
        "ansible_user": "ops"})
    assert node.target.known_hosts == f"{tmp_path}/.ssh/prod_192.0.2.7_2222_ops_%"
    node = inventory.node_from_vars("n", {"gpu_nodes"}, {
        "ansible_ssh_common_args": "-o UserKnownHostsFile=%d/kh"})
    assert node.target.known_hosts == f"{tmp_path}/kh"


def test_host_key_checking_variable_and_config_default():
    off = inventory.node_from_vars("n", set(), {"ansible_host_key_checking": False})
    assert off.target.check_host_keys is False
    assert inventory.node_from_vars("n", set(), {}, host_key_checking_default=False) \
        .target.check_host_keys is False


def test_kubernetes_node_name_from_the_labels_role_variable(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n        gpu1:\n"
                    "          gpu_node_labels_node_name: gpu1.cluster.local\n        gpu2: {}\n")
    nodes = {n.name: n for n in inventory.load(str(path))}
    assert nodes["gpu1"].node_name == "gpu1.cluster.local"
    assert nodes["gpu2"].node_name == "gpu2"


def test_host_vars_and_extra_vars_take_the_place_of_the_inventorys_settings(site):
    # What the gpu_verify role hands over (--host-vars, Ansible's resolved values), then -e.
    nodes = {n.name: n for n in inventory.load(
        str(site), host_vars={"gpu-a": {"gpu_mig_config": "all-1g.10gb",
                                        "nvidia_driver_branch": "535",
                                        "ansible_host": "10.9.9.9"}},
        extra_vars={"nvidia_device_plugin_mig_strategy": "mixed"})}
    a, b = nodes["gpu-a"], nodes["gpu-b"]
    assert (a.mig_config, a.driver_branch_pin, a.mig_strategy) == ("all-1g.10gb", "535", "mixed")
    assert (b.mig_config, b.driver_branch_pin, b.mig_strategy) == (None, None, "mixed")
    assert a.target.host == "10.0.0.1"  # how to connect is not a setting: the inventory's


@pytest.mark.parametrize(("argv", "expected"), [
    (["-e", "gpu_mig_config=all-1g.10gb nvidia_device_plugin_mig_strategy=mixed"],
     {"gpu_mig_config": "all-1g.10gb", "nvidia_device_plugin_mig_strategy": "mixed"}),
    (["-e", '{"gpu_mig_config": "all-balanced"}', "-e", "gpu_mig_config=all-disabled"],
     {"gpu_mig_config": "all-disabled"}),
])
def test_verify_takes_extra_vars_as_ansible_playbook_does(argv, expected):
    from gpuprov.commands import verify as command

    extra = {}
    for flag, text in zip(argv[::2], argv[1::2], strict=True):
        assert flag == "-e"
        extra.update(command._vars_argument(flag, text))
    assert extra == expected


@pytest.mark.parametrize("text", ["[1, 2]", "@/nonexistent/vars.yml", "{unclosed"])
def test_bad_extra_vars_are_one_line(text):
    from gpuprov.commands import verify as command
    from gpuprov.errors import GpuprovError

    with pytest.raises(GpuprovError) as error:
        command._vars_argument("-e", text)
    assert "\n" not in str(error.value) and str(error.value).startswith("-e")
