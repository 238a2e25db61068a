"""The emulator's building blocks: patches, selectors, runtime config parsing, process."""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client
from kubernetes import config as kconfig

from gpuprov.lab.kube import app, patch, selectors
from gpuprov.lab.kube.backend import parse_runtime_config
from gpuprov.lab.kube.errors import ApiError


def test_strategic_merge_uses_the_schema_merge_keys():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "a", "image": "x", "env": [
               {"name": "K", "value": "1"}]}], "tolerations": [{"key": "t"}]}}
    out = patch.apply_patch("application/strategic-merge-patch+json", pod, {"spec": {
        "containers": [{"name": "a", "env": [{"name": "L", "value": "2"}]},
                       {"name": "b", "image": "y"}],
        "tolerations": [{"key": "u"}]}})
    assert [c["name"] for c in out["spec"]["containers"]] == ["a", "b"]
    assert out["spec"]["containers"][0]["env"] == [{"name": "K", "value": "1"},
                                                   {"name": "L", "value": "2"}]
    assert out["spec"]["tolerations"] == [{"key": "u"}]  # no merge key: replaced


def test_strategic_merge_delete_directive():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "a"}, {"name": "b"}]}}
    out = patch.apply_patch("application/strategic-merge-patch+json", pod, {"spec": {
        "containers": [{"name": "a", "$patch": "delete"}]}})
    assert out["spec"]["containers"] == [{"name": "b"}]


def test_json_patch_test_op_failure_is_422():
    with pytest.raises(ApiError) as err:
        patch.json_patch({"a": 1}, [{"op": "test", "path": "/a", "value": 2}])
    assert err.value.code == 422


def test_unsupported_patch_type_is_415():
    with pytest.raises(ApiError) as err:
        patch.apply_patch("text/plain", {}, {})
    assert err.value.code == 415


@pytest.mark.parametrize(("text", "labels", "expected"), [
    ("a in (x, y),!b", {"a": "y"}, True),
    ("a in (x, y),!b", {"a": "y", "b": ""}, False),
    ("a notin (x)", {}, True),
    ("a!=x", {"a": "x"}, False),
])
def test_label_selector_grammar(text, labels, expected):
    assert selectors.matches_all(selectors.parse_label_selector(text), labels) is expected


def test_bad_label_selector_is_400():
    with pytest.raises(ApiError) as err:
        selectors.parse_label_selector("a in x")
    assert err.value.code == 400


def test_node_affinity_and_taints():
    node = {"metadata": {"name": "n1", "labels": {"gpu": "true"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}}
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "gpu", "operator": "In", "values": ["true"]}]}]}}}}
    assert selectors.node_affinity_matches(spec, node)
    assert selectors.untolerated_taints(spec, node)
    spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert not selectors.untolerated_taints(spec, node)


CONTAINERD_MAIN = """
version = 2
imports = ["/etc/containerd/conf.d/*.toml"]
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
"""
CONTAINERD_NVIDIA = """
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
"""


def test_containerd_drop_in_counts_only_when_imported():
    files = {"/etc/containerd/config.toml": CONTAINERD_MAIN,
             "/etc/containerd/conf.d/99-nvidia.toml": CONTAINERD_NVIDIA}
    config = parse_runtime_config(files, ["/usr/bin/nvidia-container-runtime"])
    assert config.handler_is_nvidia(None) and config.nvidia_handlers == {"nvidia"}
    orphan = {"/etc/containerd/config.toml": CONTAINERD_MAIN.replace("imports", "#"),
              "/etc/containerd/conf.d/99-nvidia.toml": CONTAINERD_NVIDIA}
    assert not parse_runtime_config(orphan, ["/usr/bin/nvidia-container-runtime"]) \
        .nvidia_handlers


def test_nvidia_runtime_without_its_binary_does_not_count():
    files = {"/etc/containerd/config.toml": CONTAINERD_NVIDIA}
    assert not parse_runtime_config(files, []).nvidia_handlers


def test_docker_and_crio_configs():
    docker = {"/etc/docker/daemon.json": '{"runtimes": {"nvidia": {"path": '
              '"nvidia-container-runtime"}}, "default-runtime": "nvidia"}'}
    assert parse_runtime_config(docker).handler_is_nvidia(None)
    crio = {"/etc/crio/crio.conf.d/99-nvidia.conf": '[crio.runtime.runtimes.nvidia]\n'
            'runtime_path = "/usr/bin/nvidia-container-runtime"\n'}
    config = parse_runtime_config(crio)
    assert config.handler_is_nvidia("nvidia") and not config.handler_is_nvidia(None)


def test_background_process_serves_and_stops(tmp_path):
    url = app.start_background(tmp_path)
    try:
        assert app.start_background(tmp_path) == url  # idempotent
        assert app.url(tmp_path) == url
        kubeconfig = app.write_kubeconfig(tmp_path / "kubeconfig", url)
        cfg = client.Configuration()
        kconfig.load_kube_config(str(kubeconfig), client_configuration=cfg)
        api = client.ApiClient(cfg)
        names = {n.metadata.name for n in client.CoreV1Api(api).list_namespace().items}
        assert {"default", "kube-system"} <= names
        assert yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"] == url
    finally:
        assert app.stop(tmp_path) is True
    assert app.url(tmp_path) is None
    assert app.stop(tmp_path) is False
