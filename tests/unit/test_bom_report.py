"""gpuprov bom's reading of what apt says (recorded from a real Debian 12 apt, tests/fixtures/
bom/: `apt-get -s -o Dir::State::status=/dev/null --no-install-recommends install curl` and
`apt-cache policy` of the packages it lists), and of playbooks/bom.yml's result; the lab test
(tests/lab/test_bom.py) runs the playbook on real nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov import bom, cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bom"
SIMULATE = (FIXTURES / "debian12-apt-simulate-curl.txt").read_text()
# On the same machine, where curl is installed: apt-cache depends --recurse ... curl, and
# apt-cache policy of the packages it lists.
DEPENDS = (FIXTURES / "debian12-apt-depends-curl.txt").read_text()
CLOSURE_POLICY = (FIXTURES / "debian12-apt-policy-curl-closure.txt").read_text()
POLICY = (FIXTURES / "debian12-apt-policy-curl.txt").read_text()


def test_parse_simulation_reads_every_inst_line():
    installs = bom.parse_simulation(SIMULATE)
    assert len(installs) == SIMULATE.count("\nInst ") + SIMULATE.startswith("Inst ")
    curl = next(i for i in installs if i["name"] == "curl")
    assert curl["arch"] == "amd64" and curl["origin"].startswith("Debian:12")
    assert all(i["version"] and " " not in i["version"] for i in installs)


def test_parse_simulation_with_an_installed_version_in_brackets():
    line = "Inst bash [5.2.15-2+b8] (5.2.15-2+b13 Debian:12.15/oldstable [amd64])"
    assert bom.parse_simulation(line) == [{"name": "bash", "version": "5.2.15-2+b13",
                                           "origin": "Debian:12.15/oldstable", "arch": "amd64"}]


def test_parse_policy_gives_each_version_its_repositories_not_dpkgs_status():
    policy = bom.parse_policy(POLICY)
    installs = bom.parse_simulation(SIMULATE)
    assert {i["name"] for i in installs} <= set(policy)
    for item in installs:
        sources = policy[item["name"]][item["version"]]
        assert sources and all(s.startswith(("http://", "https://", "file:")) for s in sources)
    assert policy["libc6"][next(i["version"] for i in installs if i["name"] == "libc6")][0] \
        == "http://deb.debian.org/debian bookworm/main amd64"


def test_parse_depends_lists_the_closure_without_virtual_packages():
    closure = bom.parse_depends(DEPENDS)
    assert closure[0] == "curl" and "libc6" in closure and "libcurl4" in closure
    assert len(closure) == len(set(closure))
    assert not any(name.startswith(("<", " ", "|")) for name in closure)


def test_a_converged_node_lists_its_closure_at_the_installed_versions():
    """Nothing left to install (apt-get -s lists nothing): the closure the node has, each at
    its installed version, from the repository that offers that version."""
    record = bom.node(_materials(apt_simulate="", apt_depends=DEPENDS,
                                 apt_policy=CLOSURE_POLICY))
    policy = bom.parse_policy(CLOSURE_POLICY)
    by_name = {p["name"]: p for p in record["packages"]}
    # Alternatives and providers the machine does not have are not listed.
    have = {n for n in bom.parse_depends(DEPENDS) if policy.get(n, {}).get(bom.INSTALLED)}
    assert set(by_name) == have
    for name, item in by_name.items():
        assert item["version"] == policy[name][bom.INSTALLED][0]
        sources = policy[name].get(item["version"]) or [None]
        assert item["repository"] == sources[0]
    # This machine's curl, 7.88.1-10+deb12u14, is no longer offered (the archive has u15): no
    # repository, not a guess; libc6's is.
    assert by_name["curl"]["repository"] is None
    assert by_name["libc6"]["repository"] == "http://deb.debian.org/debian bookworm/main amd64"


def _materials(**overrides) -> dict:
    return {"has_gpu": True, "os": "Debian 12.7", "package_manager": "apt", "branch": 580,
            "driver_source": "nvidia", "driver_packages": ["curl"],
            "cuda_repo_url": "http://deb.debian.org/debian",
            "cuda_repo_key_url": "http://deb.debian.org/debian/3bf863cc.pub",
            "toolkit_packages": ["libcurl4=7.88.1-10+deb12u14"],
            "toolkit_repo_url": "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)",
            "toolkit_repo_key_url": "https://nvidia.github.io/libnvidia-container/gpgkey",
            "apt_simulate": SIMULATE, "apt_depends": "", "apt_policy": POLICY, "objects": [],
            "smoke_image": "docker.io/library/ubuntu:24.04", **overrides}


def test_a_node_lists_every_package_at_aps_version_with_repository_and_key():
    record = bom.node(_materials())
    by_name = {p["name"]: p for p in record["packages"]}
    assert len(by_name) == len(bom.parse_simulation(SIMULATE))
    assert by_name["curl"]["named"] and by_name["libcurl4"]["named"]
    assert not by_name["libc6"]["named"]
    # Here the "NVIDIA repository" is Debian's archive URL: its key applies.
    assert by_name["curl"]["key"] == "http://deb.debian.org/debian/3bf863cc.pub"
    assert record["files"] == ["http://deb.debian.org/debian/3bf863cc.pub",
                               "https://nvidia.github.io/libnvidia-container/gpgkey"]


def _doc(hosts: dict) -> dict:
    """An ansible.posix.json document: a failed preflight task and the result task."""
    failed = {h: r for h, r in hosts.items() if r.get("failed") or r.get("unreachable")}
    ok = {h: r for h, r in hosts.items() if h not in failed}
    return {"plays": [{"tasks": [
        {"task": {"name": "gpu_preflight : Assert that a driver branch drives the GPUs"},
         "hosts": failed},
        {"task": {"name": bom.RESULT_TASK}, "hosts": ok}]}]}


def test_from_playbook_decides_nodes_and_says_why_others_are_undecided():
    objects = [{"kind": "DaemonSet", "spec": {"template": {"spec": {
        "initContainers": [{"image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.1"}],
        "containers": [{"image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.1"}]}}}}]
    doc = _doc({
        "gpu-a": {"msg": _materials(objects=objects)},
        "gpu-b": {"msg": _materials()},
        "gpu-k": {"failed": True, "msg": "gpu-k: Tesla K80 needs branch <= 470 ..."},
        "gpu-x": {"unreachable": True, "msg": "ssh: connect to host: Connection refused"},
        "gpu-r": {"msg": _materials(package_manager="dnf", apt_simulate=None)},
        "cpu-1": {"msg": _materials(has_gpu=False)},
    })
    result = bom.from_playbook(doc, 2)
    assert sorted(result["nodes"]) == ["gpu-a", "gpu-b"]
    assert result["undecided"] == {
        "gpu-k": "gpu_preflight : Assert that a driver branch drives the GPUs: gpu-k: Tesla "
                 "K80 needs branch <= 470 ...",
        "gpu-r": "package manager 'dnf': no apt or dnf answer for this node (gpuprov bom asks "
                 "apt and dnf only)",
        "gpu-x": "unreachable: ssh: connect to host: Connection refused"}
    mirror = result["mirror"]
    # Two nodes, one list: each package and repository once.
    assert len(mirror["packages"]) == len(bom.parse_simulation(SIMULATE))
    assert len({r["repository"] for r in mirror["repositories"]}) == \
        len(mirror["repositories"])
    assert mirror["images"] == ["docker.io/library/ubuntu:24.04",
                                "nvcr.io/nvidia/k8s-device-plugin:v0.20.1"]


def test_bom_without_an_inventory_file_is_one_line_exit_2(tmp_path, capsys):
    assert cli.main(["bom", "-i", str(tmp_path / "missing.yml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "inventory" in err and "not found" in err


@pytest.mark.parametrize("argv", [["bom", "--json", "--limit"]])
def test_bom_usage_errors_exit_2(argv, capsys):
    assert cli.main(argv) == 2
