"""The repository as the Ansible collection gpuprov.cluster, used from another project's
playbook (issue 31): `ansible-galaxy collection build` of the checkout, `ansible-galaxy
collection install` of the tarball into a temporary path, and a playbook in a directory of its
own (no gpuprov ansible.cfg, no plugin paths: ANSIBLE_COLLECTIONS_PATH only, and the JSON
callback to read the result) that runs the roles by their FQCN against the session lab:
gpuprov.cluster.gpu_preflight, then gpuprov.cluster.nvidia_driver in check mode, next to
another collection's content. community.general and kubernetes.core, the collections an admin
has beside gpuprov, ship no roles; kubernetes.core's k8s_info module reads the Node in the same
play. The build is checked against galaxy.yml's promise: collection content only.

Real: ansible-galaxy, Ansible, SSH, the nodes' apt and dpkg; simulated as everywhere in the lab
(gpuprov/lab/SIMULATION.md): the GPUs, the Kubernetes API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO, playbook_failures

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent
NODE = "gpu-pascal"
# What the build may hold of the gpuprov Python package: what the modules' module_utils link
# to (plugins/module_utils/gpuprov), shipped to the nodes.
PACKAGE_PARTS = ("gpuprov/__init__.py", "gpuprov/node/", "gpuprov/nvidia/")


def _run(*argv: str, env: dict | None = None, cwd: Path | None = None):
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=900,
                          check=False)


def _outside_env(**extra: str) -> dict:
    """The environment of a user outside the checkout: no ANSIBLE_* setting of gpuprov's (the
    commands run in a directory without ansible.cfg), only what `extra` sets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def collection(tmp_path_factory) -> dict:
    """The built tarball, its member names, the install path and both commands' output."""
    tmp = tmp_path_factory.mktemp("collection")
    build = _run(str(BIN / "ansible-galaxy"), "collection", "build", str(REPO),
                 "--output-path", str(tmp / "dist"), env=_outside_env(), cwd=tmp)
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = (tmp / "dist").glob("gpuprov-cluster-*.tar.gz")
    with tarfile.open(tarball) as archive:
        names = archive.getnames()
    # --force: a gpuprov.cluster found on the user's own collection paths must not stand in.
    install = _run(str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "--force",
                   str(tarball), "-p", str(tmp / "collections"), env=_outside_env(), cwd=tmp)
    assert install.returncode == 0, install.stdout + install.stderr
    installed = tmp / "collections" / "ansible_collections" / "gpuprov" / "cluster"
    assert (installed / "MANIFEST.json").is_file(), install.stdout + install.stderr
    print(build.stdout + install.stdout)
    return {"tarball": tarball, "names": names, "path": tmp / "collections",
            "output": build.stdout + install.stdout}


def test_the_build_holds_collection_content_only(collection):
    names = collection["names"]
    for wanted in ("MANIFEST.json", "meta/runtime.yml", "roles/nvidia_driver/tasks/main.yml",
                   "plugins/filter/nvidia_driver.py", "plugins/plugin_utils/gpuprov_support.py",
                   "playbooks/site.yml", "gpuprov/node/probe/report.py",
                   "templates/nvidia-device-plugin.yml.j2"):
        assert wanted in names, wanted
    for name in names:
        assert not name.startswith(("tests/", "molecule/", "bench/", "collections/", "scripts/",
                                    "gpuprov/lab/", ".")), name
        if name.startswith("gpuprov/"):
            # Directories are members too, without a trailing slash.
            assert f"{name}/".startswith(PACKAGE_PARTS) or name.startswith(PACKAGE_PARTS), \
                f"{name}: not collection content (galaxy.yml)"
    assert "ansible.cfg" not in names and "pyproject.toml" not in names


@pytest.fixture(scope="module")
def outside_run(collection, lab, site_run, tmp_path_factory):
    """The playbook of another project, in a directory of its own, on the converged lab."""
    rc, _ = site_run
    assert rc == 0, "site.yml failed: the lab is not converged"
    project = tmp_path_factory.mktemp("other-project")
    playbook = project / "gpu.yml"
    playbook.write_text(yaml.safe_dump([
        {"name": "Preflight from the installed collection", "hosts": NODE,
         "gather_facts": True, "gather_subset": ["min"],
         "roles": [{"role": "gpuprov.cluster.gpu_preflight"}]},
        {"name": "Driver role in check mode, beside another collection's module", "hosts": NODE,
         "gather_facts": False, "check_mode": True,
         "tasks": [
             {"name": "Read the node with kubernetes.core",
              "kubernetes.core.k8s_info": {"kind": "Node", "name": NODE,
                                           "kubeconfig": "{{ k8s_kubeconfig }}"},
              "delegate_to": "localhost", "register": "node_read"},
             {"name": "Check the driver", "ansible.builtin.include_role": {
                 "name": "gpuprov.cluster.nvidia_driver"}}]},
    ], sort_keys=False))
    env = _outside_env(ANSIBLE_COLLECTIONS_PATH=str(collection["path"]),
                       ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    assert not (project / "ansible.cfg").exists()
    proc = _run(str(BIN / "ansible-playbook"), "-i", str(lab.inventory_path), str(playbook),
                env=env, cwd=project)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}") from None
    return proc.returncode, doc, proc.stderr


def _tasks(doc: dict) -> dict[str, dict]:
    return {task["task"]["name"]: task["hosts"].get(NODE, {})
            for play in doc["plays"] for task in play["tasks"]}


def test_another_projects_playbook_runs_the_roles_by_fqcn(outside_run, collection):
    rc, doc, stderr = outside_run
    assert rc == 0, playbook_failures(doc) + stderr[-2000:]
    tasks = _tasks(doc)
    # The roles came from the installed collection: Ansible names their tasks by the role's
    # FQCN (a role from roles_path would be "gpu_preflight : ...").
    preflight = "gpuprov.cluster.gpu_preflight : "
    driver = "gpuprov.cluster.nvidia_driver : "
    assert not [name for name in tasks if name.startswith(("gpu_preflight : ", "nvidia_driver : "))]
    branch = tasks[preflight + "Report the node's GPUs and driver branch"]
    assert "535" in str(branch.get("msg")), branch
    assert driver + "Assert that the settings fit the node's OS, GPUs and branch" in tasks
    assert any(name.startswith(driver + "Install") for name in tasks), sorted(tasks)
    assert tasks["Read the node with kubernetes.core"]["resources"][0]["metadata"]["name"] == NODE
    # Check mode on the converged node: the driver role would change nothing.
    assert doc["stats"][NODE]["changed"] == 0, doc["stats"]
    assert doc["stats"][NODE]["failures"] == 0
    # The run, as the report shows it (pytest -s).
    for play in doc["plays"]:
        print(f"PLAY [{play['play']['name']}]")
        for task in play["tasks"]:
            result = task["hosts"].get(NODE, {})
            status = ("skipped" if result.get("skipped") else
                      "changed" if result.get("changed") else "ok")
            print(f"  {status:8} {task['task']['name']}")
    print(f"stats: {doc['stats']}")
