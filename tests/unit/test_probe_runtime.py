"""Container runtime configuration for NVIDIA, from recorded config files."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.node.probe import runtime, toml_subset
from gpuprov.node.probe.fs import Root

ROOTS = Path(__file__).parent.parent / "fixtures" / "probe" / "roots"
GPU_NODE = Root(str(ROOTS / "gpu-node"))
MALFORMED = Root(str(ROOTS / "malformed"))


@pytest.fixture(params=["tomllib", "subset"])
def toml_parser(request, monkeypatch):
    """Every containerd/CRI-O test runs with tomllib and with the fallback for Python < 3.11."""
    if request.param == "subset":
        monkeypatch.setattr(toml_subset, "tomllib", None)
    return request.param


def test_containerd_v2_drop_in_replaces_the_whole_cri_plugin_table(toml_parser):
    """containerd 1.x (config version 2): the drop-in's plugins."io.containerd.grpc.v1.cri"
    replaces the main file's WHOLE table (containerd issue #5837): runc, sandbox_image and
    the snapshotter of config.toml are gone, because this drop-in names only nvidia."""
    doc = runtime.collect_containerd(GPU_NODE)
    assert doc["present"] is True and doc["version"] == 2
    assert doc["import_merge"] == runtime.MERGE_REPLACE
    assert doc["files"] == [
        {"path": "/etc/containerd/config.toml", "error": None},
        {"path": "/etc/containerd/conf.d/99-nvidia.toml", "error": None},
    ]
    assert doc["runtimes"] == {
        "nvidia": {
            "runtime_type": "io.containerd.runc.v2",
            "binary": "/usr/bin/nvidia-container-runtime",
        },
    }
    assert doc["default_runtime_name"] == "nvidia"
    assert doc["nvidia_runtime"] is True and doc["default_is_nvidia"] is True


def _write(tmp_path, files: dict) -> Root:
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return Root(str(tmp_path))


def test_containerd_v3_drop_in_merges_key_by_key(tmp_path, toml_parser):
    """containerd 2.x (config version 3) merges plugin tables key by key (PR #9982)."""
    cri = '[plugins."io.containerd.cri.v1.runtime".containerd'
    root = _write(tmp_path, {
        "etc/containerd/config.toml": (
            'version = 3\nimports = ["conf.d/*.toml"]\n'
            f'{cri}]\ndefault_runtime_name = "runc"\n'
            f'{cri}.runtimes.runc]\nruntime_type = "io.containerd.runc.v2"\n'
        ),
        "etc/containerd/conf.d/99-nvidia.toml": (
            f'version = 3\n{cri}.runtimes.nvidia.options]\n'
            'BinaryName = "/usr/bin/nvidia-container-runtime"\n'
        ),
    })
    doc = runtime.collect_containerd(root)
    assert doc["import_merge"] == runtime.MERGE_DEEP
    assert set(doc["runtimes"]) == {"runc", "nvidia"}
    assert doc["default_runtime_name"] == "runc" and doc["nvidia_runtime"] is True


def test_containerd_import_order_and_rules(tmp_path, toml_parser):
    """Breadth-first, globs sorted, relative paths against the importing file, each file
    once, a later empty value does not override, lists append, a missing import is named."""
    cri_table = '[plugins."io.containerd.grpc.v1.cri"]'
    root = _write(tmp_path, {
        "etc/containerd/config.toml": (
            'version = 2\noom_score = -999\ndisabled_plugins = ["a"]\n'
            'imports = ["d/*.toml", "/etc/containerd/missing.toml", "config.toml"]\n'
            '[plugins."io.containerd.grpc.v1.cri"]\nsandbox_image = "main"\n'
        ),
        "etc/containerd/d/20-b.toml": (
            'oom_score = 0\ndisabled_plugins = ["b"]\nimports = ["../nested.toml"]\n'
            '[plugins."io.containerd.grpc.v1.cri"]\nsandbox_image = "b"\n'
        ),
        "etc/containerd/d/10-a.toml": f'{cri_table}\nsandbox_image = "a"\n',
        "etc/containerd/nested.toml": f'{cri_table}\nsandbox_image = "n"\n',
    })
    files: list = []

    def load(path):
        doc, record = (None, {"path": path, "error": "missing"})
        if root.exists(path):
            doc = toml_subset.loads(root.read(path))
            record = {"path": path, "error": None}
        files.append(path)
        return doc, record

    merged, records, mode = runtime.containerd_load("/etc/containerd/config.toml", load, root.glob)
    assert files == [
        "/etc/containerd/config.toml",
        "/etc/containerd/d/10-a.toml",
        "/etc/containerd/d/20-b.toml",
        "/etc/containerd/missing.toml",
        "/etc/containerd/nested.toml",
    ]
    assert records[3] == {"path": "/etc/containerd/missing.toml", "error": "missing"}
    assert mode == runtime.MERGE_REPLACE
    assert merged["plugins"]["io.containerd.grpc.v1.cri"] == {"sandbox_image": "n"}
    assert merged["oom_score"] == -999 and merged["disabled_plugins"] == ["a", "b"]


def test_containerd_v3_and_a_malformed_drop_in(toml_parser):
    doc = runtime.collect_containerd(MALFORMED)
    assert doc["version"] == 3
    assert doc["nvidia_runtime"] is True
    broken = doc["files"][1]
    assert broken["path"] == "/etc/containerd/conf.d/50-broken.toml"
    assert broken["error"]


def test_containerd_without_nvidia_runtime(tmp_path, toml_parser):
    config = tmp_path / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    main = (ROOTS / "gpu-node/etc/containerd/config.toml").read_text()
    config.write_text(main.replace('imports = ["/etc/containerd/conf.d/*.toml"]', ""))
    doc = runtime.collect_containerd(Root(str(tmp_path)))
    assert list(doc["runtimes"]) == ["runc"]
    assert doc["nvidia_runtime"] is False and doc["default_runtime_name"] == "runc"


def test_runtime_named_nvidia_must_run_nvidia_container_runtime(tmp_path, toml_parser):
    config = tmp_path / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
        'BinaryName = "/usr/bin/runc"\n'
    )
    assert runtime.collect_containerd(Root(str(tmp_path)))["nvidia_runtime"] is False


def test_docker_daemon_json():
    doc = runtime.collect_docker(GPU_NODE)
    assert doc["runtimes"] == {"nvidia": {"binary": "nvidia-container-runtime"}}
    assert doc["nvidia_runtime"] is True and doc["default_is_nvidia"] is True


def test_crio_drop_in(toml_parser):
    doc = runtime.collect_crio(GPU_NODE)
    assert doc["files"] == [{"path": "/etc/crio/crio.conf.d/99-nvidia.toml", "error": None}]
    assert doc["runtimes"]["nvidia"]["binary"] == "/usr/bin/nvidia-container-runtime"
    assert doc["nvidia_runtime"] is True and doc["default_is_nvidia"] is False


def test_malformed_files_are_data(toml_parser):
    docker = runtime.collect_docker(MALFORMED)
    assert docker["present"] is True and docker["error"].startswith("/etc/docker/daemon.json:")
    assert docker["nvidia_runtime"] is False
    crio = runtime.collect_crio(MALFORMED)
    assert crio["files"][0]["error"] and crio["nvidia_runtime"] is False
    assert runtime.collect_cdi(MALFORMED)[0]["error"].startswith("invalid JSON")


def test_binaries_and_cdi_specs():
    doc = runtime.collect(GPU_NODE)
    assert doc["binaries"] == {
        "nvidia-container-runtime": "/usr/bin/nvidia-container-runtime",
        "nvidia-ctk": "/usr/bin/nvidia-ctk",
        "nvidia-container-cli": None,  # present but not executable
        "nvidia-container-runtime-hook": None,
    }
    assert doc["cdi_specs"] == [
        {"path": "/etc/cdi/nvidia.yaml", "kind": "nvidia.com/gpu", "error": None,
         "devices": ["0"], "driver_versions": []},
        {"path": "/var/run/cdi/fpga.json", "kind": "example.com/fpga", "error": None,
         "devices": [], "driver_versions": []},
    ]
    assert doc["sockets"] == {"containerd": True, "docker": False, "crio": False}


def test_nothing_configured():
    doc = runtime.collect(Root(str(ROOTS / "cpu-only")))
    for name in ("containerd", "docker", "crio"):
        assert doc[name]["present"] is False and doc[name]["nvidia_runtime"] is False
    assert doc["cdi_specs"] == []


def test_toml_subset_reads_what_runtime_configs_use():
    text = (
        "version = 2  # comment\n"
        'imports = [\n  "/a/*.toml", # first\n  "b.toml",\n]\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd]\n'
        "  snapshotter = 'overlayfs'\n  max = 1_000\n  ratio = 0.5\n  flag = false\n"
        '  path = "C:\\\\x#y"\n'
    )
    doc = toml_subset._parse_subset(text)
    assert doc == {
        "version": 2,
        "imports": ["/a/*.toml", "b.toml"],
        "plugins": {
            "io.containerd.grpc.v1.cri": {
                "containerd": {
                    "snapshotter": "overlayfs",
                    "max": 1000,
                    "ratio": 0.5,
                    "flag": False,
                    "path": "C:\\x#y",
                }
            }
        },
    }
    import tomllib

    assert tomllib.loads(text) == doc


@pytest.mark.parametrize("text", ["[a\nb = 1", "a = \n", "a = {x = 1}", "[[a]]\n", "a = [1,"])
def test_toml_subset_rejects_what_it_cannot_read(text):
    with pytest.raises(toml_subset.TomlError):
        toml_subset._parse_subset(text)
