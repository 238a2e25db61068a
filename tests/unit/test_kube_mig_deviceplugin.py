"""The emulated device plugin's MIG strategies (gpuprov/lab/kube/deviceplugin.py, following
NVIDIA/k8s-device-plugin v0.20.0 internal/rm/device_map.go and rm.go), its Allocate answer for
MIG devices, and NVIDIA's runtime rules naming MIG devices (gpuprov/lab/toolkit/toolkit_rules.py).
What the plugin serves is checked against gpuprov's own expectation (gpuprov/verify/checks/
k8s.py expected_resources) where both say the plugin starts."""

from __future__ import annotations

import pytest

from gpuprov.lab.kube import deviceplugin as dp
from gpuprov.lab.kube.backend import Gpu, MigDevice
from gpuprov.lab.toolkit import toolkit_rules as rules
from gpuprov.verify.checks import k8s

# Layouts: one entry per GPU, None for MIG off, else the profiles of its MIG devices.
Layout = list[list[str] | None]


def gpus_of(layout: Layout, unhealthy: tuple[int, ...] = ()) -> list[Gpu]:
    out = []
    for i, profiles in enumerate(layout):
        devices = tuple(MigDevice(f"MIG-{i:04x}{j:04x}-0000-4000-8000-{j:012x}", p, j)
                        for j, p in enumerate(profiles or []))
        out.append(Gpu(f"GPU-{i:08x}-0000-4000-8000-{i:012x}", i not in unhealthy,
                       profiles is not None, devices))
    return out


def probe_report(layout: Layout) -> dict:
    """The same layout as gpuprov's probe reports it (gpuprov/node/probe/nvml.py _mig)."""
    return {"nvml": {"gpus": [
        {"error": None, "mig": None if profiles is None else {
            "current": True, "pending": True,
            "devices": [{"uuid": f"MIG-{i}-{j}", "profile": p}
                        for j, p in enumerate(profiles)]}}
        for i, profiles in enumerate(layout)]}}


def counts(served: dict) -> dict[str, int]:
    return {resource: len(devices) for resource, devices in served.items()}


SEVEN = ["1g.10gb"] * 7
STARTS = {  # (strategy, layout): layouts with which the plugin starts
    "none, MIG off": ("none", [None] * 4),
    "none, MIG on": ("none", [SEVEN, None, ["3g.40gb"], None]),
    "single, MIG off everywhere": ("single", [None] * 3),
    "single, one profile everywhere": ("single", [SEVEN, SEVEN, ["1g.10gb"] * 2]),
    "mixed, MIG off": ("mixed", [None] * 2),
    "mixed, several profiles and GPUs": (
        "mixed", [SEVEN, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"], ["1g.10gb+me"], None,
                  None]),
}


@pytest.mark.parametrize("case", sorted(STARTS))
def test_what_the_plugin_serves_is_what_verify_expects(case):
    strategy, layout = STARTS[case]
    served = dp.advertised(strategy, gpus_of(layout))
    expected = {r: n for r, n in k8s.expected_resources(probe_report(layout), strategy).items()
                if n}
    assert counts(served) == expected


def test_mixed_names_each_profile_and_writes_plus_as_a_dot():
    layout = [["1g.10gb", "1g.10gb+me", "2g.20gb"], None, ["1g.10gb"]]
    served = dp.advertised("mixed", gpus_of(layout))
    for resource, devices in served.items():
        if resource == dp.GPU_RESOURCE:
            assert [d.index for d in devices] == [str(i) for i, p in enumerate(layout)
                                                  if p is None]
            continue
        assert resource.startswith("nvidia.com/mig-") and "+" not in resource
        for d in devices:
            profile = layout[d.gpu][int(d.index.split(":")[1])]
            assert resource == "nvidia.com/mig-" + profile.replace("+", ".")
            assert d.index == f"{d.gpu}:{d.index.split(':')[1]}"
    assert "nvidia.com/mig-1g.10gb.me" in served
    assert sum(map(len, served.values())) == sum(len(p) if p else 1 for p in layout)


def test_none_serves_whole_gpus_whatever_their_mig_mode():
    layout = [SEVEN, None]
    served = dp.advertised("none", gpus_of(layout))
    assert [d.id for d in served[dp.GPU_RESOURCE]] == [g.uuid for g in gpus_of(layout)]


@pytest.mark.parametrize(("layout", "nvidia_says"), [
    ([SEVEN, None], "all devices on the node must be configured with the same migEnabled value"),
    ([SEVEN, ["2g.20gb"] * 3], "more than one MIG device type present on node"),
    ([SEVEN, []], "device 1 has no MIG devices configured"),
])
def test_single_refuses_what_nvidias_device_map_refuses(layout, nvidia_says):
    with pytest.raises(dp.AllocateError, match=nvidia_says):
        dp.advertised("single", gpus_of(layout))
    # The same layouts are fine under mixed (a MIG GPU without devices only warns there).
    assert dp.advertised("mixed", gpus_of(layout))


def test_mixed_refuses_a_compute_instance_smaller_than_its_gpu_instance():
    # rm.go registers mig-<profile> only for profiles whose compute and GPU slices are equal.
    with pytest.raises(dp.AllocateError, match="'1c.2g.20gb' does not match any resource"):
        dp.advertised("mixed", gpus_of([["1c.2g.20gb", "2g.20gb"]]))
    assert counts(dp.advertised("single", gpus_of([["1c.2g.20gb"] * 2]))) == \
        {dp.GPU_RESOURCE: 2}


def _pod(env: dict[str, str], config: str | None = None):
    """A plugin pod with NVIDIA's config-manager sidecar and a named config (or none)."""
    containers = [{"name": "plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
                   "env": [{"name": k, "value": v} for k, v in env.items()]}]
    volumes = []
    if config is not None:
        containers.append({"name": "config-manager", "command": ["config-manager"],
                           "image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
                           "env": [{"name": "CONFIG_FILE_SRCDIR", "value": "/available"},
                                   {"name": "DEFAULT_CONFIG", "value": "default"}],
                           "volumeMounts": [{"name": "configs", "mountPath": "/available"}]})
        volumes.append({"name": "configs", "configMap": {"name": "plugin-configs"}})
    pod = {"metadata": {"namespace": "kube-system"},
           "spec": {"containers": containers, "volumes": volumes}}
    maps = {("kube-system", "plugin-configs"): {"data": {"default": config or ""}}}
    return pod, lambda ns, name: maps.get((ns, name))


@pytest.mark.parametrize(("env", "config", "strategy"), [
    ({}, None, "none"),
    ({}, "version: v1\nflags:\n  migStrategy: mixed\n", "mixed"),
    ({"MIG_STRATEGY": "single"}, "version: v1\nflags:\n  migStrategy: mixed\n", "single"),
    ({"MIG_STRATEGY": "mixed"}, None, "mixed"),
])
def test_the_mig_strategy_comes_from_the_environment_then_the_config_file(env, config,
                                                                           strategy):
    pod, config_map = _pod(env, config)
    assert dp.settings_from_pod(pod, {}, config_map).mig_strategy == strategy


@pytest.mark.parametrize(("env", "config"), [
    ({"MIG_STRATEGY": "all"}, None),
    ({}, "version: v1\nflags:\n  migStrategy: MIXED\n"),
])
def test_an_unknown_mig_strategy_keeps_the_plugin_from_starting(env, config):
    pod, config_map = _pod(env, config)
    with pytest.raises(dp.AllocateError, match="unknown MIG strategy"):
        dp.settings_from_pod(pod, {}, config_map)


@pytest.mark.parametrize("id_strategy", ["uuid", "index"])
@pytest.mark.parametrize("list_strategy", ["envvar", "cdi-cri", "cdi-annotations"])
def test_allocate_names_mig_devices_by_uuid_or_gpu_colon_mig_index(id_strategy, list_strategy):
    layout = [None, ["1g.10gb", "1g.10gb", "2g.20gb"]]
    gpus = gpus_of(layout)
    served = dp.advertised("mixed", gpus)
    devices = served["nvidia.com/mig-1g.10gb"]
    indices = {d.id: d.index for ds in served.values() for d in ds}
    answer = dp.allocate(dp.Settings((list_strategy,), id_strategy), [d.id for d in devices],
                         [g.uuid for g in gpus], indices)
    names = [d.id if id_strategy == "uuid" else d.index for d in devices]
    if list_strategy == "envvar":
        assert answer.envs[dp.DEVICE_LIST_ENVVAR] == ",".join(names)
    else:
        cdi = answer.cdi_devices or tuple(",".join(answer.annotations.values()).split(","))
        assert cdi == tuple(f"{dp.CDI_KIND}={n}" for n in names)
    # NVIDIA's runtime gives exactly those MIG devices, whichever way they are named.
    container = rules.Container(dict(answer.envs), annotations=answer.annotations,
                                cdi_devices=answer.cdi_devices)
    mig = {g.uuid: [(d.index, d.uuid) for d in g.mig_devices] for g in gpus if g.mig_enabled}
    assert rules.container_gpus(container, {}, [g.uuid for g in gpus], True, mig) == \
        [d.id for d in devices]


def test_the_runtime_refuses_a_mig_device_the_node_does_not_have():
    gpus = gpus_of([["1g.10gb"]])
    mig = {gpus[0].uuid: [(0, gpus[0].mig_devices[0].uuid)]}
    with pytest.raises(rules.UnknownDevice, match="0:1: unknown device"):
        rules.container_gpus(rules.Container({"NVIDIA_VISIBLE_DEVICES": "0:1"}), {},
                             [gpus[0].uuid], True, mig)
    # The whole GPU and one of its MIG devices: the GPU, then the MIG device.
    both = rules.Container({"NVIDIA_VISIBLE_DEVICES": f"0:0,{gpus[0].uuid}"})
    assert rules.container_gpus(both, {}, [gpus[0].uuid], True, mig) == \
        [gpus[0].uuid, gpus[0].mig_devices[0].uuid]
