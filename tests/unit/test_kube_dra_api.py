"""The emulated API server's resource.k8s.io/v1 (DeviceClass, ResourceSlice, ResourceClaim,
ResourceClaimTemplate), through the kubernetes client's typed ResourceV1Api: served, selectable
as the real server registers them, and refused with the causes of kubernetes/kubernetes
pkg/apis/resource/validation/validation.go where the strict schemas let an object through. The
objects are the DRA driver's own: its DeviceClasses as gpuprov renders them from the chart, and
a ResourceSlice device with the attributes NVIDIA's plugin publishes
(cmd/gpu-kubelet-plugin/deviceinfo.go of kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1)."""

from __future__ import annotations

import copy
import json
import re

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuprov import manifests


@pytest.fixture(scope="module")
def resource(api):
    return client.ResourceV1Api(api)


@pytest.fixture
def ns(api, request):
    core = client.CoreV1Api(api)
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def h100(minor: int) -> dict:
    """A full GPU as NVIDIA's plugin publishes it: name gpu-<minor>, domain-less attribute keys,
    versions as semver, memory in bytes as a BinarySI quantity."""
    return {"name": f"gpu-{minor}", "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": f"GPU-0000000{minor}-h100"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"}, "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.95.5"}, "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": f"0000:{minor + 0x18:02x}:00.0"}},
        "capacity": {"memory": {"value": "80Gi"}}}


def slice_body(name: str = "gpu-hopper-gpu.nvidia.com", **spec) -> dict:
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu-hopper",
                     "pool": {"name": "gpu-hopper", "generation": 1, "resourceSliceCount": 1},
                     "devices": [h100(i) for i in range(8)]}}
    body["spec"].update(spec)
    return body


def claim_body(name: str, requests: list, **devices) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name}, "spec": {"devices": {"requests": requests, **devices}}}


def causes(exc: ApiException) -> list[tuple[str, str]]:
    assert exc.status == 422, exc.body
    return [(c["field"], c["message"]) for c in json.loads(exc.body)["details"]["causes"]]


def test_the_dra_drivers_device_classes_are_served(resource):
    classes = [o for o in manifests.dra_driver() if o["kind"] == "DeviceClass"]
    for body in classes:
        resource.create_device_class(body)
    try:
        listed = {c.metadata.name: c.spec.selectors[0].cel.expression
                  for c in resource.list_device_class().items}
        assert listed == {c["metadata"]["name"]: c["spec"]["selectors"][0]["cel"]["expression"]
                          for c in classes}
    finally:
        for body in classes:
            resource.delete_device_class(body["metadata"]["name"])


def test_the_dra_drivers_admission_policy_is_stored_and_served(api):
    # Stored and served, not evaluated: the chart's policy and binding as the role applies them.
    admission = client.AdmissionregistrationV1Api(api)
    policy, binding = (o for o in manifests.dra_driver()
                       if o["kind"].startswith("ValidatingAdmissionPolicy"))
    admission.create_validating_admission_policy(policy)
    admission.create_validating_admission_policy_binding(binding)
    try:
        served = admission.read_validating_admission_policy(policy["metadata"]["name"])
        assert [v.expression for v in served.spec.validations] == \
            [v["expression"] for v in policy["spec"]["validations"]]
        assert admission.read_validating_admission_policy_binding(
            binding["metadata"]["name"]).spec.policy_name == policy["metadata"]["name"]
    finally:
        admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
        admission.delete_validating_admission_policy(policy["metadata"]["name"])


def test_a_nodes_slice_is_found_by_node_and_driver(resource):
    resource.create_resource_slice(slice_body())
    resource.create_resource_slice(slice_body("gpu-pascal-gpu.nvidia.com", nodeName="gpu-pascal",
                                              devices=[]))
    try:
        found = resource.list_resource_slice(
            field_selector="spec.nodeName=gpu-hopper,spec.driver=gpu.nvidia.com").items
        assert [s.metadata.name for s in found] == ["gpu-hopper-gpu.nvidia.com"]
        devices = found[0].spec.devices
        assert [d.name for d in devices] == [f"gpu-{i}" for i in range(8)]
        assert devices[0].attributes["driverVersion"].version == "580.95.5"
        assert devices[0].capacity["memory"].value == "80Gi"
        assert resource.list_resource_slice(field_selector="spec.driver=other").items == []
    finally:
        resource.delete_resource_slice("gpu-hopper-gpu.nvidia.com")
        resource.delete_resource_slice("gpu-pascal-gpu.nvidia.com")


@pytest.mark.parametrize("spec, expected", [
    ({"nodeName": None}, [("spec", "Required value: exactly one of `nodeName`, `nodeSelector`, "
                           "`allNodes`, `perDeviceNodeSelection` is required")]),
    ({"allNodes": True}, [("spec", "Invalid value: \"{`nodeName`, `allNodes`}\": exactly one of "
                           "`nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is "
                           "required, but multiple fields are set")]),
    ({"devices": [h100(i) for i in range(129)]},
     [("spec.devices", "Too many: 129: must have at most 128 items")]),
    ({"devices": [h100(0), h100(0)]}, [("spec.devices[1].name", "Duplicate value: 'gpu-0'")]),
    ({"pool": {"name": "gpu-hopper", "generation": 1, "resourceSliceCount": 0}},
     [("spec.pool.resourceSliceCount", "Invalid value: 0: must be greater than zero")]),
])
def test_a_slice_the_schema_lets_through_is_refused_as_kubernetes_does(resource, spec,
                                                                       expected):
    with pytest.raises(ApiException) as refused:
        resource.create_resource_slice(slice_body(**spec))
    assert causes(refused.value) == expected
    assert resource.list_resource_slice().items == []


def test_a_device_with_too_many_attributes_or_two_values_is_refused(resource):
    device = h100(0)
    device["attributes"].update({f"extra{i}": {"int": i} for i in range(23)})
    device["attributes"]["type"] = {"string": "gpu", "bool": True}
    with pytest.raises(ApiException) as refused:
        resource.create_resource_slice(slice_body(devices=[device]))
    assert causes(refused.value) == [
        ("spec.devices[0]", "Too many: 33: must have at most 32 attributes and capacities "
                            "combined"),
        ("spec.devices[0].attributes[type]", "Invalid value: exactly one value must be "
                                             "specified")]


def test_a_claim_for_gpus_is_stored_and_its_spec_is_immutable(resource, ns):
    request = {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2,
                                           "selectors": [{"cel": {"expression": (
                                               "device.attributes['gpu.nvidia.com']"
                                               ".productName == 'NVIDIA H100 80GB HBM3'")}}]}}
    created = resource.create_namespaced_resource_claim(ns, claim_body("two", [request]))
    assert created.spec.devices.requests[0].exactly.count == 2
    changed = copy.deepcopy(request)
    changed["exactly"]["count"] = 3
    with pytest.raises(ApiException) as refused:
        resource.patch_namespaced_resource_claim(
            "two", ns, {"spec": {"devices": {"requests": [changed]}}})
    assert causes(refused.value) == [("spec", "Invalid value: field is immutable")]
    # Labels may change; the status has its own subresource.
    resource.patch_namespaced_resource_claim("two", ns, {"metadata": {"labels": {"a": "b"}}})


@pytest.mark.parametrize("requests, extra, expected", [
    ([{"name": "gpu"}], {}, [("spec.devices.requests[0]", "Required value: exactly one of "
                              "`exactly` or `firstAvailable` is required")]),
    ([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"},
       "firstAvailable": [{"name": "mig", "deviceClassName": "mig.nvidia.com"}]}], {},
     [("spec.devices.requests[0]", "Invalid value: null: exactly one of `exactly` or "
       "`firstAvailable` is required, but multiple fields are set")]),
    ([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 0}}], {},
     [("spec.devices.requests[0].exactly.count", "Invalid value: 0: must be greater than "
       "zero")]),
    ([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All",
                                  "count": 2}}], {},
     [("spec.devices.requests[0].exactly.count", "Invalid value: 2: must not be specified "
       "when allocationMode is 'All'")]),
    ([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
      {"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com"}}], {},
     [("spec.devices.requests[1].name", "Duplicate value: 'gpu'")]),
    ([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}],
     {"constraints": [{"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/productName"}]},
     [("spec.devices.constraints[0].requests[0]", "Invalid value: 'gpus': must be the name of "
       "a request in the claim or the name of a request and a subrequest separated by '/'")]),
])
def test_a_claim_the_schema_lets_through_is_refused_as_kubernetes_does(resource, ns, requests,
                                                                       extra, expected):
    with pytest.raises(ApiException) as refused:
        resource.create_namespaced_resource_claim(ns, claim_body("bad", requests, **extra))
    assert causes(refused.value) == expected


def test_a_template_is_validated_as_its_claim_and_is_immutable(resource, ns):
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}}
    resource.create_namespaced_resource_claim_template(ns, body)
    with pytest.raises(ApiException) as refused:
        resource.patch_namespaced_resource_claim_template(
            "one-gpu", ns, {"spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}}}})
    assert causes(refused.value) == [("spec", "Invalid value: field is immutable")]
    bad = copy.deepcopy(body)
    bad["metadata"]["name"] = "none"
    bad["spec"]["spec"]["devices"]["requests"] = [{"name": "gpu"}]
    with pytest.raises(ApiException) as refused:
        resource.create_namespaced_resource_claim_template(ns, bad)
    assert causes(refused.value) == [("spec.spec.devices.requests[0]", "Required value: "
                                      "exactly one of `exactly` or `firstAvailable` is required")]
