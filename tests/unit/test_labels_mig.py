"""GPU Feature Discovery's MIG labels (NVIDIA/k8s-device-plugin v0.20.0 internal/lm:
mig-strategy.go, resource.go; internal/resource/nvml-mig-device.go) from gpuprov's probe of a
partitioned node: the lab's simulated NVML with MIG, probed by the shipped probe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov import payload
from gpuprov.lab import profiles, simhw
from gpuprov.nvidia import labels, mig

OPS = Path(__file__).with_name("simnvml_mig_ops.py")
H100 = mig.model_of(0x2330)
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
pytestmark = pytest.mark.skipif(SYSTEM_PYTHON is None, reason="needs the system's python3")


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    return simhw.build_nvml_library(tmp_path_factory.mktemp("nvml"))


def _env(library: Path, node: Path) -> dict:
    env = {**os.environ, "LD_LIBRARY_PATH": str(library.parent),
           "GPUPROV_SIM_DIR": str(node / "sim"), "GPUPROV_SIM_STATE_DIR": str(node)}
    env.pop("GPUPROV_SIM_CONTAINER_GPUS", None)
    return env


def _partitioned(library: Path, tmp_path: Path, layouts: dict[int, dict[str, int]]) -> dict:
    """The probe report of an 8x H100 node whose GPUs have these layouts (created largest
    first, as the MIG stage does)."""
    node = tmp_path / "gpu-hopper"
    simhw.write_node_state(node, node.name, profiles.NODE_PROFILES["gpu-hopper"])
    for gpu, layout in layouts.items():
        order = sorted(layout.items(), key=lambda item: -H100.profile(item[0]).size)
        creates = [["create", H100.profile(n).nvml_index] for n, c in order for _ in range(c)]
        out = subprocess.run([sys.executable, str(OPS), json.dumps(
            {"gpu": gpu, "ops": [["set_mode", 1], *creates]})], env=_env(library, node),
            capture_output=True, text=True, check=True, timeout=60).stdout
        assert not [r for r in json.loads(out) if isinstance(r, dict)], out
    root = tmp_path / "root"
    (root / "sys/bus/pci").mkdir(parents=True)
    (root / "sys/bus/pci/devices").symlink_to(node / simhw.PCI_DIR)
    env = {k: v for k, v in _env(library, node).items()
           if k in ("LD_LIBRARY_PATH", "GPUPROV_SIM_DIR", "GPUPROV_SIM_STATE_DIR")}
    proc = subprocess.run([SYSTEM_PYTHON, "-I", "-", "--root", str(root)],
                          input=payload.probe_script(), env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, check=True, timeout=60)
    return json.loads(proc.stdout)


def _device(report: dict, gpu: int, profile: str) -> dict:
    return next(d for d in report["nvml"]["gpus"][gpu]["mig"]["devices"]
                if d["profile"] == profile)


def _resource(prefix: str, product: str, count: int, device: dict) -> dict[str, str]:
    engines = device["engines"]
    return {f"{prefix}.product": product, f"{prefix}.count": str(count),
            f"{prefix}.memory": str(device["memory_mb"]),
            f"{prefix}.multiprocessors": str(device["multiprocessors"]),
            f"{prefix}.slices.gi": str(device["gpu_instance_slices"]),
            f"{prefix}.slices.ci": str(device["compute_instance_slices"]),
            **{f"{prefix}.engines.{e}": str(engines[e])
               for e in ("copy", "decoder", "encoder", "jpeg", "ofa")}}


def test_mixed_labels_each_profile_as_its_own_resource(library, tmp_path):
    report = _partitioned(library, tmp_path, {0: {"1g.10gb": 7}, 1: dict(H100.balanced)})
    whole = labels.compute_labels(report)
    got = labels.compute_labels(report, mig_strategy="mixed")
    mig_keys = {k: v for k, v in got.items() if k not in whole}
    assert {k: got[k] for k in whole} == whole  # the whole GPUs' labels stay
    assert mig_keys == {
        "nvidia.com/mig.strategy": "mixed",
        **_resource("nvidia.com/mig-1g.10gb", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", 9,
                    _device(report, 0, "1g.10gb")),
        **_resource("nvidia.com/mig-2g.20gb", "NVIDIA-H100-80GB-HBM3-MIG-2g.20gb", 1,
                    _device(report, 1, "2g.20gb")),
        **_resource("nvidia.com/mig-3g.40gb", "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", 1,
                    _device(report, 1, "3g.40gb")),
    }
    assert got["nvidia.com/mig-1g.10gb.multiprocessors"] == "16"  # H100: 16 SMs per slice
    # none: no MIG label at all, partitioned or not.
    assert labels.compute_labels(report, mig_strategy="none") == whole


def test_single_labels_the_one_profile_as_nvidia_com_gpu(library, tmp_path):
    report = _partitioned(library, tmp_path, dict.fromkeys(range(8), {"1g.10gb": 7}))
    got = labels.compute_labels(report, mig_strategy="single")
    assert {k: v for k, v in got.items() if k.startswith("nvidia.com/gpu.") and k not in (
        labels.PRESENT, labels.FAMILY, labels.COMPUTE_MAJOR, labels.COMPUTE_MINOR)} == \
        _resource("nvidia.com/gpu", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", 56,
                  _device(report, 0, "1g.10gb"))
    assert got["nvidia.com/mig.strategy"] == "single" and got[labels.FAMILY] == "hopper"


@pytest.mark.parametrize("layouts", [
    {0: {"1g.10gb": 7}},  # GPUs with MIG on and off
    {g: ({"1g.10gb": 7} if g else {"3g.40gb": 2}) for g in range(8)},  # two profiles
    {g: ({"1g.10gb": 7} if g else {}) for g in range(8)},  # MIG on, no devices
], ids=["mig-on-and-off", "two-profiles", "enabled-but-empty"])
def test_single_on_a_node_it_cannot_serve_gets_gfds_invalid_labels(library, tmp_path,
                                                                    layouts):
    got = labels.compute_labels(_partitioned(library, tmp_path, layouts), mig_strategy="single")
    assert (got[labels.PRODUCT], got[labels.COUNT], got[labels.MEMORY]) == (
        "NVIDIA-H100-80GB-HBM3-MIG-INVALID", "0", "0")
    assert not [k for k in got if k.startswith("nvidia.com/mig-")]


def test_mig_labels_left_from_an_earlier_layout_are_removed():
    node = {"nvidia.com/mig-1g.10gb.count": "7", "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig-1g.10gb.replicas": "1"}
    patch = labels.label_patch(node, {"nvidia.com/mig.strategy": "mixed"})
    # Owned and stale: removed. mig.config is the MIG stage's; .replicas is GFD's alone.
    assert patch == {"nvidia.com/mig-1g.10gb.count": None}


def test_an_unknown_strategy_is_refused_with_the_setting_to_fix():
    with pytest.raises(ValueError, match="nvidia_device_plugin_mig_strategy"):
        labels.compute_labels({}, mig_strategy="mixd")
