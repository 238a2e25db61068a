"""NVIDIA datacenter GPU knowledge base: PCI device ID -> model, architecture, driver branches.

The one table every part of gpuprov uses (preflight plugin, probe, labels, verify).
Standard library only: it is shipped to nodes next to the probe.

Sources (each fact below comes from one of these; retrieved 2026-11-22):

[pci.ids] The PCI ID Repository, version 2026.10.24 (Debian package pci.ids
    0.0~2026.10.24-1): which device IDs exist and what chip/board they are.

[debian-ids] Debian nvidia-detect 550.163.01-5.1 (sid) and 535.261.03-1 (bookworm),
    /usr/share/nvidia/*.ids. Debian generates these from the driver README's "Appendix A:
    Supported NVIDIA GPU Products" of each branch it packages (legacy 340xx and 390xx,
    tesla 418/450/460/470/535, current 550). min_branch is the oldest of those lists that
    contains the ID. A trimmed copy is in tests/fixtures/hardware/datacenter-ids.tsv and the
    tests hold this table to it.

[nv-open-readme] NVIDIA open-gpu-kernel-modules README "Compatible GPUs" (the same Appendix A
    table with subsystem IDs), releases 550.40.82, 560.31.02 and the 610.43.03 table: names
    (NVML product names) and the IDs newer than Debian's lists (H200 NVL, GH200 144G,
    B200, GB200, B300, GB300, RTX PRO 6000 Blackwell Server Edition), and the subsystem IDs
    that tell an A2 from an A16.

[nv-deprecation] NVIDIA "Unix graphics feature deprecation schedule"
    (forums.developer.nvidia.com/t/unix-graphics-feature-deprecation-schedule/60588):
    release 470 is the last branch for Kepler; "The release 580 series will be the last to
    support GPUs based on the Maxwell, Pascal, and Volta architectures"; open kernel modules
    only for Turing and later. NVIDIA's legacy list: GRID K1/K2 are 340.xx legacy parts.

[nv-datacenter] NVIDIA Data Center Drivers, "Supported Drivers and CUDA Toolkit Versions"
    (docs.nvidia.com/datacenter/tesla/drivers/): R535 LTSB EOL June 2026, R580 LTSB EOL June
    2028, R595 production branch, R610 new feature branch. Hence recommended_branch 580 for
    every architecture it supports. GPU Operator platform support: HGX B200 needs
    570.133.20 or later; Grace Hopper and Blackwell datacenter GPUs need the open kernel
    modules.

[nv-cc] CUDA compute capability table (developer.nvidia.com/cuda-gpus) for compute_capability.

GPUs missing from the table (boards in no README list, newer boards) are classified from their
pci.ids name on the node (classify(..., chip_name=...)): the chip codename that starts it
(GH100, GA100, GM107GL...) names the architecture by NVIDIA's codename scheme, and that
architecture's branch rules apply with the newest first branch of any of its known boards
(a conservative floor). Such a Classification has source "pci.ids", and choose_branch says so.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

NVIDIA_VENDOR_ID = 0x10DE

# GPU Feature Discovery's family names, oldest first.
ARCHITECTURES: tuple[str, ...] = (
    "kepler",
    "maxwell",
    "pascal",
    "volta",
    "turing",
    "ampere",
    "ada-lovelace",
    "hopper",
    "blackwell",
)

# nvmlDeviceGetArchitecture() values (nvml.h NVML_DEVICE_ARCH_*).
NVML_ARCHITECTURES: dict[int, str] = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada-lovelace",
    9: "hopper",
    10: "blackwell",
}

# go-nvlib's names of NVML's enums, which NVIDIA's DRA driver publishes as the device
# attributes `architecture` and `brand` (NVIDIA/go-nvlib pkg/nvlib/device/device.go
# GetArchitectureAsString, GetBrandAsString; the values are nvml.h's NVML_DEVICE_ARCH_* and
# nvmlBrandType). An enum go-nvlib does not name is an error there.
GO_NVLIB_ARCHITECTURES: dict[int, str] = {
    2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
    8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell", 0xFFFFFFFF: "Unknown",
}
GO_NVLIB_BRANDS: dict[int, str] = {
    0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
    7: "NvidiaVApps", 8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS", 11: "NvidiaCloudGaming",
    12: "QuadroRTX", 13: "NvidiaRTX", 14: "Nvidia", 15: "GeForceRTX", 16: "TitanRTX",
}

# Branches at or below this one no longer build against the kernels of any OS gpuprov
# supports (340.xx was last updated for Linux 5.x and is packaged only in Debian sid);
# a GPU whose newest branch is one of them is "legacy".
LEGACY_BRANCH_MAX = 390


@dataclasses.dataclass(frozen=True)
class Architecture:
    name: str
    max_branch: int | None  # [nv-deprecation]; None while current branches support it
    recommended_branch: int  # [nv-datacenter]
    open_kernel_modules: bool  # [nv-deprecation]: GSP, Turing and later
    open_kernel_modules_required: bool  # [nv-datacenter]


_ARCH: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture("kepler", 470, 470, False, False),
        Architecture("maxwell", 580, 580, False, False),
        Architecture("pascal", 580, 580, False, False),
        Architecture("volta", 580, 580, False, False),
        Architecture("turing", None, 580, True, False),
        Architecture("ampere", None, 580, True, False),
        Architecture("ada-lovelace", None, 580, True, False),
        Architecture("hopper", None, 580, True, False),
        Architecture("blackwell", None, 580, True, True),
    )
}


@dataclasses.dataclass(frozen=True)
class GpuModel:
    device_id: int
    name: str  # NVML product name where NVIDIA publishes one
    architecture: str
    compute_capability: str
    min_branch: int
    max_branch: int | None
    recommended_branch: int
    open_kernel_modules: bool
    open_kernel_modules_required: bool
    series: str  # lower-case model designation: the `gputype` node label value
    subsystem_device: int | None = None  # only where one device ID is several products

    @property
    def status(self) -> str:
        if self.max_branch is not None and self.max_branch <= LEGACY_BRANCH_MAX:
            return "legacy"
        return "supported"

    def supports_branch(self, branch: int) -> bool:
        return self.min_branch <= branch and (self.max_branch is None or branch <= self.max_branch)


def _models(
    architecture: str,
    compute_capability: str,
    rows: tuple[tuple[Any, ...], ...],
    *,
    max_branch: int | None = None,
    open_required: bool | None = None,
) -> list[GpuModel]:
    """Rows are (device_id, name, series, min_branch[, subsystem_device])."""
    arch = _ARCH[architecture]
    top = arch.max_branch if max_branch is None else max_branch
    models = []
    for device_id, name, series, min_branch, *subsystem in rows:
        models.append(
            GpuModel(
                device_id=device_id,
                name=name,
                architecture=architecture,
                compute_capability=compute_capability,
                min_branch=min_branch,
                max_branch=top,
                recommended_branch=arch.recommended_branch if top is None else min(
                    top, arch.recommended_branch
                ),
                open_kernel_modules=arch.open_kernel_modules,
                open_kernel_modules_required=(
                    arch.open_kernel_modules_required if open_required is None else open_required
                ),
                series=series,
                subsystem_device=subsystem[0] if subsystem else None,
            )
        )
    return models


# min_branch: [debian-ids] unless the comment says otherwise.
_TABLE: list[GpuModel] = [
    # Kepler. GRID K1/K2/K340 appear only in the 340 legacy list: legacy.
    *_models("kepler", "3.0", (
        (0x0FEF, "GRID K340", "k340", 340),
        (0x0FF2, "GRID K1", "k1", 340),
        (0x11BF, "GRID K2", "k2", 340),
    ), max_branch=340),
    *_models("kepler", "3.0", (
        (0x118A, "GRID K520", "k520", 340),
        (0x118F, "Tesla K10", "k10", 340),
        (0x1194, "Tesla K8", "k8", 340),
    )),
    *_models("kepler", "3.5", (
        (0x1021, "Tesla K20Xm", "k20x", 340),
        (0x1022, "Tesla K20c", "k20", 340),
        (0x1026, "Tesla K20s", "k20", 340),
        (0x1028, "Tesla K20m", "k20", 340),
        (0x1023, "Tesla K40m", "k40", 340),
        (0x1024, "Tesla K40c", "k40", 340),
        (0x1027, "Tesla K40st", "k40", 340),
        (0x1029, "Tesla K40s", "k40", 340),
        (0x102A, "Tesla K40t", "k40", 390),
    )),
    *_models("kepler", "3.7", (
        (0x102D, "Tesla K80", "k80", 390),
    )),
    # Maxwell. Tesla M10 (13BD) is in no README list: deliberately absent (unknown).
    *_models("maxwell", "5.2", (
        (0x13F2, "Tesla M60", "m60", 390),
        (0x13F3, "Tesla M6", "m6", 390),
        (0x1431, "Tesla M4", "m4", 390),
        (0x17FD, "Tesla M40", "m40", 390),
    )),
    # Pascal. Tesla P4 is missing from the 535/550 README lists although NVIDIA's 580
    # notice keeps all of Pascal supported through 580: the architecture decides.
    *_models("pascal", "6.0", (
        (0x15F7, "Tesla P100-PCIE-12GB", "p100", 390),
        (0x15F8, "Tesla P100-PCIE-16GB", "p100", 390),
        (0x15F9, "Tesla P100-SXM2-16GB", "p100", 390),
    )),
    *_models("pascal", "6.1", (
        (0x1B38, "Tesla P40", "p40", 390),
        (0x1BB3, "Tesla P4", "p4", 390),
        (0x1BB4, "Tesla P6", "p6", 390),
    )),
    # Volta. 1DF5 is missing from the 535/550 lists; same reasoning as Tesla P4.
    *_models("volta", "7.0", (
        (0x1DB1, "Tesla V100-SXM2-16GB", "v100", 390),
        (0x1DB3, "Tesla V100-FHHL-16GB", "v100", 390),
        (0x1DB4, "Tesla V100-PCIE-16GB", "v100", 390),
        (0x1DB5, "Tesla V100-SXM2-32GB", "v100", 390),
        (0x1DB6, "Tesla V100-PCIE-32GB", "v100", 390),
        (0x1DB7, "Tesla V100-DGXS-32GB", "v100", 390),
        (0x1DB8, "Tesla V100-SXM3-32GB", "v100", 418),
        (0x1DF5, "Tesla V100-SXM2-16GB", "v100", 418),
        (0x1DF6, "Tesla V100S-PCIE-32GB", "v100s", 450),
    )),
    # Turing
    *_models("turing", "7.5", (
        (0x1E37, "Tesla T10", "t10", 535),
        (0x1EB4, "NVIDIA T4G", "t4g", 470),
        (0x1EB8, "Tesla T4", "t4", 418),
    )),
    # Ampere
    *_models("ampere", "8.0", (
        (0x20B0, "NVIDIA A100-SXM4-40GB", "a100", 450),
        (0x20B1, "NVIDIA A100-PCIE-40GB", "a100", 450),
        (0x20B2, "NVIDIA A100-SXM4-80GB", "a100", 450),
        (0x20B5, "NVIDIA A100 80GB PCIe", "a100", 470),
        (0x20F1, "NVIDIA A100-PCIE-40GB", "a100", 450),
        (0x20B7, "NVIDIA A30", "a30", 460),
        (0x20BD, "NVIDIA A800-SXM4-40GB", "a800", 535),
        (0x20F3, "NVIDIA A800-SXM4-80GB", "a800", 535),
        (0x20F5, "NVIDIA A800 80GB PCIe", "a800", 535),
        (0x20F6, "NVIDIA A800 40GB Active", "a800", 535),
        (0x20FD, "NVIDIA AX800", "ax800", 535),
    )),
    *_models("ampere", "8.6", (
        (0x2235, "NVIDIA A40", "a40", 460),
        (0x2236, "NVIDIA A10", "a10", 460),
        (0x2237, "NVIDIA A10G", "a10g", 460),
        (0x2238, "NVIDIA A10M", "a10m", 535),
        # One device ID, two boards [nv-open-readme]: the subsystem ID tells them apart.
        (0x25B6, "NVIDIA A2 or A16", "a2-a16", 470),
        (0x25B6, "NVIDIA A16", "a16", 470, 0x14A9),
        (0x25B6, "NVIDIA A2", "a2", 470, 0x157E),
    )),
    # Ada Lovelace
    *_models("ada-lovelace", "8.9", (
        (0x26B5, "NVIDIA L40", "l40", 535),
        (0x26B8, "NVIDIA L40G", "l40g", 535),
        (0x26B9, "NVIDIA L40S", "l40s", 535),
        (0x26BA, "NVIDIA L20", "l20", 535),
        (0x27B6, "NVIDIA L2", "l2", 535),
        (0x27B8, "NVIDIA L4", "l4", 535),
    )),
    # Hopper
    *_models("hopper", "9.0", (
        (0x2321, "NVIDIA H100 NVL", "h100", 535),
        (0x2322, "NVIDIA H800 PCIe", "h800", 535),
        (0x2324, "NVIDIA H800", "h800", 535),
        (0x2329, "NVIDIA H20", "h20", 535),
        (0x232C, "NVIDIA H20-3e", "h20", 535),
        (0x2330, "NVIDIA H100 80GB HBM3", "h100", 535),
        (0x2331, "NVIDIA H100 PCIe", "h100", 535),
        (0x2335, "NVIDIA H200", "h200", 550),
        (0x2339, "NVIDIA H100", "h100", 535),
        (0x233A, "NVIDIA H800 NVL", "h800", 535),
        # In no Debian list and not in the 560.31.02 README; listed in [nv-open-readme]
        # 610: 570 is the first production branch after 560 (to confirm on a 570 README).
        (0x233B, "NVIDIA H200 NVL", "h200", 570),
    )),
    # Grace Hopper: open kernel modules only [nv-datacenter].
    *_models("hopper", "9.0", (
        (0x2342, "NVIDIA GH200 120GB/480GB", "gh200", 535),
        (0x2348, "NVIDIA GH200 144G HBM3e", "gh200", 570),  # as H200 NVL above
    ), open_required=True),
    # Blackwell: open kernel modules only. min_branch from [nv-datacenter] release notes.
    *_models("blackwell", "10.0", (
        (0x2901, "NVIDIA B200", "b200", 570),
        (0x2909, "NVIDIA B200", "b200", 570),
        (0x2941, "NVIDIA GB200", "gb200", 570),
    )),
    *_models("blackwell", "10.3", (
        (0x3182, "NVIDIA B300 SXM6 AC", "b300", 580),
        (0x31C2, "NVIDIA GB300", "gb300", 580),
        (0x31C3, "NVIDIA GB300", "gb300", 580),
    )),
    *_models("blackwell", "12.0", (
        (0x2BB5, "NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000", 575),
    )),
]

_BY_ID: dict[tuple[int, int | None], GpuModel] = {
    (m.device_id, m.subsystem_device): m for m in _TABLE
}


def models() -> tuple[GpuModel, ...]:
    return tuple(_TABLE)


def lookup(device_id: int, subsystem_device: int | None = None) -> GpuModel | None:
    """The model for an NVIDIA device ID; the subsystem ID picks the board where it matters."""
    if subsystem_device is not None and (device_id, subsystem_device) in _BY_ID:
        return _BY_ID[(device_id, subsystem_device)]
    return _BY_ID.get((device_id, None))


def architecture_of(name: str) -> Architecture:
    """Architecture facts by GFD family name (also accepts "ada" and "Ada Lovelace")."""
    key = name.strip().lower().replace(" ", "-")
    key = "ada-lovelace" if key == "ada" else key
    if key not in _ARCH:
        raise ValueError(f"unknown GPU architecture {name!r}; known: {', '.join(ARCHITECTURES)}")
    return _ARCH[key]


def architecture_from_nvml(value: int) -> str | None:
    return NVML_ARCHITECTURES.get(value)


# Chip codename prefix -> architecture ([nv-cc]: the codename's letters name the family).
_CHIP_FAMILIES = {"GK": "kepler", "GM": "maxwell", "GP": "pascal", "GV": "volta",
                  "TU": "turing", "GA": "ampere", "AD": "ada-lovelace", "GH": "hopper",
                  "GB": "blackwell"}
# Compute capability per chip where the family has several ([nv-cc]); the first match wins.
_CHIP_CC = (("GK110", "3.5"), ("GK180", "3.5"), ("GK210", "3.7"), ("GK1", "3.0"), ("GM10", "5.0"),
            ("GM20", "5.2"), ("GP100", "6.0"), ("GP10", "6.1"), ("GV100", "7.0"), ("TU1", "7.5"),
            ("GA100", "8.0"), ("GA10", "8.6"), ("AD10", "8.9"), ("GH100", "9.0"),
            ("GB100", "10.0"), ("GB102", "10.0"), ("GB2", "12.0"))
_CHIP = re.compile(r"^(?P<chip>(?:" + "|".join(_CHIP_FAMILIES) + r")\d{3})[A-Z]*\s*"
                   r"(?:\[(?P<board>[^]]+)\])?")
# Where pci.ids lives: Debian and Ubuntu (package pci.ids), RHEL (hwdata).
PCI_IDS_PATHS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids")


def pci_ids_name(device_id: int, text: str) -> str | None:
    """The device's name under NVIDIA's vendor line in pci.ids text ("GH100 [H100]")."""
    in_nvidia = False
    wanted = f"{device_id:04x}"
    for line in text.splitlines():
        if line.startswith(f"{NVIDIA_VENDOR_ID:04x} "):
            in_nvidia = True
        elif in_nvidia and line[:1] not in ("\t", "#", ""):
            return None  # the next vendor
        elif in_nvidia and line.startswith("\t") and not line.startswith("\t\t"):
            device, _, name = line.strip().partition(" ")
            if device.lower() == wanted:
                return name.strip()
    return None


def model_from_chip(device_id: int, chip_name: str) -> GpuModel | None:
    """A GpuModel for a device the table lacks, from its pci.ids name; None where the name
    starts with no chip codename gpuprov knows."""
    match = _CHIP.match(chip_name.strip())
    if not match:
        return None
    chip, board = match["chip"], (match["board"] or "").strip()
    architecture = _CHIP_FAMILIES[chip[:2]]
    arch = _ARCH[architecture]
    known = [m for m in _TABLE if m.architecture == architecture]
    floor = max(m.min_branch for m in known)
    top = arch.max_branch
    if re.search(r"GRID K(?:1|2|340)\b", board):  # NVIDIA's legacy list: they stop at 340
        top = 340
    words = [w for w in board.split() if w not in ("Tesla", "GRID", "NVIDIA")]
    series = re.sub(r"[^a-z0-9-]", "", words[0].lower()) if words else chip.lower()
    return GpuModel(
        device_id=device_id, name=board or chip, architecture=architecture,
        compute_capability=next((cc for prefix, cc in _CHIP_CC if chip.startswith(prefix)), ""),
        min_branch=floor, max_branch=top,
        recommended_branch=arch.recommended_branch if top is None else min(
            top, arch.recommended_branch),
        open_kernel_modules=arch.open_kernel_modules,
        open_kernel_modules_required=arch.open_kernel_modules_required or "GH200" in board,
        series=series)


class InvalidPciId(ValueError):
    """The text is not an NVIDIA PCI ID. A ValueError, not a GpuprovError: this module ships
    to nodes alone, so the CLI turns it into a GpuprovError."""


_PCI_ID = re.compile(r"^(?:(?:0x)?(?P<vendor>[0-9a-f]{4}):)?(?:0x)?(?P<device>[0-9a-f]{4})$")


def parse_pci_id(text: str) -> tuple[int, int]:
    """'10de:15f8', '0x15f8', '15F8' -> (vendor, device); the vendor defaults to NVIDIA's."""
    match = _PCI_ID.match(text.strip().lower())
    if not match:
        raise InvalidPciId(
            f"{text!r} is not a PCI ID: use VENDOR:DEVICE in hex, e.g. 10de:15f8, or the device ID"
        )
    vendor = int(match["vendor"], 16) if match["vendor"] else NVIDIA_VENDOR_ID
    return vendor, int(match["device"], 16)


@dataclasses.dataclass(frozen=True)
class Classification:
    pci_id: str  # normalised "10de:15f8"
    status: str  # "supported" | "legacy" | "unknown"
    name: str | None = None
    architecture: str | None = None
    compute_capability: str | None = None
    min_branch: int | None = None
    max_branch: int | None = None
    recommended_branch: int | None = None
    open_kernel_modules: bool | None = None
    series: str | None = None
    model: GpuModel | None = dataclasses.field(default=None, compare=False, repr=False)
    # "table": gpuprov's table; "pci.ids": inferred from the chip of the pci.ids name
    source: str | None = None
    chip_name: str | None = None  # the pci.ids name it was inferred from

    @property
    def message(self) -> str:
        """One line for people: what this GPU needs."""
        if self.status == "supported":
            top = f"-{self.max_branch}" if self.max_branch is not None else "+"
            if self.source == "pci.ids":
                return (f"{self.pci_id} ({self.chip_name}): not in gpuprov's hardware table; "
                        f"{self.architecture} by its chip in pci.ids, that architecture's "
                        f"rules assumed: driver branches {self.min_branch}{top}")
            return f"{self.name}: driver branches {self.min_branch}{top}"
        if self.status == "legacy":
            return (
                f"{self.name}: legacy GPU, only driver branch {self.max_branch}.xx supports it and "
                "that branch does not build on current kernels; retire the GPU or keep the node "
                "on an old OS outside gpuprov"
            )
        return (
            f"{self.pci_id}: unknown NVIDIA device, not in gpuprov's hardware table; "
            "check NVIDIA's supported-products list and pin a branch"
        )

    def supports_branch(self, branch: int) -> bool:
        return self.model is not None and self.model.supports_branch(branch)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pci_id": self.pci_id,
            "name": self.name,
            "architecture": self.architecture,
            "compute_capability": self.compute_capability,
            "min_branch": self.min_branch,
            "max_branch": self.max_branch,
            "recommended_branch": self.recommended_branch,
            "open_kernel_modules": self.open_kernel_modules,
            "status": self.status,
            "series": self.series,
            "source": self.source,
            "chip_name": self.chip_name,
        }


def classify(pci_id: str, subsystem_device: int | None = None,
             chip_name: str | None = None) -> Classification:
    """Classify one PCI ID; InvalidPciId for text that is not a PCI ID or not NVIDIA's.
    chip_name, the device's pci.ids name, classifies a device the table lacks (source
    "pci.ids"); without it such a device is "unknown"."""
    vendor, device = parse_pci_id(pci_id)
    if vendor != NVIDIA_VENDOR_ID:
        raise InvalidPciId(
            f"{pci_id.strip()!r} is not an NVIDIA GPU: vendor {vendor:04x} is not NVIDIA (10de)"
        )
    normalised = f"{vendor:04x}:{device:04x}"
    model = lookup(device, subsystem_device)
    source = "table"
    if model is None and chip_name:
        model, source = model_from_chip(device, chip_name), "pci.ids"
    if model is None:
        return Classification(pci_id=normalised, status="unknown", chip_name=chip_name or None)
    return Classification(
        pci_id=normalised,
        status=model.status,
        name=model.name,
        architecture=model.architecture,
        compute_capability=model.compute_capability,
        min_branch=model.min_branch,
        max_branch=model.max_branch,
        recommended_branch=model.recommended_branch,
        open_kernel_modules=model.open_kernel_modules,
        series=model.series,
        model=model,
        source=source,
        chip_name=chip_name if source == "pci.ids" else None,
    )
