"""The emulated cluster with MIG (fake node backend, no containers): the device plugin's
resources per MIG strategy in the node's capacity and allocatable, read when the plugin pod
starts; scheduling, admission and allocation of nvidia.com/mig-<profile> devices; the MIG
devices a container is given; the plugin going away; and the double-allocate fault."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from gpuprov.lab.kube import deviceplugin as dp
from gpuprov.lab.kube import faults
from gpuprov.lab.kube.backend import FakeBackend, FakeNode, Gpu, MigDevice
from gpuprov.lab.kube.testing import NVIDIA_CONTAINERD, fake_uuids, running_emulator, wait_for

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "kube"
NODE = "gpu-mig"
PLUGIN = ("kube-system", "nvidia-device-plugin-daemonset")


def layout_gpus(layout: list[list[str] | None], unhealthy: tuple[int, ...] = ()) -> list[Gpu]:
    """GPUs of a fake node: None for MIG off, else the profiles of its MIG devices."""
    uuids = fake_uuids(NODE, len(layout))
    return [Gpu(uuid, i not in unhealthy, profiles is not None,
                tuple(MigDevice(f"MIG-{i:04x}{j:04x}-{uuid[4:8]}-4000-8000-{j:012x}", p, j)
                      for j, p in enumerate(profiles or [])))
            for i, (uuid, profiles) in enumerate(zip(uuids, layout, strict=True))]


def served(gpus: list[Gpu], healthy_only: bool = False) -> dict[str, int]:
    """What the mixed strategy serves, counted from the layout itself."""
    found: dict[str, int] = {}
    for gpu in gpus:
        if healthy_only and not gpu.healthy:
            continue
        names = (["nvidia.com/mig-" + d.profile.replace("+", ".") for d in gpu.mig_devices]
                 if gpu.mig_enabled else ["nvidia.com/gpu"])
        for name in names:
            found[name] = found.get(name, 0) + 1
    return found


LAYOUT = [["1g.10gb", "1g.10gb", "2g.20gb"], ["1g.10gb+me", "3g.40gb"], None, None,
          ["1g.10gb"]]
UNHEALTHY = (4,)  # a GPU NVML reports lost, with its MIG device


def plugin_manifest(mig_strategy: str) -> dict:
    manifest = yaml.safe_load((FIXTURES / "nvidia-device-plugin.yml").read_text())
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": "MIG_STRATEGY", "value": mig_strategy}]
    return manifest


@pytest.fixture
def cluster(tmp_path):
    """An emulator with one MIG node and a function to deploy the plugin."""
    backend = FakeBackend({NODE: FakeNode(layout_gpus(LAYOUT, UNHEALTHY), NVIDIA_CONTAINERD)})
    with running_emulator(backend, tmp_path) as emu:
        cfg = client.Configuration()
        cfg.host = emu.url
        api = client.ApiClient(cfg)
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        core.create_namespace({"metadata": {"name": "work"}})

        def deploy(strategy: str) -> None:
            apps.create_namespaced_daemon_set("kube-system", plugin_manifest(strategy))

        yield backend, core, deploy, tmp_path


def node_resources(core) -> tuple[dict[str, int], dict[str, int]]:
    status = core.read_node(NODE).status
    pick = lambda d: {k: int(v) for k, v in (d or {}).items() if k.startswith("nvidia.com/")}  # noqa: E731
    return pick(status.capacity), pick(status.allocatable)


def wait_resources(core, capacity: dict[str, int], allocatable: dict[str, int], what: str):
    return wait_for(lambda: node_resources(core) == (capacity, allocatable) or None, what)


def plugin_pod(core):
    pods = core.list_namespaced_pod("kube-system").items
    return next((p for p in pods if p.status.phase == "Running"
                 and not p.metadata.deletion_timestamp), None)


def mig_pod(name: str, requests: dict[str, int], command: str) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "cuda", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                        "command": ["sh", "-c", command],
                        "resources": {"limits": {k: str(v) for k, v in requests.items()}}}]}}


def finished(core, name: str):
    return wait_for(lambda: (lambda p: p if p.status.phase in ("Succeeded", "Failed")
                             else None)(core.read_namespaced_pod(name, "work")),
                    f"pod {name} to finish")


def test_mixed_serves_each_profile_and_the_gpus_without_mig(cluster):
    backend, core, deploy, _ = cluster
    gpus = backend.node_map[NODE].gpus
    deploy("mixed")
    wait_resources(core, served(gpus), served(gpus, healthy_only=True),
                   "the mixed strategy's resources")


@pytest.mark.parametrize("strategy", ["none", "single"])
def test_none_and_an_invalid_single_layout(cluster, strategy):
    backend, core, deploy, _ = cluster
    gpus = backend.node_map[NODE].gpus
    deploy(strategy)
    if strategy == "none":
        healthy = sum(g.healthy for g in gpus)
        wait_resources(core, {"nvidia.com/gpu": len(gpus)}, {"nvidia.com/gpu": healthy},
                       "every GPU as nvidia.com/gpu")
        return
    # MIG on and off, several profiles: NVIDIA's plugin does not start, and serves nothing.
    pod = wait_for(lambda: plugin_pod(core), "the plugin pod to run")
    log = wait_for(lambda: core.read_namespaced_pod_log(pod.metadata.name, "kube-system"),
                   "the plugin's log")
    assert "error building device map" in log
    events = wait_for(lambda: [e for e in core.list_namespaced_event("kube-system").items
                               if e.reason == "DevicePluginFailed"], "a DevicePluginFailed event")
    assert "invalid MIG configuration" in events[0].message
    assert node_resources(core) == ({}, {})


def test_mig_pods_get_distinct_devices_of_their_profile(cluster):
    backend, core, deploy, state_dir = cluster
    gpus = backend.node_map[NODE].gpus
    deploy("mixed")
    want = served(gpus, healthy_only=True)
    wait_resources(core, served(gpus), want, "the mixed strategy's resources")
    profile = "nvidia.com/mig-1g.10gb"
    mig = {d.uuid: d for g in gpus if g.healthy for d in g.mig_devices
           if "nvidia.com/mig-" + d.profile == profile}
    command = "echo $NVIDIA_VISIBLE_DEVICES/$GPUPROV_SIM_CONTAINER_GPUS"
    # Held while both run: each pod's devices are its own.
    core.create_namespaced_pod("work", mig_pod("a", {profile: 1}, f"{command}; sleep 2"))
    core.create_namespaced_pod("work", mig_pod("b", {profile: 1}, f"{command}; sleep 2"))
    seen = []
    for name in ("a", "b"):
        pod = finished(core, name)
        assert pod.status.phase == "Succeeded", pod.status
        visible, given = core.read_namespaced_pod_log(name, "work").strip().split("/")
        assert visible == given  # the runtime gives what the plugin answered
        seen += given.split(",")
    assert len(seen) == len(set(seen)) == want[profile] and set(seen) <= set(mig)
    # More than the node has: the scheduler says which resource.
    core.create_namespaced_pod("work", mig_pod("greedy", {profile: want[profile] + 1}, "true"))

    def unschedulable():
        conds = core.read_namespaced_pod("greedy", "work").status.conditions or []
        return next((c for c in conds if c.type == "PodScheduled" and c.status == "False"),
                    None)

    assert f"Insufficient {profile}" in wait_for(unschedulable, "PodScheduled=False").message
    # Two resources in one container, envvar strategy: both answers set NVIDIA_VISIBLE_DEVICES
    # and the kubelet keeps the first ("Skip existing env"), so the runtime gives only those.
    both = {"nvidia.com/gpu": 1, "nvidia.com/mig-3g.40gb": 1}
    core.create_namespaced_pod("work", mig_pod("both", both, command))
    assert finished(core, "both").status.phase == "Succeeded"
    visible, given = core.read_namespaced_pod_log("both", "work").strip().split("/")
    assert visible == given and given in [g.uuid for g in gpus if not g.mig_enabled]
    # The double-allocate fault hands out a device another pod holds.
    faults.set_fault(state_dir, NODE, "double-allocate")
    try:
        core.create_namespaced_pod("work", mig_pod("c", {profile: want[profile]},
                                                   f"{command}; sleep 2"))
        core.create_namespaced_pod("work", mig_pod("d", {profile: 1}, command))
        for name in ("c", "d"):
            assert finished(core, name).status.phase == "Succeeded"
    finally:
        faults.clear_fault(state_dir, NODE, "double-allocate")
    c = core.read_namespaced_pod_log("c", "work").strip().split("/")[1].split(",")
    d = core.read_namespaced_pod_log("d", "work").strip().split("/")[1].split(",")
    assert set(d) <= set(c)


def test_admission_names_the_resource_the_node_lacks(cluster):
    backend, core, deploy, _ = cluster
    deploy("mixed")
    wait_for(lambda: node_resources(core)[1], "the plugin's resources")
    # Bound by hand (no scheduler): the kubelet's own admission check.
    spec = mig_pod("direct", {"nvidia.com/mig-7g.80gb": 1}, "true")
    spec["spec"]["nodeName"] = NODE
    core.create_namespaced_pod("work", spec)
    pod = finished(core, "direct")
    assert (pod.status.phase, pod.status.reason) == ("Failed", "OutOfnvidia.com/mig-7g.80gb")
    assert "nvidia.com/mig-7g.80gb, requested: 1" in pod.status.message


def test_a_new_layout_counts_only_when_the_plugin_pod_is_recreated(cluster):
    backend, core, deploy, _ = cluster
    old = backend.node_map[NODE].gpus
    deploy("mixed")
    wait_resources(core, served(old), served(old, healthy_only=True), "the first layout")
    # A new MIG layout; the lost GPU stays lost (health is NVML's now, by GPU).
    new = layout_gpus([["2g.20gb"] * 3, None, ["7g.80gb"], None, None], UNHEALTHY)
    backend.node_map[NODE].gpus = new
    pod = plugin_pod(core)
    time.sleep(1.0)  # several passes: the running plugin keeps what it enumerated
    assert node_resources(core) == (served(old), served(old, healthy_only=True))
    core.delete_namespaced_pod(pod.metadata.name, "kube-system")
    wait_for(lambda: (lambda p: p if p and p.metadata.uid != pod.metadata.uid else None)(
        plugin_pod(core)), "the DaemonSet's new plugin pod")
    # Resources of the old layout only stay in capacity, at 0 (the kubelet's way).
    stale = {r: 0 for r in served(old) if r not in served(new)}
    assert stale
    wait_resources(core, {**stale, **served(new)}, {**stale, **served(new, healthy_only=True)},
                   "the new layout, stale resources at 0")


def test_without_its_plugin_every_resource_keeps_capacity_and_nothing_is_allocatable(cluster):
    backend, core, deploy, state_dir = cluster
    gpus = backend.node_map[NODE].gpus
    deploy("mixed")
    capacity = served(gpus)
    wait_resources(core, capacity, served(gpus, healthy_only=True), "the resources")
    faults.set_fault(state_dir, NODE, "plugin-unregistered")
    try:
        wait_resources(core, capacity, dict.fromkeys(capacity, 0), "allocatable 0")
    finally:
        faults.clear_fault(state_dir, NODE, "plugin-unregistered")
    wait_resources(core, capacity, served(gpus, healthy_only=True), "the resources again")


def test_the_plugin_serves_what_the_library_decides():
    """The counts above are the test's own; the emulator's come from deviceplugin.advertised:
    the two agree for this layout (a second opinion for the layout the tests use)."""
    gpus = layout_gpus(LAYOUT, UNHEALTHY)
    assert {r: len(d) for r, d in dp.advertised("mixed", copy.deepcopy(gpus)).items()} == \
        served(gpus)
