"""The nvidia_container_toolkit role's decisions (gpuprov/stages/nvidia_container_toolkit.py), as
the role calls them through plugins/filter/nvidia_container_toolkit.py, with the role's own data
(vars/main.yml, defaults/main.yml)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from test_runtime_mode import SPEC

from gpuprov.stages import nvidia_container_toolkit

ROLE = Path(__file__).resolve().parents[2] / "roles" / "nvidia_container_toolkit"
DATA = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
SOURCES = "Types: deb\nURIs: https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)\n"


def _settings(**overrides) -> dict:
    settings = {
        "host": "gpu-a", "os_name": "Debian", "os_version": "12", "package_manager": "apt",
        "packages": DATA["__nvidia_container_toolkit_packages"],
        "version": DEFAULTS["nvidia_container_toolkit_version"],
        "runtimes": DATA["__nvidia_container_toolkit_runtimes"],
        "apt_sources_path": DATA["__nvidia_container_toolkit_apt_sources_path"],
    }
    return {**settings, **overrides}


@pytest.fixture(scope="module")
def toolkit(ansible_plugin):
    return ansible_plugin("filter/nvidia_container_toolkit.py")


def test_the_plan_pins_all_four_packages_and_names_the_files(toolkit):
    plan = toolkit.gpuprov_toolkit_plan(_settings())
    version = DEFAULTS["nvidia_container_toolkit_version"]
    assert plan["install_names"] == [f"{n}={version}" for n in
                                     DATA["__nvidia_container_toolkit_packages"]]
    assert plan["runtime"]["installed"] == ["containerd", "--version"]
    assert plan["written_files"] == [
        "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg",
        "/etc/apt/sources.list.d/nvidia-container-toolkit.sources",
        "/etc/containerd/conf.d/99-nvidia.toml"]
    assert plan["read_configs"] == ["/etc/containerd/config.toml",
                                    "/etc/nvidia-container-runtime/config.toml",
                                    "/var/run/cdi/nvidia.yaml"]
    assert plan["key_source"] == "/usr/share/keyrings/nvidia-container-toolkit-keyring.asc"
    assert plan["problem"] is None


def test_dnf_and_docker_nodes_write_and_read_other_files(toolkit):
    plan = toolkit.gpuprov_toolkit_plan(_settings(package_manager="dnf", runtime="docker",
                                          version="1.18.1-1"))
    assert plan["install_names"][0] == "nvidia-container-toolkit-1.18.1-1"
    assert plan["written_files"] == []
    assert plan["read_configs"] == ["/etc/docker/daemon.json",
                                    "/etc/nvidia-container-runtime/config.toml",
                                    "/var/run/cdi/nvidia.yaml"]


@pytest.mark.parametrize("overrides, expected", [
    ({"package_manager": None}, "Debian 12 has no data in the nvidia_container_toolkit role"),
    ({"runtime": "podman"}, "nvidia_container_toolkit_runtime must be one of containerd, docker, "
                            "crio (is podman)"),
    ({"runtime_name": "NVIDIA_runtime"}, "a RuntimeClass handler name"),
    ({"runtime_binary": "nvidia-container-runtime"}, "an absolute path"),
])
def test_setting_problems_say_what_is_wrong(toolkit, overrides, expected):
    assert expected in toolkit.gpuprov_toolkit_plan(_settings(**overrides))["problem"]


def _root_file(path: str, text: str = "", mode: str = "0644") -> dict:
    return {"path": path, "mode": mode, "uid": 0, "gid": 0,
            "checksum": hashlib.sha1(text.encode()).hexdigest()}


def test_a_converged_node_leaves_no_work(toolkit):
    plan = toolkit.gpuprov_toolkit_plan(_settings())
    version = DEFAULTS["nvidia_container_toolkit_version"]
    probe = [{"name": n, "version": version, "state": "installed", "held": True}
             for n in DATA["__nvidia_container_toolkit_packages"]]
    state = {"version": {"rc": 0, "output": "containerd github.com/containerd/containerd 1.6.20"},
             "files": [_root_file(plan["written_files"][0], "key"),
                       _root_file(plan["written_files"][1], SOURCES)],
             "contents": {"/etc/containerd/config.toml": "version = 2\n"}, "unreadable": []}
    state["contents"][plan["read_configs"][1]] = (
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"
        "accept-nvidia-visible-devices-as-volume-mounts = true\n")
    work = toolkit.gpuprov_toolkit_work(state, plan, probe, apt_sources=SOURCES)
    assert work == {"runtime_problem": None, "keyring_found": True, "keyring_ok": True,
                    "apt_sources_current": True, "repo_pending": False, "missing": [],
                    "unheld": [],
                    "containerd_text": "version = 2\n", "docker": None,
                    "config": {"text": state["contents"][plan["read_configs"][1]],
                               "changed": False},
                    # containerd 1.6: no CDI, so NVIDIA's runtime as the default.
                    "mode": "legacy", "mode_reason": "containerd 1.6 cannot inject CDI devices",
                    "set_default": True, "cdi_refresh": False}
    assert toolkit.gpuprov_toolkit_repository(work, True, False) == {"dearmor_needed": False,
                                                                     "work": False}
    # Check mode on the same node: the repository is there, nothing is pending.
    assert not toolkit.gpuprov_toolkit_work(state, plan, probe, apt_sources=SOURCES,
                                            check_mode=True)["repo_pending"]
    # Check mode where the sources file is not the role's yet: the package steps only report.
    changed = toolkit.gpuprov_toolkit_work(state, plan, probe, apt_sources=SOURCES + "# new\n",
                                           check_mode=True)
    assert not changed["apt_sources_current"] and changed["repo_pending"]
    # The role does not manage the repository: nothing of its own is pending.
    unmanaged = toolkit.gpuprov_toolkit_plan(_settings(manage_repo=False))
    assert not toolkit.gpuprov_toolkit_work(state, unmanaged, probe, check_mode=True,
                                            apt_sources=SOURCES + "# new\n")["repo_pending"]


def test_a_bare_node_needs_the_key_the_repository_and_the_packages(toolkit):
    plan = toolkit.gpuprov_toolkit_plan(_settings())
    state = {"version": {"rc": 0, "output": "containerd 1.6.20"}, "files": [], "contents": {},
             "unreadable": []}
    work = toolkit.gpuprov_toolkit_work(state, plan, [], apt_sources=SOURCES)
    assert work["missing"] == DATA["__nvidia_container_toolkit_packages"]
    assert work["unheld"] == work["missing"]
    assert not (work["keyring_found"] or work["keyring_ok"] or work["apt_sources_current"])
    assert work["config"]["changed"]  # no config.toml yet: the keys are to be written
    assert toolkit.gpuprov_toolkit_repository(work, True, False) == {"dearmor_needed": True,
                                                                     "work": True}
    # A site that manages the repository itself: only the packages are the role's work.
    assert toolkit.gpuprov_toolkit_repository(work, False, False) == {"dearmor_needed": False,
                                                              "work": True}


def test_a_rotated_key_is_dearmored_again_and_a_wrong_mode_fixed(toolkit):
    plan = toolkit.gpuprov_toolkit_plan(_settings(hold=False))
    probe = [{"name": n, "version": "1.20.0-1", "state": "installed", "held": False}
             for n in DATA["__nvidia_container_toolkit_packages"]]
    state = {"version": {"rc": 0, "output": "containerd"}, "contents": {}, "unreadable": [],
             "files": [_root_file(plan["written_files"][0], "key", mode="0600"),
                       _root_file(plan["written_files"][1], SOURCES)]}
    work = toolkit.gpuprov_toolkit_work(state, plan, probe, apt_sources=SOURCES)
    assert work["keyring_found"] and not work["keyring_ok"] and work["unheld"] == []
    assert toolkit.gpuprov_toolkit_repository(work, True, False) == {"dearmor_needed": False,
                                                             "work": True}
    assert toolkit.gpuprov_toolkit_repository(work, True, True)["dearmor_needed"] is True


def test_runtime_problems_missing_runtime_then_unreadable_config(toolkit):
    plan = toolkit.gpuprov_toolkit_plan(_settings(runtime="crio"))
    missing = {"version": {"rc": 127, "output": "crio: not found"}, "unreadable": []}
    assert toolkit.gpuprov_toolkit_work(missing, plan, [])["runtime_problem"] == (
        "gpu-a: crio --version failed (crio: not found): install crio first (this role "
        "configures the node's runtime, it installs none), or set "
        "nvidia_container_toolkit_runtime to the runtime the node has.")
    unreadable = {"version": {"rc": 0, "output": "crio version 1.28"},
                  "unreadable": ["/etc/nvidia-container-runtime/config.toml"]}
    assert toolkit.gpuprov_toolkit_work(unreadable, plan, [])["runtime_problem"].startswith(
        "gpu-a: /etc/nvidia-container-runtime/config.toml exists but could not be read")


def test_bad_input_is_one_clear_error(toolkit):
    with pytest.raises(AnsibleFilterError, match="unknown settings flavour"):
        toolkit.gpuprov_toolkit_plan(_settings(flavour="open"))
    with pytest.raises(AnsibleFilterError, match="expects the node's read, the plan"):
        toolkit.gpuprov_toolkit_work({}, {}, "not a list")


def test_a_toolkit_config_that_is_not_toml_is_one_clear_error(toolkit):
    plan = toolkit.gpuprov_toolkit_plan(_settings())
    state = {"version": {"rc": 0, "output": "containerd"}, "files": [], "unreadable": [],
             "contents": {plan["read_configs"][1]: "[nvidia-container-cli\n"}}
    with pytest.raises(AnsibleFilterError, match="config.toml"):
        toolkit.gpuprov_toolkit_work(state, plan, [])


# nvidia-ctk's block YAML of one GPU, for driver 580.105.08 (test_runtime_mode.py).
SPEC_TEXT = SPEC
NVML = {"driver_version": "580.105.08", "gpus": [{"index": 0, "uuid": "GPU-aaaa", "error": None}]}


@pytest.mark.parametrize(("text", "nvml", "driver_changed", "refresh"), [
    (SPEC_TEXT, NVML, False, False),  # current
    (None, NVML, False, True),  # no spec
    (None, NVML, True, True),  # no spec, whatever the driver stage did
    (SPEC_TEXT, {**NVML, "driver_version": "590.44.01"}, False, True),  # another driver
    (SPEC_TEXT, {**NVML, "driver_version": "590.44.01"}, True, False),  # refreshed by it
    (SPEC_TEXT, {**NVML, "gpus": [*NVML["gpus"], {"index": 1, "uuid": "GPU-bbbb"}]}, False,
     True),  # a GPU it does not name
])
def test_the_cdi_spec_is_refreshed_only_when_it_is_not_current(text, nvml, driver_changed,
                                                               refresh):

    assert nvidia_container_toolkit.cdi_refresh(text, nvml, driver_changed) is refresh


def test_cdi_mode_on_containerd_2_is_not_the_default_runtime(toolkit):
    plan = toolkit.gpuprov_toolkit_plan(_settings())
    state = {"version": {"rc": 0, "output": "containerd github.com/containerd/containerd/v2 "
                                            "2.1.9+unknown"},
             "files": [], "contents": {}, "unreadable": []}
    work = toolkit.gpuprov_toolkit_work(state, plan, [], apt_sources=SOURCES, nvml=NVML)
    assert (work["mode"], work["set_default"], work["cdi_refresh"]) == ("cdi", False, True)
    plan = toolkit.gpuprov_toolkit_plan({**_settings(), "mode": "cdi"})
    state["version"]["output"] = "containerd github.com/containerd/containerd 1.6.20"
    problem = toolkit.gpuprov_toolkit_work(state, plan, [], apt_sources=SOURCES)["runtime_problem"]
    assert "containerd 1.6 cannot inject CDI devices" in problem


# Docker hosts: what `dockerd --version` says on Debian 12 and 13 (docker.io), and NVML's GPUs.
DOCKER_20 = "Docker version 20.10.24+dfsg1, build 297e128"
DOCKER_26 = "Docker version 26.1.5+dfsg1, build a72d7cd"
NVML = {"gpus": [{"index": 0, "uuid": "GPU-aaaa"}, {"index": 1, "uuid": "GPU-bbbb"},
                 {"index": 2, "uuid": "GPU-cccc", "error": "GPU is lost"}]}


def _docker_work(toolkit, version: str, daemon_json: str | None = None, **overrides) -> dict:
    plan = toolkit.gpuprov_toolkit_plan(_settings(runtime="docker", **overrides))
    state = {"version": {"rc": 0, "output": version},
             "contents": {"/etc/docker/daemon.json": daemon_json}, "unreadable": []}
    return plan, toolkit.gpuprov_toolkit_work(state, plan, [], apt_sources=SOURCES, nvml=NVML)


def test_a_docker_host_keeps_runc_as_default_and_hears_the_variable_for_gpus(toolkit):
    """Docker's --gpus hands NVIDIA's hook the request only by NVIDIA_VISIBLE_DEVICES, so the
    toolkit must honour it; nvidia not being Docker's default keeps it from other containers."""
    plan, work = _docker_work(toolkit, DOCKER_20, '{"log-driver": "journald"}\n')
    assert plan["gpu_access"]["accept-nvidia-visible-devices-envvar-when-unprivileged"] is True
    assert "swarm-resource" not in plan["gpu_access"]
    assert work["mode"] == "legacy" and work["set_default"] is False
    daemon = yaml.safe_load(work["docker"]["text"])
    assert daemon == {"log-driver": "journald",
                      "runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime",
                                              "args": []}}}


def test_docker_26_gets_the_cdi_feature(toolkit):
    _, work = _docker_work(toolkit, DOCKER_26)
    assert work["mode"] == "cdi"
    assert yaml.safe_load(work["docker"]["text"])["features"] == {"cdi": True}


def test_a_swarm_gpu_node_advertises_its_healthy_gpus_and_names_swarms_variable(toolkit):
    plan, work = _docker_work(toolkit, DOCKER_26, docker_swarm=True)
    assert plan["gpu_access"]["swarm-resource"] == "DOCKER_RESOURCE_NVIDIA-GPU"
    assert work["set_default"] is True  # a Swarm service cannot pick a runtime
    daemon = yaml.safe_load(work["docker"]["text"])
    assert daemon["node-generic-resources"] == ["NVIDIA-GPU=GPU-aaaa", "NVIDIA-GPU=GPU-bbbb"]
    assert daemon["default-runtime"] == "nvidia"


def test_the_admin_may_ask_for_nvidia_as_dockers_default(toolkit):
    _, work = _docker_work(toolkit, DOCKER_20, docker_default_runtime=True)
    assert yaml.safe_load(work["docker"]["text"])["default-runtime"] == "nvidia"


def test_a_swarm_kind_swarm_would_split_is_refused_before_any_change(toolkit):
    plan = toolkit.gpuprov_toolkit_plan(_settings(runtime="docker", docker_swarm=True,
                                                  swarm_resource_kind="NVIDIA=GPU"))
    assert "nvidia_container_toolkit_swarm_resource_kind" in plan["problem"]


def test_an_unmergeable_daemon_json_fails_the_work_with_one_line(toolkit):
    with pytest.raises(AnsibleFilterError, match="daemon.json is not valid JSON"):
        _docker_work(toolkit, DOCKER_20, '{"debug": true,}')
