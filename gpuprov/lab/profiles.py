"""SIMULATION: the GPU models and node profiles of the lab, and each node's GPU identities.

What a simulated GPU reports (NVML name, PCI IDs, memory, limits, thresholds) is taken
from public `nvidia-smi` output of the real board; each model records its sources.
Compute capability and architecture are not repeated here: they come from the project's
hardware table (gpuprov.nvidia.hardware), like everything else that knows GPUs.

`expected_gpus(node_name, profile)` is the one definition of what a lab node has: the
simulated NVML configuration and PCI tree are written from it (lab/simhw.py), and tests
compare what the probe reports with it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

MIB = 1024 * 1024

# Row remapping replaced page retirement with Ampere: NVML answers
# nvmlDeviceGetRemappedRows on these and nvmlDeviceGetRetiredPages on the older ones.
ROW_REMAP_ARCHITECTURES = frozenset({"ampere", "ada-lovelace", "hopper", "blackwell"})

NVML_BRAND_TESLA = 2
NVML_BRAND_NVIDIA = 14

PCI_CLASS_3D_CONTROLLER = 0x030200
NVIDIA_VENDOR = 0x10DE


@dataclass(frozen=True)
class GpuModel:
    """A simulated board. Its NVML name, architecture and compute capability are the
    hardware table's (gpuprov.nvidia.hardware), looked up by PCI ID."""

    key: str
    pci_device_id: int
    pci_subsystem_device: int  # subsystem vendor is NVIDIA for these reference boards
    memory_total: int  # bytes, nvmlDeviceGetMemoryInfo().total
    pcie_max_gen: int
    pcie_max_width: int
    power_limit_w: int
    temp_shutdown: int
    temp_slowdown: int
    temp_gpu_max: int | None  # None: NVML answers NOT_SUPPORTED (older boards)
    idle_temp: int
    idle_power_w: int
    brand: int
    sources: str
    ecc: bool = True
    # What the driver reserves of the memory (NVML v2's "reserved", which v1 counts as used);
    # 0 where no reading of the board is at hand.
    memory_reserved: int = 0

    @property
    def hardware(self):
        from gpuprov.nvidia import hardware  # the one GPU table

        model = hardware.lookup(self.pci_device_id, self.pci_subsystem_device)
        if model is None:
            raise LookupError(
                f"gpuprov.nvidia.hardware has no entry for PCI device 10de:{self.pci_device_id:04x}"
            )
        return model

    @property
    def name(self) -> str:
        return self.hardware.name

    @property
    def architecture(self) -> str:
        return self.hardware.architecture

    @property
    def nvml_architecture(self) -> int:
        from gpuprov.nvidia.hardware import NVML_ARCHITECTURES

        return next(v for v, name in NVML_ARCHITECTURES.items() if name == self.architecture)

    @property
    def compute_capability(self) -> str:
        return self.hardware.compute_capability

    @property
    def row_remapping(self) -> bool:
        return self.architecture in ROW_REMAP_ARCHITECTURES


# Sources: memory totals and limits are as nvidia-smi shows them with the driver branch the
# lab gives each model (MiB * 2^20 unless the exact byte count was published). Values marked
# "typical" were not found in a citable public output and are plausible, not verified.
MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel(
            key="tesla-k80",  # one of the two GK210 GPUs on a K80 board
            pci_device_id=0x102D,
            pci_subsystem_device=0x106C,
            memory_total=11441 * MIB,
            pcie_max_gen=3,
            pcie_max_width=16,
            power_limit_w=149,
            temp_shutdown=93,
            temp_slowdown=88,
            temp_gpu_max=None,
            idle_temp=38,
            idle_power_w=62,
            brand=NVML_BRAND_TESLA,
            sources="11441MiB and 149 W: nvidia-smi in github.com/rcgsheffield/sheffield_hpc"
            "/pull/1030 (396.37) and github.com/openmm/openmm/issues/2386 (410.104); "
            "thresholds 93/88 C and subsystem 0x106c: typical",
        ),
        GpuModel(
            key="tesla-p100-pcie-16gb",
            pci_device_id=0x15F8,
            pci_subsystem_device=0x118F,
            memory_total=16384 * MIB,
            pcie_max_gen=3,
            pcie_max_width=16,
            power_limit_w=250,
            temp_shutdown=85,
            temp_slowdown=82,
            temp_gpu_max=None,
            idle_temp=33,
            idle_power_w=27,
            brand=NVML_BRAND_TESLA,
            sources="16384MiB, 27 W / 250 W idle: nvidia-smi tables of R535+ drivers in "
            "public notebooks (older drivers showed 16280MiB); 85/82 C and 250 W: "
            "github.com/NVIDIA/dcgm-exporter/issues/16; subsystem 0x118f: typical",
        ),
        GpuModel(
            key="tesla-v100-sxm2-16gb",
            pci_device_id=0x1DB1,
            pci_subsystem_device=0x1212,
            memory_total=16384 * MIB,
            pcie_max_gen=3,
            pcie_max_width=16,
            power_limit_w=300,
            temp_shutdown=90,
            temp_slowdown=87,
            temp_gpu_max=83,
            idle_temp=31,
            idle_power_w=43,
            brand=NVML_BRAND_TESLA,
            sources="16384MiB, 300 W, 43 W idle: github.com/1CatAI/1Cat-vLLM/issues/85 "
            "(570.211.01); thresholds and subsystem 0x1212: typical",
        ),
        GpuModel(
            key="tesla-t4",
            pci_device_id=0x1EB8,
            pci_subsystem_device=0x12A2,
            memory_total=15360 * MIB,
            pcie_max_gen=3,
            pcie_max_width=16,
            power_limit_w=70,
            temp_shutdown=96,
            temp_slowdown=93,
            temp_gpu_max=85,
            idle_temp=30,
            idle_power_w=10,
            brand=NVML_BRAND_TESLA,
            sources="15360MiB: github.com/modal-labs/modal-client/pull/2797; 70 W: board "
            "TDP; thresholds and subsystem 0x12a2: typical",
        ),
        GpuModel(
            key="a100-sxm4-80gb",
            pci_device_id=0x20B2,
            pci_subsystem_device=0x1463,
            memory_total=81920 * MIB,
            pcie_max_gen=4,
            pcie_max_width=16,
            power_limit_w=400,
            temp_shutdown=92,
            temp_slowdown=89,
            temp_gpu_max=85,
            idle_temp=33,
            idle_power_w=85,
            brand=NVML_BRAND_NVIDIA,
            sources="81920MiB: github.com/modal-labs/modal-client/pull/2797; 400 W, 85 W "
            "idle: github.com/NVIDIA/DCGM/issues/152; thresholds and subsystem: typical",
        ),
        GpuModel(
            key="h100-sxm5-80gb",
            pci_device_id=0x2330,
            pci_subsystem_device=0x16C1,
            memory_total=85520809984,  # 81559 MiB
            pcie_max_gen=5,
            pcie_max_width=16,
            power_limit_w=700,
            temp_shutdown=95,
            temp_slowdown=89,
            temp_gpu_max=87,
            idle_temp=33,
            idle_power_w=72,
            brand=NVML_BRAND_NVIDIA,
            sources="85520809984 bytes: github.com/modal-labs/modal-client/pull/2797; "
            "81559MiB, 700 W: github.com/wilicc/gpu-burn/issues/114 (550.90.07); subsystem "
            "0x16c1, PCIe 5 x16, 72 W / 33 C idle and thresholds (T.Limit 87 C, slowdown "
            "-2, shutdown -8): a published nvidia-smi -a of driver 545.23.08",
        ),
        GpuModel(
            key="h200-sxm-141gb",
            pci_device_id=0x2335,
            pci_subsystem_device=0x18BF,
            memory_total=150754820096,  # 143771 MiB
            memory_reserved=644939776,  # 615 MiB
            pcie_max_gen=5,
            pcie_max_width=16,
            power_limit_w=700,
            temp_shutdown=95,
            temp_slowdown=89,
            temp_gpu_max=87,
            idle_temp=39,
            idle_power_w=81,
            brand=NVML_BRAND_NVIDIA,
            sources="every value read off a real H200 by scripts/nvml_truth.py (driver "
            "580.159.04, 2026-11-26): tests/fixtures/real/h200-580.159.04/",
        ),
        GpuModel(
            key="l4",
            pci_device_id=0x27B8,
            pci_subsystem_device=0x16CA,
            memory_total=23034 * MIB,
            pcie_max_gen=4,
            pcie_max_width=16,
            power_limit_w=72,
            temp_shutdown=95,
            temp_slowdown=92,
            temp_gpu_max=87,
            idle_temp=35,
            idle_power_w=16,
            brand=NVML_BRAND_NVIDIA,
            sources="23034MiB: github.com/modal-labs/modal-client/pull/2797; 72 W: board "
            "TDP; thresholds and subsystem 0x16ca: typical",
        ),
    )
}


@dataclass(frozen=True)
class NodeProfile:
    """A lab node as an admin would get it: hardware, OS, and the admin's driver choice."""

    name: str
    gpus: tuple[str, ...]  # GpuModel keys, in PCI order
    driver_version: str | None  # what NVML reports until a real driver package is installed
    # A key of gpuprov.lab.image.NODE_OSES (`lab up --nodes P@OS` overrides it); the lab's
    # driver settings follow the OS (lab.LAB_DRIVER_SETTINGS).
    os: str = "debian-12"

    @property
    def models(self) -> tuple[GpuModel, ...]:
        return tuple(MODELS[key] for key in self.gpus)


NODE_PROFILES: dict[str, NodeProfile] = {
    p.name: p
    for p in (
        # A K80 board carries two GK210 GPUs: NVML (and the device plugin) see two GPUs.
        NodeProfile("gpu-kepler", ("tesla-k80",) * 2, "470.256.02"),
        NodeProfile("gpu-pascal", ("tesla-p100-pcie-16gb",) * 4, "535.261.03"),
        # Debian 13 with containerd 2.x; its driver: R580 from NVIDIA's repository (lab.py).
        # NVML reports Debian 13's own 550 until a driver package is installed.
        NodeProfile("gpu-hopper", ("h100-sxm5-80gb",) * 8, "550.163.01", os="debian-13"),
        NodeProfile("cpu-only", (), None),
    )
}
DEFAULT_LAB = ["gpu-kepler", "gpu-pascal", "gpu-hopper", "cpu-only"]

# PCI buses of the GPU slots, in order, as a dual-socket 8-GPU server lays them out:
# the first four behind socket 0 (NUMA node 0), the rest behind socket 1.
GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)

# NVML's CUDA driver version (1000 * major + 10 * minor) by driver branch: the highest CUDA
# version each branch supports, as its release notes and nvidia-smi's header state.
CUDA_BY_BRANCH = {470: 11040, 535: 12020, 550: 12040, 570: 12080, 575: 12090, 580: 13000}


@dataclass(frozen=True)
class ExpectedGpu:
    """One simulated GPU of one node, as NVML reports it (NVML index order)."""

    index: int
    model: GpuModel
    uuid: str
    serial: str
    pci_bus: int
    numa_node: int

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def pci_bus_id(self) -> str:
        """NVML's form (nvmlPciInfo_t.busId)."""
        return f"00000000:{self.pci_bus:02X}:00.0"

    @property
    def sysfs_address(self) -> str:
        """The directory name under /sys/bus/pci/devices."""
        return f"0000:{self.pci_bus:02x}:00.0"

    @property
    def pci_device_id(self) -> int:
        """NVML's nvmlPciInfo_t.pciDeviceId: device << 16 | vendor."""
        return self.model.pci_device_id << 16 | NVIDIA_VENDOR

    @property
    def pci_subsystem_id(self) -> int:
        return self.model.pci_subsystem_device << 16 | NVIDIA_VENDOR

    @property
    def memory_total(self) -> int:
        return self.model.memory_total

    @property
    def compute_capability(self) -> str:
        return self.model.compute_capability

    @property
    def architecture(self) -> str:
        return self.model.architecture

    @property
    def minor_number(self) -> int:
        return self.index  # /dev/nvidiaN, N in PCI order


def expected_gpus(node_name: str, profile: NodeProfile) -> tuple[ExpectedGpu, ...]:
    """The GPUs a lab node has: stable per node name, distinct across nodes."""
    if len(profile.gpus) > len(GPU_BUSES):
        raise ValueError(f"profile {profile.name} has more GPUs than the lab has PCI slots")
    gpus = []
    for index, model in enumerate(profile.models):
        digest = hashlib.sha256(f"gpuprov-lab/{node_name}/{index}".encode()).hexdigest()
        h = digest[:32]
        uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        serial = f"132{int(digest[32:48], 16) % 10**10:010d}"  # 13 digits like real ones
        gpus.append(
            ExpectedGpu(
                index=index,
                model=model,
                uuid=uuid,
                serial=serial,
                pci_bus=GPU_BUSES[index],
                numa_node=0 if index < len(GPU_BUSES) // 2 else 1,
            )
        )
    return tuple(gpus)


def cuda_driver_version(driver_version: str) -> int:
    """NVML's CUDA driver version for a driver version: its branch's entry, else that of
    the newest branch below it (a newer branch supports at least as much). The simulated
    NVML applies the same rule to the table written into nvml.conf."""
    branch = int(driver_version.split(".", 1)[0])
    known = [b for b in CUDA_BY_BRANCH if b <= branch]
    if not known:
        raise ValueError(f"driver {driver_version} is older than every branch the lab knows")
    return CUDA_BY_BRANCH[max(known)]
