"""SIMULATION: a lab node's GPU hardware, as files on the host that the node mounts.

    node_dir/pci/<address>/{vendor,device,class,...}   mounted over /sys/bus/pci/devices
    node_dir/sim/nvml.conf                              mounted at /etc/gpuprov-sim (GPU nodes)
    node_dir/sim/faults
    node_dir/kmsg                                       mounted at /dev/kmsg (every node)
    <lib dir>/libnvidia-ml.so.1                         mounted at /opt/gpuprov-sim/lib

The simulated NVML (lab/nvml/simnvml.c) re-reads nvml.conf and faults at every
nvmlInit, so `gpuprov lab fault` takes effect without touching the container. Nodes
without GPUs get a PCI tree without NVIDIA devices and no sim directory. What the
simulation does and does not do: lab/SIMULATION.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpuprov.errors import GpuprovError
from gpuprov.lab import faults as fault_registry
from gpuprov.lab.cache import CACHE
from gpuprov.lab.profiles import (
    CUDA_BY_BRANCH,
    NVIDIA_VENDOR,
    PCI_CLASS_3D_CONTROLLER,
    NodeProfile,
    expected_gpus,
)
from gpuprov.nvidia import mig

LIBRARY_NAME = "libnvidia-ml.so.1"
SOURCE = Path(__file__).parent / "nvml" / "simnvml.c"
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", f"-Wl,-soname,{LIBRARY_NAME}")
# Not named lib*.so*: ldconfig scans the library directory inside the nodes.
BUILD_STAMP = "simnvml.sha256"

PCI_DIR = "pci"
SIM_DIR = "sim"
NVML_CONF = "nvml.conf"
FAULTS_FILE = "faults"
# The node's kernel log, in /dev/kmsg's record format ("prio,seq,usec,flags;message"). A
# container has no /dev/kmsg of its own (podman leaves it out, or passes the host's on some
# machines), so the lab mounts this file there: the probe reads the same kernel log on every
# machine, and the kernel-log faults (XIDs) write into it.
KMSG_FILE = "kmsg"
KMSG_BOOT = "6,0,0,-;Linux version (gpuprov lab: simulated kernel log, see lab/SIMULATION.md)\n"
# "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus." per kernel-log fault.
# The kernel-log faults (layer "kmsg" of lab/faults.py): name -> (message with {pci} the
# kernel's "0000:3b:00" and {bdf} the full address, how many records). Formats: krcReportXid's
# and the error-containment log of NVIDIA's open-gpu-kernel-modules (the MIG form with
# " GPU-I:NN"), and the driver's "GPU ... has fallen off the bus" line that comes without an
# XID (tests/fixtures/health has real ones, with their sources).
XID_MESSAGES = {
    "xid-79": ("NVRM: Xid (PCI:{pci}): 79, pid=1234, name=python3, GPU has fallen off the bus.",
               1),
    "xid-48": ("NVRM: Xid (PCI:{pci}): 48, pid=1234, name=python3, An uncorrectable double "
               "bit error (DBE) has been detected on GPU in the framebuffer at partition 1, "
               "subpartition 0.", 1),
    "xid-94-mig": ("NVRM: Xid (PCI:{pci} GPU-I:01): 94, pid=7194, Contained: CE User Channel "
                   "(0x9). RST: No, D-RST: No", 1),
    "xid-95-mig": ("NVRM: Xid (PCI:{pci}): 95, pid=7062, Uncontained: LTC TAG (0x2, 0x1). "
                   "RST: Yes, D-RST: No", 1),
    # A storm of one XID on one GPU (NVSentinel #1120 saw 800,000 duplicate XID 95 lines).
    "xid-storm": ("NVRM: Xid (PCI:{pci}): 95, pid=7062, Uncontained: LTC TAG (0x2, 0x1). "
                  "RST: Yes, D-RST: No", 5000),
    "fallen-off-bus": ("NVRM: GPU {bdf}: GPU has fallen off the bus.", 1),
    # Not the driver's: the record a reset tool writes after a GPU reset (the driver prints
    # none; the wording is NVSentinel's gpu-reset/gpu_reset.sh, see gpuprov/node/health/kmsg.py
    # RESET_EXECUTED), written to /dev/kmsg from user space, so with the user facility.
    "gpu-reset": ("GPU reset executed: {uuid}, success: true", 1),
}
# Records user space writes to /dev/kmsg: facility LOG_USER (1 << 3) with the default level 4,
# as the kernel numbers a record written without a "<N>" prefix (Documentation/ABI/testing/
# dev-kmsg); the driver's records are the kernel's, facility 0, level 3 (KERN_ERR).
USER_RECORDS = {"gpu-reset"}
# What the simulated GPU's reset takes away: it re-initialises the GPU, so one that had fallen
# off the bus answers again and a pending row remap is applied (NVIDIA's "reset the GPU" for
# both); its ECC counts and the kernel log's XID records stay (the log keeps what it printed).
RESET_CLEARS = ("gpu-lost", "row-remap-pending")
# Sequence numbers the node's kernel log has handed out: {"next": n, "records": {"name idx":
# first seq}}, so that a record keeps its seq when the file is rewritten and a new one always
# gets a higher seq, as /dev/kmsg numbers records (a follower dedupes by seq).
KMSG_SEQ_FILE = "kmsg-seq.json"

# sysfs spells the link rate per generation like this (Linux 6.x).
LINK_SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe",
              5: "32.0 GT/s PCIe"}
GPU_REVISION = 0xA1


@dataclass(frozen=True)
class PciFunction:
    address: str
    vendor: int
    device: int
    pci_class: int
    subsystem_vendor: int
    subsystem_device: int
    revision: int
    numa_node: int
    link: tuple[int, int] | None  # (generation, width); None: not a PCIe endpoint


# What every lab server has besides GPUs, so PCI-reading code must filter: the host bridge
# (no link files, as in sysfs), the BMC's VGA (a display controller that is not NVIDIA's)
# and an Intel I350 NIC. Subsystem IDs are those of a Supermicro board.
BASE_FUNCTIONS = (
    PciFunction("0000:00:00.0", 0x8086, 0x2020, 0x060000, 0x15D9, 0x1B76, 0x04, 0, None),
    PciFunction("0000:03:00.0", 0x1A03, 0x2000, 0x030000, 0x15D9, 0x1B76, 0x41, 0, (2, 1)),
    PciFunction("0000:04:00.0", 0x8086, 0x1521, 0x020000, 0x15D9, 0x1521, 0x01, 0, (2, 4)),
)


# -- the library ----------------------------------------------------------------------------
def build_nvml_library(out_dir: Path) -> Path:
    """The simulated NVML in out_dir, compiled once per machine and source (the machine's
    cache, gpuprov/lab/cache.py, keyed by the source's and flags' hash) and copied from there:
    every lab and test that needs it would otherwise run gcc again."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + "\0".join(CFLAGS).encode()).hexdigest()
    library = out_dir / LIBRARY_NAME
    stamp = out_dir / BUILD_STAMP
    if library.exists() and stamp.exists() and stamp.read_text().strip() == key:
        return library
    built = _compiled(key)
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".copy-")
    os.close(fd)
    try:
        shutil.copyfile(built, tmp)
        os.chmod(tmp, 0o755)
        # Replaced, not rewritten: processes in the nodes that have the old one mapped keep it.
        os.replace(tmp, library)
    finally:
        Path(tmp).unlink(missing_ok=True)
    stamp.write_text(key + "\n")
    return library


def _compiled(key: str) -> Path:
    """The library compiled from SOURCE with CFLAGS, in the machine's cache."""
    built = CACHE / "simnvml" / key[:16] / LIBRARY_NAME
    if built.exists():
        return built
    gcc = shutil.which("gcc")
    if gcc is None:
        raise GpuprovError(
            "gcc not found: the lab compiles its simulated NVML library with it; "
            "install it (apt-get install gcc) and retry"
        )
    built.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=built.parent, prefix=".build-")
    os.close(fd)
    try:
        proc = subprocess.run(
            [gcc, *CFLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["no output"])[0]
            raise GpuprovError(f"compiling the simulated NVML ({SOURCE}) failed: {first}")
        os.replace(tmp, built)  # atomic: a concurrent build of the same key is the same file
    finally:
        Path(tmp).unlink(missing_ok=True)
    return built


# -- node state -----------------------------------------------------------------------------
def write_node_state(node_dir: Path, node_name: str, profile: NodeProfile) -> None:
    """The node's PCI tree, and for GPU nodes its NVML configuration with no fault active."""
    gpus = expected_gpus(node_name, profile)
    functions = list(BASE_FUNCTIONS)
    for gpu in gpus:
        functions.append(
            PciFunction(
                gpu.sysfs_address, NVIDIA_VENDOR, gpu.model.pci_device_id,
                PCI_CLASS_3D_CONTROLLER, NVIDIA_VENDOR, gpu.model.pci_subsystem_device,
                GPU_REVISION, gpu.numa_node, (gpu.model.pcie_max_gen, gpu.model.pcie_max_width),
            )
        )
    _write_pci_tree(node_dir / PCI_DIR, functions)
    _write_in_place(node_dir / KMSG_FILE, KMSG_BOOT)
    (node_dir / KMSG_SEQ_FILE).unlink(missing_ok=True)
    sim = node_dir / SIM_DIR
    if not gpus:
        if sim.exists():
            shutil.rmtree(sim)
        return
    sim.mkdir(parents=True, exist_ok=True)
    _write_atomic(sim / NVML_CONF, _nvml_conf(node_name, profile))
    _write_atomic(sim / FAULTS_FILE, "")


def _write_pci_tree(pci: Path, functions: list[PciFunction]) -> None:
    # Entries are rewritten in place, never the directory itself: a running node has it
    # bind-mounted and would keep seeing a replaced one's old contents.
    pci.mkdir(parents=True, exist_ok=True)
    wanted = {f.address for f in functions}
    for stale in pci.iterdir():
        if stale.name not in wanted:
            shutil.rmtree(stale)
    for f in functions:
        files = {
            "vendor": f"0x{f.vendor:04x}",
            "device": f"0x{f.device:04x}",
            "class": f"0x{f.pci_class:06x}",
            "subsystem_vendor": f"0x{f.subsystem_vendor:04x}",
            "subsystem_device": f"0x{f.subsystem_device:04x}",
            "revision": f"0x{f.revision:02x}",
            "numa_node": str(f.numa_node),
        }
        if f.link is not None:
            gen, width = f.link
            for which in ("current", "max"):
                files[f"{which}_link_speed"] = LINK_SPEED[gen]
                files[f"{which}_link_width"] = str(width)
        directory = pci / f.address
        directory.mkdir(exist_ok=True)
        for name, value in files.items():
            (directory / name).write_text(value + "\n")


# The MIG state the simulated driver keeps (simnvml.c mig_state_dir): node_dir/mig, mounted
# writable at MIG_STATE_NODE_PATH in the node.
MIG_STATE_DIR = "mig"
MIG_STATE_NODE_PATH = "/var/lib/gpuprov-sim/mig"


def _nvml_conf(node_name: str, profile: NodeProfile) -> str:
    branches = " ".join(f"{b}:{c}" for b, c in sorted(CUDA_BY_BRANCH.items()))
    lines = [
        f"# SIMULATION: NVML of lab node {node_name} (profile {profile.name}).",
        "# Written by gpuprov/lab/simhw.py; read by the simulated libnvidia-ml.so.1.",
        "# driver_version holds until a real NVIDIA driver package is installed on the node.",
        f"driver_version = {profile.driver_version}",
        f"cuda_driver_version_by_branch = {branches}",
        "# auto: Enabled while nvidia-persistenced runs (its pid file names a live process)",
        "persistence_mode = auto",
    ]
    for gpu in expected_gpus(node_name, profile):
        m = gpu.model
        lines += [
            "",
            "[gpu]",
            f"name = {m.name}",
            f"uuid = {gpu.uuid}",
            f"serial = {gpu.serial}",
            f"pci_bus_id = {gpu.pci_bus_id}",
            f"pci_device_id = 0x{gpu.pci_device_id:08x}",
            f"pci_subsystem_id = 0x{gpu.pci_subsystem_id:08x}",
            f"memory_total = {m.memory_total}",
            "memory_used = 0",
            f"memory_reserved = {m.memory_reserved}",
            f"compute_capability = {m.compute_capability}",
            f"architecture = {m.nvml_architecture}",
            f"brand = {m.brand}",
            f"minor_number = {gpu.minor_number}",
            f"pcie_max_gen = {m.pcie_max_gen}",
            f"pcie_max_width = {m.pcie_max_width}",
            f"pcie_curr_gen = {m.pcie_max_gen}",
            f"pcie_curr_width = {m.pcie_max_width}",
            f"power_limit_mw = {m.power_limit_w * 1000}",
            f"power_usage_mw = {m.idle_power_w * 1000}",
            f"temperature = {m.idle_temp}",
            f"temp_shutdown = {m.temp_shutdown}",
            f"temp_slowdown = {m.temp_slowdown}",
        ]
        if m.temp_gpu_max is not None:
            lines.append(f"temp_gpu_max = {m.temp_gpu_max}")
        lines += [
            "utilization_gpu = 0",
            "utilization_memory = 0",
            f"ecc = {int(m.ecc)}",
            f"row_remapping = {int(m.row_remapping)}",
        ]
        lines += _mig_lines(m.pci_device_id, m.memory_total)
    return "\n".join(lines) + "\n"


def _mig_lines(device_id: int, memory_total: int) -> list[str]:
    """A MIG-capable model's GPU instance profiles, from gpuprov/nvidia/mig.py (one table for the
    MIG stage, verify and this simulation); MIG mode off, as a GPU leaves the factory.
    Instance memory is derived (the GPU's memory over its memory slices, in 128 MiB steps),
    not NVIDIA's figure: SIMULATION.md says so."""
    model = mig.model_of(device_id)
    if model is None:
        return []
    slice_mb = (memory_total >> 20) // model.memory_slices // 128 * 128
    profiles = ";".join(
        f"{p.nvml_index}:{p.nvml_id}:{p.name}:{p.compute}:{p.size}:{p.count}:"
        f"{model.profile_multiprocessors(p)}:{slice_mb * p.size}:"
        f"{','.join(map(str, p.starts))}" for p in model.profiles)
    return ["mig_mode = 0", f"mig_compute_slices = {model.compute_slices}",
            f"mig_profiles = {profiles}"]


def _write_atomic(path: Path, text: str) -> None:
    # The library may read while we write: it sees the old file or the new one, never half.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- faults ---------------------------------------------------------------------------------
def _sim_dir(node_dir: Path, fault: str) -> Path:
    sim = node_dir / SIM_DIR
    if not (sim / NVML_CONF).exists():
        raise GpuprovError(
            f"node {node_dir.name} has no simulated GPUs: fault {fault!r} needs a GPU node"
        )
    return sim


def _read_faults(sim: Path) -> list[tuple[str, int | None]]:
    try:
        text = (sim / FAULTS_FILE).read_text()
    except FileNotFoundError:
        return []
    entries = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            entries.append((words[0], int(words[1]) if len(words) > 1 else None))
    return entries


def _write_faults(sim: Path, entries: list[tuple[str, int | None]]) -> None:
    text = "".join(f"{name}\n" if idx is None else f"{name} {idx}\n" for name, idx in entries)
    _write_atomic(sim / FAULTS_FILE, text)
    _write_kernel_log(sim.parent, entries)


def _write_in_place(path: Path, text: str) -> None:
    # Not _write_atomic: this file is bind-mounted on its own, and a mount keeps the inode it
    # was given, so a renamed-over file would never be seen by the running node.
    with open(path, "w") as f:
        f.write(text)


def _write_kernel_log(node_dir: Path, entries: list[tuple[str, int | None]]) -> None:
    conf = (node_dir / SIM_DIR / NVML_CONF).read_text().splitlines()
    bus_ids = [line.split("=", 1)[1].strip() for line in conf if line.startswith("pci_bus_id")]
    uuids = [line.split("=", 1)[1].strip() for line in conf if line.startswith("uuid")]
    seq_path = node_dir / KMSG_SEQ_FILE
    try:
        seqs = json.loads(seq_path.read_text())
    except (FileNotFoundError, ValueError):
        seqs = {"next": 1, "records": {}}
    # A record whose fault was switched off leaves the file; switched on again it is a new
    # record with a new, higher seq (a second XID, a second reset), as the kernel numbers them.
    active = {f"{name} {idx}" for name, idx in entries}
    seqs["records"] = {k: v for k, v in seqs["records"].items() if k in active}
    records = []
    for name, idx in entries:
        if name not in XID_MESSAGES:
            continue
        text, count = XID_MESSAGES[name]
        key = f"{name} {idx}"
        if key not in seqs["records"]:
            seqs["records"][key] = seqs["next"]
            seqs["next"] += count
        first = seqs["records"][key]
        # NVML's "00000000:3B:00.0" -> the kernel's "0000:3b:00".
        domain, bus, dev_fn = bus_ids[idx or 0].lower().split(":")
        pci = f"{domain[-4:]}:{bus}:{dev_fn.split('.')[0]}"
        message = text.format(pci=pci, bdf=f"{pci}.{dev_fn.split('.')[1]}",
                              uuid=uuids[idx or 0])
        prio = 12 if name in USER_RECORDS else 3
        records += [(seq, f"{prio},{seq},{seq * 1000},-;{message}\n")
                    for seq in range(first, first + count)]
    _write_atomic(seq_path, json.dumps(seqs, sort_keys=True))
    _write_in_place(node_dir / KMSG_FILE,
                    KMSG_BOOT + "".join(record for _, record in sorted(records)))


def _gpu_count(sim: Path) -> int:
    return sum(1 for line in (sim / NVML_CONF).read_text().splitlines() if line.strip() == "[gpu]")


def set_fault(node_dir: Path, fault: str, gpu_index: int | None = None) -> None:
    """Switch a fault on (on one GPU for per-GPU faults; default GPU 0). Idempotent."""
    spec = fault_registry.get(fault)
    sim = _sim_dir(node_dir, fault)
    if spec.per_gpu:
        index = fault_registry.DEFAULT_GPU_INDEX if gpu_index is None else gpu_index
        count = _gpu_count(sim)
        if not 0 <= index < count:
            raise GpuprovError(
                f"node {node_dir.name} has GPUs 0..{count - 1}: no GPU {index} for {fault!r}"
            )
        entry: tuple[str, int | None] = (fault, index)
    else:
        if gpu_index is not None:
            raise GpuprovError(f"fault {fault!r} hits the whole node: leave out the GPU index")
        entry = (fault, None)
    entries = _read_faults(sim)
    if fault == "gpu-reset":
        kept = [e for e in entries if not (e[0] in RESET_CLEARS and e[1] == entry[1])]
        if kept != entries or entry not in entries:
            _write_faults(sim, [*(e for e in kept if e != entry), entry])
        return
    if entry not in entries:
        _write_faults(sim, [*entries, entry])


def clear_fault(node_dir: Path, fault: str) -> None:
    """Switch a fault off (on every GPU it is on). Idempotent."""
    fault_registry.get(fault)
    sim = _sim_dir(node_dir, fault)
    entries = _read_faults(sim)
    kept = [e for e in entries if e[0] != fault]
    if kept != entries:
        _write_faults(sim, kept)


def active_faults(node_dir: Path) -> list[str]:
    """Active faults as "name" or "name:gpu-index", in the order they were switched on."""
    return [
        name if idx is None else f"{name}:{idx}"
        for name, idx in _read_faults(node_dir / SIM_DIR)
    ]
