"""gpuprov/node/mig_apply.py, shipped as the payload's mig-apply entry (as the gpu_mig role runs it:
`python3 -I - PLAN [--apply]`, the script on stdin), against the lab's simulated NVML with MIG
(gpuprov/lab/nvml/simnvml.c), on a temporary gpu-hopper node state. The plans come from
gpuprov.nvidia.mig (default layouts), as the role's filter makes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov import payload
from gpuprov.lab import profiles, simhw
from gpuprov.nvidia import mig

OPS = Path(__file__).with_name("simnvml_mig_ops.py")
NVIDIA_SMI = Path(__file__).parents[2] / "gpuprov" / "lab" / "image" / "nvidia-smi"
H100 = 0x2330


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    return simhw.build_nvml_library(tmp_path_factory.mktemp("nvml"))


@pytest.fixture
def node(tmp_path) -> Path:
    node_dir = tmp_path / "gpu-hopper"
    simhw.write_node_state(node_dir, node_dir.name, profiles.NODE_PROFILES["gpu-hopper"])
    return node_dir


def _env(library: Path, node: Path) -> dict:
    env = {**os.environ, "LD_LIBRARY_PATH": str(library.parent),
           "GPUPROV_SIM_DIR": str(node / "sim"), "GPUPROV_SIM_STATE_DIR": str(node)}
    env.pop("GPUPROV_SIM_CONTAINER_GPUS", None)
    return env


def plan(name: str, gpus=(0, 1), configs=None) -> dict:
    layouts = mig.plan(configs or mig.default_configs(), name, [(i, H100) for i in gpus])
    return mig.node_plan(layouts)


def apply(library, node, the_plan, *flags, reset=None) -> tuple[int, dict]:
    if reset is not None:
        the_plan = {**the_plan, "reset_command": reset}
    proc = subprocess.run([sys.executable, "-I", "-", json.dumps(the_plan), *flags],
                          input=payload.node_script("mig-apply"), env=_env(library, node),
                          capture_output=True, check=False, timeout=120)
    assert proc.stderr == b"", proc.stderr.decode()
    return proc.returncode, json.loads(proc.stdout)


def devices(library, node, gpu) -> list[str]:
    proc = subprocess.run([sys.executable, str(OPS), json.dumps({"gpu": gpu, "ops": [
        ["devices"]]})], env=_env(library, node), capture_output=True, text=True, check=True,
        timeout=60)
    return sorted(d["name"].rpartition(" MIG ")[2] for d in json.loads(proc.stdout)[0])


def test_without_apply_it_reads_and_changes_nothing(library, node):
    rc, report = apply(library, node, plan("all-1g.10gb"))
    assert rc == 0 and report["changed"] is False and report["error"] is None
    assert [g["has_layout"] for g in report["gpus"]] == [False, False]
    assert report["gpus"][0]["before"] == {"current": False, "pending": False, "devices": {}}
    assert devices(library, node, 0) == []


def test_apply_partitions_then_repartitions_then_disables(library, node):
    rc, report = apply(library, node, plan("all-1g.10gb"), "--apply")
    assert (rc, report["error"], report["changed"]) == (0, None, True)
    assert report["gpus"][0]["after"] == {"current": True, "pending": True,
                                          "devices": {"1g.10gb": 7}}
    assert report["gpus"][0]["steps"] == ["MIG mode on", "created 7 MIG device(s)"]
    assert devices(library, node, 1) == ["1g.10gb"] * 7
    assert devices(library, node, 2) == []  # not in the plan: left alone

    # The same layout again: nothing to do.
    rc, report = apply(library, node, plan("all-1g.10gb"), "--apply")
    assert (rc, report["changed"]) == (0, False)
    assert all(g["has_layout"] for g in report["gpus"])

    # all-balanced places 3g, 2g and two 1g: the 3g needs its start slice free, which the
    # driver's default placement (the highest free one) would not leave after the small ones.
    rc, report = apply(library, node, plan("all-balanced"), "--apply")
    assert (rc, report["error"]) == (0, None)
    assert report["gpus"][0]["steps"][0] == "destroyed 7 GPU instance(s)"
    assert devices(library, node, 0) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]

    rc, report = apply(library, node, plan("all-disabled"), "--apply")
    assert (rc, report["error"]) == (0, None)
    assert report["gpus"][1]["after"] == {"current": False, "pending": False, "devices": {}}
    assert devices(library, node, 0) == []


def _busy(node: Path, gpu: int) -> None:
    """GPU `gpu` has a process (nvml.conf's processes, pid:used-bytes), as a CUDA program."""
    conf = node / "sim" / simhw.NVML_CONF
    sections = conf.read_text().split("\n[gpu]\n")
    sections[gpu + 1] = sections[gpu + 1].rstrip("\n") + "\nprocesses = 4242:1048576\n"
    conf.write_text("\n[gpu]\n".join(sections))


def test_a_pending_mode_change_is_reset_and_a_refused_reset_says_what_to_do(library, node):
    _busy(node, 0)
    smi = [sys.executable, str(NVIDIA_SMI), "-r", "-i", "{index}"]
    rc, report = apply(library, node, plan("all-1g.10gb", gpus=(0,)), "--apply", reset=smi)
    assert rc == 1
    assert report["error"].startswith("GPU 0: the MIG mode change needs a GPU reset, and ")
    assert "In use by another client" in report["error"]
    assert "reboot the node" in report["error"]
    assert devices(library, node, 0) == []

    # The process goes; the reset then makes the pending mode current and the layout follows.
    conf = node / "sim" / simhw.NVML_CONF
    conf.write_text(conf.read_text().replace("processes = 4242:1048576\n", ""))
    rc, report = apply(library, node, plan("all-1g.10gb", gpus=(0,)), "--apply", reset=smi)
    assert (rc, report["error"]) == (0, None), report
    assert devices(library, node, 0) == ["1g.10gb"] * 7


def test_a_reset_that_does_not_take_asks_for_a_reboot(library, node):
    _busy(node, 0)
    rc, report = apply(library, node, plan("all-1g.10gb", gpus=(0,)), "--apply",
                       reset=["true"])
    assert rc == 1
    assert report["error"] == ("GPU 0: MIG mode is still off after the GPU reset: reboot the "
                               "node, then rerun")


def test_a_bad_plan_is_exit_2_with_one_line(library, node):
    proc = subprocess.run([sys.executable, "-I", "-", "{not json"],
                          input=payload.node_script("mig-apply"), env=_env(library, node),
                          capture_output=True, check=False, timeout=60)
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"].startswith("PLAN must be JSON")
