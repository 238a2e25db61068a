"""The MIG stage (roles/gpu_mig, site.yml's playbooks/mig.yml) on the lab, as issue 20 asks:
gpu-hopper's eight H100s partitioned with mig-parted's all-1g.10gb and offered by the device
plugin's mixed strategy, the other nodes untouched, verify passing with its smoke pods on MIG
devices; the same layout again changes nothing; a GPU pod on the node is evicted before a
change; a change that fails midway leaves the node cordoned, labelled failed and annotated;
all-disabled gives the eight whole GPUs back.

Simulated (gpuprov/lab/SIMULATION.md): the GPUs and their MIG state (the lab's NVML), the
kubelet and the device plugin (gpuprov/lab/kube). Real: Ansible, SSH, the role's tasks, the
applier shipped to the node and run with the node's python3 and pynvml, the Kubernetes API
calls (patches, evictions, the DaemonSet's pause by label), containerd running the pods."""

from __future__ import annotations

import time

import pytest
from conftest import kube_api, playbook_failures
from kubernetes import client

from gpuprov.stages import gpu_mig

pytestmark = pytest.mark.lab

NODE = "gpu-hopper"
LAYOUT = ("-e", "gpu_mig_config=all-1g.10gb", "-e", "nvidia_device_plugin_mig_strategy=mixed")
WORKLOAD_NS = "mig-workload"
ONE_G = {"nvidia.com/mig-1g.10gb": "1"}


def _node(lab) -> dict:
    return client.CoreV1Api(kube_api(lab)).read_node(NODE).to_dict()


def _allocatable(lab, name: str = NODE) -> dict[str, str]:
    node = client.CoreV1Api(kube_api(lab)).read_node(name)
    return {k: v for k, v in (node.status.allocatable or {}).items()
            if k.startswith("nvidia.com/")}


def _wait_allocatable(lab, expected: dict[str, str], timeout: float = 60) -> dict[str, str]:
    """The node's nvidia.com/* allocatable once it is `expected` (the plugin's new pod starts
    after the stage gives it back), or what it is at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        found = {k: v for k, v in _allocatable(lab).items() if v != "0"}
        if found == expected or time.monotonic() > deadline:
            return found
        time.sleep(1)


def _stats_changed(doc: dict) -> dict[str, int]:
    return {host: s["changed"] for host, s in doc["stats"].items()}


def _verify_lines(doc: dict) -> list[str]:
    for play in doc["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] == "gpu_verify : Show the verify report":
                for result in task["hosts"].values():
                    return [str(line) for line in result.get("msg") or []]
    raise AssertionError("the verify stage showed no report")


def _start_gpu_pod(lab, name: str, budget: bool = False) -> str:
    """A pod on gpu-hopper holding one 1g.10gb MIG device (with a PodDisruptionBudget that
    forbids evicting it, if `budget`); its uid once Running."""
    api = kube_api(lab)
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(WORKLOAD_NS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                 "nodeSelector": {"kubernetes.io/hostname": NODE},
                 "containers": [{"name": "infer", "image": lab.require().pod_image,
                                 "command": ["sleep", "3600"],
                                 "resources": {"requests": ONE_G, "limits": ONE_G}}]}})
    if budget:
        client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(WORKLOAD_NS, {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}}}})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, WORKLOAD_NS)
        if pod.status.phase == "Running":
            return pod.metadata.uid
        time.sleep(1)
    raise AssertionError(f"the GPU pod did not start: {pod.status}")


@pytest.fixture(scope="module")
def partitioned(lab, site_run, playbook):
    """site.yml with the layout and the mixed strategy, after the session's first site.yml.
    The lab is not put back afterwards: the suite runs this module after every other module of
    the session lab (RUN_LAST in tests/conftest.py), so that no site.yml exists only for that."""
    rc, doc = site_run
    assert rc == 0, playbook_failures(doc)
    client.CoreV1Api(kube_api(lab)).create_namespace({"metadata": {"name": WORKLOAD_NS}})
    started = time.monotonic()
    result = playbook("site.yml", *LAYOUT)
    yield result, time.monotonic() - started
    client.CoreV1Api(kube_api(lab)).delete_namespace(WORKLOAD_NS)


def test_site_partitions_gpu_hopper_only_and_verify_passes_on_mig_devices(lab, partitioned):
    (rc, doc), seconds = partitioned
    assert rc == 0, playbook_failures(doc)
    assert _wait_allocatable(lab, {"nvidia.com/mig-1g.10gb": "56"}) == {
        "nvidia.com/mig-1g.10gb": "56"}
    labels = _node(lab)["metadata"]["labels"]
    assert (labels[gpu_mig.CONFIG_LABEL], labels[gpu_mig.STATE_LABEL]) == (
        "all-1g.10gb", "success")
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "56"
    # The others keep whole GPUs and get no layout labels (no MIG-capable GPU there).
    for name, gpus in (("gpu-kepler", "2"), ("gpu-pascal", "4")):
        assert {k: v for k, v in _allocatable(lab, name).items() if v != "0"} == {
            "nvidia.com/gpu": gpus}
        other = client.CoreV1Api(kube_api(lab)).read_node(name).metadata.labels
        assert gpu_mig.CONFIG_LABEL not in other
    # site.yml fails when verify does; its report names the MIG checks and smoke pods.
    report = " ".join(" ".join(_verify_lines(doc)).split())
    assert "PASS gpu.mig layout all-1g.10gb: 8 of 8 MIG-capable GPU(s) in MIG mode, " \
           "56 MIG device(s)" in report, report
    assert "PASS pods.gpu-count asked for 56 nvidia.com/mig-1g.10gb, saw exactly those 56" \
        in report, report
    assert "different MIG devices" in report and "Job completed on 1 MIG device" in report
    print(f"site.yml with the layout: {seconds:.1f} s")


def test_the_same_layout_again_changes_nothing(lab, partitioned, playbook):
    rc, doc = playbook("playbooks/mig.yml", *LAYOUT)
    assert rc == 0, playbook_failures(doc)
    assert set(_stats_changed(doc).values()) == {0}, _stats_changed(doc)


def test_a_gpu_pod_is_evicted_before_the_layout_changes(lab, partitioned, playbook):
    uid = _start_gpu_pod(lab, "inference")
    rc, doc = playbook("playbooks/mig.yml", "-e", "gpu_mig_config=all-balanced")
    assert rc == 0, playbook_failures(doc)
    pods = client.CoreV1Api(kube_api(lab)).list_namespaced_pod(WORKLOAD_NS).items
    assert uid not in {p.metadata.uid for p in pods if not p.metadata.deletion_timestamp}
    # mig-parted's all-balanced on H100-80GB: two 1g.10gb, one 2g.20gb, one 3g.40gb per GPU.
    assert _wait_allocatable(lab, {"nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-2g.20gb": "8",
                                   "nvidia.com/mig-3g.40gb": "8"}) == {
        "nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-2g.20gb": "8",
        "nvidia.com/mig-3g.40gb": "8"}
    node = _node(lab)
    assert not node["spec"].get("unschedulable")
    assert node["metadata"]["labels"][gpu_mig.STATE_LABEL] == "success"


def test_a_change_that_fails_midway_leaves_the_node_cordoned_and_annotated(
        lab, partitioned, playbook):
    _start_gpu_pod(lab, "guarded", budget=True)
    rc, doc = playbook("playbooks/mig.yml", "-e", "gpu_mig_config=all-1g.10gb",
                       "-e", "gpu_mig_evict_timeout=5")
    assert rc != 0
    node = _node(lab)
    annotations = node["metadata"]["annotations"] or {}
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"][gpu_mig.STATE_LABEL] == "failed"
    assert f"{WORKLOAD_NS}/guarded: refused by its budget" in annotations[gpu_mig.FAILED]
    # The device plugin is given back: the node offers the GPUs it has (the layout it kept),
    # it is not left at zero.
    assert gpu_mig.PLUGIN_DEPLOY_LABEL not in node["metadata"]["labels"]
    assert _wait_allocatable(lab, {"nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-2g.20gb": "8",
                                   "nvidia.com/mig-3g.40gb": "8"})["nvidia.com/mig-3g.40gb"] == "8"

    # The budget goes; the rerun evicts the pod, applies the layout and gives the node back
    # (it was not cordoned before the failed run).
    client.PolicyV1Api(kube_api(lab)).delete_namespaced_pod_disruption_budget(
        "guarded", WORKLOAD_NS)
    rc, doc = playbook("playbooks/mig.yml", "-e", "gpu_mig_config=all-1g.10gb")
    assert rc == 0, playbook_failures(doc)
    node = _node(lab)
    assert not node["spec"].get("unschedulable")
    assert not set(gpu_mig.ANNOTATIONS) & set(node["metadata"]["annotations"] or {})
    assert node["metadata"]["labels"][gpu_mig.STATE_LABEL] == "success"
    assert _wait_allocatable(lab, {"nvidia.com/mig-1g.10gb": "56"}) == {
        "nvidia.com/mig-1g.10gb": "56"}


def test_all_disabled_gives_the_eight_whole_gpus_back(lab, partitioned, playbook):
    rc, doc = playbook("playbooks/mig.yml", "-e", "gpu_mig_config=all-disabled")
    assert rc == 0, playbook_failures(doc)
    assert _wait_allocatable(lab, {"nvidia.com/gpu": "8"}) == {"nvidia.com/gpu": "8"}
    assert _node(lab)["metadata"]["labels"][gpu_mig.CONFIG_LABEL] == "all-disabled"
