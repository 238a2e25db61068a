"""The lab's NVIDIA runtime rules (gpuprov/lab/toolkit/toolkit_rules.py) and the emulated device
plugin's Allocate (gpuprov/lab/kube/deviceplugin.py): each device list strategy gives a
container exactly its GPUs, by UUID, under the toolkit settings that strategy needs; an
unprivileged container that asks by environment only gets nothing under the secure settings."""

from __future__ import annotations

import pytest

from gpuprov.lab.kube import deviceplugin as dp
from gpuprov.lab.toolkit import toolkit_rules as rules

NODE = [f"GPU-{i:08x}-0000-4000-8000-000000000000" for i in range(4)]
DEFAULTS: dict = {}  # the toolkit's defaults: envvar accepted, mounts not
SECURE = {rules.ENVVAR_UNPRIVILEGED: False, rules.AS_VOLUME_MOUNTS: True}


def plugin_pod(strategy: str, id_strategy: str = "uuid") -> dict:
    env = [{"name": "DEVICE_LIST_STRATEGY", "value": strategy},
           {"name": "DEVICE_ID_STRATEGY", "value": id_strategy}]
    return {"spec": {"containers": [{"name": "p", "env": env}]}}


def allocated_container(strategy: str, gpus: list[str], id_strategy: str = "uuid",
                        env: dict | None = None) -> rules.Container:
    answer = dp.allocate(dp.settings_from_pod(plugin_pod(strategy, id_strategy)), gpus, NODE)
    return rules.Container({**(env or {}), **answer.envs}, answer.mounts, False,
                           answer.annotations, answer.cdi_devices)


@pytest.mark.parametrize(("strategy", "settings"), [
    ("envvar", DEFAULTS),
    ("volume-mounts", SECURE),
    ("cdi-cri", SECURE),
    ("cdi-annotations", SECURE),
    ("envvar,volume-mounts", SECURE),
])
@pytest.mark.parametrize("id_strategy", ["uuid", "index"])
def test_each_strategy_gives_exactly_the_allocated_gpus(strategy, settings, id_strategy):
    want = [NODE[3], NODE[1]]
    container = allocated_container(strategy, want, id_strategy)
    assert rules.container_gpus(container, settings, NODE, nvidia_runtime=True) == \
        [NODE[1], NODE[3]]


def test_envvar_strategy_under_the_secure_settings_gives_nothing():
    """Why the secure settings need the volume-mounts strategy: the plugin's variable is an
    unprivileged container's request, which the runtime then ignores."""
    container = allocated_container("envvar", [NODE[0]])
    assert rules.container_gpus(container, SECURE, NODE, nvidia_runtime=True) == []


def test_volume_mounts_on_a_toolkit_that_does_not_accept_them_fails_the_container():
    container = allocated_container("volume-mounts", [NODE[0]])
    with pytest.raises(rules.UnknownDevice, match="nvidia-container-devices: unknown device"):
        rules.container_gpus(container, DEFAULTS, NODE, nvidia_runtime=True)


@pytest.mark.parametrize(("settings", "privileged", "seen"), [
    (DEFAULTS, False, NODE),  # the leak: every GPU, no request
    (SECURE, False, []),
    (SECURE, True, NODE),  # privileged containers keep the variable (the plugin itself)
    ({rules.ENVVAR_UNPRIVILEGED: False}, False, []),
])
def test_no_request_pod_asking_by_environment(settings, privileged, seen):
    container = rules.Container({"NVIDIA_VISIBLE_DEVICES": "all"}, privileged=privileged)
    assert rules.container_gpus(container, settings, NODE, nvidia_runtime=True) == seen


def test_plain_runc_gives_no_gpu_whatever_the_environment():
    container = rules.Container({"NVIDIA_VISIBLE_DEVICES": "all"}, privileged=True)
    assert rules.container_gpus(container, DEFAULTS, NODE, nvidia_runtime=False) == []


def test_volume_mount_requests_win_over_the_variable():
    container = allocated_container("volume-mounts", [NODE[2]],
                                    env={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert rules.container_gpus(container, SECURE, NODE, nvidia_runtime=True) == [NODE[2]]


@pytest.mark.parametrize(("value", "want"), [
    (None, None), ("", None), ("void", None), ("0,void", None), ("none", []),
    ("all", ["all"]), ("0,all", ["all"]), ("1, 0,1", ["1", "0"]), ("none,2", []),
])
def test_visible_devices_variable(value, want):
    env = {} if value is None else {"NVIDIA_VISIBLE_DEVICES": value}
    assert rules.devices_from_envvar(env) == want


def test_legacy_cuda_image_without_the_variable_asks_for_all():
    assert rules.devices_from_envvar({"CUDA_VERSION": "11.0"}) == ["all"]
    assert rules.devices_from_envvar({"CUDA_VERSION": "11.0",
                                      "NVIDIA_REQUIRE_CUDA": "cuda>=11.0"}) is None


def test_only_dev_null_mounts_under_the_root_count():
    mounts = [rules.Mount("/dev/null", "/var/run/nvidia-container-devices/GPU-a"),
              rules.Mount("/etc/passwd", "/var/run/nvidia-container-devices/GPU-b"),
              rules.Mount("/dev/null", "/var/run/other/GPU-c"),
              rules.Mount("/dev/null", "/var/run/nvidia-container-devices/")]
    assert rules.devices_from_mounts(mounts) == ["GPU-a"]


@pytest.mark.parametrize(("context", "privileged"), [
    ({}, False),
    ({"privileged": True}, True),
    ({"capabilities": {"add": ["SYS_ADMIN"]}}, True),
    ({"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}, True),
    ({"capabilities": {"drop": ["ALL"]}}, False),
])
def test_privileged_means_cap_sys_admin(context, privileged):
    assert rules.is_privileged(context) is privileged


def test_cdi_strategies_name_the_plugins_own_kind_and_set_no_variable():
    answer = dp.allocate(dp.Settings(("cdi-cri",), "uuid"), [NODE[0]], NODE)
    assert answer.cdi_devices == (f"k8s.device-plugin.nvidia.com/gpu={NODE[0]}",)
    assert not answer.envs and not answer.mounts
    annotated = dp.allocate(dp.Settings(("cdi-annotations",), "index"), [NODE[2]], NODE)
    (key, value), = annotated.annotations.items()
    assert key.startswith("cdi.k8s.io/nvidia-device-plugin_")
    assert value == "k8s.device-plugin.nvidia.com/gpu=2"


@pytest.mark.parametrize("env", [{"DEVICE_LIST_STRATEGY": "bogus"},
                                 {"DEVICE_ID_STRATEGY": "serial"}])
def test_settings_the_plugin_refuses(env):
    pod = {"spec": {"containers": [{"name": "p", "env": [{"name": k, "value": v}
                                                         for k, v in env.items()]}]}}
    with pytest.raises(dp.AllocateError):
        dp.settings_from_pod(pod)


def test_the_rules_take_the_same_toolkit_defaults_as_the_probe():
    from gpuprov.node.probe import runtime as probe_runtime

    assert rules.TOOLKIT_DEFAULTS == probe_runtime.TOOLKIT_KEYS


def _rendered_plugin():
    """gpuprov's own DaemonSet pod and named-config ConfigMap (templates/, role defaults)."""
    from gpuprov import manifests

    objects = {o["kind"]: o for o in manifests.device_plugin()}
    template = objects["DaemonSet"]["spec"]["template"]
    pod = {"metadata": {"namespace": objects["DaemonSet"]["metadata"]["namespace"]},
           "spec": template["spec"]}
    maps = {(objects["ConfigMap"]["metadata"]["namespace"],
             objects["ConfigMap"]["metadata"]["name"]): objects["ConfigMap"]}
    return pod, lambda ns, name: maps.get((ns, name))


@pytest.mark.parametrize(("labels", "strategies"), [
    ({"nvidia.com/device-plugin.config": "cdi"}, ("cdi-cri",)),
    ({"nvidia.com/device-plugin.config": "legacy"}, ("volume-mounts",)),
    ({}, ("volume-mounts",)),  # config-manager's DEFAULT_CONFIG
])
def test_the_node_label_picks_the_plugins_named_config(labels, strategies):
    pod, config_map = _rendered_plugin()
    settings = dp.settings_from_pod(pod, labels, config_map)
    assert settings.strategies == strategies and settings.id_strategy == "uuid"
    assert settings.cdi is (strategies == ("cdi-cri",))


def test_a_label_naming_no_config_fails_as_config_manager_does():
    pod, config_map = _rendered_plugin()
    with pytest.raises(dp.AllocateError, match="specified config 'mig' does not exist"):
        dp.settings_from_pod(pod, {"nvidia.com/device-plugin.config": "mig"}, config_map)


def test_the_plugins_environment_wins_over_its_config_file():
    pod, config_map = _rendered_plugin()
    plugin = next(c for c in pod["spec"]["containers"] if c["name"] == "nvidia-device-plugin-ctr")
    plugin["env"].append({"name": "DEVICE_LIST_STRATEGY", "value": "envvar"})
    settings = dp.settings_from_pod(pod, {"nvidia.com/device-plugin.config": "cdi"}, config_map)
    assert settings.strategies == ("envvar",)


def test_a_swarm_task_gets_the_gpus_swarm_assigned_not_nvidia_visible_devices():
    """swarm-resource names the variable(s) preferred over NVIDIA_VISIBLE_DEVICES where the
    container has them (internal/config/image/cuda_image.go visibleEnvVars), still subject to
    the unprivileged rule."""
    from gpuprov.lab.toolkit import toolkit_rules as rules

    env = {"DOCKER_RESOURCE_NVIDIA-GPU": "GPU-b", "NVIDIA_VISIBLE_DEVICES": "all"}
    on = {rules.ENVVAR_UNPRIVILEGED: True, rules.SWARM_RESOURCE: "DOCKER_RESOURCE_NVIDIA-GPU"}
    task = rules.Container(env=env)
    assert rules.container_gpus(task, on, ["GPU-a", "GPU-b"], True) == ["GPU-b"]
    # The toolkit's commented default names another variable: the task then gets every GPU.
    default = {**on, rules.SWARM_RESOURCE: "DOCKER_RESOURCE_GPU"}
    assert rules.container_gpus(task, default, ["GPU-a", "GPU-b"], True) == ["GPU-a", "GPU-b"]
    off = {**on, rules.ENVVAR_UNPRIVILEGED: False}
    assert rules.container_gpus(task, off, ["GPU-a", "GPU-b"], True) == []
