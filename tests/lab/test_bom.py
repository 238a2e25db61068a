"""`gpuprov bom` on the converged session lab (issue 32): it lists every NVIDIA package
site.yml installed on each GPU node, at the installed version, and no package that none of the
nodes has; nothing on the nodes changes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import connect, installed_packages, node_state, node_target

pytestmark = pytest.mark.lab

GPU_NODES = ("gpu-kepler", "gpu-pascal", "gpu-hopper")
# NVIDIA's packages by name, as Debian's archive and NVIDIA's repositories name them
# (nvidia-kernel-dkms, nvidia-tesla-470-*, libnvidia-ml1, libcuda1, firmware-nvidia-gsp,
# nvidia-container-toolkit, libnvidia-container1, nvidia-driver-pinning-580, ...): read from
# dpkg on each node, independently of what bom says.
NVIDIA = re.compile(r"^(nvidia-|libnvidia-|libcuda|firmware-nvidia-)")


@pytest.fixture(scope="module")
def converged(site_run):
    rc, _ = site_run
    assert rc == 0, "site.yml failed on the lab; see test_site_playbook"


@pytest.fixture(scope="module")
def bom_run(lab, converged):
    before = node_state(lab)
    proc = subprocess.run([sys.executable, "-m", "gpuprov", "bom", "-i", str(lab.inventory_path),
                           "--json"], capture_output=True, text=True, timeout=900, check=False)
    table = subprocess.run([sys.executable, "-m", "gpuprov", "bom", "-i",
                            str(lab.inventory_path)], capture_output=True, text=True,
                           timeout=900, check=False)
    print(table.stdout + table.stderr)
    return proc, json.loads(proc.stdout or "{}"), before, node_state(lab)


@pytest.fixture(scope="module")
def installed(lab, converged):
    out = {}
    for node in GPU_NODES:
        with connect(node_target(lab, node)) as conn:
            out[node] = {name: version for name, (version, _) in installed_packages(conn).items()}
    return out


def test_every_gpu_node_is_decided_and_nothing_changed(bom_run):
    proc, doc, before, after = bom_run
    assert proc.returncode == 0, proc.stderr
    assert doc["schema_version"] == 1 and doc["undecided"] == {}
    assert sorted(doc["nodes"]) == sorted(GPU_NODES)
    assert before == after  # packages, selections and the roles' files, on every node


@pytest.mark.parametrize("node", GPU_NODES)
def test_every_nvidia_package_site_yml_installed_is_listed_at_its_version(bom_run, installed,
                                                                           node):
    _, doc, _, _ = bom_run
    listed = {p["name"]: p["version"] for p in doc["nodes"][node]["packages"]}
    nvidia = {name: version for name, version in installed[node].items() if NVIDIA.match(name)}
    assert nvidia, f"{node}: no NVIDIA package installed?"
    assert {n: listed.get(n) for n in nvidia} == nvidia


def test_no_package_that_no_node_has(bom_run, installed):
    _, doc, _, _ = bom_run
    everywhere = set().union(*(set(p) for p in installed.values()))
    listed = {p["name"] for p in doc["mirror"]["packages"]}
    assert listed and listed - everywhere == set()


def test_the_mirror_list_names_repositories_keys_images_and_files(bom_run):
    _, doc, _, _ = bom_run
    mirror = doc["mirror"]
    repos = {r["repository"]: r["key"] for r in mirror["repositories"]}
    # NVIDIA's repositories as the lab's mirrors of them serve, with their keys.
    cuda = [r for r in repos if r.startswith("file:/srv/gpuprov-lab-cuda/debian13/x86_64")]
    toolkit = [r for r in repos if r.startswith("file:/srv/gpuprov-lab-repo/stable/deb/amd64")]
    assert cuda and toolkit, repos
    assert repos[cuda[0]] == "file:///srv/gpuprov-lab-cuda/debian13/x86_64/8793F200.pub"
    assert repos[toolkit[0]] == "file:///srv/gpuprov-lab-repo/gpgkey"
    assert any(i.startswith("nvcr.io/nvidia/k8s-device-plugin:") for i in mirror["images"])
    assert set(mirror["files"]) == {repos[cuda[0]], repos[toolkit[0]]}
    # One entry per package version, however many nodes need it.
    keys = [(p["name"], p["version"], p["arch"]) for p in mirror["packages"]]
    assert len(keys) == len(set(keys))
