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
    problem = kube.gpuprov_plugin_node_problem(nodes, ["gpu-a", "gpu-b", "gpu-c"], SELECTOR)
    assert problem.startswith("GPU nodes not in the cluster: gpu-c (kubectl get nodes;")
    assert ('GPU nodes without the labels {"nvidia.com/gpu.present": "true"} the DaemonSet '
            "selects: gpu-b. Run the labels stage first") in problem
    # --check: the labels stage changed nothing, so labels cannot be asked for yet.
    assert "without the labels" not in kube.gpuprov_plugin_node_problem(
        nodes, ["gpu-a", "gpu-b", "gpu-c"], SELECTOR, True)
    assert kube.gpuprov_plugin_node_problem(nodes[:1], ["gpu-a"], SELECTOR) is None


def test_the_daemonset_is_found_in_the_apply_result(kube):
    applied = {"result": {"results": [{"result": {"kind": "RuntimeClass"}},
                                      {"result": _ds(2, 2, 2, 2, 2)}, {"changed": False}]}}
    assert kube.gpuprov_plugin_daemonset(applied)["kind"] == "DaemonSet"
    assert kube.gpuprov_plugin_daemonset({"result": {"results": ["odd"]}}) == {}


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
    assert kube.gpuprov_plugin_settled(ds, ["gpu-a", "gpu-b"], before) is expected


def test_the_generation_counts_once_the_controller_saw_it(kube):
    assert kube.gpuprov_ds_generation([_ds(3, 3, 2, 2, 2)]) == 3
    assert kube.gpuprov_ds_generation([_ds(3, 2, 2, 2, 2)]) == 0
    assert kube.gpuprov_ds_generation([]) == 0


def test_gpu_nodes_without_a_running_pod_of_the_current_template(kube):
    pods = [_pod("gpu-a"), _pod("gpu-b", generation="1"), _pod("gpu-c", phase="Pending"),
            _pod("gpu-d", deleting=True)]
    assert kube.gpuprov_plugin_without_pod(pods, ["gpu-a", "gpu-b", "gpu-c", "gpu-d"], 2) == [
        "gpu-b", "gpu-c", "gpu-d"]


def test_allocatable_and_without_gpus_per_named_node(kube):
    nodes = [_node("gpu-a", "4"), _node("gpu-b")]
    assert kube.gpuprov_allocatable_gpus(["gpu-a", "gpu-b", "gpu-c"], nodes) == {
        "gpu-a": "4", "gpu-b": "0", "gpu-c": "0"}
    assert kube.gpuprov_without_gpus(["gpu-a", "gpu-b", "gpu-c"], nodes) == ["gpu-b", "gpu-c"]
    with pytest.raises(AnsibleFilterError, match="list of Node objects"):
        kube.gpuprov_allocatable_gpus(["gpu-a"], {"items": nodes})
    with pytest.raises(AnsibleFilterError, match="nodeSelector as a mapping"):
        kube.gpuprov_plugin_node_problem(nodes, ["gpu-a"], "nvidia.com/gpu.present=true")


# -- what the waits saw (tasks/wait.yml) ----------------------------------------------------


def _read(*objects: dict) -> dict:
    """A k8s_info task's registered result."""
    return {"changed": False, "resources": list(objects)}


SKIPPED = {"changed": False, "skipped": True, "skip_reason": "Conditional result was False"}


def test_registration_names_the_nodes_without_a_pod_and_without_gpus(kube):
    seen = kube.gpuprov_plugin_registration(
        ["gpu-a", "gpu-b", "gpu-c"], daemonset=_read(_ds(2, 2, 3, 3, 2)),
        pods=_read(_pod("gpu-a"), _pod("gpu-c", generation="1")),
        nodes=_read(_node("gpu-a", "4"), _node("gpu-b"), _node("gpu-c", "2")),
        nodes_before=_read(), settled=False, namespace="kube-system",
        pod_label="nvidia-device-plugin-ds", wait_s=300)
    assert seen["without_pod"] == ["gpu-b", "gpu-c"]  # gpu-c's pod is of the old template
    assert seen["without_gpus"] == ["gpu-b"]
    assert seen["allocatable"] == {"gpu-a": "4", "gpu-b": "0", "gpu-c": "2"}
    assert seen["summary"] == "gpu-a: 4, gpu-b: 0, gpu-c: 2"
    assert seen["problem"] == (
        "The NVIDIA device plugin did not register on every GPU node within 300 s. "
        "No running plugin pod of the current template on: gpu-b, gpu-c. "
        "No allocatable nvidia.com/gpu on: gpu-b. Look at `kubectl -n kube-system get pods "
        "-l name=nvidia-device-plugin-ds -o wide` and the pod's logs: the driver (nvidia-smi on "
        "the node) and the NVIDIA runtime in the container runtime (the container toolkit stage) "
        "must work first.")


def test_a_settled_rollout_is_judged_by_the_nodes_before_the_apply(kube):
    seen = kube.gpuprov_plugin_registration(
        ["gpu-a"], daemonset=SKIPPED, pods=SKIPPED, nodes=SKIPPED,
        nodes_before=_read(_node("gpu-a", "4")), settled=True)
    assert seen == {"without_pod": [], "without_gpus": [], "allocatable": {"gpu-a": "4"},
                    "summary": "gpu-a: 4", "problem": None}
    assert kube.gpuprov_plugin_registration([], settled=True)["summary"] == (
        "no GPU node in this play")
    with pytest.raises(AnsibleFilterError, match="list of node names"):
        kube.gpuprov_plugin_registration("gpu-a")
