"""MIG between the lab's simulated NVML (gpuprov/lab/nvml/simnvml.c) and the emulated
cluster: what the lab backend reads of a node's MIG devices for the device plugin, that the
plugin serves what gpuprov's probe and verify expect of the same node, and what a container
given MIG devices (GPUPROV_SIM_CONTAINER_GPUS, set by NVIDIA's rules) sees through NVML."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov.lab import profiles, simhw
from gpuprov.lab.kube import deviceplugin as dp
from gpuprov.lab.kube.backend import LabBackend
from gpuprov.lab.toolkit import toolkit_rules as rules
from gpuprov.nvidia import mig

OPS = Path(__file__).with_name("simnvml_mig_ops.py")
H100 = mig.model_of(0x2330)
NODE = "gpu-hopper"
# GPU index -> the GPU instances created on it (largest first, as the MIG stage does).
LAYOUT = {0: ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"], 1: ["1g.10gb+me", "1g.10gb"]}

# What a process sees through NVML: GPU UUIDs, and each GPU's MIG devices (UUIDs) by index.
SEES = r"""
import json, pynvml as N
N.nvmlInit()
out = []
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    migs = []
    for j in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            migs.append(N.nvmlDeviceGetUUID(N.nvmlDeviceGetMigDeviceHandleByIndex(h, j)))
        except N.NVMLError_NotFound:
            pass
    out.append([N.nvmlDeviceGetUUID(h), migs])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """A lab directory as LabBackend reads it: lab.json, the library, one node's state with
    the MIG layout created through NVML."""
    lab_dir = tmp_path_factory.mktemp("lab")
    simhw.build_nvml_library(lab_dir / "nvml")
    (lab_dir / "lab.json").write_text(json.dumps(
        {"nodes": [{"name": NODE, "container": f"lab-{NODE}"}]}))
    node_dir = lab_dir / "nodes" / NODE
    simhw.write_node_state(node_dir, NODE, profiles.NODE_PROFILES[NODE])
    (node_dir / simhw.MIG_STATE_DIR).mkdir(exist_ok=True)
    for gpu, names in LAYOUT.items():
        results = _run(lab_dir, [sys.executable, str(OPS), json.dumps(
            {"gpu": gpu, "ops": [["set_mode", 1]] + [
                ["create", H100.profile(n).nvml_index] for n in names]})])
        assert not [r for r in results if isinstance(r, dict)], results
    return lab_dir


def _env(lab_dir: Path, container_gpus: str | None = None) -> dict[str, str]:
    node_dir = lab_dir / "nodes" / NODE
    env = {**os.environ, "LD_LIBRARY_PATH": str(lab_dir / "nvml"),
           "GPUPROV_SIM_DIR": str(node_dir / "sim"),
           "GPUPROV_SIM_STATE_DIR": str(node_dir / simhw.MIG_STATE_DIR)}
    env.pop("GPUPROV_SIM_CONTAINER_GPUS", None)
    if container_gpus is not None:
        env["GPUPROV_SIM_CONTAINER_GPUS"] = container_gpus
    return env


def _run(lab_dir: Path, argv: list[str], container_gpus: str | None = None):
    proc = subprocess.run(argv, env=_env(lab_dir, container_gpus), capture_output=True,
                          text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def sees(lab_dir: Path, container_gpus: str | None) -> list:
    return _run(lab_dir, [sys.executable, "-c", SEES], container_gpus)


def _probe_report(lab: Path) -> dict:
    """gpuprov's probe on the lab node's simulated NVML (the system python, as on a node)."""
    from gpuprov import payload

    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if system_python is None:
        pytest.skip("needs the system's python3")
    node_dir = lab / "nodes" / NODE
    root = lab / "root"
    (root / "sys/bus/pci").mkdir(parents=True, exist_ok=True)
    if not (root / "sys/bus/pci/devices").exists():
        (root / "sys/bus/pci/devices").symlink_to(node_dir / simhw.PCI_DIR)
    env = {"PATH": "/usr/bin:/bin", **{k: v for k, v in _env(lab).items()
                                       if k.startswith(("LD_", "GPUPROV_"))}}
    proc = subprocess.run([system_python, "-I", "-", "--root", str(root)],
                          input=payload.probe_script(), env=env, capture_output=True,
                          check=True, timeout=60)
    return json.loads(proc.stdout)


def test_the_backend_reads_mig_mode_devices_and_profiles(lab):
    gpus = LabBackend(lab).gpus(NODE)
    host = sees(lab, None)
    assert [g.uuid for g in gpus] == [uuid for uuid, _ in host]
    for i, gpu in enumerate(gpus):
        assert gpu.mig_enabled is (i in LAYOUT)
        assert [d.uuid for d in gpu.mig_devices] == host[i][1]
        assert sorted(d.profile for d in gpu.mig_devices) == sorted(LAYOUT.get(i, []))


def test_the_plugin_serves_what_verify_expects_of_the_probes_report(lab):
    from gpuprov.verify.checks import k8s

    report = _probe_report(lab)
    gpus = LabBackend(lab).gpus(NODE)
    for strategy in ("none", "mixed"):
        served = {r: len(d) for r, d in dp.advertised(strategy, gpus).items()}
        expected = {r: n for r, n in k8s.expected_resources(report, strategy).items() if n}
        assert served == expected, strategy
    # MIG on some GPUs only: NVIDIA's single strategy does not start.
    with pytest.raises(dp.AllocateError, match="same migEnabled value|more than one MIG"):
        dp.advertised("single", gpus)


@pytest.mark.parametrize("id_strategy", ["uuid", "index"])
def test_a_container_given_mig_devices_sees_their_parents_with_only_those(lab, id_strategy):
    gpus = LabBackend(lab).gpus(NODE)
    served = dp.advertised("mixed", gpus)
    wanted = served["nvidia.com/mig-1g.10gb"]  # on both MIG GPUs
    indices = {d.id: d.index for ds in served.values() for d in ds}
    answer = dp.allocate(dp.Settings(("envvar",), id_strategy), [d.id for d in wanted],
                         [g.uuid for g in gpus], indices)
    given = rules.container_gpus(
        rules.Container(dict(answer.envs)), {}, [g.uuid for g in gpus], True,
        {g.uuid: [(d.index, d.uuid) for d in g.mig_devices] for g in gpus if g.mig_enabled})
    seen = sees(lab, ",".join(given))
    parents = sorted({d.gpu for d in wanted})
    assert [uuid for uuid, _ in seen] == [gpus[i].uuid for i in parents]
    assert [m for _, migs in seen for m in migs] == [d.id for d in wanted]


def test_a_gpu_named_itself_keeps_all_its_mig_devices(lab):
    gpus = LabBackend(lab).gpus(NODE)
    one = gpus[1].mig_devices[0].uuid
    seen = sees(lab, f"{one},{gpus[0].uuid}")
    assert seen == [[gpus[0].uuid, [d.uuid for d in gpus[0].mig_devices]],
                    [gpus[1].uuid, [one]]]
    assert sees(lab, "MIG-00000000-0000-0000-0000-000000000000") == []


TOOLKIT = Path(__file__).resolve().parents[2] / "gpuprov" / "lab" / "toolkit"


def test_the_lab_runtime_gives_a_container_the_mig_devices_it_names(lab, tmp_path):
    """The lab's nvidia-container-runtime (legacy mode, in the node) on `create`: NVIDIA's
    rules with the node's MIG devices from NVML, then runc (a stand-in that does nothing)."""
    gpus = LabBackend(lab).gpus(NODE)
    wanted = [gpus[0].mig_devices[-1], gpus[1].mig_devices[0]]
    names = [wanted[0].uuid, f"1:{wanted[1].index}"]  # by UUID and by "<gpu>:<mig>"
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"process": {
        "env": [f"NVIDIA_VISIBLE_DEVICES={','.join(names)}"],
        "capabilities": {"bounding": []}}}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "runc").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "runc").chmod(0o755)
    env = {**_env(lab), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "XDG_CONFIG_HOME": str(tmp_path)}  # no config.toml: NVIDIA's defaults
    proc = subprocess.run([sys.executable, str(TOOLKIT / "nvidia-container-runtime"),
                           "create", "--bundle", str(bundle), "c1"], env=env,
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    spec = json.loads((bundle / "config.json").read_text())
    given = next(e.split("=", 1)[1] for e in spec["process"]["env"]
                 if e.startswith("GPUPROV_SIM_CONTAINER_GPUS="))
    assert given.split(",") == [d.uuid for d in wanted]
    assert [m for _, migs in sees(lab, given) for m in migs] == [d.uuid for d in wanted]


def test_the_dra_plugin_publishes_the_mig_devices_as_nvidia_names_them(lab):
    """NVIDIA's DRA plugin (v0.4.1) on a node with MIG on some GPUs: the others as gpu-<minor>,
    each MIG GPU as its MIG devices only, named
    gpu-<minor>-mig-<profile without dots, RFC 1123>-<GI profile ID>-<placement start>
    (mig.go ToCanonicalName). The profile IDs are nvidia-smi mig -lgip's (gpuprov.nvidia.mig's
    table), the placements those H100 allows; verify's dra.devices-vs-nvml, reading gpuprov's
    probe of the same node, finds every device as NVML has it."""
    import re

    from gpuprov.lab.kube import draplugin
    from gpuprov.verify.checks import dra
    from gpuprov.verify.facts import ClusterFacts
    from gpuprov.verify.inventory import Node

    gpus = LabBackend(lab).gpus(NODE)
    published = draplugin.node_slice(NODE, gpus)
    devices = {d["name"]: d for d in published["spec"]["devices"]}
    report = _probe_report(lab)
    by_index = {g["index"]: g for g in report["nvml"]["gpus"]}
    whole = {f"gpu-{g['minor_number']}" for i, g in by_index.items() if i not in LAYOUT}
    assert whole <= set(devices)
    for index, profiles_made in LAYOUT.items():
        minor = by_index[index]["minor_number"]
        assert f"gpu-{minor}" not in devices  # a MIG GPU is not a full GPU
        mine = {n: d for n, d in devices.items() if n.startswith(f"gpu-{minor}-mig-")}
        seen = []
        for name, device in mine.items():
            found = re.fullmatch(r"gpu-(\d+)-mig-(.+)-(\d+)-(\d+)", name)
            profile = H100.profile(device["attributes"]["profile"]["string"])
            assert found and profile is not None, name
            assert found[2] == profile.name.replace(".", "").replace("+", "-")
            assert int(found[3]) == profile.nvml_id
            assert int(found[4]) in profile.starts
            slices = {k for k in device["capacity"] if k.startswith("memorySlice")}
            assert slices == {f"memorySlice{int(found[4]) + i}" for i in range(profile.size)}
            seen.append(profile.name)
        assert sorted(seen) == sorted(profiles_made)
    assert len(devices) == len(whole) + sum(map(len, LAYOUT.values()))
    k8s_node = {"metadata": {"name": NODE, "labels": {}},
                "status": {"allocatable": {"cpu": "8"}}}
    node = Node(name=NODE, target=None, gpu_expected=True, gpu_allocation="dra")
    facts = ClusterFacts(node, report, k8s_node, (), (published,))
    verdict = dra.devices_vs_nvml(facts)
    assert verdict.status == "pass", verdict


def test_a_mig_device_smaller_than_its_gpu_instance_stops_the_plugin():
    """getGpuInfo keeps only the profiles whose compute instance is the whole GPU instance,
    so a MIG device with a smaller one has no profile: the plugin does not start."""
    from gpuprov.lab.kube import backend, draplugin

    facts = backend.GpuFacts(0, "NVIDIA H100 80GB HBM3", 14, 9, "9.0", 85520809984,
                             "00000000:18:00.0", "580.95.05", 13000)
    small = backend.MigDevice("MIG-1", "1c.2g.20gb", 0, (0, 2),
                              backend.MigProfileInfo(14, 32, 2, 2, 0, 2, 0, 19968))
    gpu = backend.Gpu("GPU-1", True, True, (small,), facts)
    with pytest.raises(draplugin.PluginError, match="error getting profile info for MIG "
                       "device: MIG-1"):
        draplugin.node_slice(NODE, [gpu])
