"""The lab's DRA allocation (gpuprov/lab/kube/dra.py) against things nobody here wrote: the
DeviceClasses of NVIDIA's DRA driver chart (as gpuprov renders them), the attributes its
gpu-kubelet-plugin publishes (kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1
cmd/gpu-kubelet-plugin/deviceinfo.go and mig.go: domain-less keys, `type` gpu or mig, names
gpu-<minor> and gpu-<minor>-mig-<profile>-<gi profile>-<start>), and the selectors of the
driver's own demo (demo/specs/quickstart/v1/gpu-test6.yaml:
`device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$')`)."""

from __future__ import annotations

import pytest

from gpuprov import manifests
from gpuprov.lab.kube import dra

CLASSES = [o for o in manifests.dra_driver() if o["kind"] == "DeviceClass"]


def gpu(minor: int, product: str = "NVIDIA H100 80GB HBM3", architecture: str = "Hopper",
        memory: str = "80Gi") -> dict:
    return {"name": f"gpu-{minor}", "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": f"GPU-{minor:08d}"},
        "productName": {"string": product}, "brand": {"string": "Nvidia"},
        "architecture": {"string": architecture}, "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.95.5"},
        "resource.kubernetes.io/pciBusID": {"string": f"0000:{minor + 0x18:02x}:00.0"}},
        "capacity": {"memory": {"value": memory}}}


def mig(parent: int, profile: str, gi_profile: int, start: int) -> dict:
    return {"name": f"gpu-{parent}-mig-{profile.replace('.', '')}-{gi_profile}-{start}",
            "attributes": {"type": {"string": "mig"}, "profile": {"string": profile},
                           "parentUUID": {"string": f"GPU-{parent:08d}"},
                           "productName": {"string": "NVIDIA H100 80GB HBM3"}},
            "capacity": {"memory": {"value": "10240Mi"}}}


def node_slice(node: str, devices: list[dict]) -> dict:
    return {"metadata": {"name": f"{node}-gpu.nvidia.com"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "devices": devices,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}}


HOPPER = node_slice("gpu-hopper", [gpu(i) for i in range(8)])
PASCAL = node_slice("gpu-pascal", [gpu(i, "Tesla P100-PCIE-16GB", "Pascal", "16Gi")
                                   for i in range(2)])
MIGGED = node_slice("gpu-hopper", [gpu(0), mig(1, "1g.10gb", 19, 0), mig(1, "1g.10gb", 19, 1)])
SLICES = [HOPPER, PASCAL]


def claim(*requests: dict, **devices) -> dict:
    return {"spec": {"devices": {"requests": list(requests), **devices}}}


def exactly(name: str = "gpu", cls: str = "gpu.nvidia.com", **fields) -> dict:
    return {"name": name, "exactly": {"deviceClassName": cls, **fields}}


def names(results) -> list[str]:
    return None if results is None else [r.device for r in results]


def test_a_claim_for_k_gpus_gets_k_devices_of_the_node_it_is_placed_on():
    results = dra.allocate(claim(exactly(count=3)), CLASSES, SLICES, "gpu-hopper")
    assert [r.to_dict() for r in results] == [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-hopper", "device": d}
        for d in ("gpu-0", "gpu-1", "gpu-2")]
    assert names(dra.allocate(claim(exactly(count=3)), CLASSES, SLICES, "gpu-pascal")) is None
    assert names(dra.allocate(claim(exactly(allocationMode="All")), CLASSES, SLICES,
                              "gpu-pascal")) == ["gpu-0", "gpu-1"]


def test_devices_another_claim_holds_are_not_given_again():
    first = {"status": {"allocation": {"devices": {"results": [
        r.to_dict() for r in dra.allocate(claim(exactly(count=6)), CLASSES, SLICES,
                                          "gpu-hopper")]}}}}
    taken = dra.in_use([first])
    assert names(dra.allocate(claim(exactly(count=2)), CLASSES, SLICES, "gpu-hopper",
                              taken)) == ["gpu-6", "gpu-7"]
    assert dra.allocate(claim(exactly(count=3)), CLASSES, SLICES, "gpu-hopper", taken) is None
    # Two requests of one claim never share a device either.
    two = dra.allocate(claim(exactly("a", count=4), exactly("b", count=4)), CLASSES, SLICES,
                       "gpu-hopper")
    assert [(r.request, r.device) for r in two] == [
        ("a", f"gpu-{i}") for i in range(4)] + [("b", f"gpu-{i}") for i in range(4, 8)]


def test_the_drivers_demo_selector_on_the_product_name():
    def by_product(pattern: str) -> dict:
        return claim(exactly(selectors=[{"cel": {"expression": (
            "device.attributes['gpu.nvidia.com'].productName.lowerAscii()"
            f".matches('^.*{pattern}.*$')")}}]))

    assert names(dra.allocate(by_product("h100"), CLASSES, SLICES, "gpu-hopper")) == ["gpu-0"]
    assert dra.allocate(by_product("h100"), CLASSES, SLICES, "gpu-pascal") is None
    assert names(dra.allocate(by_product("p100"), CLASSES, SLICES, "gpu-pascal")) == ["gpu-0"]
    # A product the cluster lacks fits no node.
    assert all(dra.allocate(by_product("a100"), CLASSES, SLICES, node) is None
               for node in ("gpu-hopper", "gpu-pascal"))


def test_the_classes_tell_whole_gpus_from_mig_devices():
    assert names(dra.allocate(claim(exactly(allocationMode="All")), CLASSES, [MIGGED],
                              "gpu-hopper")) == ["gpu-0"]
    assert names(dra.allocate(claim(exactly(cls="mig.nvidia.com", count=2)), CLASSES,
                              [MIGGED], "gpu-hopper")) == [
        "gpu-1-mig-1g10gb-19-0", "gpu-1-mig-1g10gb-19-1"]
    # A class that does not exist allocates nothing.
    assert dra.allocate(claim(exactly(cls="vfio.gpu.nvidia.com")), CLASSES, [MIGGED],
                        "gpu-hopper") is None


def test_first_available_takes_the_first_sub_request_that_fits():
    request = {"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 4},
        {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 1}]}
    assert [(r.request, r.device) for r in dra.allocate(
        claim(request), CLASSES, SLICES, "gpu-pascal")] == [("gpu/small", "gpu-0")]
    assert [r.request for r in dra.allocate(claim(request), CLASSES, SLICES,
                                            "gpu-hopper")] == ["gpu/big"] * 4


def test_qualified_attributes_and_unknown_domains_read_as_kubernetes_reads_them():
    pci = claim(exactly(selectors=[{"cel": {"expression": (
        "device.attributes['resource.kubernetes.io'].pciBusID == '0000:1a:00.0'")}}]))
    assert names(dra.allocate(pci, CLASSES, SLICES, "gpu-hopper")) == ["gpu-2"]
    # A domain the device lacks is an empty map: `in` is false, no error.
    other = claim(exactly(selectors=[{"cel": {"expression": (
        "'model' in device.attributes['example.com']")}}]))
    assert dra.allocate(other, CLASSES, SLICES, "gpu-hopper") is None


def test_a_missing_attribute_or_a_bad_expression_aborts_the_allocation():
    missing = claim(exactly(selectors=[{"cel": {"expression": (
        "device.attributes['gpu.nvidia.com'].index == 0")}}]))  # removed in v25.8.0
    with pytest.raises(dra.SelectorError, match="gpu-0"):
        dra.allocate(missing, CLASSES, SLICES, "gpu-hopper")
    with pytest.raises(dra.SelectorError, match="compilation failed"):
        dra.allocate(claim(exactly(selectors=[{"cel": {"expression": "device.driver =="}}])),
                     CLASSES, SLICES, "gpu-hopper")
    with pytest.raises(dra.SelectorError, match="must return bool"):
        dra.allocate(claim(exactly(selectors=[{"cel": {"expression": "device.driver"}}])),
                     CLASSES, SLICES, "gpu-hopper")


def test_what_is_not_emulated_is_refused_not_guessed():
    with pytest.raises(dra.NotEmulated, match="constraints"):
        dra.allocate(claim(exactly(count=2), constraints=[
            {"requests": ["gpu"], "matchAttribute": "gpu.nvidia.com/productName"}]),
            CLASSES, SLICES, "gpu-hopper")
    with pytest.raises(dra.NotEmulated, match="adminAccess"):
        dra.allocate(claim(exactly(adminAccess=True)), CLASSES, SLICES, "gpu-hopper")
