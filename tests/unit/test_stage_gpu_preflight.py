"""gpu_preflight's decisions about the probe run and what it found (gpuprov/stages/
gpu_preflight.py), through plugins/filter/gpu_preflight.py: gpu_node_labels and gpu_mig probe
again with the same filters. The labels role's node and taint plans are in
test_stage_gpu_node_labels.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

PROBES = Path(__file__).resolve().parents[1] / "fixtures" / "verify" / "probe"
TOO_OLD = "gpuprov probe needs python3 >= 3.9, this node has 3.6.8"


@pytest.fixture(scope="module")
def gpuprov(ansible_plugin):
    return ansible_plugin("filter/gpu_preflight.py")


@pytest.mark.parametrize("interpreter, discovered, expected", [
    ("/usr/bin/python3.11", "/usr/bin/python3", "/usr/bin/python3.11"),
    ("auto_silent", "/usr/bin/python3", "/usr/bin/python3"),
    (None, None, "python3"),
])
def test_the_probe_runs_with_ansibles_python(gpuprov, interpreter, discovered, expected):
    assert gpuprov.gpuprov_node_python(interpreter, discovered) == expected


def test_a_probe_run_gives_its_report_or_one_line_why_not(gpuprov):
    report = (PROBES / "gpu-pascal.json").read_text()
    ok = gpuprov.gpuprov_probe_outcome({"rc": 0, "stdout": report, "stderr": ""})
    assert ok == {"ok": True, "report": json.loads(report), "error": None}
    old = gpuprov.gpuprov_probe_outcome({"rc": 2, "stdout": "", "stderr": f"\n{TOO_OLD}\n"})
    assert old == {"ok": False, "report": None, "error": TOO_OLD}
    missing = gpuprov.gpuprov_probe_outcome({"rc": 127, "msg": "[Errno 2] No such file"})
    assert missing["error"] == "[Errno 2] No such file"
    assert gpuprov.gpuprov_probe_outcome({"rc": 0, "stdout": "{oops"})["error"].startswith(
        "the report is not JSON")


def test_without_a_new_probe_the_earlier_report_is_used(gpuprov):
    earlier = json.loads((PROBES / "gpu-hopper.json").read_text())
    skipped = {"changed": False, "skipped": True}
    assert gpuprov.gpuprov_probe_outcome(skipped, False, earlier)["report"] == earlier
    assert not gpuprov.gpuprov_probe_outcome(skipped, False, None)["ok"]
    with pytest.raises(AnsibleFilterError, match="expects a command result"):
        gpuprov.gpuprov_probe_outcome("stdout")


def test_the_gpu_summary_groups_by_pci_id(gpuprov):
    gpus = [{"pci_id": "10de:2330", "name": "NVIDIA H100 80GB HBM3", "architecture": "hopper",
             "compute_capability": "9.0"},
            {"pci_id": "10de:102d", "name": "Tesla K80", "architecture": "kepler",
             "compute_capability": "3.7"},
            {"pci_id": "10de:102d", "name": "Tesla K80", "architecture": "kepler",
             "compute_capability": "3.7"},
            {"pci_id": "10de:2336", "name": None, "architecture": None,
             "compute_capability": None}]
    assert gpuprov.gpuprov_gpu_summary(gpus) == (
        "2x Tesla K80 (kepler, cc 3.7), 1x NVIDIA H100 80GB HBM3 (hopper, cc 9.0), "
        "1x unknown GPU 10de:2336 (unknown architecture, cc ?)")


def test_the_choice_text_has_the_reason_and_each_note_once(gpuprov):
    choice = {"reason": "newest branch supporting all GPUs", "notes": ["a", "b", "a"]}
    assert gpuprov.gpuprov_choice_text(choice) == "newest branch supporting all GPUs; a; b"
    assert gpuprov.gpuprov_choice_text({"reason": "r", "notes": []}) == "r"


def test_os_problems_name_the_os_and_what_to_do(gpuprov):
    supported = ["Debian 12", "Ubuntu 24"]
    problem = gpuprov.gpuprov_os_problem(supported, "gpu-a", "Debian", "11", "debian")
    assert problem.startswith("Debian 11 is not a supported OS for GPU nodes (supported: "
                              "Debian 12, Ubuntu 24). Install a supported OS on gpu-a")
    problem = gpuprov.gpuprov_os_problem(supported, "gpu-a", "Ubuntu", "24", None)
    assert "add roles/gpu_preflight/vars/Ubuntu_24.yml" in problem
    assert gpuprov.gpuprov_os_problem(supported, "gpu-a", "Debian", "12", "debian") is None


# -- gpu_allocation: device-plugin | dra, refused with the reason where DRA cannot be had ----


def _report(name: str, *, runtime_package: str | None = None, enable_cdi=None,
            driver: str | None = "keep") -> dict:
    """A lab node's recorded probe report with its runtime package, containerd's enable_cdi and
    NVML's driver version set as a node would report them."""
    report = json.loads((PROBES / f"{name}.json").read_text())
    if runtime_package:
        package, version = runtime_package.split("=")
        report["packages"]["runtime"] = [{"name": package, "version": version,
                                          "state": "installed", "held": False}]
    report["container_runtime"]["containerd"]["enable_cdi"] = enable_cdi
    if driver != "keep":
        report["nvml"]["driver_version"] = driver
    return report


NEW = {"api_server": "v1.34.2", "kubelet": "v1.34.2"}


def test_the_device_plugin_is_the_default_and_needs_nothing(gpuprov):
    old = _report("gpu-kepler", runtime_package="containerd=1.6.20~ds1-1+deb12u3")
    for setting in (None, "", "device-plugin", "Device-Plugin"):
        assert gpuprov.gpuprov_allocation_problem(setting, "gpu-kepler", old,
                                                  api_server="v1.29.0") is None


@pytest.mark.parametrize("setting", ["DRA-mode", "gpu", "true", "device_plugin"])
def test_a_bad_allocation_mode_is_one_line_naming_the_choices(gpuprov, setting):
    problem = gpuprov.gpuprov_allocation_problem(setting, "gpu-hopper", None)
    assert problem == (f"gpu-hopper: gpu_allocation must be one of device-plugin, dra, got "
                       f"{setting!r}: set it per host or group to device-plugin (the default) "
                       "or dra")


def test_dra_on_a_node_that_has_everything(gpuprov):
    # Debian 13's containerd 2.1 (CDI on by default) and an R580 driver.
    report = _report("gpu-hopper", runtime_package="containerd=2.1.9~ds1-1",
                     driver="580.95.05")
    assert gpuprov.gpuprov_allocation_problem("dra", "gpu-hopper", report, **NEW) is None


@pytest.mark.parametrize("cluster, expected", [
    ({"api_server": "v1.34.1", "kubelet": "v1.34.2"}, "the API server is v1.34.1, older than "
     "v1.34.2"),
    ({"api_server": "v1.35.0", "kubelet": "v1.34.0"}, "the kubelet is v1.34.0, older than "
     "v1.34.2"),
    ({"api_server": "v1.33.5-gke.100", "kubelet": "v1.36.1"}, "the API server is "
     "v1.33.5-gke.100, older than v1.34.2"),
    ({"kubelet": "v1.34.2"}, "the API server version unknown (None; v1.34.2 or later is needed)"),
])
def test_dra_needs_kubernetes_1_34_2_on_the_api_server_and_the_kubelet(gpuprov, cluster,
                                                                       expected):
    report = _report("gpu-hopper", runtime_package="containerd=2.1.9~ds1-1", driver="580.95.05")
    problem = gpuprov.gpuprov_allocation_problem("dra", "gpu-hopper", report, **cluster)
    assert problem.startswith(f"gpu-hopper: gpu_allocation is dra, but {expected} (")
    assert problem.endswith("set gpu_allocation: device-plugin for this node")


def test_dra_is_refused_on_containerd_1_6_and_an_r470_driver_with_both_reasons(gpuprov):
    # The lab's gpu-kepler: Debian 12's containerd 1.6 and R470.
    report = _report("gpu-kepler", runtime_package="containerd=1.6.20~ds1-1+deb12u3")
    problem = gpuprov.gpuprov_allocation_problem("dra", "gpu-kepler", report, **NEW)
    assert "containerd 1.6 has no CDI (containerd >= 1.7 is needed)" in problem
    assert ("driver branch R470 is older than R565, the oldest NVIDIA's DRA driver supports"
            in problem)
    assert "kubernetes-sigs/dra-driver-nvidia-gpu docs/prerequisites.md" in problem
    assert "\n" not in problem


def test_containerd_1_7_with_cdi_off_is_refused_only_where_the_toolkit_leaves_it_off(gpuprov):
    report = _report("gpu-hopper", runtime_package="containerd=1.7.24~ds1-6", enable_cdi=None,
                     driver="580.95.05")
    # auto chooses cdi on containerd 1.7, and the toolkit stage then sets enable_cdi itself.
    assert gpuprov.gpuprov_allocation_problem("dra", "gpu-hopper", report, **NEW) is None
    legacy = gpuprov.gpuprov_allocation_problem("dra", "gpu-hopper", report, **NEW,
                                                toolkit_mode="legacy")
    assert "containerd 1.7 has CDI off (enable_cdi in its CRI plugin's settings)" in legacy
    assert "set nvidia_container_toolkit_mode to auto or cdi" in legacy
    on = _report("gpu-hopper", runtime_package="containerd=1.7.24~ds1-6", enable_cdi=True,
                 driver="580.95.05")
    assert gpuprov.gpuprov_allocation_problem("dra", "gpu-hopper", on, **NEW,
                                              toolkit_mode="legacy") is None
    off = _report("gpu-hopper", runtime_package="containerd=2.1.9~ds1-1", enable_cdi=False,
                  driver="580.95.05")
    assert "containerd 2.1 has CDI off" in gpuprov.gpuprov_allocation_problem(
        "dra", "gpu-hopper", off, **NEW, toolkit_mode="legacy")


def test_before_the_driver_is_installed_the_chosen_branch_counts(gpuprov):
    bare = _report("gpu-hopper", runtime_package="containerd=2.1.9~ds1-1", driver=None)
    assert gpuprov.gpuprov_allocation_problem("dra", "gpu-hopper", bare, **NEW,
                                              branch=580) is None
    assert "driver branch R550 is older than R565" in gpuprov.gpuprov_allocation_problem(
        "dra", "gpu-hopper", bare, **NEW, branch="550")
    assert "driver branch unknown (None; R565 or later is needed)" in (
        gpuprov.gpuprov_allocation_problem("dra", "gpu-hopper", bare, **NEW))
    # The installed driver wins over the branch: it is what the DRA plugin will meet.
    installed = _report("gpu-hopper", runtime_package="containerd=2.1.9~ds1-1",
                        driver="535.261.03")
    assert "driver branch R535" in gpuprov.gpuprov_allocation_problem(
        "dra", "gpu-hopper", installed, **NEW, branch=580)


def test_an_unknown_runtime_version_and_docker_are_refused(gpuprov):
    unknown = _report("gpu-hopper", driver="580.95.05")
    assert "containerd's version is unknown" in gpuprov.gpuprov_allocation_problem(
        "dra", "gpu-hopper", unknown, **NEW)
    assert "Docker is not a Kubernetes runtime" in gpuprov.gpuprov_allocation_problem(
        "dra", "gpu-hopper", unknown, **NEW, runtime="docker")
    crio = gpuprov.gpuprov_allocation_problem("dra", "gpu-hopper", unknown, **NEW,
                                              runtime="crio")
    assert crio is None


def test_a_report_that_is_not_a_mapping_is_refused(gpuprov):
    with pytest.raises(AnsibleFilterError, match="expects the probe report as a mapping"):
        gpuprov.gpuprov_allocation_problem("dra", "gpu-hopper", ["not", "a", "report"])


def test_a_host_without_gpus_has_only_its_value_checked(gpuprov):
    # A group may set dra for all its hosts; a CPU node has no allocation mode to refuse.
    assert gpuprov.gpuprov_allocation_problem("dra", "cpu-0", None, has_gpu=False) is None
    assert gpuprov.gpuprov_allocation_problem("both", "cpu-0", None, has_gpu=False).startswith(
        "cpu-0: gpu_allocation must be one of device-plugin, dra, got 'both'")


def test_the_cluster_is_read_only_where_a_host_asks_for_dra(gpuprov):
    hostvars = {"a": {}, "b": {"gpu_allocation": "device-plugin"}, "c": {"gpu_allocation": "x"}}
    assert gpuprov.gpuprov_dra_asked(list(hostvars), hostvars) is False
    hostvars["d"] = {"gpu_allocation": "DRA"}
    assert gpuprov.gpuprov_dra_asked(list(hostvars), hostvars) is True


def test_the_versions_are_the_api_servers_and_the_nodes_kubelets(gpuprov):
    # k8s_cluster_info's answer: /version as the API server serves it (kubernetes/kubernetes
    # staging/src/k8s.io/apimachinery/pkg/version/types.go Info's JSON names).
    info = {"version": {"client": "34.1.0", "server": {"kubernetes": {
        "major": "1", "minor": "34", "gitVersion": "v1.34.2", "platform": "linux/amd64"}}}}
    nodes = [{"metadata": {"name": "gpu-hopper"},
              "status": {"nodeInfo": {"kubeletVersion": "v1.34.1",
                                      "containerRuntimeVersion": "containerd://2.1.9"}}}]
    assert gpuprov.gpuprov_cluster_versions(info, nodes, "gpu-hopper") == {
        "api_server": "v1.34.2", "kubelet": "v1.34.1"}
    # Not read (no host asked for dra: the task was skipped), or a node not joined yet.
    assert gpuprov.gpuprov_cluster_versions({"skipped": True}, [], "gpu-hopper") == {
        "api_server": None, "kubelet": None}
