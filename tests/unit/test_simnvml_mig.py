"""The lab's simulated NVML with MIG (gpuprov/lab/nvml/simnvml.c), through pynvml, against
gpuprov/nvidia/mig.py's profile tables (NVIDIA's MIG user guide): profiles and placements per model,
MIG mode (pending while the GPU is in use), GPU and compute instances, MIG devices and their
UUIDs, state shared between processes, and NOT_SUPPORTED on GPUs without MIG."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov.lab import profiles, simhw
from gpuprov.nvidia import mig

OPS = Path(__file__).with_name("simnvml_mig_ops.py")
H100 = mig.model_of(0x2330)
NOT_SUPPORTED, RESET_REQUIRED, IN_USE, INSUFFICIENT_RESOURCES = 3, 16, 19, 23


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    return simhw.build_nvml_library(tmp_path_factory.mktemp("nvml"))


@pytest.fixture
def node(tmp_path) -> Path:
    node_dir = tmp_path / "gpu-hopper"
    simhw.write_node_state(node_dir, node_dir.name, profiles.NODE_PROFILES["gpu-hopper"])
    return node_dir


def ops(library: Path, node: Path, gpu: int, *operations) -> list:
    env = {**os.environ, "LD_LIBRARY_PATH": str(library.parent),
           "GPUPROV_SIM_DIR": str(node / "sim"), "GPUPROV_SIM_STATE_DIR": str(node)}
    env.pop("GPUPROV_SIM_CONTAINER_GPUS", None)
    proc = subprocess.run([sys.executable, str(OPS), json.dumps(
        {"gpu": gpu, "ops": [list(op) for op in operations]})], env=env, capture_output=True,
        text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_profiles_and_placements_are_the_models(library, node):
    (found,) = ops(library, node, 0, ("profiles",))
    assert set(found) == {p.name for p in H100.profiles}
    for p in H100.profiles:
        assert found[p.name] | {"memory_mb": None} == {
            "index": p.nvml_index, "id": p.nvml_id, "slices": p.compute, "count": p.count,
            "sms": H100.profile_multiprocessors(p), "memory_mb": None,
            "placements": list(p.starts)}, p.name
    # Instance memory grows with the memory slices the profile takes.
    per_slice = found["1g.10gb"]["memory_mb"]
    assert all(found[p.name]["memory_mb"] == per_slice * p.size for p in H100.profiles)


def test_a_gpu_without_mig_answers_not_supported(library, tmp_path):
    node_dir = tmp_path / "gpu-pascal"
    simhw.write_node_state(node_dir, node_dir.name, profiles.NODE_PROFILES["gpu-pascal"])
    assert ops(library, node_dir, 0, ("mode",), ("set_mode", 1), ("profiles",),
               ("max_devices",)) == [{"error": NOT_SUPPORTED}, {"error": NOT_SUPPORTED},
                                     {}, 0]


def test_seven_1g_instances_become_seven_mig_devices(library, node):
    one_g = H100.profile("1g.10gb")
    results = ops(library, node, 0, ("create", one_g.nvml_index), ("set_mode", 1), ("mode",),
                  *[("create", one_g.nvml_index)] * 8, ("capacity", one_g.nvml_index),
                  ("devices",))
    assert results[:3] == [{"error": NOT_SUPPORTED}, 0, [1, 1]]  # MIG off: nothing to create
    assert results[3:10] == [1, 2, 3, 4, 5, 6, 7]
    assert results[10] == {"error": INSUFFICIENT_RESOURCES}  # the eighth
    assert results[11] == 0
    devices = results[12]
    gpu_uuid = profiles.expected_gpus("gpu-hopper", profiles.NODE_PROFILES["gpu-hopper"])[0].uuid
    assert len(devices) == 7 and len({d["uuid"] for d in devices}) == 7
    for gi, device in enumerate(devices, start=1):
        assert re.fullmatch(r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                            device["uuid"]), device
        assert device["name"] == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
        assert (device["gi"], device["ci"], device["parent"], device["is_mig"]) == \
            (gi, 0, gpu_uuid, True)
        assert device["attrs"] | {"memory_mb": 0} == {"gi_slices": 1, "ci_slices": 1, "sms": 16,
                                                      "memory_mb": 0}
        assert device["memory"] == device["attrs"]["memory_mb"] << 20
    # Another process (verify, nvidia-smi) sees the same devices: the driver keeps them.
    assert ops(library, node, 0, ("devices",)) == [devices]
    # The other GPUs are untouched.
    assert ops(library, node, 1, ("mode",), ("devices",)) == [[0, 0], []]


@pytest.mark.parametrize("layout", sorted(n for n, entries in mig.default_configs().items()
                                          if n.startswith("all-") and any(
                                              0x2330 in [int(f[:6], 16) for f in
                                                         e.get("device-filter", [])]
                                              for e in entries)))
def test_every_default_layout_of_the_h100_is_created_largest_first(library, node, layout):
    """mig.fits() says each of mig-parted's layouts fits; the simulated driver agrees when
    the instances are created as the MIG stage creates them (largest first, any place)."""
    entry = next(e for e in mig.default_configs()[layout]
                 if "0x233010DE" in e.get("device-filter", []))
    wanted = entry["mig-devices"]
    assert mig.fits(H100, wanted) is None
    order = sorted(wanted.items(), key=lambda item: -H100.profile(item[0]).size)
    creates = [("create", H100.profile(name).nvml_index)
               for name, count in order for _ in range(count)]
    results = ops(library, node, 0, ("set_mode", 1), *creates, ("devices",))
    assert not [r for r in results[1:-1] if isinstance(r, dict)], results
    names = sorted(d["name"].rsplit(" ", 1)[1] for d in results[-1])
    assert names == sorted(n for n, c in wanted.items() for _ in range(c))


def test_instances_go_before_the_mode_and_compute_before_gpu_instances(library, node):
    one_g = H100.profile("1g.10gb").nvml_index
    results = ops(library, node, 0, ("set_mode", 1), ("create", one_g), ("set_mode", 0),
                  ("destroy_gi", 1), ("destroy_all",), ("set_mode", 0), ("mode",),
                  ("max_devices",), ("devices",))
    assert results == [0, 1, {"error": IN_USE}, {"error": IN_USE}, 0, 0, [0, 0], 0, []]


def test_another_process_finds_counts_and_destroys_the_instances(library, node):
    """The MIG stage, verify and nvidia-smi are separate processes: one that did not create
    the instances lists them by profile, knows what is left, and can take them down (the lab
    once found none: instances read at nvmlInit pointed at the parse buffer's profiles)."""
    one_g = H100.profile("1g.10gb")
    assert ops(library, node, 4, ("set_mode", 1), *[("create", one_g.nvml_index)] * 3) == \
        [0, 1, 2, 3]
    assert ops(library, node, 4, ("capacity", one_g.nvml_index),
               ("capacity", H100.profile("7g.80gb").nvml_index), ("destroy_gi", 2),
               ("set_mode", 0)) == [4, 0, {"error": IN_USE}, {"error": IN_USE}]
    assert ops(library, node, 4, ("destroy_all",), ("set_mode", 0), ("mode",)) == [0, 0, [0, 0]]


def test_a_gpu_in_use_keeps_the_mode_change_pending(library, node):
    conf = node / "sim" / "nvml.conf"
    sections = conf.read_text().split("[gpu]")
    sections[1] = sections[1].rstrip("\n") + "\nprocesses = 4242:1048576\n\n"
    conf.write_text("[gpu]".join(sections))
    assert ops(library, node, 0, ("set_mode", 1), ("mode",), ("create", 0)) == [
        RESET_REQUIRED, [0, 1], {"error": NOT_SUPPORTED}]
    assert ops(library, node, 1, ("set_mode", 1), ("mode",)) == [0, [1, 1]]  # GPU 1 is idle


def test_nvidia_smi_lists_mig_devices_under_their_gpu(library, node):
    """The lab's nvidia-smi -L, as NVIDIA's prints MIG devices (MIG user guide, "Device
    Enumeration")."""
    smi = Path(__file__).resolve().parents[2] / "gpuprov" / "lab" / "image" / "nvidia-smi"
    balanced = [H100.profile(n).nvml_index for n in ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")]
    results = ops(library, node, 2, ("set_mode", 1), *[("create", i) for i in balanced],
                  ("devices",))
    devices = results[-1]
    env = {**os.environ, "LD_LIBRARY_PATH": str(library.parent),
           "GPUPROV_SIM_DIR": str(node / "sim"), "GPUPROV_SIM_STATE_DIR": str(node)}
    env.pop("GPUPROV_SIM_CONTAINER_GPUS", None)
    out = subprocess.run([sys.executable, str(smi), "-L"], env=env, capture_output=True,
                         text=True, timeout=30, check=True).stdout.splitlines()
    gpus = profiles.expected_gpus("gpu-hopper", profiles.NODE_PROFILES["gpu-hopper"])
    assert out[:3] == [f"GPU {g.index}: NVIDIA H100 80GB HBM3 (UUID: {g.uuid})" for g in gpus[:3]]
    assert out[3:7] == [
        f"  MIG {d['name'].rsplit(' ', 1)[1]:<11} Device {i:>2}: (UUID: {d['uuid']})"
        for i, d in enumerate(devices)]
    assert out[3] == f"  MIG 3g.40gb     Device  0: (UUID: {devices[0]['uuid']})"
    assert out[7].startswith("GPU 3: ") and len(out) == 8 + 4


def test_the_probe_reports_mig_mode_and_devices(library, node, tmp_path):
    """gpuprov's probe (the payload shipped to nodes, in a bare python3) on a partitioned GPU:
    what verify, the labels and `gpuprov status` read."""
    import shutil

    from gpuprov import payload

    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if system_python is None:
        pytest.skip("needs the system's python3")
    wanted = [H100.profile(n).nvml_index for n in ("3g.40gb", "1g.10gb")]
    *_, devices = ops(library, node, 1, ("set_mode", 1), *[("create", i) for i in wanted],
                      ("devices",))
    root = tmp_path / "root"
    (root / "sys/bus/pci").mkdir(parents=True)
    (root / "sys/bus/pci/devices").symlink_to(node / simhw.PCI_DIR)
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(library.parent),
           "GPUPROV_SIM_DIR": str(node / "sim"), "GPUPROV_SIM_STATE_DIR": str(node)}
    proc = subprocess.run([system_python, "-I", "-", "--root", str(root)],
                          input=payload.probe_script(), env=env, capture_output=True,
                          check=True, timeout=60)
    gpus = json.loads(proc.stdout)["nvml"]["gpus"]
    assert gpus[0]["mig"] == {"current": False, "pending": False, "devices": []}
    assert gpus[1]["mig"]["current"] is gpus[1]["mig"]["pending"] is True
    got = gpus[1]["mig"]["devices"]
    assert [(d["uuid"], d["profile"], d["gpu_instance_id"], d["compute_instance_id"])
            for d in got] == [(d["uuid"], d["name"].rsplit(" ", 1)[1], d["gi"], d["ci"])
                              for d in devices]
    assert [(d["multiprocessors"], d["gpu_instance_slices"]) for d in got] == [(60, 3), (16, 1)]
    assert not [k for gpu in gpus for k in gpu["errors"] if k.startswith("mig")]
