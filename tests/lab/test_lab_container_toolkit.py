"""playbooks/container_toolkit.yml on the lab: the toolkit from the lab's signed local
repository (gpuprov/lab/pkgrepo.py, mounted read-only in every node) through the role's
repository settings, NVIDIA's runtime merged into each GPU node's real containerd, and the
lab's emulated device plugin registration (one parser: the probe) seeing it.

Runs after the session's first site.yml run (site_run), so that whichever stages site.yml has
by then, this stage is checked on top of them, then run again to prove it changes nothing.
"""

from __future__ import annotations

import pytest
import tomllib
from conftest import playbook_failures

from gpuprov.lab.kube.backend import LabBackend

GPU_NODES = ["gpu-kepler", "gpu-pascal", "gpu-hopper"]


@pytest.fixture(scope="module")
def toolkit_runs(site_run, playbook):
    return playbook("playbooks/container_toolkit.yml"), playbook("playbooks/container_toolkit.yml")


def test_stage_runs_and_a_second_run_changes_nothing(toolkit_runs):
    (rc, first), (rc2, second) = toolkit_runs
    assert rc == 0, playbook_failures(first)
    assert rc2 == 0, playbook_failures(second)
    assert {h: s["changed"] for h, s in second["stats"].items()} == dict.fromkeys(GPU_NODES, 0)


@pytest.mark.parametrize("name", GPU_NODES)
def test_gpu_node_runs_nvidia_runtime_from_the_local_repository(toolkit_runs, lab,
                                                                node_connection, name):
    conn = node_connection(name)
    run = lambda cmd: conn.run(cmd, hide=True, in_stream=False).stdout  # noqa: E731
    assert run("nvidia-ctk --version").startswith("NVIDIA Container Toolkit CLI version 1.20.1")
    assert "file:/srv/gpuprov-lab-repo/stable/deb/amd64" in run(
        "apt-cache policy nvidia-container-toolkit"
    )
    # containerd itself loads the drop-in: Debian's CRI settings and NVIDIA's runtime, under
    # the CRI plugin of its config version (1.x: version 2's; 2.x: version 3's runtime plugin).
    dump = tomllib.loads(run("containerd config dump"))
    plugins = dump["plugins"]
    cri = plugins.get("io.containerd.cri.v1.runtime") or plugins["io.containerd.grpc.v1.cri"]
    assert (dump["version"] == 3) == ("io.containerd.cri.v1.runtime" in plugins)
    runtimes = cri["containerd"]["runtimes"]
    assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    # containerd 2.x can inject CDI devices: CDI mode there (nvidia_container_toolkit_mode
    # auto), NVIDIA's runtime only for the RuntimeClass; containerd 1.6: NVIDIA's as default.
    cdi = dump["version"] == 3
    default = "runc" if cdi else "nvidia"
    assert cri["containerd"]["default_runtime_name"] == default
    assert cri.get("enable_cdi", False) is cdi  # 1.6 has no CDI (no key)
    assert "/usr/lib/cni" in [cri["cni"].get("bin_dir"), *(cri["cni"].get("bin_dirs") or [])]
    assert "Server:" in run("ctr version")
    # What the emulated device plugin registration decides from: the probe's runtime section,
    # read from the host in the node's root.
    config = LabBackend(lab.dir).runtime(name)
    assert config.runtime == "containerd" and config.default_handler == default
    assert config.handler_is_nvidia(None) is not cdi and "nvidia" in config.nvidia_handlers


def test_cpu_node_is_left_alone(toolkit_runs, node_connection):
    out = node_connection("cpu-only").run(
        "ls /etc/apt/sources.list.d /etc/containerd; "
        "dpkg-query -W nvidia-container-toolkit 2>&1 || true",
        hide=True, in_stream=False,
    ).stdout
    assert "nvidia-container-toolkit.sources" not in out
    assert "conf.d" not in out and "no packages found" in out
