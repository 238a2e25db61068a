"""verify on DRA nodes (issue 35 item 3): the dra.* cluster checks against what NVIDIA's DRA
driver publishes (its docs' ResourceSlice device, tests/fixtures/real/dra-driver-nvidia-gpu) and
what NVML says (the recorded H200, tests/fixtures/real/h200-580.159.04), and the device
plugin's checks left to device-plugin nodes."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from gpuprov.errors import GpuprovError
from gpuprov.verify import inventory
from gpuprov.verify.checks import dra, k8s  # noqa: F401 (registers the cluster checks)
from gpuprov.verify.facts import ClusterFacts
from gpuprov.verify.findings import CHECKS, FAIL, PASS, SKIP
from gpuprov.verify.inventory import Node

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
DOCS = FIXTURES / "real" / "dra-driver-nvidia-gpu" / "resourceslice-attributes.md"
H200 = FIXTURES / "real" / "h200-580.159.04" / "probe.json"


def docs_devices() -> dict[str, dict]:
    """The docs page's published devices (its yaml blocks), by type."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.S)
    devices = [yaml.safe_load(b)[0] for b in blocks]
    return {d["attributes"]["type"]["string"]: d for d in devices}


def a100_report() -> dict:
    """NVML's answers, in the probe's formats, for the GPU the docs' device describes (an
    A100-PCIE-40GB, minor 0, driver 580.126.20 with CUDA 13.0): NVML's 8-digit PCI domain,
    its "8.0" compute capability, its architecture enum (7, Ampere), its brand enum (14,
    NVML_BRAND_NVIDIA, nvidia-smi's "NVIDIA"), its total bytes."""
    gpu = {"index": 0, "minor_number": 0, "error": None, "name": "NVIDIA A100-PCIE-40GB",
           "uuid": "GPU-2fa81118-5a5f-aa66-7660-471eed407181", "architecture_nvml": 7,
           "brand_nvml": 14,
           "compute_capability": "8.0", "pci_bus_id": "00000000:65:00.0",
           "memory": {"total": 40 * 2**30}, "mig": {"current": False, "devices": []}}
    return {"pci": [{}], "nvml": {"driver_version": "580.126.20", "cuda_driver_version": "13.0",
                                  "gpus": [gpu]}}


def slice_of(node: str, devices: list[dict], generation: int = 1, count: int = 1) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-gpu.nvidia.com-x"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": generation,
                              "resourceSliceCount": count},
                     "devices": devices}}


def k8s_node(name: str, allocatable: dict | None = None) -> dict:
    return {"metadata": {"name": name, "labels": {}},
            "status": {"allocatable": allocatable or {"cpu": "4"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, image: str, phase: str = "Running", namespace: str = "nvidia-dra-driver"):
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"image": image}]}, "status": {"phase": phase}}


PLUGIN = pod("nvidia-dra-driver-kubelet-plugin-x",
             "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1")
DEVICE_PLUGIN = pod("nvidia-device-plugin-x", "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
                    namespace="kube-system")


def facts(report: dict | None = None, slices=None, pods=(PLUGIN,), allocatable=None,
          mode: str = "dra", name: str = "gpu-a") -> ClusterFacts:
    node = Node(name=name, target=None, gpu_expected=True, gpu_allocation=mode)
    if slices is None:
        slices = (slice_of(name, [copy.deepcopy(docs_devices()["gpu"])]),)
    return ClusterFacts(node, a100_report() if report is None else report,
                        k8s_node(name, allocatable), tuple(pods), slices)


def run(check_id: str, f: ClusterFacts):
    return CHECKS[check_id].finding(f.node.name, CHECKS[check_id].func(f))


def test_the_docs_device_matches_nvml_of_the_gpu_it_describes():
    finding = run("dra.devices-vs-nvml", facts())
    assert finding.status == PASS, finding.message
    assert finding.details["matched"] == 1


@pytest.mark.parametrize(("attribute", "value"), [
    ("uuid", "GPU-00000000-5a5f-aa66-7660-471eed407181"),
    ("productName", "NVIDIA A100-SXM4-40GB"),
    ("architecture", "Hopper"),
    ("brand", "Tesla"),
    ("cudaComputeCapability", "8.6.0"),
    ("driverVersion", "580.126.9"),
    ("cudaDriverVersion", "12.9.0"),
    ("resource.kubernetes.io/pciBusID", "0000:66:00.0"),
])
def test_each_attribute_nvml_disagrees_with_is_one_finding(attribute, value):
    device = docs_devices()["gpu"]
    kind = next(iter(device["attributes"][attribute]))
    device["attributes"][attribute] = {kind: value}
    finding = run("dra.devices-vs-nvml", facts(slices=(slice_of("gpu-a", [device]),)))
    assert finding.status == FAIL
    [found] = finding.details["findings"]
    assert (found["attribute"], found["published"]) == (attribute, value)
    assert found["remedy"]
    assert finding.remediation


def test_a_probe_report_without_the_brand_leaves_it_out():
    # A report of a probe from before brand_nvml (the recorded H200's is one): no brand to
    # compare, so no finding about it either way.
    report = a100_report()
    del report["nvml"]["gpus"][0]["brand_nvml"]
    device = docs_devices()["gpu"]
    device["attributes"]["brand"] = {"string": "Tesla"}
    assert run("dra.devices-vs-nvml", facts(report, (slice_of("gpu-a", [device]),))).status \
        == PASS


def test_memory_capacity_is_compared_as_a_quantity():
    device = docs_devices()["gpu"]
    device["capacity"]["memory"] = {"value": "39Gi"}
    finding = run("dra.devices-vs-nvml", facts(slices=(slice_of("gpu-a", [device]),)))
    assert finding.status == FAIL
    assert [f["attribute"] for f in finding.details["findings"]] == ["capacity memory"]
    device["capacity"]["memory"] = {"value": str(40 * 2**30)}  # the same bytes, spelt out
    assert run("dra.devices-vs-nvml", facts(slices=(slice_of("gpu-a", [device]),))).status \
        == PASS


def h200_device() -> dict:
    """What the driver's conversions make of the recorded H200's NVML answers (research 1.5):
    580.159.04 parsed as semver, CUDA 13000 as 13.0, compute 9.0, 143771 MiB as BinarySI,
    the 4-digit PCI domain; on the docs device's shape."""
    device = docs_devices()["gpu"]
    device["attributes"].update({
        "architecture": {"string": "Hopper"}, "productName": {"string": "NVIDIA H200"},
        "uuid": {"string": "GPU-f87e8035-046b-2413-4636-cc1158b6a6bc"},
        "driverVersion": {"version": "580.159.4"}, "cudaDriverVersion": {"version": "13.0.0"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:00:06.0"}})
    device["capacity"]["memory"] = {"value": "143771Mi"}
    return device


def test_the_real_h200_against_its_published_device():
    report = json.loads(H200.read_text())
    finding = run("dra.devices-vs-nvml", facts(report, (slice_of("gpu-a", [h200_device()]),)))
    assert finding.status == PASS, finding.message
    # 580.159.04 == 580.159.4 as versions; 580.159.5 is another driver.
    device = h200_device()
    device["attributes"]["driverVersion"] = {"version": "580.159.5"}
    finding = run("dra.devices-vs-nvml", facts(report, (slice_of("gpu-a", [device]),)))
    assert finding.status == FAIL and "580.159.04" in finding.message


def test_a_gpu_not_published_and_a_device_nvml_lacks_are_findings():
    report = json.loads(H200.read_text())
    device = h200_device()
    device["name"] = "gpu-1"  # the minor is 0: NVML has no GPU behind gpu-1
    finding = run("dra.devices-vs-nvml", facts(report, (slice_of("gpu-a", [device]),)))
    assert finding.status == FAIL
    problems = {f["device"]: f["problem"] for f in finding.details["findings"]}
    assert problems == {"gpu-0": "not published",
                        "gpu-1": "published, but NVML has no such GPU or MIG device"}


def test_mig_devices_are_matched_by_uuid_with_the_profile_memory():
    report = a100_report()
    gpu = report["nvml"]["gpus"][0]
    gpu["mig"] = {"current": True, "devices": [
        {"uuid": "MIG-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d", "profile": "1g.5gb",
         "memory_mb": 4864}]}
    mig = docs_devices()["mig"]
    finding = run("dra.devices-vs-nvml", facts(report, (slice_of("gpu-a", [mig]),)))
    assert finding.status == PASS, finding.message
    # A GPU with MIG on is not published whole: its gpu-0 beside the MIG device is stale.
    stale = run("dra.devices-vs-nvml", facts(report, (slice_of(
        "gpu-a", [mig, docs_devices()["gpu"]]),)))
    assert stale.status == FAIL and "gpu-0" in stale.message
    gpu["mig"]["devices"][0]["memory_mb"] = 9984
    assert run("dra.devices-vs-nvml", facts(report, (slice_of("gpu-a", [mig]),))).status == FAIL


def test_pool_complete_incomplete_and_older_generations():
    gpu = docs_devices()["gpu"]
    assert run("dra.slice", facts()).status == PASS
    half = run("dra.slice", facts(slices=(slice_of("gpu-a", [gpu], count=2),)))
    assert half.status == FAIL and "incomplete" in half.message
    old = slice_of("gpu-a", [gpu], generation=1, count=2)
    new = slice_of("gpu-a", [gpu], generation=2)
    renewed = run("dra.slice", facts(slices=(old, new)))
    assert renewed.status == PASS and renewed.details["older_slices"] == 1
    none = run("dra.slice", facts(slices=()))
    assert none.status == FAIL and "no ResourceSlice" in none.message
    unread = run("dra.slice", facts(slices="the API server serves no resource.k8s.io/v1"))
    assert unread.status == FAIL and "resource.k8s.io/v1" in unread.message


def test_plugin_running_alone_without_nvidia_gpu():
    assert run("dra.plugin", facts(allocatable={"nvidia.com/gpu": "0"})).status == PASS
    both = run("dra.plugin", facts(pods=(PLUGIN, DEVICE_PLUGIN),
                                   allocatable={"nvidia.com/gpu": "8"}))
    assert both.status == FAIL
    assert "device plugin pod runs here" in both.message and "nvidia.com/gpu 8" in both.message
    pending = run("dra.plugin", facts(pods=(pod("p", PLUGIN["spec"]["containers"][0]["image"],
                                                "Pending"),)))
    assert pending.status == FAIL and "not Running" in pending.message
    assert run("dra.plugin", facts(pods=())).status == FAIL


def _containerd(version: str, enable_cdi=None, dirs=None) -> dict:
    report = a100_report()
    report["packages"] = {"runtime": [{"name": "containerd", "version": version,
                                       "state": "installed"}]}
    report["container_runtime"] = {"containerd": {"enable_cdi": enable_cdi,
                                                  "cdi_spec_dirs": dirs}}
    return report


@pytest.mark.parametrize(("version", "enable_cdi", "dirs", "status"), [
    ("2.1.4~ds1-1", None, None, PASS),  # 2.x: CDI on by default
    ("1.7.24~ds1-1", True, ["/etc/cdi", "/var/run/cdi"], PASS),
    ("1.7.24~ds1-1", None, None, FAIL),  # 1.7: off by default
    ("1.6.20~ds1-1", True, None, FAIL),  # no CDI at all
    ("2.1.4~ds1-1", True, ["/etc/cdi"], FAIL),  # the claims' specs are not read
])
def test_runtime_cdi(version, enable_cdi, dirs, status):
    finding = run("dra.runtime", facts(_containerd(version, enable_cdi, dirs)))
    assert finding.status == status, finding.message


def test_each_mode_skips_the_other_modes_checks():
    plugin_node = facts(mode="device-plugin", pods=(DEVICE_PLUGIN,),
                        allocatable={"nvidia.com/gpu": "1"}, slices=())
    for check_id in ("dra.plugin", "dra.slice", "dra.devices-vs-nvml", "dra.runtime"):
        finding = run(check_id, plugin_node)
        assert finding.status == SKIP and "device-plugin" in finding.message
    assert run("k8s.device-plugin", plugin_node).status == PASS
    dra_node = facts()
    for check_id in ("k8s.device-plugin", "k8s.allocatable"):
        finding = run(check_id, dra_node)
        assert finding.status == SKIP and "gpu_allocation dra" in finding.message
    ready = run("k8s.node-ready", dra_node)
    assert ready.details["gpu_allocation"] == "dra" and "gpu_allocation dra" in ready.message


def test_inventory_reads_the_mode():
    node = inventory.node_from_vars("n", {"gpu_nodes"}, {"gpu_allocation": "DRA"})
    assert node.gpu_allocation == "dra" and node.dra
    assert inventory.node_from_vars("n", {"gpu_nodes"}, {}).gpu_allocation == "device-plugin"
    with pytest.raises(GpuprovError, match="inventory host n: gpu_allocation must be one of"):
        inventory.node_from_vars("n", {"gpu_nodes"}, {"gpu_allocation": "both"})


def test_snapshot_reads_each_dra_nodes_slices_by_field_selector(api):
    """Through the emulated API server's resource.k8s.io/v1 and its field selectors: the DRA
    node's slice of NVIDIA's driver, not another node's nor another driver's."""
    from kubernetes import client

    from gpuprov.verify import cluster

    resource = client.ResourceV1Api(api)
    device = docs_devices()["gpu"]
    for name, node, driver in (("hopper-gpu", "gpu-hopper", "gpu.nvidia.com"),
                               ("pascal-gpu", "gpu-pascal", "gpu.nvidia.com"),
                               ("hopper-other", "gpu-hopper", "example.com")):
        body = slice_of(node, [device])
        body["metadata"]["name"] = name
        body["spec"]["driver"] = driver
        resource.create_resource_slice(body)
    try:
        view = cluster.snapshot(api, ("gpu-hopper",))
        [found] = view.slices_by_node["gpu-hopper"]
        assert found["metadata"]["name"] == "hopper-gpu"
        assert "gpu-pascal" not in view.slices_by_node
    finally:
        for name in ("hopper-gpu", "pascal-gpu", "hopper-other"):
            resource.delete_resource_slice(name)


def test_a_mixed_cluster_report_lists_each_nodes_mode_and_checks():
    """The cluster phase on one DRA node (the recorded H200 with its published device) and one
    device-plugin node, through the JSON and JUnit formatters."""
    from gpuprov.verify import cluster, report
    from gpuprov.verify.nodes import ProbeResult
    from gpuprov.verify.runner import cluster_findings, select_checks

    h200 = json.loads(H200.read_text())
    h200["packages"] = {"runtime": [{"name": "containerd", "version": "2.1.4~ds1-1",
                                     "state": "installed"}]}
    dra_node = Node(name="gpu-a", target=None, gpu_expected=True, gpu_allocation="dra")
    plugin_node = Node(name="gpu-b", target=None, gpu_expected=True)
    view = cluster.ClusterView(
        server="https://127.0.0.1:6443",
        nodes={"gpu-a": k8s_node("gpu-a"), "gpu-b": k8s_node("gpu-b", {"nvidia.com/gpu": "1"})},
        pods_by_node={"gpu-a": (PLUGIN,), "gpu-b": (DEVICE_PLUGIN,)},
        slices_by_node={"gpu-a": (slice_of("gpu-a", [h200_device()]),)})
    findings = cluster_findings([ProbeResult(dra_node, h200), ProbeResult(plugin_node, h200)],
                                view, select_checks(["k8s.node-ready", "k8s.device-plugin",
                                                     "dra"]))
    doc = report.json_document(findings)
    got = {(r["node"], r["check"]): r["status"] for r in doc["results"]}
    assert got == {
        ("gpu-a", "k8s.node-ready"): PASS, ("gpu-a", "k8s.device-plugin"): SKIP,
        ("gpu-a", "dra.plugin"): PASS, ("gpu-a", "dra.slice"): PASS,
        ("gpu-a", "dra.devices-vs-nvml"): PASS, ("gpu-a", "dra.runtime"): PASS,
        ("gpu-b", "k8s.node-ready"): PASS, ("gpu-b", "k8s.device-plugin"): PASS,
        ("gpu-b", "dra.plugin"): SKIP, ("gpu-b", "dra.slice"): SKIP,
        ("gpu-b", "dra.devices-vs-nvml"): SKIP, ("gpu-b", "dra.runtime"): SKIP}
    modes = {r["node"]: r["details"]["gpu_allocation"] for r in doc["results"]
             if r["check"] == "k8s.node-ready"}
    assert modes == {"gpu-a": "dra", "gpu-b": "device-plugin"}
    suites = {s.get("name"): [c.get("name") for c in s] for s in report.junit(findings).getroot()}
    assert "dra.devices-vs-nvml" in suites["gpu-a"] and "dra.plugin" in suites["gpu-b"]
