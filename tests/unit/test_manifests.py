"""gpuprov.manifests and `gpuprov manifests`: the templates rendered with the role's defaults,
valid against the official strict schemas, identical to what Ansible renders, and bad values
refused with one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from ansible_render import objects_by_ansible

from gpuprov import cli, manifests

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "nvidia_device_plugin"
K8S_VERSIONS = ("1.29", "1.30", "1.31", "1.32", "1.33", "1.34")
TIME_SLICED = {"nvidia_device_plugin_time_slicing_replicas": 4,
               "nvidia_device_plugin_mig_strategy": "mixed",
               "nvidia_device_plugin_namespace": "gpu-system"}


def values_file(tmp_path: Path, values: dict | str) -> Path:
    path = tmp_path / "values.yml"
    path.write_text(values if isinstance(values, str) else yaml.safe_dump(values))
    return path


def by_kind(objects: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objects}


KINDS = ["RuntimeClass", "ConfigMap", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
         "DaemonSet"]


def plugin_container(pod: dict) -> dict:
    return next(c for c in pod["containers"] if c["name"] == "nvidia-device-plugin-ctr")


def test_defaults_give_runtime_class_configs_and_daemonset():
    objects = manifests.device_plugin()
    assert [o["kind"] for o in objects] == KINDS
    found = by_kind(objects)
    rc, ds = found["RuntimeClass"], found["DaemonSet"]
    assert rc["metadata"]["name"] == "nvidia" and rc["handler"] == "nvidia"
    assert ds["metadata"]["namespace"] == "kube-system"
    pod = ds["spec"]["template"]["spec"]
    container = plugin_container(pod)
    assert container["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.20.1"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["runtimeClassName"] == "nvidia"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"]
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in pod["tolerations"]
    # volume-mounts: CAP_SYS_ADMIN alone, as NVIDIA's chart adds it (requiresCapSysAdmin).
    assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"],
                                                             "add": ["SYS_ADMIN"]}}
    # The settings are in the config files only: the plugin lets its environment win.
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["CONFIG_FILE"] == "/config/config.yaml"
    assert not {"DEVICE_LIST_STRATEGY", "DEVICE_ID_STRATEGY", "MIG_STRATEGY"} & set(env)
    assert pod["volumes"][0]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
    assert container["volumeMounts"][0]["mountPath"] == "/var/lib/kubelet/device-plugins"


def test_one_named_config_per_runtime_mode_chosen_by_the_node_label():
    found = by_kind(manifests.device_plugin())
    configs = {name: yaml.safe_load(text)
               for name, text in found["ConfigMap"]["data"].items()}
    assert set(configs) == {"legacy", "cdi"}
    assert configs["legacy"]["flags"]["plugin"]["deviceListStrategy"] == ["volume-mounts"]
    assert configs["cdi"]["flags"]["plugin"]["deviceListStrategy"] == ["cdi-cri"]
    for config in configs.values():
        assert config["version"] == "v1" and "sharing" not in config
        assert config["flags"]["migStrategy"] == "none"
        assert config["flags"]["plugin"]["deviceIDStrategy"] == "uuid"
    pod = found["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == found["ServiceAccount"]["metadata"]["name"]
    assert pod["shareProcessNamespace"] is True
    managers = pod["initContainers"] + [c for c in pod["containers"]
                                        if c["command"] == ["config-manager"]]
    assert len(managers) == 2
    for manager in managers:
        env = {e["name"]: e.get("value") for e in manager["env"]}
        assert env["NODE_LABEL"] == "nvidia.com/device-plugin.config"
        assert env["DEFAULT_CONFIG"] == "legacy"
        assert env["CONFIG_FILE_DST"] == plugin_container(pod)["env"][0]["value"]
        assert manager["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {m["mountPath"] for m in plugin_container(pod)["volumeMounts"]} >= {
        "/var/run/cdi", "/driver-root", "/config"}
    # config-manager may read nodes, nothing else.
    assert found["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]


def test_envvar_strategy_keeps_every_capability_dropped(tmp_path):
    path = tmp_path / "values.yml"
    path.write_text("nvidia_device_plugin_device_list_strategy: envvar\n")
    ds = by_kind(manifests.device_plugin(path))["DaemonSet"]
    container = plugin_container(ds["spec"]["template"]["spec"])
    assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"]}}


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_a_mig_strategy_gets_the_mig_monitor_and_sys_admin_as_nvidias_chart(tmp_path, strategy):
    # NVIDIA's chart v0.20.0: NVIDIA_MIG_MONITOR_DEVICES=all and CAP_SYS_ADMIN for any MIG
    # strategy but none (daemonset-device-plugin.yml, _helpers.tpl requiresCapSysAdmin);
    # k8s-device-plugin #229, #609: without them MIG devices fail to enumerate.
    path = values_file(tmp_path, {"nvidia_device_plugin_device_list_strategy": "envvar",
                                  "nvidia_device_plugin_mig_strategy": strategy})
    ds = by_kind(manifests.device_plugin(path))["DaemonSet"]
    container = plugin_container(ds["spec"]["template"]["spec"])
    assert {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"} in container["env"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"],
                                                             "add": ["SYS_ADMIN"]}}
    none = values_file(tmp_path, {"nvidia_device_plugin_device_list_strategy": "envvar"})
    plain = plugin_container(by_kind(manifests.device_plugin(none))["DaemonSet"]["spec"][
        "template"]["spec"])
    assert all(e["name"] != "NVIDIA_MIG_MONITOR_DEVICES" for e in plain["env"])


def test_time_slicing_goes_into_every_named_config(tmp_path):
    objects = by_kind(manifests.device_plugin(values_file(tmp_path, TIME_SLICED)))
    assert list(objects) == KINDS
    for text in objects["ConfigMap"]["data"].values():
        config = yaml.safe_load(text)
        assert config["flags"]["migStrategy"] == "mixed"
        assert config["sharing"]["timeSlicing"]["resources"] == [
            {"name": "nvidia.com/gpu", "replicas": 4}]
    ds = objects["DaemonSet"]
    assert ds["metadata"]["namespace"] == objects["ConfigMap"]["metadata"]["namespace"] == \
        "gpu-system"
    pod = ds["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "available-configs")
    assert volume["configMap"]["name"] == objects["ConfigMap"]["metadata"]["name"]


def test_a_config_change_restarts_the_plugin_pods(tmp_path):
    def annotation(replicas):
        values = values_file(tmp_path, {"nvidia_device_plugin_time_slicing_replicas": replicas})
        ds = by_kind(manifests.device_plugin(values))["DaemonSet"]
        return ds["spec"]["template"]["metadata"]["annotations"]["gpuprov.io/config-sha256"]
    assert annotation(4) != annotation(8)
    assert len(annotation(4)) == 64


def test_smoke_pod_and_job_request_gpus_with_least_privilege():
    pod = manifests.smoke_pod("smoke-1", "gpuprov-verify", gpus=2, node="gpu-pascal")
    job = manifests.smoke_job("smoke-job", "gpuprov-verify", gpus=1)
    assert pod["kind"] == "Pod" and job["kind"] == "Job" and job["apiVersion"] == "batch/v1"
    assert pod["metadata"]["namespace"] == job["metadata"]["namespace"] == "gpuprov-verify"
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "gpu-pascal"}
    assert "nodeSelector" not in job["spec"]["template"]["spec"]
    assert job["spec"]["backoffLimit"] == 0
    for spec, gpus in ((pod["spec"], 2), (job["spec"]["template"]["spec"], 1)):
        assert spec["restartPolicy"] == "Never"
        assert spec["runtimeClassName"] == "nvidia"
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        (container,) = spec["containers"]
        assert container["command"] == ["nvidia-smi", "-L"]
        # Quantities as the API returns them: strings.
        assert container["resources"]["limits"] == {"nvidia.com/gpu": str(gpus)}
        assert container["resources"]["requests"] == {"nvidia.com/gpu": str(gpus)}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["image"] == "docker.io/library/ubuntu:24.04"


@pytest.mark.parametrize("gpus", [0, -1, True, "2"])
def test_smoke_workloads_need_at_least_one_gpu(gpus):
    with pytest.raises(manifests.GpuprovError):
        manifests.smoke_pod("s", "ns", gpus=gpus)


def _all_objects(tmp_path: Path) -> list[dict]:
    return (manifests.device_plugin() + manifests.device_plugin(values_file(tmp_path, TIME_SLICED))
            + [manifests.smoke_pod("smoke", "gpuprov-verify", 1, node="gpu-pascal"),
               manifests.smoke_job("smoke", "gpuprov-verify", 2)])


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_validates_against_the_strict_official_schema(version, tmp_path):
    objects = _all_objects(tmp_path)
    assert len(objects) == 2 * len(KINDS) + 2
    for obj in objects:
        assert kubernetes_validate.validate(obj, version, strict=True) == version


def test_the_schema_check_is_not_vacuous():
    ds = by_kind(manifests.device_plugin())["DaemonSet"]
    ds["spec"]["template"]["spec"]["containers"][0]["envv"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, "1.33", strict=True)


def test_role_defaults_and_argument_specs_list_the_same_settings():
    defaults = manifests.role_defaults()
    options = manifests.role_options()
    assert set(defaults) == set(options)
    for name, spec in options.items():
        value = defaults[name]
        if isinstance(value, str) and "{{" in value:
            continue  # resolved by Ansible (the inventory's k8s_kubeconfig)
        assert spec.get("default") == value, name


def test_ansible_renders_the_same_objects(tmp_path):
    """The role's lookup of the same template, with the same values, gives the same objects."""
    values = values_file(tmp_path, TIME_SLICED)
    template = ROOT / "templates" / manifests.DEVICE_PLUGIN_TEMPLATE
    assert objects_by_ansible(tmp_path, template, ROLE / "defaults" / "main.yml", values) \
        == manifests.device_plugin(values)


def test_cli_prints_the_objects_as_multi_document_yaml(capsys):
    assert cli.main(["manifests"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("---\n")
    assert list(yaml.safe_load_all(out)) == manifests.device_plugin()


def test_cli_with_values(tmp_path, capsys):
    assert cli.main(["manifests", "--values", str(values_file(tmp_path, TIME_SLICED))]) == 0
    kinds = [o["kind"] for o in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds == KINDS


@pytest.mark.parametrize("content,message", [
    (None, "does not exist"),
    ("a: [\n", "is not valid YAML (line 2)"),
    ("- 1\n- 2\n", "must be a YAML mapping"),
    ("nvidia_device_plugin_versoin: v0.18.0\n",
     "unknown key 'nvidia_device_plugin_versoin' (did you mean nvidia_device_plugin_version?)"),
    ("nvidia_device_plugin_time_slicing_replicas: '4'\n",
     "nvidia_device_plugin_time_slicing_replicas must be int, got str '4'"),
    ("nvidia_device_plugin_use_runtime_class: 1\n",
     "nvidia_device_plugin_use_runtime_class must be bool"),
    ("nvidia_device_plugin_mig_strategy: all\n",
     "nvidia_device_plugin_mig_strategy must be one of none, single, mixed"),
    ("nvidia_device_plugin_node_selector: {nvidia.com/gpu.present: true}\n",
     "must map strings to strings"),
    ("nvidia_device_plugin_time_slicing_replicas: 0\n", "must be 1 (no sharing) or more"),
])
def test_cli_bad_values_exit_2_with_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "values.yml"
    if content is not None:
        path.write_text(content)
    assert cli.main(["manifests", "--values", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuprov: error: ")
    assert message in lines[0]


def test_cli_without_templates_says_where_they_should_be(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(manifests, "REPO_ROOT", tmp_path)
    assert cli.main(["manifests"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuprov: error: ") and "pip install -e ." in err
    assert str(tmp_path) in err


def test_an_empty_values_file_means_the_defaults(tmp_path):
    assert manifests.device_plugin(values_file(tmp_path, "")) == manifests.device_plugin()
