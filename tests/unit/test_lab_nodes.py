"""The lab's node list: `lab up --nodes [NAME=]PROFILE[@OS]`, the OS images it can build, and
the driver settings it writes per OS (no containers: gpuprov.lab.lab.plan_nodes and tables)."""

from __future__ import annotations

import pytest

from gpuprov.errors import GpuprovError
from gpuprov.lab import image, profiles
from gpuprov.lab.lab import DOCKER_LAB, LAB_DRIVER_SETTINGS, plan_nodes

K8S = "containerd"


def test_default_lab_mixes_debian_12_and_13():
    assert plan_nodes(profiles.DEFAULT_LAB) == [
        ("gpu-kepler", "gpu-kepler", "debian-12", K8S),
        ("gpu-pascal", "gpu-pascal", "debian-12", K8S),
        ("gpu-hopper", "gpu-hopper", "debian-13", K8S), ("cpu-only", "cpu-only", "debian-12", K8S)]


def test_a_node_spec_may_name_the_node_and_its_os():
    assert plan_nodes(["gpu-pascal@debian-13", "gpu-pascal", "h=gpu-hopper@debian-12"]) == [
        ("gpu-pascal", "gpu-pascal", "debian-13", K8S),
        ("gpu-pascal-2", "gpu-pascal", "debian-12", K8S), ("h", "gpu-hopper", "debian-12", K8S)]


def test_with_docker_adds_a_docker_host_per_docker_generation():
    """Debian 12's docker.io 20.10 (NVIDIA's hook) and Debian 13's 26.1 (CDI)."""
    assert plan_nodes(DOCKER_LAB) == [("docker-12", "gpu-pascal", "debian-12", "docker"),
                                      ("docker-13", "gpu-hopper", "debian-13", "docker")]


def test_an_engine_other_than_docker_is_one_clear_error():
    with pytest.raises(GpuprovError, match=r"the only engine after '\+' is docker"):
        plan_nodes(["gpu-pascal+podman"])


def test_an_os_the_lab_cannot_build_is_one_clear_error():
    with pytest.raises(GpuprovError, match="cannot build node OS 'ubuntu-24.04'; it builds: "
                                           "debian-12, debian-13"):
        plan_nodes(["gpu-pascal@ubuntu-24.04"])


def test_every_os_has_its_own_image_and_driver_settings():
    assert len({image.node_ref(name) for name in image.NODE_OSES}) == len(image.NODE_OSES)
    assert set(LAB_DRIVER_SETTINGS) == set(image.NODE_OSES)
    assert {p.os for p in profiles.NODE_PROFILES.values()} <= set(image.NODE_OSES)
    # The roles' names for the settings the lab writes.
    for settings in LAB_DRIVER_SETTINGS.values():
        assert set(settings) <= {"nvidia_driver_source", "nvidia_driver_branch",
                                 "nvidia_driver_allow_vulnerable"}
        assert settings["nvidia_driver_source"] in ("distro", "nvidia")


@pytest.mark.parametrize(("value", "shares"), [(None, None), ("", None), ("512", 512),
                                               ("2", 2), ("262144", 262144)])
def test_the_nodes_cpu_weight_comes_from_the_environment(monkeypatch, value, shares):
    from gpuprov.lab.lab import Lab

    if value is None:
        monkeypatch.delenv("GPUPROV_LAB_CPU_SHARES", raising=False)
    else:
        monkeypatch.setenv("GPUPROV_LAB_CPU_SHARES", value)
    assert Lab.cpu_shares() == shares


@pytest.mark.parametrize("value", ["half", "1", "0", "-5", "262145", "1.5"])
def test_a_cpu_weight_the_kernel_refuses_is_one_clear_error(monkeypatch, value):
    from gpuprov.lab.lab import Lab

    monkeypatch.setenv("GPUPROV_LAB_CPU_SHARES", value)
    with pytest.raises(GpuprovError, match=r"GPUPROV_LAB_CPU_SHARES=.* is not a CPU weight: "
                                           r"give a whole number from 2 to 262144"):
        Lab.cpu_shares()
