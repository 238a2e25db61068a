"""The DRA smoke's objects and judgments (gpuprov.verify.claims): the objects are accepted by
the emulated API server's resource.k8s.io/v1 validation, and the readers take the shapes the
contract and Kubernetes give (claim status.allocation, pod resourceClaimStatuses, conditions)."""

from __future__ import annotations

import contextlib

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from test_verify_dra import docs_devices, slice_of

from gpuprov import manifests
from gpuprov.verify import claims

NS = "default"


def claim(results: list[tuple[str, str]], node: str = "gpu-a") -> dict:
    return {"metadata": {"name": "p-gpus-abcde", "uid": "1234"},
            "status": {"allocation": {
                "devices": {"results": [{"request": "gpus", "driver": "gpu.nvidia.com",
                                         "pool": pool, "device": device}
                                        for pool, device in results]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}}


def test_the_template_and_pod_are_valid_resource_k8s_io_v1(api):
    resource, core = client.ResourceV1Api(api), client.CoreV1Api(api)
    body = claims.claim_template("smoke-gpus", 2, claims.product_selector('NVIDIA "H200"'))
    resource.create_namespaced_resource_claim_template(NS, body)
    pod = claims.with_claim(manifests.smoke_pod("smoke-claim", NS, gpus=0, node="gpu-hopper",
                                                visible_devices="void"),
                            "smoke-gpus")
    try:
        stored = resource.read_namespaced_resource_claim_template("smoke-gpus", NS)
        [request] = stored.spec.spec.devices.requests
        assert (request.exactly.device_class_name, request.exactly.count) == (
            "gpu.nvidia.com", 2)
        assert request.exactly.selectors[0].cel.expression == (
            "device.attributes['gpu.nvidia.com'].productName == \"NVIDIA \\\"H200\\\"\"")
        created = core.create_namespaced_pod(NS, pod)
        assert created.spec.resource_claims[0].resource_claim_template_name == "smoke-gpus"
    finally:
        resource.delete_namespaced_resource_claim_template("smoke-gpus", NS)
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod("smoke-claim", NS, grace_period_seconds=0)


def test_a_template_for_no_gpu_is_refused(api):
    with pytest.raises(ApiException) as refused:
        client.ResourceV1Api(api).create_namespaced_resource_claim_template(
            NS, claims.claim_template("zero", 0))
    assert refused.value.status == 422


def test_allocated_devices_map_to_uuids_through_the_slice():
    gpu = docs_devices()["gpu"]
    slices = [slice_of("gpu-a", [gpu])]
    uuids, unknown = claims.device_uuids(claim([("gpu-a", "gpu-0"), ("gpu-a", "gpu-7")]), slices)
    assert uuids == ["GPU-2fa81118-5a5f-aa66-7660-471eed407181"]
    assert unknown == ["gpu-a/gpu-7"]
    assert claims.allocated_node(claim([("gpu-a", "gpu-0")])) == "gpu-a"
    assert claims.allocated_node({"status": {}}) is None


def test_judge_count():
    assert claims.judge_count(["a", "b"], ["b", "a"], 2) is None
    assert "not claimed: c" in claims.judge_count(["a", "c"], ["a", "b"], 2)
    assert "got 1 device(s) for 2" in claims.judge_count(["a"], ["a"], 2)


def test_judge_isolation():
    assert claims.judge_isolation({"p0": ["a"], "p1": ["b"]}) is None
    assert claims.judge_isolation({"p0": ["a"], "p1": ["a"]}) == "a seen by p0, p1"
    assert claims.judge_isolation({"p0": [], "p1": ["a"]}) == "p0 sees 0 GPU(s)"


def test_judge_pending_wants_the_schedulers_claim_reason():
    def pod(phase, reason="Unschedulable", message="0/4 nodes are available: 4 cannot "
            "allocate all claims."):
        return {"status": {"phase": phase, "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}]}}
    assert claims.judge_pending(pod("Pending")) is None
    assert "Running" in claims.judge_pending(pod("Running"))
    assert "not about claims" in claims.judge_pending(pod("Pending", message="0/4 nodes: cpu"))
    assert "without" in claims.judge_pending({"status": {"phase": "Pending"}})


def test_claim_name_and_cdi_path():
    pod = {"status": {"resourceClaimStatuses": [{"name": "gpus",
                                                 "resourceClaimName": "p-gpus-x1y2z"}]}}
    assert claims.pod_claim_name(pod) == "p-gpus-x1y2z"
    assert claims.pod_claim_name({}) is None
    assert claims.cdi_spec_path("1234") == "/var/run/cdi/k8s.gpu.nvidia.com-claim_1234.yaml"
