"""The emulator's building blocks: patches, selectors, runtime config from the probe, process."""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client
from kubernetes import config as kconfig

from gpuprov.lab.kube import app, backend, patch, selectors
from gpuprov.lab.kube.backend import RuntimeConfig, runtime_from_probe
from gpuprov.lab.kube.errors import ApiError
from gpuprov.node.probe import runtime as probe_runtime
from gpuprov.node.probe.fs import Root


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


NVIDIA_BIN = "/usr/bin/nvidia-container-runtime"
BINARIES = {"nvidia-container-runtime": NVIDIA_BIN, "nvidia-ctk": "/usr/bin/nvidia-ctk"}
ABSENT = {"present": False, "runtimes": {}, "default_runtime_name": None}


def probe_report(binaries=BINARIES, **sections) -> dict:
    """A probe report whose container_runtime has `sections` (containerd=..., crio=...,
    docker=...: {runtime name: binary}, plus "default" for the default runtime's name)."""
    runtime = {"containerd": ABSENT, "crio": ABSENT, "docker": ABSENT, "binaries": binaries}
    for key, spec in sections.items():
        spec = dict(spec)
        default = spec.pop("default", None)
        runtime[key] = {"present": True, "default_runtime_name": default,
                        "runtimes": {n: {"binary": b} for n, b in spec.items()}}
    return {"schema_version": 1, "container_runtime": runtime}


def test_containerd_nvidia_default_runtime():
    config = runtime_from_probe(probe_report(
        containerd={"runc": "", "nvidia": NVIDIA_BIN, "default": "nvidia"}))
    assert config.runtime == "containerd" and config.default_handler == "nvidia"
    assert config.nvidia_handlers == {"nvidia"} and config.handler_is_nvidia(None)


def test_containerd_nvidia_only_through_a_runtime_class():
    config = runtime_from_probe(probe_report(
        containerd={"runc": "", "nvidia": NVIDIA_BIN,
                    "nvidia-cdi": "/usr/bin/nvidia-container-runtime.cdi", "default": "runc"}))
    assert config.nvidia_handlers == {"nvidia", "nvidia-cdi"}
    assert config.handler_is_nvidia("nvidia") and not config.handler_is_nvidia(None)


def test_lab_backend_reads_the_node_files_and_keeps_them_while_it_is_stopped(tmp_path,
                                                                             monkeypatch):
    """The runtime is read with the probe's runtime section in the node's root (here a
    directory; in the lab /proc/<pid>/root); a stopped node (no root) changes nothing."""
    (tmp_path / "lab.json").write_text('{"nodes": [{"name": "n1", "container": "c1"}]}')
    root = tmp_path / "root"
    (root / "etc/containerd").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text(CONTAINERD_NVIDIA)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-container-runtime").write_text("#!/bin/sh\n")
    (root / "usr/bin/nvidia-container-runtime").chmod(0o755)
    (root / "etc/nvidia-container-runtime").mkdir(parents=True)
    (root / "etc/nvidia-container-runtime/config.toml").write_text(
        "#accept-nvidia-visible-devices-as-volume-mounts = false\n"
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n")
    lab = backend.LabBackend(tmp_path)
    roots = [str(root), None]
    monkeypatch.setattr(lab, "_node_root", lambda node: roots.pop(0))
    monkeypatch.setattr(backend, "RUNTIME_CACHE_SECONDS", 0)
    # The toolkit's keys as its config.toml has them; a commented one at NVIDIA's default.
    toolkit = {"accept-nvidia-visible-devices-envvar-when-unprivileged": False,
               "accept-nvidia-visible-devices-as-volume-mounts": False}
    assert lab.runtime("n1") == backend.RuntimeConfig(frozenset({"nvidia"}), "nvidia",
                                                      toolkit_settings=toolkit)
    assert lab.runtime("n1").handler_is_nvidia(None)  # stopped: the last one stays
    assert roots == []


def test_nvidia_runtime_without_its_binary_does_not_count():
    report = probe_report(binaries={**BINARIES, "nvidia-container-runtime": None},
                          containerd={"nvidia": NVIDIA_BIN, "default": "nvidia"})
    config = runtime_from_probe(report)
    assert config.runtime == "containerd" and not config.nvidia_handlers
    assert not config.handler_is_nvidia(None)


def test_a_runtime_named_nvidia_with_another_binary_does_not_count():
    config = runtime_from_probe(probe_report(containerd={"nvidia": "/usr/bin/runc"}))
    assert not config.nvidia_handlers and config.default_handler == "runc"


def test_crio_defaults_to_crun_and_docker_to_runc():
    crio = runtime_from_probe(probe_report(crio={"nvidia": NVIDIA_BIN}))
    assert crio.runtime == "cri-o" and crio.default_handler == "crun"
    assert crio.handler_is_nvidia("nvidia") and not crio.handler_is_nvidia(None)
    docker = runtime_from_probe(probe_report(
        docker={"nvidia": "nvidia-container-runtime", "default": "nvidia"}))
    assert docker.runtime == "docker" and docker.handler_is_nvidia(None)


def test_containerd_wins_over_crio_and_docker():
    config = runtime_from_probe(probe_report(containerd={}, crio={"nvidia": NVIDIA_BIN},
                                             docker={"nvidia": NVIDIA_BIN}))
    assert config == RuntimeConfig(frozenset(), "runc", "containerd")


@pytest.mark.parametrize("report", [{}, {"container_runtime": None}, probe_report()])
def test_no_runtime_configured_is_plain_containerd(report):
    assert runtime_from_probe(report) == RuntimeConfig()


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


@pytest.mark.parametrize(("main", "nvidia"), [(CONTAINERD_MAIN, True),
                                              (CONTAINERD_MAIN.replace("imports", "#"), False)])
def test_probe_reads_a_containerd_drop_in_only_when_imported(tmp_path, main, nvidia):
    """End to end through the probe's own parser: the files a node has -> RuntimeConfig."""
    files = {"etc/containerd/config.toml": main,
             "etc/containerd/conf.d/99-nvidia.toml": CONTAINERD_NVIDIA,
             "usr/bin/nvidia-container-runtime": "#!/bin/sh\n"}
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "usr/bin/nvidia-container-runtime").chmod(0o755)
    report = {"container_runtime": probe_runtime.collect(Root(str(tmp_path)))}
    config = runtime_from_probe(report)
    assert config.handler_is_nvidia(None) is nvidia
    assert config.nvidia_handlers == ({"nvidia"} if nvidia else set())


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
