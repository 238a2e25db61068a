"""The nvidia_device_plugin role's decisions from the Kubernetes API's answers
(gpuprov/stages/nvidia_device_plugin.py), through plugins/filter/nvidia_device_plugin.py. The
objects are shaped as the API serves them (metadata, status; the k8s module's result of a
multi-object apply)."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

SELECTOR = {"nvidia.com/gpu.present": "true"}


@pytest.fixture(scope="module")
def kube(ansible_plugin):
    return ansible_plugin("filter/nvidia_device_plugin.py")


def _node(name: str, gpus: str | None = None, **labels) -> dict:
    status = {"allocatable": {"cpu": "8", **({"nvidia.com/gpu": gpus} if gpus else {})}}
    return {"metadata": {"name": name, "labels": labels}, "status": status}


def _ds(generation: int, observed: int, desired: int, updated: int, available: int) -> dict:
    return {"kind": "DaemonSet", "metadata": {"name": "nvidia-device-plugin-daemonset",
                                              "generation": generation},
            "status": {"observedGeneration": observed, "desiredNumberScheduled": desired,
                       "updatedNumberScheduled": updated, "numberAvailable": available}}


def _pod(node: str, phase: str = "Running", generation: str = "2", deleting: bool = False):
    meta = {"name": f"plugin-{node}", "labels": {"name": "nvidia-device-plugin-ds",
                                                 "pod-template-generation": generation}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-25T15:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase}}


def test_unknown_and_unselected_gpu_nodes_are_named_with_what_to_do(kube):
    nodes = [_node("gpu-a", **{"nvidia.com/gpu.present": "true"}), _node("gpu-b")]
    problem = kube.plugin_node_problem(nodes, ["gpu-a", "gpu-b", "gpu-c"], SELECTOR)
    assert problem.startswith("GPU nodes not in the cluster: gpu-c (kubectl get nodes;")
    assert ('GPU nodes without the labels {"nvidia.com/gpu.present": "true"} the DaemonSet '
            "selects: gpu-b. Run the labels stage first") in problem
    # --check: the labels stage changed nothing, so labels cannot be asked for yet.
    assert "without the labels" not in kube.plugin_node_problem(
        nodes, ["gpu-a", "gpu-b", "gpu-c"], SELECTOR, True)
    assert kube.plugin_node_problem(nodes[:1], ["gpu-a"], SELECTOR) is None


def test_the_daemonset_is_found_in_the_apply_result(kube):
    applied = {"result": {"results": [{"result": {"kind": "RuntimeClass"}},
                                      {"result": _ds(2, 2, 2, 2, 2)}, {"changed": False}]}}
    assert kube.plugin_daemonset(applied)["kind"] == "DaemonSet"
    assert kube.plugin_daemonset({"result": {"results": ["odd"]}}) == {}


@pytest.mark.parametrize("ds, before, expected", [
    (_ds(2, 2, 2, 2, 2), [_node("gpu-a", "4"), _node("gpu-b", "1")], True),
    # The controller has not seen the new template yet.
    (_ds(3, 2, 2, 2, 2), [_node("gpu-a", "4"), _node("gpu-b", "1")], False),
    # One pod of the template is not available.
    (_ds(2, 2, 2, 2, 1), [_node("gpu-a", "4"), _node("gpu-b", "1")], False),
    # A GPU node advertised no GPUs before the apply.
    (_ds(2, 2, 2, 2, 2), [_node("gpu-a", "4"), _node("gpu-b")], False),
    ({}, [_node("gpu-a", "4"), _node("gpu-b", "1")], False),
])
def test_settled_only_when_the_rollout_is_complete_and_every_gpu_node_advertised(
        kube, ds, before, expected):
    assert kube.plugin_settled(ds, ["gpu-a", "gpu-b"], before) is expected


def test_the_generation_counts_once_the_controller_saw_it(kube):
    assert kube.ds_generation([_ds(3, 3, 2, 2, 2)]) == 3
    assert kube.ds_generation([_ds(3, 2, 2, 2, 2)]) == 0
    assert kube.ds_generation([]) == 0


def test_gpu_nodes_without_a_running_pod_of_the_current_template(kube):
    pods = [_pod("gpu-a"), _pod("gpu-b", generation="1"), _pod("gpu-c", phase="Pending"),
            _pod("gpu-d", deleting=True)]
    assert kube.plugin_without_pod(pods, ["gpu-a", "gpu-b", "gpu-c", "gpu-d"], 2) == [
        "gpu-b", "gpu-c", "gpu-d"]


def test_allocatable_and_without_gpus_per_named_node(kube):
    nodes = [_node("gpu-a", "4"), _node("gpu-b")]
    assert kube.allocatable_gpus(["gpu-a", "gpu-b", "gpu-c"], nodes) == {
        "gpu-a": "4", "gpu-b": "0", "gpu-c": "0"}
    assert kube.without_gpus(["gpu-a", "gpu-b", "gpu-c"], nodes) == ["gpu-b", "gpu-c"]
    with pytest.raises(AnsibleFilterError, match="list of Node objects"):
        kube.allocatable_gpus(["gpu-a"], {"items": nodes})
    with pytest.raises(AnsibleFilterError, match="nodeSelector as a mapping"):
        kube.plugin_node_problem(nodes, ["gpu-a"], "nvidia.com/gpu.present=true")
