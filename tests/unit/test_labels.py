"""gpuprov.nvidia.labels: recorded probe reports -> node labels. Expected values are worked out here
from the reports' own fields (or written down from the issue), not taken from the function."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpuprov.nvidia import hardware, labels

PROBES = Path(__file__).resolve().parent.parent / "fixtures" / "verify" / "probe"
GPU_NODES = ("gpu-kepler", "gpu-pascal", "gpu-hopper")


def report(name: str) -> dict:
    return json.loads((PROBES / f"{name}.json").read_text())


def test_gpu_pascal_labels_as_the_issue_specifies():
    got = labels.compute_labels(report("gpu-pascal"))
    assert got["gputype"] == "p100"
    assert got["nvidia.com/gpu.family"] == "pascal"
    assert got["nvidia.com/gpu.product"] == "Tesla-P100-PCIE-16GB"
    assert got["nvidia.com/gpu.count"] == "4"
    assert got["nvidia.com/gpu.present"] == "true"
    assert got["nvidia.com/gpu.memory"] == "16384"  # 16 GiB board: 17179869184 B / 2**20
    assert got["nvidia.com/gpu.compute.major"] == "6"
    assert got["nvidia.com/gpu.compute.minor"] == "0"
    assert got["nvidia.com/cuda.driver-version.full"] == "535.261.03"
    driver = "nvidia.com/cuda.driver-version."
    assert (got[driver + "major"], got[driver + "minor"], got[driver + "revision"]) == (
        "535", "261", "03")
    assert (got["nvidia.com/cuda.runtime-version.major"],
            got["nvidia.com/cuda.runtime-version.minor"],
            got["nvidia.com/cuda.runtime-version.full"]) == ("12", "2", "12.2")


@pytest.mark.parametrize("node,series,family", [
    ("gpu-kepler", "k80", "kepler"), ("gpu-pascal", "p100", "pascal"),
    ("gpu-hopper", "h100", "hopper")])
def test_every_recorded_gpu_node_follows_gfd_from_its_nvml_fields(node, series, family):
    rep = report(node)
    nvml = rep["nvml"]
    gpu = nvml["gpus"][0]
    major, minor = gpu["compute_capability"].split(".")
    driver = nvml["driver_version"].split(".")
    cuda = nvml["cuda_driver_version"].split(".")
    assert labels.compute_labels(rep) == {
        "gputype": series,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": gpu["name"].replace(" ", "-"),
        "nvidia.com/gpu.family": family,
        "nvidia.com/gpu.count": str(len(nvml["gpus"])),
        "nvidia.com/gpu.memory": str(gpu["memory"]["total"] // (1024 * 1024)),
        "nvidia.com/gpu.compute.major": major,
        "nvidia.com/gpu.compute.minor": minor,
        "nvidia.com/cuda.driver-version.major": driver[0],
        "nvidia.com/cuda.driver-version.minor": driver[1],
        "nvidia.com/cuda.driver-version.revision": driver[2],
        "nvidia.com/cuda.driver-version.full": nvml["driver_version"],
        "nvidia.com/cuda.runtime-version.major": cuda[0],
        "nvidia.com/cuda.runtime-version.minor": cuda[1],
        "nvidia.com/cuda.runtime-version.full": nvml["cuda_driver_version"],
    }


def test_a_node_without_gpus_has_no_gpuprov_labels():
    assert labels.compute_labels(report("cpu-only")) == {}


def test_without_nvml_what_pci_and_the_hardware_table_know():
    rep = report("gpu-pascal")
    rep["nvml"] = {"available": False, "error": {"name": "NVML_ERROR_LIBRARY_NOT_FOUND"},
                   "gpus": [], "driver_version": None, "cuda_driver_version_int": None}
    assert labels.compute_labels(rep) == {
        "gputype": "p100", "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "Tesla-P100-PCIE-16GB", "nvidia.com/gpu.family": "pascal",
        "nvidia.com/gpu.count": "4", "nvidia.com/gpu.compute.major": "6",
        "nvidia.com/gpu.compute.minor": "0"}


def test_without_nvml_and_without_a_classification_the_table_is_asked():
    rep = report("gpu-kepler")
    rep["nvml"] = {"available": False, "gpus": []}
    for device in rep["pci"]:
        device["classification"] = None
    got = labels.compute_labels(rep)
    assert got["gputype"] == "k80" and got["nvidia.com/gpu.product"] == "Tesla-K80"


def test_an_unknown_gpu_is_present_but_has_no_model_labels():
    rep = report("gpu-pascal")
    rep["nvml"] = {"available": False, "gpus": []}
    rep["pci"] = [{"device_id": "10de:ffff", "subsystem_id": None, "classification": None}]
    assert labels.compute_labels(rep) == {"nvidia.com/gpu.present": "true"}


def _mixed(pascal: int, hopper: int) -> dict:
    """A node with `pascal` P100s then `hopper` H100s, from the recorded NVML views."""
    rep = report("gpu-pascal")
    p100 = rep["nvml"]["gpus"][0]
    h100 = report("gpu-hopper")["nvml"]["gpus"][0]
    gpus = [copy.deepcopy(p100) for _ in range(pascal)] + [copy.deepcopy(h100)
                                                           for _ in range(hopper)]
    for index, gpu in enumerate(gpus):
        gpu["index"] = index
    rep["nvml"]["gpus"] = gpus
    return rep


def test_mixed_node_series_is_the_sorted_join_and_gfd_keys_the_majority_model():
    got = labels.compute_labels(_mixed(pascal=1, hopper=3))
    assert got["gputype"] == "h100-p100"
    assert got["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert got["nvidia.com/gpu.count"] == "3"  # GFD: the count of that product
    assert got["nvidia.com/gpu.family"] == "hopper"


def test_mixed_node_with_a_tie_labels_the_model_of_the_lowest_index():
    got = labels.compute_labels(_mixed(pascal=2, hopper=2))
    assert got["nvidia.com/gpu.product"] == "Tesla-P100-PCIE-16GB"
    assert got["nvidia.com/gpu.count"] == "2"


def test_a_gpu_whose_nvml_handle_fails_is_not_counted():
    rep = report("gpu-pascal")
    rep["nvml"]["gpus"][3] = {"index": 3, "error": {"name": "NVML_ERROR_GPU_IS_LOST"}}
    assert labels.compute_labels(rep)["nvidia.com/gpu.count"] == "3"


@pytest.mark.parametrize("cc,family", [
    ((3, 7), "kepler"), ((5, 2), "maxwell"), ((6, 0), "pascal"), ((7, 0), "volta"),
    ((7, 5), "turing"), ((8, 0), "ampere"), ((8, 6), "ampere"), ((8, 9), "ada-lovelace"),
    ((9, 0), "hopper"), ((10, 0), "blackwell"), ((12, 0), "blackwell"), ((13, 0), "rubin"),
    ((11, 0), "undefined"), ((14, 0), "undefined"), ((1, 3), "tesla"), ((2, 1), "fermi"),
    ((4, 0), "undefined")])
def test_family_follows_gfd_get_arch_family(cc, family):
    assert labels.gfd_family(*cc) == family


def test_gfd_family_agrees_with_the_hardware_table_for_every_model():
    wrong = [(m.name, m.compute_capability, m.architecture) for m in hardware.models()
             if labels.gfd_family(*map(int, m.compute_capability.split("."))) != m.architecture]
    assert wrong == []


def test_every_model_series_is_a_valid_label_value():
    for model in hardware.models():
        assert labels.sanitise_value(model.series) == model.series, model


def test_product_is_sanitised_like_gfd_and_cut_to_a_label_value():
    assert labels.sanitise_value("NVIDIA A100-SXM4-80GB") == "NVIDIA-A100-SXM4-80GB"
    assert labels.sanitise_value("  NVIDIA  RTX (TM) 6000 ") == "NVIDIA-RTX-TM-6000"
    long = labels.sanitise_value("X" * 62 + " -Y")
    assert len(long) <= 63 and long[-1].isalnum()


def test_custom_series_key():
    got = labels.compute_labels(report("gpu-pascal"), "example.com/gpu-model")
    assert got["example.com/gpu-model"] == "p100" and "gputype" not in got
    assert labels.is_owned("example.com/gpu-model", "example.com/gpu-model")
    assert not labels.is_owned("gputype", "example.com/gpu-model")


@pytest.mark.parametrize("key", ["", "bad key", "-x", "a/" + "b" * 64, "nvidia.com/gpu.count",
                                 "UPPER.example/x"])
def test_invalid_series_keys_are_refused(key):
    with pytest.raises(ValueError):
        labels.compute_labels(report("gpu-pascal"), key)


def test_owned_keys_are_the_series_key_and_the_gfd_keys_set():
    owned = labels.owned_keys()
    assert "gputype" in owned and "nvidia.com/gpu.product" in owned
    for key in ("nvidia.com/gpu.replicas", "nvidia.com/mig.capable", "kubernetes.io/hostname",
                "nvidia.com/cuda.driver.major", "team"):
        assert not labels.is_owned(key)
    for name in GPU_NODES:
        assert set(labels.compute_labels(report(name))) <= owned


def test_diff_and_patch_touch_only_owned_keys():
    expected = labels.compute_labels(report("gpu-pascal"))
    actual = {**expected, "team": "ml", "nvidia.com/gpu.replicas": "1",
              "nvidia.com/gpu.count": "3"}
    del actual["gputype"]
    assert labels.diff_labels(actual, expected) == {
        "gputype": {"actual": None, "expected": "p100"},
        "nvidia.com/gpu.count": {"actual": "3", "expected": "4"}}
    assert labels.label_patch(actual, expected) == {"gputype": "p100",
                                                    "nvidia.com/gpu.count": "4"}


def test_patch_removes_stale_owned_labels_with_null():
    stale = {"gputype": "k80", "nvidia.com/gpu.memory": "11441", "team": "ml"}
    assert labels.label_patch(stale, {}) == {"gputype": None, "nvidia.com/gpu.memory": None}
    assert labels.label_patch(labels.compute_labels(report("gpu-hopper")),
                              labels.compute_labels(report("gpu-hopper"))) == {}


def test_filter_plugin_calls_the_labels_module(ansible_plugin):
    filters = ansible_plugin("filter/gpu_node_labels.py").FilterModule().filters()
    rep = report("gpu-kepler")
    assert filters["gpuprov_node_labels"](rep) == labels.compute_labels(rep)
    assert filters["gpuprov_label_node_plan"](
        [{"metadata": {"name": "n", "labels": {"gputype": "x", "a": "b"}}}], "n", {})[
        "patch"] == {"gputype": None}
    assert filters["gpuprov_label_owned"]("nvidia.com/gpu.count") is True
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError, match="probe report"):
        filters["gpuprov_node_labels"]([1, 2])
    with pytest.raises(AnsibleFilterError, match="not a valid Kubernetes label key"):
        filters["gpuprov_node_labels"](rep, "bad key")


# -- the allocation mode's labels (gpu_allocation: device-plugin | dra) ----------------------


def test_a_dra_node_is_labelled_off_the_device_plugin_and_on_the_dra_driver():
    assert labels.allocation_labels("dra") == {"nvidia.com/gpu.deploy.device-plugin": "false",
                                               "nvidia.com/gpu.deploy.dra-driver": "true"}
    # Back on the device plugin both keys go: the plugin's DaemonSet runs without its key.
    assert labels.allocation_labels("device-plugin") == {
        "nvidia.com/gpu.deploy.device-plugin": None, "nvidia.com/gpu.deploy.dra-driver": None}
    with pytest.raises(ValueError, match="unknown GPU allocation mode 'both'"):
        labels.allocation_labels("both")


def test_the_device_plugin_daemonset_leaves_out_dra_nodes_only():
    """The device plugin's DaemonSet, as gpuprov renders it, against nodes labelled for each
    mode (the emulator's node-affinity matcher follows Kubernetes' own; test code only)."""
    from gpuprov import manifests
    from gpuprov.lab.kube import selectors

    daemonset = next(o for o in manifests.device_plugin() if o["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]

    def node(mode: str) -> dict:
        set_labels = {k: v for k, v in labels.allocation_labels(mode).items() if v is not None}
        return {"metadata": {"name": mode, "labels": {labels.PRESENT: "true", **set_labels}}}

    def selected(n: dict) -> bool:
        return selectors.node_selector_matches(pod, n) and selectors.node_affinity_matches(pod, n)

    assert selected(node("device-plugin"))
    assert not selected(node("dra"))
