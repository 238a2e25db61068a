"""The pod phase of gpuprov verify against the emulated API (fake nodes, no containers): smoke
workloads, what the pod checks make of them, and the namespace that never outlives a run."""

from __future__ import annotations

import contextlib
import os
import stat

import pytest
from kubernetes import client, utils

from gpuprov import manifests
from gpuprov.lab.kube import faults
from gpuprov.lab.kube.backend import FakeBackend, FakeNode, Gpu
from gpuprov.lab.kube.testing import (
    NVIDIA_CONTAINERD,
    SECURE_NVIDIA_CONTAINERD,
    default_lab_backend,
    fake_uuids,
    running_emulator,
    wait_for,
)
from gpuprov.verify import pods
from gpuprov.verify.checks import pods as pod_checks
from gpuprov.verify.facts import PodFacts
from gpuprov.verify.findings import CHECKS
from gpuprov.verify.inventory import Node

KINDS = pods.SMOKE_KINDS
# The fake nodes' commands run on this machine: an `nvidia-smi -L` that lists the GPUs the
# lab's NVIDIA runtime rules gave the container (GPUPROV_SIM_CONTAINER_GPUS), as the
# toolkit-injected one lists the device nodes a container was given.
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$GPUPROV_SIM_CONTAINER_GPUS" in ""|void|none) echo "No devices were found"; exit 6;; esac
i=0
for uuid in $(echo "$GPUPROV_SIM_CONTAINER_GPUS" | tr ',' ' '); do
  echo "GPU $i: Fake GPU (UUID: $uuid)"; i=$((i+1))
done
"""


@contextlib.contextmanager
def cluster(backend, state_dir, bindir, node_labels: dict | None = None):
    """An emulated cluster with gpuprov's own device plugin objects (templates/, the role's
    defaults: volume-mounts, CAP_SYS_ADMIN), run on every node, registered on the GPU ones.
    node_labels: {node: labels} set before the plugin starts (its named config)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
        with running_emulator(backend, state_dir) as emu:
            cfg = client.Configuration()
            cfg.host = emu.url
            api_client = client.ApiClient(cfg)
            if node_labels:
                core = client.CoreV1Api(api_client)
                wait_for(lambda: len(core.list_node().items) == len(backend.node_map),
                         "the nodes to register")
                for node, labels in node_labels.items():
                    core.patch_node(node, {"metadata": {"labels": labels}})
            values = {**manifests.load_values(), "nvidia_device_plugin_node_selector": {}}
            for obj in manifests.render(manifests.DEVICE_PLUGIN_TEMPLATE, values):
                _create(api_client, obj)
            core = client.CoreV1Api(api_client)
            wait_for(lambda: all(
                (n.status.allocatable or {}).get("nvidia.com/gpu") not in (None, "0")
                for n in core.list_node().items if n.metadata.name != "cpu-only"),
                "the plugin to register every GPU node")
            yield api_client


def _create(api_client, obj: dict) -> None:
    utils.create_from_dict(api_client, obj)


@pytest.fixture(scope="module")
def bindir(tmp_path_factory):
    bindir = tmp_path_factory.mktemp("bin")
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    return bindir


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("kube-state")


@pytest.fixture(scope="module")
def api(state_dir, bindir):
    with cluster(default_lab_backend(SECURE_NVIDIA_CONTAINERD), state_dir, bindir) as api_client:
        yield api_client


def _namespaces(api_client) -> list[str]:
    return [n.metadata.name for n in client.CoreV1Api(api_client).list_namespace().items
            if n.metadata.name.startswith(pods.NAMESPACE_PREFIX)]


def _facts(node: str, runs: dict, gpus: int) -> PodFacts:
    report = {"nvml": {"gpus": [{"uuid": u} for u in fake_uuids(node, gpus)]}}
    return PodFacts(Node(node, None, True), report, runs)


def test_smoke_workloads_pass_on_healthy_nodes_and_leave_nothing(api):
    targets = [pods.Target("gpu-pascal", 4, 0), pods.Target("gpu-kepler", 2, 0)]
    runs = pods.run(api, targets, KINDS, timeout=30, concurrency=4)
    assert _namespaces(api) == []
    pascal = runs["gpu-pascal"]
    assert sorted(pascal["gpu-count"].pods[0].uuids) == sorted(fake_uuids("gpu-pascal", 4))
    assert len(pascal["isolation"].pods) == 4
    assert pascal["batch-job"].completed is True
    for node, gpus in (("gpu-pascal", 4), ("gpu-kepler", 2)):
        facts = _facts(node, runs[node], gpus)
        for kind in KINDS:
            verdict = CHECKS[f"pods.{kind}"].func(facts)
            assert verdict.status == "pass", (node, kind, verdict.message)


def test_a_cordoned_node_is_verified_too(api):
    # Cordoned for maintenance or a driver upgrade: the pinned smoke pods still run there.
    core = client.CoreV1Api(api)
    core.patch_node("gpu-kepler", {"spec": {"unschedulable": True}})
    try:
        runs = pods.run(api, [pods.Target("gpu-kepler", 2, 0)], KINDS, timeout=15,
                        concurrency=1)
    finally:
        core.patch_node("gpu-kepler", {"spec": {"unschedulable": None}})
    facts = _facts("gpu-kepler", runs["gpu-kepler"], 2)
    for kind in KINDS:
        verdict = CHECKS[f"pods.{kind}"].func(facts)
        assert verdict.status == "pass", (kind, verdict.message)
    assert _namespaces(api) == []


def test_double_allocate_fails_isolation(api, state_dir):
    faults.set_fault(state_dir, "gpu-pascal", "double-allocate")
    try:
        runs = pods.run(api, [pods.Target("gpu-pascal", 4, 0)], ["isolation"], 30, 2)
    finally:
        faults.clear_fault(state_dir, "gpu-pascal", "double-allocate")
    verdict = pod_checks.isolation(_facts("gpu-pascal", runs["gpu-pascal"], 4))
    assert verdict.status == "problem"
    assert "GPU shared between concurrent pods" in verdict.message
    assert _namespaces(api) == []


def test_a_pod_that_cannot_be_scheduled_times_out_as_a_failure(api):
    # Asking for more GPUs than the node has: Pending until the deadline.
    runs = pods.run(api, [pods.Target("gpu-kepler", 3, 0)], ["gpu-count"], 2, 1)
    verdict = pod_checks.gpu_count(_facts("gpu-kepler", runs["gpu-kepler"], 2))
    assert verdict.status == "problem"
    assert "did not finish in time" in verdict.message
    assert _namespaces(api) == []


def test_interrupt_during_the_pod_phase_removes_the_namespace(api, monkeypatch):
    created = []
    original = pods.NodeRunner.gpu_count

    def interrupted(self):
        original(self)
        created.append(self.ns)
        raise KeyboardInterrupt

    monkeypatch.setattr(pods.NodeRunner, "gpu_count", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pods.run(api, [pods.Target("gpu-hopper", 8, 0)], KINDS, 30, 1)
    assert created and _namespaces(api) == []


def test_a_node_whose_toolkit_honours_the_variable_fails_no_request_alone(tmp_path, bindir):
    """NVIDIA's default config.toml on one node: its unprivileged no-request pod sees every
    GPU; the secure node beside it passes."""
    backend = FakeBackend({
        "secure": FakeNode([Gpu(u) for u in fake_uuids("secure", 2)], SECURE_NVIDIA_CONTAINERD),
        "open": FakeNode([Gpu(u) for u in fake_uuids("open", 2)], NVIDIA_CONTAINERD),
    })
    with cluster(backend, tmp_path, bindir) as api_client:
        targets = [pods.Target("secure", 2, 0), pods.Target("open", 2, 0)]
        runs = pods.run(api_client, targets, ["no-request"], timeout=30, concurrency=2)
    secure = pod_checks.no_request(_facts("secure", runs["secure"], 2))
    assert secure.status == "pass", secure.message
    leak = pod_checks.no_request(_facts("open", runs["open"], 2))
    assert leak.status == "problem"
    assert leak.message.startswith("a pod that requested no GPU saw 2 GPU(s)")
    assert "accept-nvidia-visible-devices-envvar-when-unprivileged" in leak.message


def test_no_request_verdicts():
    unfinished = pods.SmokeRun("no-request", 0, (_pod("p", "Timeout", message="Pending"),))
    result = pod_checks.no_request(_facts("gpu-pascal", {"no-request": unfinished}, 4))
    assert result.status == "problem" and "did not finish in time" in result.message


def test_busy_node_is_not_disturbed():
    runner = pods.NodeRunner(None, "ns", pods.Target("gpu-pascal", 4, 1), 5, {})
    run = runner.gpu_count()
    assert run.skipped and "1 of 4 GPUs are in use" in run.skipped
    assert pod_checks.gpu_count(_facts("gpu-pascal", {"gpu-count": run}, 4)).status == "skip"


# -- the checks on recorded runs --------------------------------------------------------------

UUIDS = fake_uuids("gpu-pascal", 4)


def _pod(name, phase, *uuids, message=""):
    return pods.PodRecord(name, phase, tuple(uuids), message)


@pytest.mark.parametrize(("seen", "verdict", "text"), [
    (UUIDS, "pass", "saw exactly those 4"),
    (UUIDS[:3], "problem", "asked for 4 GPU(s), the pod saw 3"),
    (UUIDS[:3] + ["GPU-elsewhere"], "problem", "not this node's: GPU-elsewhere"),
    (UUIDS[:3] + UUIDS[:1], "problem", "the pod saw 4"),
])
def test_gpu_count_verdicts(seen, verdict, text):
    run = pods.SmokeRun("gpu-count", 4, (_pod("p", "Succeeded", *seen),))
    result = pod_checks.gpu_count(_facts("gpu-pascal", {"gpu-count": run}, 4))
    assert result.status == verdict and text in result.message


def test_isolation_verdicts():
    distinct = pods.SmokeRun("isolation", 1, tuple(
        _pod(f"p{i}", "Running", u) for i, u in enumerate(UUIDS)))
    assert pod_checks.isolation(_facts("gpu-pascal", {"isolation": distinct}, 4)).status == "pass"
    two = pods.SmokeRun("isolation", 1, (_pod("a", "Running", *UUIDS[:2]),
                                         _pod("b", "Running", UUIDS[2])))
    result = pod_checks.isolation(_facts("gpu-pascal", {"isolation": two}, 4))
    assert result.status == "problem" and "a saw 2" in result.message
    stuck = pods.SmokeRun("isolation", 1, (_pod("a", "Running", UUIDS[0]),
                                           _pod("b", "Timeout", message="Unschedulable")))
    result = pod_checks.isolation(_facts("gpu-pascal", {"isolation": stuck}, 4))
    assert result.status == "problem"
    assert "b did not finish in time: Unschedulable" in result.message


def test_batch_job_verdicts():
    failed = pods.SmokeRun("batch-job", 1, (_pod("j", "Failed", message="exit 1"),),
                           completed=False)
    result = pod_checks.batch_job(_facts("gpu-pascal", {"batch-job": failed}, 4))
    assert result.status == "problem" and result.message.startswith("the Job failed")
    late = pods.SmokeRun("batch-job", 1, (), completed=None)
    result = pod_checks.batch_job(_facts("gpu-pascal", {"batch-job": late}, 4))
    assert result.status == "problem" and "no pod was created" in result.message


def test_an_api_refusal_is_an_error_not_a_pass():
    refused = pods.SmokeRun("gpu-count", 0, error="API 403 Forbidden: quota")
    result = pod_checks.gpu_count(_facts("gpu-pascal", {"gpu-count": refused}, 4))
    assert result.status == "error" and "403" in result.message


@pytest.mark.parametrize(("image", "version"), [
    ("nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04", (12, 4)),
    ("nvidia/cuda:11.8.0-runtime-ubuntu20.04", (11, 8)),
    ("registry.local:5000/cuda:12.2", (12, 2)),
    ("registry.local:5000/team/app:latest", None),
    ("pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", (12, 1)),
    ("nvcr.io/nvidia/pytorch:24.01-py3", None),  # NGC's release tags are not CUDA versions
    ("registry.local:5000/cuda", None),
])
def test_image_cuda_version_from_the_tag(image, version):
    assert pod_checks.image_cuda_version(image) == version


def test_cuda_compat_names_both_versions():
    facts = PodFacts(Node("gpu-kepler", None, True),
                     {"nvml": {"cuda_driver_version": "11.4"}}, {},
                     image="nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04")
    result = pod_checks.cuda_compat(facts)
    assert result.status == "problem"
    assert result.message == "driver supports CUDA 11.4 < image CUDA 12.4"
    facts = PodFacts(Node("gpu-pascal", None, True),
                     {"nvml": {"cuda_driver_version": "12.2"}}, {},
                     image="nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04")
    assert pod_checks.cuda_compat(facts).status == "pass"


def test_a_node_labelled_cdi_gets_the_plugins_cdi_config_and_spec(tmp_path, bindir):
    """The plugin's named config follows the node's label: on the CDI node it writes its CDI
    spec and answers Allocate with CDI device names, and the smoke pods still see exactly
    their GPUs; the legacy nodes keep volume-mounts."""
    backend = default_lab_backend(SECURE_NVIDIA_CONTAINERD)
    labels = {"gpu-hopper": {"nvidia.com/device-plugin.config": "cdi"}}
    with cluster(backend, tmp_path, bindir, labels) as api_client:
        assert backend.cdi_specs == [("gpu-hopper", "k8s.device-plugin.nvidia.com/gpu", "uuid",
                                      "/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json")]
        runs = pods.run(api_client, [pods.Target("gpu-hopper", 8, 0),
                                     pods.Target("gpu-pascal", 4, 0)],
                        ("gpu-count",), timeout=30, concurrency=4)
    for node, gpus in (("gpu-hopper", 8), ("gpu-pascal", 4)):
        assert sorted(runs[node]["gpu-count"].pods[0].uuids) == sorted(fake_uuids(node, gpus))
    # What the kubelet passed: CDI device names on hopper, volume mounts on pascal.
    env_of = {node: env for node, argv, env in backend.started if argv == ["nvidia-smi", "-L"]}
    assert env_of["gpu-pascal"]["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of["gpu-hopper"]


def test_a_container_with_mig_devices_is_seen_by_its_mig_uuids():
    # `nvidia-smi -L` in a container given two MIG devices of one GPU (the lab's stand-in
    # prints NVIDIA's format: MIG user guide, "Device Enumeration").
    log_text = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a5667db9-3595-86d1-c399-161ebc452f28)\n"
                "  MIG 1g.10gb     Device  0: (UUID: MIG-0b8f7f3e-1b46-5e2b-9a39-3c3c1d9d5b01)\n"
                "  MIG 1g.10gb     Device  1: (UUID: MIG-7a1c2f44-55d9-5b1e-8f0e-2b8d3a6c7e02)\n")
    assert pods.gpu_uuids(log_text) == ["MIG-0b8f7f3e-1b46-5e2b-9a39-3c3c1d9d5b01",
                                        "MIG-7a1c2f44-55d9-5b1e-8f0e-2b8d3a6c7e02"]
    assert pods.gpu_uuids(log_text.splitlines()[0]) == [
        "GPU-a5667db9-3595-86d1-c399-161ebc452f28"]


@pytest.mark.parametrize(("allocatable", "expected"), [
    ({"nvidia.com/gpu": "8"}, "nvidia.com/gpu"),
    ({"nvidia.com/gpu": "2", "nvidia.com/mig-1g.10gb": "14"}, "nvidia.com/gpu"),
    ({"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-3g.40gb": "8"},
     "nvidia.com/mig-1g.10gb"),
    ({"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "0"}, None),
    ({}, None),
])
def test_smoke_pods_ask_for_whole_gpus_else_the_most_offered_mig_profile(allocatable, expected):
    from gpuprov.verify import runner

    assert runner.smoke_resource({"status": {"allocatable": allocatable}}) == expected


def test_a_smoke_pod_requests_the_resource_it_is_given():
    from gpuprov import manifests
    from gpuprov.errors import GpuprovError

    pod = manifests.smoke_pod("p", "ns", gpus=2, resource="nvidia.com/mig-1g.10gb")
    (container,) = pod["spec"]["containers"]
    assert container["resources"] == {"requests": {"nvidia.com/mig-1g.10gb": "2"},
                                      "limits": {"nvidia.com/mig-1g.10gb": "2"}}
    job = manifests.smoke_job("j", "ns", resource="nvidia.com/mig-3g.40gb")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": "1"}
    with pytest.raises(GpuprovError, match="not 'amd.com/gpu'"):
        manifests.smoke_pod("p", "ns", resource="amd.com/gpu")


def _mig_facts(runs: dict) -> PodFacts:
    gpu = "GPU-a5667db9-3595-86d1-c399-161ebc452f28"
    devices = [{"uuid": f"MIG-0000000{i}-1b46-5e2b-9a39-3c3c1d9d5b01", "profile": "1g.10gb"}
               for i in range(3)] + [{"uuid": "MIG-00000009-1b46-5e2b-9a39-3c3c1d9d5b01",
                                      "profile": "3g.40gb"}]
    report = {"nvml": {"gpus": [{"uuid": gpu, "mig": {"current": True, "devices": devices}}]}}
    return PodFacts(Node("gpu-hopper", None, True), report, runs)


def test_a_mig_smoke_pod_must_see_mig_devices_of_its_profile():
    one_g = "nvidia.com/mig-1g.10gb"
    good = [f"MIG-0000000{i}-1b46-5e2b-9a39-3c3c1d9d5b01" for i in range(3)]
    check = CHECKS["pods.gpu-count"].func
    ok = pods.SmokeRun("gpu-count", 3, (pods.PodRecord("p", "Succeeded", tuple(good)),),
                       resource=one_g)
    verdict = check(_mig_facts({"gpu-count": ok}))
    assert verdict.status == "pass", verdict.message
    assert verdict.message == "asked for 3 nvidia.com/mig-1g.10gb, saw exactly those 3 of " \
                              "this node"
    # The parent GPU instead of its MIG devices (a runtime that gave the whole GPU), or a MIG
    # device of another profile: not what was asked for.
    for seen in (("GPU-a5667db9-3595-86d1-c399-161ebc452f28",) * 3,
                 (*good[:2], "MIG-00000009-1b46-5e2b-9a39-3c3c1d9d5b01")):
        run = pods.SmokeRun("gpu-count", 3, (pods.PodRecord("p", "Succeeded", seen),),
                            resource=one_g)
        verdict = check(_mig_facts({"gpu-count": run}))
        assert verdict.status == "problem", seen
    batch = pods.SmokeRun("batch-job", 1, (pods.PodRecord("j", "Succeeded", (
        "GPU-a5667db9-3595-86d1-c399-161ebc452f28",)),), completed=True, resource=one_g)
    assert CHECKS["pods.batch-job"].func(_mig_facts({"batch-job": batch})).status == "problem"
