"""The lab's DRA emulation on a real lab node (issue 35 item 4): gpu-hopper (Debian 13,
containerd 2.x) moved to NVIDIA's DRA driver by its labels, gpuprov's DaemonSet of the v0.4.1
driver (manifests.dra_driver()) run there by the emulated kubelet as the simulated plugin; the
node's ResourceSlice published from its simulated NVML; a pod with a claim for two GPUs sees
exactly those two through the node's real containerd, which injects the claim's CDI devices
from the spec the kubelet's prepare wrote with the node's nvidia-ctk; the spec is gone after
the pod. The module gives gpu-hopper back as it found it: labels, no DRA DaemonSet, its
device plugin and 8 nvidia.com/gpu again (the session lab's other tests expect them)."""

from __future__ import annotations

import json

import pytest
from conftest import kube_api, playbook_failures
from kubernetes import client, utils

from gpuprov import manifests
from gpuprov.lab.kube.testing import wait_for
from gpuprov.nvidia.labels import DEPLOY_DEVICE_PLUGIN, DEPLOY_DRA_DRIVER

NODE = "gpu-hopper"
NS = "default"
SELECTOR = "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('h100')"


@pytest.fixture(scope="module")
def dra_hopper(site_run, lab):
    rc, doc = site_run
    assert rc == 0, playbook_failures(doc)
    api = kube_api(lab)
    core = client.CoreV1Api(api)
    before = dict(core.read_node(NODE).metadata.labels or {})
    gpus_before = core.read_node(NODE).status.allocatable.get("nvidia.com/gpu")
    core.patch_node(NODE, {"metadata": {"labels": {DEPLOY_DRA_DRIVER: "true",
                                                   DEPLOY_DEVICE_PLUGIN: "false"}}})
    created = []
    try:
        for obj in manifests.dra_driver():
            if obj["kind"].startswith("ValidatingAdmissionPolicy"):
                continue  # the emulator serves no admission policies (EMULATION.md)
            try:
                utils.create_from_dict(api, obj)
            except utils.FailToCreateError as exc:
                if any(e.status != 409 for e in exc.api_exceptions):
                    raise
                continue  # there already (the role's objects): left as found
            created.append(obj)
        yield api
    finally:
        resource = client.ResourceV1Api(api)
        for obj in reversed(created):
            meta = obj["metadata"]
            if obj["kind"] == "DaemonSet":
                client.AppsV1Api(api).delete_namespaced_daemon_set(meta["name"],
                                                                   meta["namespace"])
            elif obj["kind"] == "DeviceClass":
                resource.delete_device_class(meta["name"])
            elif obj["kind"] == "Namespace":
                core.delete_namespace(meta["name"])
            elif obj["kind"] == "ServiceAccount":
                core.delete_namespaced_service_account(meta["name"], meta["namespace"])
            elif obj["kind"] == "ClusterRoleBinding":
                client.RbacAuthorizationV1Api(api).delete_cluster_role_binding(meta["name"])
            elif obj["kind"] == "ClusterRole":
                client.RbacAuthorizationV1Api(api).delete_cluster_role(meta["name"])
        core.patch_node(NODE, {"metadata": {"labels": {
            key: before.get(key) for key in (DEPLOY_DRA_DRIVER, DEPLOY_DEVICE_PLUGIN)}}})
        wait_for(lambda: not resource.list_resource_slice(
            field_selector=f"spec.nodeName={NODE}").items, "gpu-hopper's slice to go", 90)
        wait_for(lambda: core.read_node(NODE).status.allocatable.get("nvidia.com/gpu")
                 == gpus_before, "gpu-hopper's device plugin GPUs back", 120)


def test_a_claim_pod_gets_exactly_its_gpus_through_containerds_cdi(dra_hopper, lab,
                                                                   node_connection):
    api = dra_hopper
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    slices = wait_for(lambda: resource.list_resource_slice(
        field_selector=f"spec.nodeName={NODE}").items, "gpu-hopper's ResourceSlice", 90)
    assert [d.name for d in slices[0].spec.devices] == [f"gpu-{i}" for i in range(8)]
    by_device = {d.name: d.attributes["uuid"].string for d in slices[0].spec.devices}
    image = lab.require().pod_image
    resource.create_namespaced_resource_claim_template(NS, {
        "metadata": {"name": "dra-two-h100"}, "spec": {"spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2,
                                         "selectors": [{"cel": {"expression": SELECTOR}}]}}]}}}})
    core.create_namespaced_pod(NS, {"metadata": {"name": "dra-two"}, "spec": {
        "restartPolicy": "Never",
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "dra-two-h100"}],
        "containers": [{"name": "smi", "image": image,
                        "command": ["sh", "-c", "nvidia-smi -L; sleep 30"],
                        "resources": {"claims": [{"name": "gpus"}]}}]}})
    conn = node_connection(NODE)
    try:
        wait_for(lambda: core.read_namespaced_pod("dra-two", NS).status.phase == "Running",
                 "the claim pod to run", 90)
        pod = core.read_namespaced_pod("dra-two", NS)
        claim = resource.read_namespaced_resource_claim(
            pod.status.resource_claim_statuses[0].resource_claim_name, NS)
        devices = [r.device for r in claim.status.allocation.devices.results]
        assert len(devices) == 2 and pod.spec.node_name == NODE
        logs = wait_for(lambda: core.read_namespaced_pod_log("dra-two", NS,
                                                             container="smi").strip(),
                        "nvidia-smi -L")
        seen = [line.split("(UUID: ")[1].rstrip(")") for line in logs.splitlines()]
        assert sorted(seen) == sorted(by_device[d] for d in devices), logs
        path = f"/var/run/cdi/k8s.gpu.nvidia.com-claim_{claim.metadata.uid}.yaml"
        spec = json.loads(conn.run(f"cat {path}", hide=True, in_stream=False).stdout)
        assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
        assert sorted(d["name"] for d in spec["devices"]) == sorted(
            f"{claim.metadata.uid}-{d}" for d in devices)
    finally:
        core.delete_namespaced_pod("dra-two", NS, grace_period_seconds=0)
        resource.delete_namespaced_resource_claim_template("dra-two-h100", NS)
    wait_for(lambda: conn.run(f"test -e {path}", hide=True, in_stream=False,
                              warn=True).failed, "the claim's spec to go (unprepare)", 60)
    wait_for(lambda: not resource.list_namespaced_resource_claim(NS).items,
             "the claim to go with its pod", 60)
