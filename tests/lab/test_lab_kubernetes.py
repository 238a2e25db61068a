"""The lab's emulated Kubernetes API, with its kubelet running pods in the real node containers."""

from __future__ import annotations

import time

import pytest
from conftest import kube_api
from kubernetes import client

from gpuprov.cli import main

WAIT_S = 60


@pytest.fixture(scope="module")
def core(lab):
    api_client = kube_api(lab)
    yield client.CoreV1Api(api_client)
    api_client.close()


def wait_for(predicate, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def ready(node) -> str:
    return next(c.status for c in node.status.conditions if c.type == "Ready")


def test_status_names_the_api_and_the_kubeconfig(lab):
    doc = lab.status()
    assert doc["kubernetes"]["url"].startswith("http://127.0.0.1:")
    assert doc["kubernetes"]["kubeconfig"] == str(lab.kubeconfig_path)
    assert lab.kubeconfig_path.exists()


def test_every_lab_node_is_a_ready_node(core, lab_state):
    nodes = core.list_node().items
    assert sorted(n.metadata.name for n in nodes) == sorted(n.name for n in lab_state.nodes)
    assert all(ready(n) == "True" for n in nodes)


def test_a_pod_runs_as_a_container_in_its_node_and_sees_no_gpu(core, lab_state):
    name = "lab-hello"
    core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "gpu-pascal"},
            "restartPolicy": "Never",
            "containers": [{
                "name": "main", "image": lab_state.pod_image,
                # The GPUs the lab's runtime gave the container (in place of device nodes),
                # and the nvidia-smi it mounts into a container given GPUs.
                "command": ["sh", "-c", "hostname; echo given=${GPUPROV_SIM_CONTAINER_GPUS-none};"
                            " command -v nvidia-smi || echo no-nvidia-smi"],
            }],
        },
    })
    try:
        phase = wait_for(
            lambda: core.read_namespaced_pod(name, "default").status.phase
            in ("Succeeded", "Failed") and core.read_namespaced_pod(name, "default").status.phase,
            "the pod to finish",
        )
        log = core.read_namespaced_pod_log(name, "default")
        assert phase == "Succeeded", log
        # The sandbox shares the node's network and UTS namespaces, as a hostNetwork pod.
        assert log.split() == ["gpu-pascal", "given=none", "no-nvidia-smi"]
        status = core.read_namespaced_pod(name, "default").status.container_statuses[0]
        assert status.container_id.startswith("containerd://")
    finally:
        core.delete_namespaced_pod(name, "default")


def test_node_notready_fault_flips_the_node_condition(lab, core):
    argv = ["lab", "--dir", str(lab.project_dir), "fault", "cpu-only", "node-notready"]
    assert main(argv) == 0
    try:
        assert "node-notready" in lab.status_of(lab.require().node("cpu-only"))["faults"]
        wait_for(lambda: ready(core.read_node("cpu-only")) == "False", "Ready=False")
    finally:
        assert main([*argv, "--clear"]) == 0
    wait_for(lambda: ready(core.read_node("cpu-only")) == "True", "Ready=True again")


def test_a_node_whose_containerd_is_stopped_turns_not_ready_with_the_reason(lab, core,
                                                                          node_connection):
    """The node's real containerd stopped: the kubelet's CRI call fails, the node is NotReady
    with "container runtime is down" and why, and Ready again once containerd runs."""
    conn = node_connection("cpu-only")
    conn.run("systemctl stop containerd", hide=True, in_stream=False)
    try:
        def down():
            cond = next(c for c in core.read_node("cpu-only").status.conditions
                        if c.type == "Ready")
            return cond if cond.status == "False" else None

        cond = wait_for(down, "Ready=False")
        assert cond.reason == "KubeletNotReady"
        assert cond.message.startswith("container runtime is down: the CRI Version call "
                                       "failed: UNAVAILABLE"), cond.message
    finally:
        conn.run("systemctl start containerd", hide=True, in_stream=False)
    # containerd's CRI plugin answers some seconds after its start, and the kubelet asks at its
    # next heartbeat (10 s): on a loaded machine that has taken more than a minute.
    wait_for(lambda: ready(core.read_node("cpu-only")) == "True", "Ready=True again", 180)


def test_a_gpu_fault_of_the_cluster_on_the_cpu_node_is_a_usage_error(lab, capsys):
    argv = ["lab", "--dir", str(lab.project_dir), "fault", "cpu-only", "double-allocate"]
    assert main(argv) == 2
    assert "needs a GPU node" in capsys.readouterr().err
