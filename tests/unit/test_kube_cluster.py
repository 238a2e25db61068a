"""Simulated cluster behaviour: device plugin registration, GPU allocation, scheduler,
kubelet, Jobs, DaemonSets, drain and the fault switches (fake node backend, no containers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuprov.lab.kube import faults
from gpuprov.lab.kube.backend import FakeBackend, FakeNode, Gpu
from gpuprov.lab.kube.testing import (
    NVIDIA_CONTAINERD,
    PLAIN_CONTAINERD,
    fake_uuids,
    running_emulator,
    wait_for,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "kube"
PASCAL = fake_uuids("gpu-pascal", 4)
HOPPER = fake_uuids("gpu-hopper", 8)
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("kube-state")


@pytest.fixture(scope="module")
def emulator(state_dir):
    backend = FakeBackend({
        "gpu-pascal": FakeNode([Gpu(u) for u in PASCAL], NVIDIA_CONTAINERD),
        # The driver is there but the runtime was never configured for NVIDIA.
        "gpu-kepler": FakeNode([Gpu(u) for u in fake_uuids("gpu-kepler", 2)],
                               PLAIN_CONTAINERD),
        # One GPU the simulated NVML reports lost.
        "gpu-hopper": FakeNode([Gpu(u, healthy=i != 7) for i, u in enumerate(HOPPER)],
                               NVIDIA_CONTAINERD),
        "cpu-only": FakeNode([], PLAIN_CONTAINERD),
    })
    with running_emulator(backend, state_dir) as emu:
        cfg = client.Configuration()
        cfg.host = emu.url
        emu.api = client.ApiClient(cfg)
        apps = client.AppsV1Api(emu.api)
        manifest = yaml.safe_load((FIXTURES / "nvidia-device-plugin.yml").read_text())
        apps.create_namespaced_daemon_set("kube-system", manifest)
        yield emu


@pytest.fixture(scope="module")
def core(emulator):
    return client.CoreV1Api(emulator.api)


@pytest.fixture
def ns(core, request):
    name = "t-" + request.node.name.replace("_", "-").lower()[:40].strip("-")
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def allocatable(core) -> dict[str, str | None]:
    return {n.metadata.name: (n.status.allocatable or {}).get(GPU)
            for n in core.list_node().items}


def gpu_pod(name: str, node: str, gpus: int, command: str, **spec) -> dict:
    resources = {"limits": {GPU: str(gpus)}} if gpus else {}
    return {"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [{"name": "cuda", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                        "command": ["sh", "-c", command], "resources": resources}],
        **spec}}


def when(obj, predicate):
    """obj if predicate(obj) else None: a probe for wait_for."""
    return obj if predicate(obj) else None


def finished(core, ns: str, name: str):
    def probe():
        p = core.read_namespaced_pod(name, ns)
        return p if p.status.phase in ("Succeeded", "Failed") else None
    return wait_for(probe, f"pod {ns}/{name} to finish")


def running_with_output(core, ns: str, name: str) -> str:
    def probe():
        p = core.read_namespaced_pod(name, ns)
        if p.status.phase != "Running":
            return None
        return core.read_namespaced_pod_log(name, ns).strip()
    return wait_for(probe, f"pod {ns}/{name} to run and print")


# -- device plugin ----------------------------------------------------------------------------

def test_plugin_makes_gpus_allocatable_only_where_the_runtime_is_nvidia(core):
    wait_for(lambda: allocatable(core).get("gpu-pascal"), "nvidia.com/gpu on gpu-pascal")
    wait_for(lambda: allocatable(core).get("gpu-hopper"), "nvidia.com/gpu on gpu-hopper")
    got = allocatable(core)
    assert got["gpu-pascal"] == "4"
    assert got["gpu-kepler"] is None  # plugin runs there, but the runtime is not NVIDIA's
    assert got["cpu-only"] is None


def test_unhealthy_gpu_is_in_capacity_but_not_allocatable(core):
    wait_for(lambda: allocatable(core).get("gpu-hopper"), "nvidia.com/gpu on gpu-hopper")
    node = core.read_node("gpu-hopper")
    assert node.status.capacity[GPU] == "8"
    assert node.status.allocatable[GPU] == "7"


def test_daemonset_status_counts_every_node(emulator):
    apps = client.AppsV1Api(emulator.api)

    def ready():
        ds = apps.read_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system")
        return ds if ds.status.number_ready == 4 else None

    ds = wait_for(ready, "the device plugin on all 4 nodes")
    assert ds.status.desired_number_scheduled == 4
    assert ds.status.observed_generation == 1


# -- GPU pods -----------------------------------------------------------------------------------

def test_two_gpu_pod_sees_two_distinct_gpus_of_its_node(core, ns):
    core.create_namespaced_pod(ns, gpu_pod("two", "gpu-pascal", 2,
                                           "echo $GPUPROV_SIM_CONTAINER_GPUS"))
    pod = finished(core, ns, "two")
    assert pod.status.phase == "Succeeded"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    uuids = core.read_namespaced_pod_log("two", ns).strip().split(",")
    assert len(set(uuids)) == 2 and set(uuids) <= set(PASCAL)


def test_pod_without_gpu_request_sees_no_gpu(core, ns):
    core.create_namespaced_pod(ns, gpu_pod("none", "gpu-pascal", 0,
                                           "echo $GPUPROV_SIM_CONTAINER_GPUS"))
    finished(core, ns, "none")
    assert core.read_namespaced_pod_log("none", ns).strip() == "void"


def test_failing_command_fails_the_pod_with_its_exit_code(core, ns):
    core.create_namespaced_pod(ns, gpu_pod("bad", "gpu-pascal", 0, "echo oops; exit 3"))
    pod = finished(core, ns, "bad")
    assert pod.status.phase == "Failed"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 3
    assert core.read_namespaced_pod_log("bad", ns) == "oops\n"


def _concurrent_pair(core, ns: str, stop: Path) -> tuple[str, str]:
    hold = f"echo $GPUPROV_SIM_CONTAINER_GPUS; while [ ! -f {stop} ]; do sleep 0.05; done"
    for name in ("a", "b"):
        core.create_namespaced_pod(ns, gpu_pod(name, "gpu-pascal", 1, hold))
    seen = running_with_output(core, ns, "a"), running_with_output(core, ns, "b")
    stop.touch()
    for name in ("a", "b"):
        assert finished(core, ns, name).status.phase == "Succeeded"
    return seen


def test_concurrent_one_gpu_pods_get_different_gpus(core, ns, tmp_path):
    first, second = _concurrent_pair(core, ns, tmp_path / "stop")
    assert first in PASCAL and second in PASCAL
    assert first != second


def test_double_allocate_fault_hands_out_the_same_gpu(core, ns, tmp_path, state_dir):
    faults.set_fault(state_dir, "gpu-pascal", "double-allocate")
    try:
        first, second = _concurrent_pair(core, ns, tmp_path / "stop")
    finally:
        faults.clear_fault(state_dir, "gpu-pascal", "double-allocate")
    assert first == second


# -- scheduler ---------------------------------------------------------------------------------

def test_too_many_gpus_stays_pending_with_a_reason(core, ns):
    spec = gpu_pod("greedy", "gpu-pascal", 8, "true")
    del spec["spec"]["nodeSelector"]
    core.create_namespaced_pod(ns, spec)

    def reason():
        conds = core.read_namespaced_pod("greedy", ns).status.conditions or []
        return next((c for c in conds if c.type == "PodScheduled" and c.status == "False"),
                    None)

    cond = wait_for(reason, "PodScheduled=False")
    assert cond.reason == "Unschedulable"
    assert f"Insufficient {GPU}" in cond.message
    assert core.read_namespaced_pod("greedy", ns).status.phase == "Pending"


def test_scheduler_places_gpu_pods_on_a_node_with_free_gpus(core, ns):
    spec = gpu_pod("anywhere", "x", 6, "true")
    del spec["spec"]["nodeSelector"]
    core.create_namespaced_pod(ns, spec)
    pod = finished(core, ns, "anywhere")
    assert pod.spec.node_name == "gpu-hopper"
    assert pod.status.phase == "Succeeded"


def test_cordoned_node_gets_no_new_pods(core, ns):
    core.patch_node("gpu-pascal", {"spec": {"unschedulable": True}})
    try:
        core.create_namespaced_pod(ns, gpu_pod("cordoned", "gpu-pascal", 1, "true"))
        cond = wait_for(lambda: next((c for c in core.read_namespaced_pod("cordoned", ns)
                                      .status.conditions or [] if c.type == "PodScheduled"),
                                     None), "a scheduling decision")
        assert cond.status == "False" and "unschedulable" in cond.message
    finally:
        core.patch_node("gpu-pascal", {"spec": {"unschedulable": False}})
    assert finished(core, ns, "cordoned").status.phase == "Succeeded"


# -- Jobs ---------------------------------------------------------------------------------------

def test_job_requesting_a_gpu_completes(emulator, ns):
    batch = client.BatchV1Api(emulator.api)
    template = gpu_pod("ignored", "gpu-hopper", 1, "echo $GPUPROV_SIM_CONTAINER_GPUS")
    del template["metadata"]["name"]
    batch.create_namespaced_job(ns, {"metadata": {"name": "smoke"},
                                     "spec": {"backoffLimit": 0, "template": template}})
    job = wait_for(lambda: when(batch.read_namespaced_job_status("smoke", ns),
                                lambda j: j.status.succeeded), "job smoke to succeed")
    assert [c.type for c in job.status.conditions if c.status == "True"] == [
        "SuccessCriteriaMet", "Complete"]
    core = client.CoreV1Api(emulator.api)
    pods = core.list_namespaced_pod(ns, label_selector="job-name=smoke").items
    assert len(pods) == 1
    assert core.read_namespaced_pod_log(pods[0].metadata.name, ns).strip() in HOPPER


def test_job_fails_after_backoff_limit(emulator, ns):
    batch = client.BatchV1Api(emulator.api)
    template = gpu_pod("ignored", "gpu-hopper", 0, "exit 1")
    del template["metadata"]["name"]
    batch.create_namespaced_job(ns, {"metadata": {"name": "doomed"},
                                     "spec": {"backoffLimit": 1, "template": template}})
    job = wait_for(lambda: when(batch.read_namespaced_job_status("doomed", ns),
                                lambda j: any(c.type == "Failed"
                                              for c in j.status.conditions or [])),
                   "job doomed to fail")
    assert job.status.failed == 2
    failed = next(c for c in job.status.conditions if c.type == "Failed")
    assert failed.reason == "BackoffLimitExceeded"


def test_job_with_restart_policy_always_is_invalid(emulator, ns):
    batch = client.BatchV1Api(emulator.api)
    template = gpu_pod("ignored", "gpu-hopper", 0, "true", restartPolicy="Always")
    del template["metadata"]["name"]
    with pytest.raises(ApiException) as err:
        batch.create_namespaced_job(ns, {"metadata": {"name": "j"},
                                         "spec": {"template": template}})
    assert err.value.status == 422


# -- DaemonSets and deletion ----------------------------------------------------------------------

def test_daemonset_honours_node_selector_and_deleting_it_removes_its_pods(emulator, core, ns):
    apps = client.AppsV1Api(emulator.api)
    apps.create_namespaced_daemon_set(ns, {
        "metadata": {"name": "only-cpu"},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": {
            "metadata": {"labels": {"app": "x"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": "cpu-only"},
                     "containers": [{"name": "c", "image": "busybox:1.36",
                                     "command": ["sh", "-c", "while :; do sleep 1; done"]}]}}}})
    pods = wait_for(lambda: [p for p in core.list_namespaced_pod(ns).items
                             if p.status.phase == "Running"], "the daemon pod to run")
    assert [p.spec.node_name for p in pods] == ["cpu-only"]
    assert pods[0].metadata.owner_references[0].kind == "DaemonSet"
    apps.delete_namespaced_daemon_set("only-cpu", ns)
    wait_for(lambda: not core.list_namespaced_pod(ns).items, "the daemon pod to be deleted")


# -- drain and eviction ----------------------------------------------------------------------------

def test_eviction_respects_a_pod_disruption_budget(emulator, core, ns, tmp_path):
    policy = client.PolicyV1Api(emulator.api)
    hold = f"while [ ! -f {tmp_path / 'stop'} ]; do sleep 0.05; done"
    spec = gpu_pod("guarded", "cpu-only", 0, hold)
    spec["metadata"]["labels"] = {"app": "guarded"}
    core.create_namespaced_pod(ns, spec)
    policy.create_namespaced_pod_disruption_budget(ns, {
        "metadata": {"name": "keep-one"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    wait_for(lambda: core.read_namespaced_pod("guarded", ns).status.phase == "Running",
             "the guarded pod to run")
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": "guarded", "namespace": ns}}
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_eviction("guarded", ns, eviction)
    assert err.value.status == 429
    policy.delete_namespaced_pod_disruption_budget("keep-one", ns)
    core.create_namespaced_pod_eviction("guarded", ns, eviction)

    def gone():
        try:
            core.read_namespaced_pod("guarded", ns)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, "the evicted pod to be removed")


# -- faults ---------------------------------------------------------------------------------------

def test_plugin_unregistered_fault_zeroes_allocatable(core, state_dir):
    wait_for(lambda: allocatable(core).get("gpu-pascal") == "4", "4 GPUs on gpu-pascal")
    faults.set_fault(state_dir, "gpu-pascal", "plugin-unregistered")
    try:
        wait_for(lambda: allocatable(core).get("gpu-pascal") == "0",
                 "allocatable to drop to 0")
    finally:
        faults.clear_fault(state_dir, "gpu-pascal", "plugin-unregistered")
    wait_for(lambda: allocatable(core).get("gpu-pascal") == "4", "allocatable to come back")


def test_node_notready_fault(core, state_dir):
    faults.set_fault(state_dir, "cpu-only", "node-notready")
    try:
        def not_ready():
            node = core.read_node("cpu-only")
            ready = next(c for c in node.status.conditions if c.type == "Ready")
            return node if ready.status == "False" else None

        node = wait_for(not_ready, "cpu-only to turn NotReady")
        assert any(t.key == "node.kubernetes.io/not-ready" for t in node.spec.taints)
    finally:
        faults.clear_fault(state_dir, "cpu-only", "node-notready")
    wait_for(lambda: not core.read_node("cpu-only").spec.taints, "the taint to go")


def test_pod_stuck_pending_fault(core, ns, state_dir):
    faults.set_fault(state_dir, "cpu-only", "pod-stuck-pending")
    try:
        core.create_namespaced_pod(ns, gpu_pod("stuck", "cpu-only", 0, "true"))
        pod = wait_for(lambda: when(core.read_namespaced_pod("stuck", ns),
                                    lambda p: p.status.container_statuses),
                       "a container status")
        assert pod.status.phase == "Pending"
        assert pod.status.container_statuses[0].state.waiting.reason == "ContainerCreating"
    finally:
        faults.clear_fault(state_dir, "cpu-only", "pod-stuck-pending")
    assert finished(core, ns, "stuck").status.phase == "Succeeded"


def test_fault_files_are_what_the_lab_cli_toggles(tmp_path):
    faults.set_fault(tmp_path, "n1", "double-allocate")
    assert faults.active_faults(tmp_path, "n1") == ["double-allocate"]
    faults.clear_fault(tmp_path, "n1", "double-allocate")
    assert faults.active_faults(tmp_path, "n1") == []
    with pytest.raises(ValueError):
        faults.set_fault(tmp_path, "n1", "no-such-fault")
    assert json.dumps(sorted(faults.FAULTS))  # the list `lab fault` can offer


def test_a_pod_whose_process_exits_is_reported_without_waiting_for_a_tick():
    """The kubelet learns of an exit from the process itself: with a periodic pass only
    every hour, the pod is still reported finished (nothing else changes the store)."""
    backend = FakeBackend({"cpu-only": FakeNode([], PLAIN_CONTAINERD)})
    with running_emulator(backend, tick=3600) as emu:
        cfg = client.Configuration()
        cfg.host = emu.url
        core = client.CoreV1Api(client.ApiClient(cfg))
        core.create_namespaced_pod("default", gpu_pod("quick", "cpu-only", 0,
                                                      "sleep 0.3; echo done"))
        pod = finished(core, "default", "quick")
        assert pod.status.phase == "Succeeded"
        assert core.read_namespaced_pod_log("quick", "default").strip() == "done"
