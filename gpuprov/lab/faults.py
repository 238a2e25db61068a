"""SIMULATION: the fault switches of the lab's simulated GPU hardware.

One registry of every fault `gpuprov lab fault NODE FAULT` accepts. The NVML faults below
are implemented by the simulated NVML library (lab/nvml/simnvml.c), which reads the
node's `faults` file at every nvmlInit; their names are the contract between the two.
Faults that later parts of the lab implement (the Kubernetes emulator's) are added here
with their own `layer`, so `lab fault`, `lab status` and the docs list them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov.errors import GpuprovError


@dataclass(frozen=True)
class Fault:
    name: str
    description: str
    per_gpu: bool  # hits one GPU (index given with --gpu, default 0) or the whole node
    layer: str = "nvml"  # which simulation implements it
    needs_gpu: bool = True  # refused on nodes without GPUs


DEFAULT_GPU_INDEX = 0

FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "nvml-init-fail",
            "nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED (9), as when the kernel module "
            "is not loaded",
            per_gpu=False,
        ),
        Fault(
            "version-mismatch",
            "nvmlInit fails with NVML_ERROR_LIB_RM_VERSION_MISMATCH (18): user-space library "
            "and kernel module versions differ (\"Driver/library version mismatch\")",
            per_gpu=False,
        ),
        Fault(
            "gpu-lost",
            "one GPU fell off the bus: still counted by nvmlDeviceGetCount and still on PCI, "
            "but getting its handle fails with NVML_ERROR_GPU_IS_LOST (15)",
            per_gpu=True,
        ),
        Fault(
            "ecc-uncorrectable",
            "one GPU has uncorrectable (double-bit) ECC errors in device memory: volatile and "
            "aggregate uncorrected counters > 0",
            per_gpu=True,
        ),
        Fault(
            "row-remap-pending",
            "one GPU needs a reset to finish memory repair: Ampere and newer report a pending "
            "row remap, older GPUs a page pending retirement",
            per_gpu=True,
        ),
        Fault(
            "double-allocate",
            "the node's device plugin hands the same GPUs to concurrent pods (broken isolation)",
            per_gpu=False, layer="kube", needs_gpu=True,
        ),
        Fault(
            "plugin-unregistered",
            "the device plugin never registers: the node never advertises nvidia.com/gpu",
            per_gpu=False, layer="kube", needs_gpu=True,
        ),
        Fault(
            "dra-plugin-unregistered",
            "NVIDIA's DRA plugin publishes the node's ResourceSlice but the kubelet never "
            "registers it (Kubernetes 1.34.0/1.34.1 \"driver not registered\"): claim pods "
            "bound there fail FailedPrepareDynamicResources and stay Pending",
            per_gpu=False, layer="kube", needs_gpu=True,
        ),
        Fault(
            "dra-prepare-fails",
            "NVIDIA's DRA plugin fails every NodePrepareResources on the node: claim pods "
            "bound there fail FailedPrepareDynamicResources and stay Pending",
            per_gpu=False, layer="kube", needs_gpu=True,
        ),
        Fault(
            "dra-cdi-spec-empty",
            "NVIDIA's DRA plugin writes each claim's CDI devices without their device nodes "
            "(dra-driver-nvidia-gpu#1380, a fresh node): prepare succeeds and the claim pod "
            "runs without a GPU",
            per_gpu=False, layer="kube", needs_gpu=True,
        ),
        Fault(
            "pod-stuck-pending",
            "the node's kubelet never starts the pods bound to it (they stay Pending)",
            per_gpu=False, layer="kube", needs_gpu=False,
        ),
        Fault(
            "node-notready",
            "the node reports Ready=False and gets the not-ready taint",
            per_gpu=False, layer="kube", needs_gpu=False,
        ),
        Fault(
            "hot-gpu",
            "one GPU runs above its slowdown temperature, with the SW and HW thermal slowdown "
            "clock event reasons set",
            per_gpu=True,
        ),
        Fault(
            "next-kernel-no-module",
            "a newer kernel is installed (/boot/vmlinuz-RELEASE, its /lib/modules; RELEASE "
            "the newest the node's archive has headers for) without an nvidia module, as "
            "after a kernel upgrade without the headers DKMS needs: the node would boot "
            "without its driver; the nvidia_driver role builds it (needs site.yml run first)",
            per_gpu=False, layer="node",
        ),
        Fault(
            "containerd-config-rewritten",
            "/etc/containerd/config.toml replaced by the node's own `containerd config "
            "default` (no imports of conf.d, no nvidia runtime), as an installer resetting "
            "containerd's config does; containerd is not restarted",
            per_gpu=False, layer="node",
        ),
        Fault(
            "xid-79",
            "the kernel log has the driver's XID 79 for one GPU (\"GPU has fallen off the "
            "bus\"), as on a GPU that needs a reset or a reseat",
            per_gpu=True, layer="kmsg",
        ),
        Fault(
            "xid-48",
            "the kernel log has the driver's XID 48 for one GPU (an uncorrectable double-bit "
            "ECC error)",
            per_gpu=True, layer="kmsg",
        ),
        Fault(
            "xid-94-mig",
            "the kernel log has a contained ECC error (XID 94) attributed to GPU instance 1 of "
            "one GPU, in the driver's MIG form (\"PCI:... GPU-I:01\")",
            per_gpu=True, layer="kmsg",
        ),
        Fault(
            "xid-95-mig",
            "the kernel log has an uncontained ECC error (XID 95, \"RST: Yes\") for one GPU "
            "(use it on a MIG GPU: uncontained errors are not attributed to an instance)",
            per_gpu=True, layer="kmsg",
        ),
        Fault(
            "xid-storm",
            "a storm: 5000 records of the same XID 95 for one GPU in the kernel log",
            per_gpu=True, layer="kmsg",
        ),
        Fault(
            "gpu-reset",
            "one GPU was reset and came back: the kernel log gets the record a reset tool "
            "writes (\"GPU reset executed: GPU-..., success: true\"; the driver prints none) "
            "and the GPU's gpu-lost and row-remap-pending faults go; its XID records stay. "
            "Set it again for another reset after a new fault (clear it first)",
            per_gpu=True, layer="kmsg",
        ),
        Fault(
            "fallen-off-bus",
            "the kernel log has the driver's \"GPU ... has fallen off the bus\" line for one "
            "GPU, with no XID line beside it (older drivers, gpud PR 1209)",
            per_gpu=True, layer="kmsg",
        ),
    )
}


def get(name: str) -> Fault:
    try:
        return FAULTS[name]
    except KeyError:
        known = ", ".join(FAULTS)
        raise GpuprovError(f"unknown fault {name!r}; known faults: {known}") from None
