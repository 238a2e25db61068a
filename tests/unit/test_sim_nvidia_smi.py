"""The lab's simulated nvidia-smi (gpuprov/lab/image/nvidia-smi) on the simulated NVML: what
the smoke pods of `gpuprov verify` read in the lab."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov.lab import profiles, simhw

SMI = Path(__file__).resolve().parents[2] / "gpuprov" / "lab" / "image" / "nvidia-smi"


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    return simhw.build_nvml_library(tmp_path_factory.mktemp("nvml"))


@pytest.fixture(scope="module")
def pascal(tmp_path_factory) -> Path:
    node = tmp_path_factory.mktemp("nodes") / "gpu-pascal"
    simhw.write_node_state(node, node.name, profiles.NODE_PROFILES["gpu-pascal"])
    return node


def smi(library: Path, node: Path, *args: str, visible: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "GPUPROV_SIM_CONTAINER_GPUS"}
    env.update(LD_LIBRARY_PATH=str(library.parent), GPUPROV_SIM_DIR=str(node / "sim"))
    if visible is not None:
        env["GPUPROV_SIM_CONTAINER_GPUS"] = visible
    return subprocess.run([sys.executable, str(SMI), *args], env=env, capture_output=True,
                          text=True, timeout=30)


def test_list_gpus_shows_every_gpu_with_its_uuid(library, pascal):
    want = profiles.expected_gpus(pascal.name, profiles.NODE_PROFILES["gpu-pascal"])
    proc = smi(library, pascal, "-L")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        f"GPU {g.index}: Tesla P100-PCIE-16GB (UUID: {g.uuid})" for g in want]


def test_visible_devices_limit_what_a_container_sees(library, pascal):
    want = profiles.expected_gpus(pascal.name, profiles.NODE_PROFILES["gpu-pascal"])
    proc = smi(library, pascal, "-L", visible=f"{want[2].uuid},{want[0].uuid}")
    # Re-indexed from 0 in PCI order, as in a container given those two GPUs.
    assert proc.stdout.splitlines() == [
        f"GPU 0: Tesla P100-PCIE-16GB (UUID: {want[0].uuid})",
        f"GPU 1: Tesla P100-PCIE-16GB (UUID: {want[2].uuid})"]
    none = smi(library, pascal, "-L", visible="void")
    assert (none.returncode, none.stdout.strip()) == (6, "No devices were found")


def test_query_gpu_csv(library, pascal):
    want = profiles.expected_gpus(pascal.name, profiles.NODE_PROFILES["gpu-pascal"])
    proc = smi(library, pascal, "--query-gpu=index,uuid,memory.total,persistence_mode",
               "--format=csv,noheader")
    assert proc.returncode == 0, proc.stdout
    mib = want[0].model.memory_total // (1024 * 1024)
    assert proc.stdout.splitlines()[1] == f"1, {want[1].uuid}, {mib} MiB, Disabled"
    header = smi(library, pascal, "--query-gpu=name,memory.used", "--format=csv,nounits")
    assert header.stdout.splitlines()[:2] == ["name, memory.used", "Tesla P100-PCIE-16GB, 0"]


def test_what_is_not_simulated_says_so(library, pascal):
    proc = smi(library, pascal, "-q")
    assert proc.returncode == 2 and "supports only" in proc.stdout
    bad = smi(library, pascal, "--query-gpu=clocks.sm", "--format=csv")
    assert bad.returncode == 2 and "clocks.sm" in bad.stdout


def test_no_driver_is_exit_9(library, tmp_path):
    proc = smi(library, tmp_path / "nowhere", "-L")
    assert proc.returncode == 9 and "couldn't communicate with the NVIDIA driver" in proc.stdout
