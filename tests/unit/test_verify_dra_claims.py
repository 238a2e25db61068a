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
from gpuprov.verify import (
    claims,
    runner,  # noqa: F401 (registers every phase's checks)
)

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


def _facts(runs: dict, mode: str = "dra"):
    from gpuprov.verify.facts import PodFacts
    from gpuprov.verify.inventory import Node

    return PodFacts(Node(name="gpu-hopper", target=None, gpu_expected=True,
                         gpu_allocation=mode), {"pci": [{}]}, runs)


def _verdict(check_id: str, runs: dict, mode: str = "dra"):
    from gpuprov.verify.findings import CHECKS

    check = CHECKS[check_id]
    return check.finding("gpu-hopper", check.func(_facts(runs, mode)))


def test_a_claim_for_an_absent_product_stays_pending_on_the_emulator(emulator, api):
    """The claim smoke's unavailable-product claim through the emulated scheduler's
    DynamicResources placement; the smoke's namespace is gone afterwards."""
    from gpuprov.lab.kube.registry import R
    from gpuprov.verify import pods

    for obj in manifests.dra_driver():
        if obj["kind"] == "DeviceClass":
            emulator.registry.create(R["DeviceClass"], "", obj)
    device = docs_devices()["gpu"]
    published = slice_of("gpu-hopper", [device])
    published["metadata"]["name"] = "claims-smoke-hopper"
    emulator.registry.create(R["ResourceSlice"], "", published)
    target = pods.DraTarget("gpu-hopper", (published,), "NVIDIA A100-PCIE-40GB")
    runs = pods.run(api, [target], ["claim-unavailable"], 20, 2)["gpu-hopper"]
    finding = _verdict("dra.claim-unavailable", runs)
    assert finding.status == "pass", finding.message
    assert claims.UNALLOCATABLE in finding.message
    left = [n.metadata.name for n in client.CoreV1Api(api).list_namespace().items
            if n.metadata.name.startswith(pods.NAMESPACE_PREFIX)]
    assert left == []


def _record(uuids_seen, uuids_claimed, node="gpu-hopper", phase="Running", **more):
    from gpuprov.verify import pods

    return pods.ClaimRecord(pod=pods.PodRecord(f"p-{len(uuids_seen)}-{phase}", phase,
                                               tuple(uuids_seen)),
                            claim="c", claim_uid="u1", node=node, uuids=tuple(uuids_claimed),
                            **more)


def _run(kind, requested, *records):
    from gpuprov.verify import pods

    return {kind: pods.ClaimRun(kind, requested, tuple(records))}


def test_claim_count_judges_seen_against_claimed():
    ok = _run("claim-count", 2, _record(["a", "b"], ["b", "a"]))
    assert _verdict("dra.claim-count", ok).status == "pass"
    extra = _run("claim-count", 2, _record(["a", "b", "c"], ["a", "b"]))
    finding = _verdict("dra.claim-count", extra)
    assert finding.status == "fail" and "not claimed: c" in finding.message
    failed = _run("claim-count", 2, _record([], ["a", "b"], phase="Failed"))
    assert "Failed" in _verdict("dra.claim-count", failed).message


def test_claim_isolation_and_selector():
    from gpuprov.verify import pods

    def rec(name, seen, claimed, node="gpu-hopper"):
        return pods.ClaimRecord(pods.PodRecord(name, "Running", (seen,)), "c", "u", node,
                                (claimed,))
    ok = {"claim-isolation": pods.ClaimRun("claim-isolation", 1, (rec("p0", "a", "a"),
                                                                  rec("p1", "b", "b")))}
    assert _verdict("dra.claim-isolation", ok).status == "pass"
    shared = {"claim-isolation": pods.ClaimRun("claim-isolation", 1, (rec("p0", "a", "a"),
                                                                      rec("p1", "a", "b")))}
    assert _verdict("dra.claim-isolation", shared).message == "a seen by p0, p1"
    elsewhere = {"claim-selector": pods.ClaimRun("claim-selector", 1, (
        rec("p", "a", "a", node="gpu-other"),))}
    finding = _verdict("dra.claim-selector", elsewhere)
    assert finding.status == "fail" and "gpu-other" in finding.message


def test_claim_cdi_while_running_and_after():
    def verdict(during, after):
        return _verdict("dra.claim-cdi", _run("claim-count", 1, _record(
            ["a"], ["a"], cdi_while_running=during, cdi_after=after)))
    assert verdict(True, False).status == "pass"
    assert "still there" in verdict(True, True).message
    assert "missing" in verdict(False, False).message
    assert verdict(None, None).status == "skip"


def test_claim_checks_skip_on_a_device_plugin_node_and_pods_checks_on_a_dra_node():
    assert _verdict("dra.claim-count", {}, mode="device-plugin").status == "skip"
    finding = _verdict("pods.gpu-count", {})
    assert finding.status == "skip" and "gpu_allocation dra" in finding.message


def test_file_exists_on_a_local_node(tmp_path):
    from gpuprov.verify import nodes
    from gpuprov.verify.inventory import Node

    local = Node(name="here", target=None, gpu_expected=True)
    spec = tmp_path / "k8s.gpu.nvidia.com-claim_1234.yaml"
    assert not nodes.file_exists(local, str(spec), 5)
    spec.write_text("cdiVersion: 0.6.0\n")
    assert nodes.file_exists(local, str(spec), 5)


def test_a_cdi_spec_is_waited_for_until_it_goes_or_the_time_is_up():
    """dra.claim-cdi's "gone after": the kubelet unprepares a force-deleted pod's claim after
    the pod's object is gone, so the spec is asked for again until it goes (bounded)."""
    import time

    from gpuprov.verify import pods

    answers = iter([True, True, False])
    slept: list[float] = []
    assert pods.stays(lambda: next(answers), 5, 1, slept.append) is False
    assert slept == [1, 1]
    slept.clear()

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    assert pods.stays(lambda: True, 0.05, 0.01, sleep) is True
    assert slept and sum(slept) <= 0.05 + 1e-6
    assert pods.stays(lambda: False, 5, 1, slept.append) is False
