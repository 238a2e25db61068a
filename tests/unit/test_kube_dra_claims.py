"""The lab's DRA control plane on the in-process emulator: the resourceclaim controller
(kubernetes pkg/controller/resourceclaim/controller.go: template -> claim named
`<pod>-<entry>-<suffix>`, annotated with the entry, owned by the pod, recorded in
pod.status.resourceClaimStatuses; reservation dropped and the template claim deleted when the
pod ends) and the scheduler's DynamicResources plugin (allocation written before the bind;
"cannot allocate all claims" where nothing fits). The DeviceClasses are NVIDIA's driver's, as
gpuprov renders them; the slices carry the attributes its plugin publishes (deviceinfo.go)."""

from __future__ import annotations

import pytest
from test_kube_dra_allocation import PASCAL, gpu, node_slice

from gpuprov import manifests
from gpuprov.lab.kube import dra
from gpuprov.lab.kube.registry import PODS, R
from gpuprov.lab.kube.testing import running_emulator, wait_for

CLAIMS, TEMPLATES = R["ResourceClaim"], R["ResourceClaimTemplate"]
HOPPER = node_slice("gpu-hopper", [gpu(i) for i in range(2)])


@pytest.fixture(scope="module")
def emu():
    with running_emulator() as emulator:
        reg = emulator.registry
        for obj in manifests.dra_driver():
            if obj["kind"] == "DeviceClass":
                reg.create(R["DeviceClass"], "", obj)
        for item in (HOPPER, PASCAL):
            reg.create(R["ResourceSlice"], "", item)
        yield emulator


def template(reg, ns: str, name: str, count: int = 1, selector: str = "") -> None:
    exactly = {"deviceClassName": "gpu.nvidia.com", "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    # The claim takes the labels of the template's spec.metadata, not of the template.
    reg.create(TEMPLATES, ns, {"metadata": {"name": name, "labels": {"of": "template"}},
                               "spec": {"metadata": {"labels": {"from": "template"}},
                                        "spec": {"devices": {"requests": [
                                            {"name": "gpus", "exactly": exactly}]}}}})


def claim_pod(reg, ns: str, name: str, tmpl: str) -> dict:
    return reg.create(PODS, ns, {"metadata": {"name": name}, "spec": {
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": tmpl}],
        "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "60"],
                        "resources": {"claims": [{"name": "gpus"}]}}]}})


def pod_claim(reg, ns: str, pod: str) -> dict | None:
    p = reg.find(PODS, ns, pod)
    statuses = (p or {}).get("status", {}).get("resourceClaimStatuses") or []
    return reg.find(CLAIMS, ns, statuses[0]["resourceClaimName"]) if statuses else None


def allocated(reg, ns: str, pod: str) -> dict | None:
    c = pod_claim(reg, ns, pod)
    return c if c and (c.get("status") or {}).get("allocation") else None


def test_template_claim_allocated_reserved_released_and_deleted(emu):
    reg = emu.registry
    template(reg, "default", "two", count=2)
    pod = claim_pod(reg, "default", "trainer", "two")
    claim = wait_for(lambda: allocated(reg, "default", "trainer"), "the claim's allocation")
    meta = claim["metadata"]
    assert meta["name"].startswith("trainer-gpus-") and len(meta["name"]) == len(
        "trainer-gpus-") + 5
    assert meta["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpus"
    assert meta["labels"] == {"from": "template"}
    assert [(r["kind"], r["uid"], r["controller"]) for r in meta["ownerReferences"]] == [
        ("Pod", pod["metadata"]["uid"], True)]
    status = claim["status"]
    results = status["allocation"]["devices"]["results"]
    # Two devices of one node, the node the pod is bound to.
    assert len({r["device"] for r in results}) == 2
    assert {(r["driver"], r["request"]) for r in results} == {("gpu.nvidia.com", "gpus")}
    node = results[0]["pool"]
    assert {r["pool"] for r in results} == {node}
    assert status["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"] == [
        {"key": "metadata.name", "operator": "In", "values": [node]}]
    assert status["reservedFor"] == [{"resource": "pods", "name": "trainer",
                                      "uid": pod["metadata"]["uid"]}]
    bound = wait_for(lambda: reg.find(PODS, "default", "trainer")["spec"].get("nodeName"),
                     "the bind")
    assert bound == node
    reg.delete(PODS, "default", "trainer", {"gracePeriodSeconds": 0})
    wait_for(lambda: reg.find(CLAIMS, "default", meta["name"]) is None,
             "the template claim to go with its pod")


def test_one_gpu_claims_get_different_gpus(emu):
    reg = emu.registry
    template(reg, "default", "one-hopper",
             selector="device.attributes['gpu.nvidia.com'].productName == "
                      "'NVIDIA H100 80GB HBM3'")
    for name in ("a", "b"):
        claim_pod(reg, "default", name, "one-hopper")
    got = [wait_for(lambda n=n: allocated(reg, "default", n), f"{n}'s allocation")
           for n in ("a", "b")]
    devices = [r["device"] for c in got for r in c["status"]["allocation"]["devices"]["results"]]
    assert len(devices) == 2 and len(set(devices)) == 2
    # Both GPUs of the hopper slice are held now: a third one-GPU hopper pod cannot have one.
    claim_pod(reg, "default", "c", "one-hopper")
    wait_for(lambda: dra.CANNOT_ALLOCATE in _scheduled_message(reg, "default", "c"),
             "c to be unschedulable")
    assert reg.find(PODS, "default", "c")["spec"].get("nodeName") is None
    # One of them ends: its GPU is free again (reservation dropped, claim deleted), c gets it.
    freed = got[0]["status"]["allocation"]["devices"]["results"][0]["device"]
    reg.delete(PODS, "default", "a", {"gracePeriodSeconds": 0})
    claim_c = wait_for(lambda: allocated(reg, "default", "c"), "c's allocation")
    assert [r["device"] for r in claim_c["status"]["allocation"]["devices"]["results"]] == [
        freed]
    for name in ("b", "c"):
        reg.delete(PODS, "default", name, {"gracePeriodSeconds": 0})


def _scheduled_message(reg, ns: str, pod: str) -> str:
    for cond in (reg.find(PODS, ns, pod) or {}).get("status", {}).get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond["status"] == "False":
            return f"{cond.get('reason')}: {cond.get('message')}"
    return ""


def test_product_the_cluster_lacks_stays_pending_with_the_reason(emu):
    reg = emu.registry
    template(reg, "default", "a100",
             selector="device.attributes['gpu.nvidia.com'].productName.lowerAscii()"
                      ".matches('^.*a100.*$')")
    claim_pod(reg, "default", "wants-a100", "a100")
    message = wait_for(lambda: _scheduled_message(reg, "default", "wants-a100"),
                       "the scheduler's verdict")
    assert message.startswith("Unschedulable: 0/4 nodes are available: ")
    # Every node fails on the claim (those with slices and those without), in the
    # DynamicResources plugin's words.
    assert f"4 {dra.CANNOT_ALLOCATE}." in message
    claim = pod_claim(reg, "default", "wants-a100")
    assert claim is not None and not (claim.get("status") or {}).get("allocation")
    reg.delete(PODS, "default", "wants-a100", {"gracePeriodSeconds": 0})


def test_an_allocated_claim_pins_its_pods_to_its_node_and_is_shared(emu):
    """A ResourceClaim made by the user (resourceClaimName): the first pod's scheduling
    allocates it; a second pod naming it goes to the same node and is reserved too; the
    claim stays (it has no pod owner) and is deallocated once neither pod runs."""
    reg = emu.registry
    reg.create(CLAIMS, "default", {"metadata": {"name": "shared"}, "spec": {"devices": {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
    pods = []
    for name in ("s1", "s2"):
        pods.append(reg.create(PODS, "default", {"metadata": {"name": name}, "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}],
            "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "60"],
                            "resources": {"claims": [{"name": "gpu"}]}}]}}))
        wait_for(lambda n=name: reg.find(PODS, "default", n)["spec"].get("nodeName"),
                 f"{name}'s bind")
    claim = reg.find(CLAIMS, "default", "shared")
    node = claim["status"]["allocation"]["devices"]["results"][0]["pool"]
    assert {reg.find(PODS, "default", n)["spec"]["nodeName"] for n in ("s1", "s2")} == {node}
    assert sorted(r["name"] for r in claim["status"]["reservedFor"]) == ["s1", "s2"]
    for name in ("s1", "s2"):
        reg.delete(PODS, "default", name, {"gracePeriodSeconds": 0})
    wait_for(lambda: not (reg.find(CLAIMS, "default", "shared").get("status") or {}).get(
        "allocation"), "the claim to be deallocated")
    assert not reg.find(CLAIMS, "default", "shared")["status"].get("reservedFor")
    reg.delete(CLAIMS, "default", "shared")
