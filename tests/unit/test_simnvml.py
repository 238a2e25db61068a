"""The lab's simulated GPU hardware: the PCI tree and the NVML library, read through pynvml.

pynvml loads libnvidia-ml.so.1 once per process, so every NVML query runs
simnvml_snapshot.py in a fresh interpreter with LD_LIBRARY_PATH pointing at the library
built here and GPUPROV_SIM_DIR at the node's simulated state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov.errors import GpuprovError
from gpuprov.lab import faults, profiles, simhw
from gpuprov.node.probe import host as probe_host
from gpuprov.node.probe.fs import Root
from gpuprov.nvidia.hardware import NVML_ARCHITECTURES

SNAPSHOT = Path(__file__).with_name("simnvml_snapshot.py")
GPU_PROFILES = [name for name in profiles.DEFAULT_LAB if profiles.NODE_PROFILES[name].gpus]

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999
REASON_GPU_IDLE = 0x1
REASONS_THERMAL = 0x20 | 0x40  # SW and HW thermal slowdown


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    return simhw.build_nvml_library(tmp_path_factory.mktemp("nvml"))


def make_node(tmp_path: Path, profile_name: str, node_name: str | None = None) -> Path:
    node_dir = tmp_path / (node_name or profile_name)
    simhw.write_node_state(node_dir, node_dir.name, profiles.NODE_PROFILES[profile_name])
    return node_dir


def query(library: Path, node_dir: Path, uuids=(), **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "GPUPROV_SIM_CONTAINER_GPUS"}
    environ.update(LD_LIBRARY_PATH=str(library.parent), GPUPROV_SIM_DIR=str(node_dir / "sim"))
    environ.update(env)
    proc = subprocess.run(
        [sys.executable, str(SNAPSHOT), json.dumps(list(uuids))],
        env=environ, capture_output=True, text=True, check=False, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def expected(node_dir: Path, profile_name: str):
    return profiles.expected_gpus(node_dir.name, profiles.NODE_PROFILES[profile_name])


# -- the node's NVML view is its profile -----------------------------------------------------
@pytest.mark.parametrize("profile_name", GPU_PROFILES)
def test_nvml_reports_the_profile(library, tmp_path, profile_name):
    node = make_node(tmp_path, profile_name)
    profile = profiles.NODE_PROFILES[profile_name]
    want = expected(node, profile_name)
    doc = query(library, node, uuids=[g.uuid for g in want])

    assert doc["driver_version"] == profile.driver_version
    cuda = profiles.cuda_driver_version(profile.driver_version)
    assert doc["cuda_driver_version"] == cuda
    assert doc["nvml_version"] == f"{cuda // 1000}.{profile.driver_version}"
    assert doc["count"] == len(profile.gpus) == len(want)
    assert doc["by_uuid"] == {g.uuid: g.index for g in want}
    assert len({g["uuid"] for g in doc["gpus"]}) == len(want)
    assert len({g["bus_id"] for g in doc["gpus"]}) == len(want)
    for got, gpu in zip(doc["gpus"], want, strict=True):
        m = gpu.model
        major, minor = (int(x) for x in gpu.compute_capability.split("."))
        assert got["index"] == got["index_by_bus_id"] == gpu.index
        assert got["name"] == gpu.name
        assert got["uuid"] == gpu.uuid
        assert got["serial"] == gpu.serial
        assert got["bus_id"] == gpu.pci_bus_id
        assert got["bus_id_legacy"] == gpu.pci_bus_id[4:]
        assert got["pci_device_id"] == gpu.pci_device_id
        assert got["pci_subsystem_id"] == gpu.pci_subsystem_id
        assert got["memory"] == [gpu.memory_total, gpu.memory_total, 0]
        assert got["memory_v2"] == [gpu.memory_total, 0, gpu.memory_total, 0]
        assert got["compute_capability"] == [major, minor]
        assert NVML_ARCHITECTURES[got["architecture"]] == gpu.architecture
        assert got["brand"] == m.brand
        assert got["minor_number"] == gpu.minor_number
        assert got["temperature"] == got["temperature_v"] == m.idle_temp < m.temp_slowdown
        assert got["temp_shutdown"] == m.temp_shutdown
        assert got["temp_slowdown"] == m.temp_slowdown
        assert got["temp_gpu_max"] == (
            m.temp_gpu_max if m.temp_gpu_max is not None else {"error": NVML_ERROR_NOT_SUPPORTED}
        )
        assert got["power_limit"] == got["enforced_power_limit"] == m.power_limit_w * 1000
        assert got["power_usage"] == m.idle_power_w * 1000
        assert got["utilization"] == [0, 0]
        assert got["persistence_mode"] == 0  # no nvidia-persistenced runs here
        assert got["ecc_mode"] == [1, 1]
        for key in ("ecc_volatile_uncorrected", "ecc_aggregate_uncorrected",
                    "ecc_volatile_corrected", "ecc_dram_volatile_uncorrected"):
            assert got[key] == 0, key
        if m.row_remapping:
            assert got["remapped_rows"] == [0, 0, 0, 0]
            assert got["retired_pages_pending"] == {"error": NVML_ERROR_NOT_SUPPORTED}
        else:
            assert got["remapped_rows"] == {"error": NVML_ERROR_NOT_SUPPORTED}
            assert got["retired_pages_pending"] == 0
            assert got["retired_pages_dbe"] == got["retired_pages_sbe"] == []
        assert got["clocks_event_reasons"] == got["clocks_throttle_reasons"] == REASON_GPU_IDLE
        assert got["pcie"] == [m.pcie_max_gen, m.pcie_max_gen, m.pcie_max_width,
                               m.pcie_max_width]
        assert got["processes"] == 0


def test_identities_are_stable_per_node_and_distinct_across_nodes():
    pascal = profiles.NODE_PROFILES["gpu-pascal"]
    first = profiles.expected_gpus("node-a", pascal)
    assert first == profiles.expected_gpus("node-a", pascal)
    other = profiles.expected_gpus("node-b", pascal)
    assert not {g.uuid for g in first} & {g.uuid for g in other}
    assert not {g.serial for g in first} & {g.serial for g in other}
    for gpu in first:
        assert len(gpu.serial) == 13 and gpu.serial.isdigit()
        assert gpu.uuid.startswith("GPU-") and [len(p) for p in gpu.uuid[4:].split("-")] == [
            8, 4, 4, 4, 12]


def test_cpu_only_node_has_no_nvml(library, tmp_path):
    node = make_node(tmp_path, "cpu-only")
    assert not (node / "sim").exists()
    # The library is not mounted on such nodes; where it is loaded anyway, it says what
    # NVML says on a machine without an NVIDIA driver.
    assert query(library, node) == {"init_error": NVML_ERROR_DRIVER_NOT_LOADED}


# -- faults ----------------------------------------------------------------------------------
FAULTED_GPU = 1


def _lost(base: dict, gpu: dict, model) -> tuple[dict, dict]:
    return {"error": NVML_ERROR_GPU_IS_LOST}, {}


def _ecc(base: dict, gpu: dict, model) -> tuple[dict, dict]:
    keys = ("ecc_volatile_uncorrected", "ecc_aggregate_uncorrected",
            "ecc_dram_volatile_uncorrected")
    return {**gpu, **dict.fromkeys(keys, 1)}, {}


def _remap(base: dict, gpu: dict, model) -> tuple[dict, dict]:
    if model.row_remapping:
        return {**gpu, "remapped_rows": [0, 1, 1, 0]}, {}
    pages = gpu["retired_pages_dbe"]
    assert pages == []
    return {**gpu, "retired_pages_pending": 1, "retired_pages_dbe": ["ANY"],
            "retired_pages_dbe_v2": ["ANY"]}, {}


def _hot(base: dict, gpu: dict, model) -> tuple[dict, dict]:
    return {**gpu, "temperature": model.temp_slowdown + 3, "temperature_v":
            model.temp_slowdown + 3, "clocks_event_reasons": 0x8 | REASONS_THERMAL,
            "clocks_throttle_reasons": 0x8 | REASONS_THERMAL}, {}


# fault -> (what the whole snapshot becomes) for node-wide faults, or a function giving
# (the faulted GPU's entry, other top-level changes) for per-GPU ones.
EFFECTS = {
    "nvml-init-fail": {"init_error": NVML_ERROR_DRIVER_NOT_LOADED},
    "version-mismatch": {"init_error": NVML_ERROR_LIB_RM_VERSION_MISMATCH},
    "gpu-lost": _lost,
    "ecc-uncorrectable": _ecc,
    "row-remap-pending": _remap,
    "hot-gpu": _hot,
}


def test_every_registered_fault_is_tested():
    assert set(EFFECTS) == {n for n, f in faults.FAULTS.items() if f.layer == "nvml"}


def _normalise_pages(gpu: dict) -> dict:
    # Retired page addresses are opaque: only their number matters to anyone.
    out = dict(gpu)
    for key in ("retired_pages_dbe", "retired_pages_dbe_v2"):
        if isinstance(out.get(key), list):
            out[key] = ["ANY"] * len(out[key])
    return out


@pytest.mark.parametrize("profile_name", ["gpu-pascal", "gpu-hopper"])
@pytest.mark.parametrize("fault", list(EFFECTS))
def test_fault_changes_only_what_it_should(library, tmp_path, profile_name, fault):
    node = make_node(tmp_path, profile_name)
    uuids = [g.uuid for g in expected(node, profile_name)]
    baseline = query(library, node, uuids=uuids)
    spec = faults.FAULTS[fault]
    simhw.set_fault(node, fault, gpu_index=FAULTED_GPU if spec.per_gpu else None)
    faulted = query(library, node, uuids=uuids)

    effect = EFFECTS[fault]
    if not spec.per_gpu:
        assert faulted == effect
    else:
        model = profiles.NODE_PROFILES[profile_name].models[FAULTED_GPU]
        gpu, _ = effect(baseline, baseline["gpus"][FAULTED_GPU], model)
        want = json.loads(json.dumps(baseline))
        want["gpus"][FAULTED_GPU] = gpu
        if fault == "gpu-lost":
            want["by_uuid"][uuids[FAULTED_GPU]] = {"error": NVML_ERROR_GPU_IS_LOST}
        faulted["gpus"] = [_normalise_pages(g) for g in faulted["gpus"]]
        assert faulted == want
        assert faulted["count"] == baseline["count"]  # a lost GPU still counts

    simhw.clear_fault(node, fault)
    assert query(library, node, uuids=uuids) == baseline


def test_lost_gpu_stays_on_pci(tmp_path):
    node = make_node(tmp_path, "gpu-pascal")
    before = sorted(p.name for p in (node / "pci").iterdir())
    simhw.set_fault(node, "gpu-lost")
    assert sorted(p.name for p in (node / "pci").iterdir()) == before
    assert expected(node, "gpu-pascal")[0].sysfs_address in before


def test_fault_switches_are_idempotent_and_listed(tmp_path):
    node = make_node(tmp_path, "gpu-pascal")
    assert simhw.active_faults(node) == []
    simhw.set_fault(node, "hot-gpu")
    simhw.set_fault(node, "hot-gpu")
    simhw.set_fault(node, "hot-gpu", gpu_index=3)
    simhw.set_fault(node, "version-mismatch")
    assert simhw.active_faults(node) == ["hot-gpu:0", "hot-gpu:3", "version-mismatch"]
    simhw.clear_fault(node, "hot-gpu")
    simhw.clear_fault(node, "hot-gpu")
    simhw.clear_fault(node, "gpu-lost")  # not active: nothing to do
    assert simhw.active_faults(node) == ["version-mismatch"]
    # A fresh node state has no faults.
    simhw.write_node_state(node, node.name, profiles.NODE_PROFILES["gpu-pascal"])
    assert simhw.active_faults(node) == []


@pytest.mark.parametrize(
    ("profile_name", "fault", "gpu_index", "message"),
    [
        ("gpu-pascal", "melted", None, "unknown fault 'melted'"),
        ("cpu-only", "hot-gpu", None, "has no simulated GPUs"),
        ("cpu-only", "nvml-init-fail", None, "has no simulated GPUs"),
        ("gpu-pascal", "hot-gpu", 4, "no GPU 4"),
        ("gpu-pascal", "hot-gpu", -1, "no GPU -1"),
        ("gpu-pascal", "nvml-init-fail", 0, "whole node"),
    ],
)
def test_bad_fault_requests_are_refused(tmp_path, profile_name, fault, gpu_index, message):
    node = make_node(tmp_path, profile_name)
    with pytest.raises(GpuprovError, match=message):
        simhw.set_fault(node, fault, gpu_index=gpu_index)
    if profile_name != "cpu-only":
        assert simhw.active_faults(node) == []


def test_clearing_on_a_node_without_gpus_is_refused(tmp_path):
    node = make_node(tmp_path, "cpu-only")
    with pytest.raises(GpuprovError, match="has no simulated GPUs"):
        simhw.clear_fault(node, "hot-gpu")


# -- GPUPROV_SIM_CONTAINER_GPUS: the GPUs the lab's runtime gave a container ----------------
@pytest.mark.parametrize(
    ("visible", "physical"),
    [
        (None, [0, 1, 2, 3]),
        ("all", [0, 1, 2, 3]),
        ("none", []),
        ("void", []),
        ("", []),
        ("2,0", [0, 2]),
        ("uuid:3,uuid:1", [1, 3]),
        ("1, GPU-00000000-0000-0000-0000-000000000000", [1]),
    ],
)
def test_visible_devices(library, tmp_path, visible, physical):
    node = make_node(tmp_path, "gpu-pascal")
    want = expected(node, "gpu-pascal")
    env = {}
    if visible is not None:
        env["GPUPROV_SIM_CONTAINER_GPUS"] = ",".join(
            want[int(part.split(":")[1])].uuid if part.startswith("uuid:") else part
            for part in visible.split(",")
        ) if visible else ""
    doc = query(library, node, uuids=[g.uuid for g in want], **env)
    assert doc["count"] == len(physical)
    assert [g["uuid"] for g in doc["gpus"]] == [want[i].uuid for i in physical]
    assert [g["index"] for g in doc["gpus"]] == list(range(len(physical)))
    assert [g["minor_number"] for g in doc["gpus"]] == physical  # /dev/nvidiaN keeps its N
    hidden = {"error": NVML_ERROR_NOT_FOUND}
    assert doc["by_uuid"] == {
        g.uuid: physical.index(g.index) if g.index in physical else hidden for g in want
    }


# -- real node state: installed driver, nvidia-persistenced, device nodes ---------------------
def _with_node_root(node: Path, root: Path) -> None:
    conf = node / "sim" / "nvml.conf"
    conf.write_text(f"node_root = {root}\n" + conf.read_text())


@pytest.mark.parametrize(("devices", "physical"), [
    (["nvidiactl", "nvidia0", "nvidia1", "nvidia2", "nvidia3"], [0, 1, 2, 3]),  # a node
    (["nvidiactl", "nvidia3", "nvidia1"], [1, 3]),  # a container given two GPUs (CDI)
    (["nvidiactl"], []),  # the control device alone: no GPU
    (["nvidia2"], [0, 1, 2, 3]),  # no nvidiactl: the test machine's rule, every GPU
])
def test_visibility_follows_the_device_nodes(library, tmp_path, devices, physical):
    node = make_node(tmp_path, "gpu-pascal")
    want = expected(node, "gpu-pascal")
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    for name in devices:
        (root / "dev" / name).write_text("")  # stat() is all the library asks
    _with_node_root(node, root)
    doc = query(library, node, uuids=[g.uuid for g in want])
    assert [g["minor_number"] for g in doc["gpus"]] == physical
    assert [g["index"] for g in doc["gpus"]] == list(range(len(physical)))
    # The runtime's variable, where set (legacy mode), decides instead.
    doc = query(library, node, GPUPROV_SIM_CONTAINER_GPUS="all")
    assert doc["count"] == 4


def test_installed_driver_version_wins(library, tmp_path):
    node = make_node(tmp_path, "gpu-kepler")
    root = tmp_path / "root"
    libdir = root / "usr/lib/x86_64-linux-gnu/nvidia"
    # What Debian's libnvidia-tesla-470-ml1 and libnvidia-ml1 install (dpkg -c).
    for flavour, version in (("tesla-470", "470.256.02"), ("current", "550.163.01")):
        (libdir / flavour).mkdir(parents=True)
        (libdir / flavour / f"libnvidia-ml.so.{version}").write_bytes(b"")
        (libdir / flavour / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{version}")
    _with_node_root(node, root)
    doc = query(library, node)
    assert doc["driver_version"] == "550.163.01"
    assert doc["cuda_driver_version"] == 12040
    assert doc["nvml_version"] == "12.550.163.01"

    (libdir / "current" / "libnvidia-ml.so.550.163.01").unlink()
    doc = query(library, node)
    assert doc["driver_version"] == "470.256.02"
    assert doc["cuda_driver_version"] == 11040


def test_configured_driver_version_without_installed_driver(library, tmp_path):
    node = make_node(tmp_path, "gpu-kepler")
    (tmp_path / "empty-root").mkdir()
    _with_node_root(node, tmp_path / "empty-root")
    assert query(library, node)["driver_version"] == "470.256.02"


@pytest.mark.parametrize(
    ("branch", "cuda"),
    [("470.256.02", 11040), ("535.261.03", 12020), ("550.163.01", 12040),
     ("570.195.03", 12080), ("575.64.05", 12090), ("580.95.05", 13000),
     ("555.42.06", 12040)],
)
def test_cuda_driver_version_by_branch(branch, cuda):
    assert profiles.cuda_driver_version(branch) == cuda


def test_persistence_mode_follows_nvidia_persistenced(library, tmp_path):
    node = make_node(tmp_path, "gpu-pascal")
    root = tmp_path / "root"
    pid_file = root / "run/nvidia-persistenced/nvidia-persistenced.pid"
    pid_file.parent.mkdir(parents=True)
    _with_node_root(node, root)
    assert {g["persistence_mode"] for g in query(library, node)["gpus"]} == {0}
    pid_file.write_text(f"{os.getpid()}\n")  # a live process
    assert {g["persistence_mode"] for g in query(library, node)["gpus"]} == {1}


def test_persistence_mode_follows_nvidia_persistenced_enabled_at_boot(library, tmp_path):
    node = make_node(tmp_path, "gpu-pascal")
    root = tmp_path / "root"
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    _with_node_root(node, root)
    assert {g["persistence_mode"] for g in query(library, node)["gpus"]} == {0}
    unit = "/lib/systemd/system/nvidia-persistenced.service"
    (wants / "nvidia-persistenced.service").symlink_to(unit)
    assert {g["persistence_mode"] for g in query(library, node)["gpus"]} == {1}


# -- the library itself ----------------------------------------------------------------------
API_SEMANTICS = r"""
import ctypes, json, pynvml as N
out = {}
def err(fn, *a):
    try:
        fn(*a)
    except N.NVMLError as exc:
        return exc.value
    return 0
N.nvmlInit()
N.nvmlInit()
N.nvmlShutdown()
out["count_after_one_of_two_shutdowns"] = N.nvmlDeviceGetCount()
h = N.nvmlDeviceGetHandleByIndex(0)
lib = N.nvmlLib
small = ctypes.create_string_buffer(4)
out["name_small_buffer"] = lib.nvmlDeviceGetName(h, small, ctypes.c_uint(4))
out["bad_index"] = err(N.nvmlDeviceGetHandleByIndex, 99)
out["bad_bus_id"] = err(N.nvmlDeviceGetHandleByPciBusId, "0000:77:00.0")
out["bad_sensor"] = err(N.nvmlDeviceGetTemperature, h, 1)
out["missing_function"] = err(N.nvmlDeviceGetFanSpeed, h)
out["bad_handle"] = lib.nvmlDeviceGetUUID(ctypes.c_void_p(8), small, ctypes.c_uint(4))
N.nvmlShutdown()
out["count_after_shutdown"] = err(N.nvmlDeviceGetCount)
out["shutdown_twice"] = err(N.nvmlShutdown)
out["error_string"] = N.nvmlErrorString(N.NVML_ERROR_GPU_IS_LOST)
print(json.dumps(out))
"""


def test_api_semantics(library, tmp_path):
    node = make_node(tmp_path, "gpu-pascal")
    env = {**os.environ, "LD_LIBRARY_PATH": str(library.parent),
           "GPUPROV_SIM_DIR": str(node / "sim")}
    proc = subprocess.run([sys.executable, "-c", API_SEMANTICS], env=env, capture_output=True,
                          text=True, check=True, timeout=60)
    assert json.loads(proc.stdout) == {
        "count_after_one_of_two_shutdowns": 4,  # init is reference-counted
        "name_small_buffer": 7,  # NVML_ERROR_INSUFFICIENT_SIZE
        "bad_index": 2,  # NVML_ERROR_INVALID_ARGUMENT
        "bad_bus_id": NVML_ERROR_NOT_FOUND,
        "bad_sensor": 2,
        "missing_function": 13,  # not simulated: pynvml's NVML_ERROR_FUNCTION_NOT_FOUND
        "bad_handle": 2,
        "count_after_shutdown": 1,  # NVML_ERROR_UNINITIALIZED
        "shutdown_twice": 1,
        "error_string": "GPU is lost",
    }


def test_malformed_configuration_is_reported(library, tmp_path):
    node = make_node(tmp_path, "gpu-pascal")
    conf = node / "sim" / "nvml.conf"
    conf.write_text(conf.read_text().replace("temp_slowdown", "temp_slowdwn", 1))
    env = {**os.environ, "LD_LIBRARY_PATH": str(library.parent),
           "GPUPROV_SIM_DIR": str(node / "sim")}
    proc = subprocess.run([sys.executable, str(SNAPSHOT)], env=env, capture_output=True,
                          text=True, check=True, timeout=60)
    assert json.loads(proc.stdout) == {"init_error": NVML_ERROR_UNKNOWN}
    assert "unknown key temp_slowdwn" in proc.stderr


def test_library_is_built_once_per_source(tmp_path, monkeypatch):
    out = tmp_path / "lib"
    library = simhw.build_nvml_library(out)
    assert library == out / "libnvidia-ml.so.1"
    assert b"libnvidia-ml.so.1" in library.read_bytes()  # the soname is in the ELF file
    inode = library.stat().st_ino
    assert simhw.build_nvml_library(out).stat().st_ino == inode

    changed = tmp_path / "simnvml.c"
    changed.write_text(simhw.SOURCE.read_text() + "/* changed */\n")
    monkeypatch.setattr(simhw, "SOURCE", changed)
    assert simhw.build_nvml_library(out).stat().st_ino != inode


# -- the PCI tree ----------------------------------------------------------------------------
def _read_tree(pci: Path) -> dict:
    return {
        d.name: {f.name: f.read_text() for f in sorted(d.iterdir())}
        for d in sorted(pci.iterdir())
    }


@pytest.mark.parametrize("profile_name", profiles.DEFAULT_LAB)
def test_pci_tree(tmp_path, profile_name):
    node = make_node(tmp_path, profile_name)
    tree = _read_tree(node / "pci")
    want = expected(node, profile_name)
    nvidia = {addr: files for addr, files in tree.items() if files["vendor"] == "0x10de\n"}
    assert sorted(nvidia) == sorted(g.sysfs_address for g in want)
    for gpu in want:
        files = nvidia[gpu.sysfs_address]
        m = gpu.model
        speed = simhw.LINK_SPEED[m.pcie_max_gen] + "\n"
        assert files == {
            "vendor": "0x10de\n",
            "device": f"0x{m.pci_device_id:04x}\n",
            "class": "0x030200\n",
            "subsystem_vendor": "0x10de\n",
            "subsystem_device": f"0x{m.pci_subsystem_device:04x}\n",
            "revision": "0xa1\n",
            "current_link_speed": speed,
            "max_link_speed": speed,
            "current_link_width": f"{m.pcie_max_width}\n",
            "max_link_width": f"{m.pcie_max_width}\n",
            "numa_node": f"{gpu.numa_node}\n",
        }
    others = {addr: files for addr, files in tree.items() if addr not in nvidia}
    assert sorted(others) == sorted(f.address for f in simhw.BASE_FUNCTIONS)
    assert others["0000:03:00.0"]["class"] == "0x030000\n"  # a display controller, not NVIDIA's
    assert "current_link_speed" not in others["0000:00:00.0"]  # host bridges have no link


def test_pci_tree_rewrite_is_idempotent_and_drops_stale_devices(tmp_path):
    node = make_node(tmp_path, "gpu-pascal", node_name="n1")
    first = _read_tree(node / "pci")
    pci_inode = (node / "pci").stat().st_ino
    simhw.write_node_state(node, "n1", profiles.NODE_PROFILES["gpu-pascal"])
    assert _read_tree(node / "pci") == first
    simhw.write_node_state(node, "n1", profiles.NODE_PROFILES["cpu-only"])
    assert sorted(_read_tree(node / "pci")) == sorted(f.address for f in simhw.BASE_FUNCTIONS)
    assert (node / "pci").stat().st_ino == pci_inode  # still the directory a node has mounted
    assert not (node / "sim").exists()


def _kernel_log(node: Path, tmp_path: Path) -> dict:
    # The probe reads /dev/kmsg under its root; the lab mounts node/kmsg there.
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True, exist_ok=True)
    (root / "dev" / "kmsg").unlink(missing_ok=True)
    (root / "dev" / "kmsg").symlink_to(node / simhw.KMSG_FILE)
    return probe_host.collect_kernel_log(Root(str(root)))


def test_every_kernel_log_fault_has_a_message():
    assert set(simhw.XID_MESSAGES) == {n for n, f in faults.FAULTS.items() if f.layer == "kmsg"}


@pytest.mark.parametrize("profile_name", ["gpu-pascal", "gpu-hopper"])
def test_xid_fault_is_in_the_kernel_log_for_its_gpu_only(library, tmp_path, profile_name):
    node = make_node(tmp_path, profile_name)
    uuids = [g.uuid for g in expected(node, profile_name)]
    nvml_before = query(library, node, uuids=uuids)
    booted = _kernel_log(node, tmp_path)
    assert booted["readable"] and booted["xid_events"] == []

    simhw.set_fault(node, "xid-79", gpu_index=FAULTED_GPU)
    log = _kernel_log(node, tmp_path)
    gpu = expected(node, profile_name)[FAULTED_GPU]
    assert [(e["pci"], e["xid"]) for e in log["xid_events"]] == [
        (gpu.sysfs_address.rsplit(".", 1)[0], 79)]
    assert "fallen off the bus" in log["xid_events"][0]["message"]
    assert query(library, node, uuids=uuids) == nvml_before  # NVML does not see it

    simhw.clear_fault(node, "xid-79")
    assert _kernel_log(node, tmp_path)["xid_events"] == []
