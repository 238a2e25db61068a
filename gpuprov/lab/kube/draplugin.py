"""The simulated NVIDIA DRA kubelet plugin (gpu-kubelet-plugin of
kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1; SIMULATION: lab test infrastructure, never
imported by production code). Its pod runs no process, like the simulated device plugin; the
emulated kubelet (kubelet.py) calls what is here:

- when its pod starts on a node, it publishes the node's ResourceSlice from the node's NVML,
  read once (nvlib.go enumerates the devices once at start): driver `gpu.nvidia.com`, pool =
  the node's name, one device per full GPU named `gpu-<minor>` (deviceinfo.go CanonicalName),
  with the attributes of deviceinfo.go `Attributes` as nvlib.go `getGpuInfo` reads them
  (go-nvlib's names for brand and architecture, versions through Masterminds semver, the PCI
  bus ID as go-nvlib's GetPCIBusID writes it) and the capacity `memory` of partitions.go
  `fullGpuCapacity` (bytes as a BinarySI quantity);
- prepare: one CDI spec per claim, /var/run/cdi/k8s.gpu.nvidia.com-claim_<claimUID>.yaml, with
  a device `<claimUID>-<device name>` per allocated device, and the CDI IDs
  `k8s.gpu.nvidia.com/claim=<claimUID>-<device name>` (cdi.go CreateClaimSpecFile,
  GetClaimDeviceName); unprepare deletes the file (DeleteClaimSpecFile).

- a GPU with MIG on is published as its MIG devices only, none of them when it has none
  (nvlib.go GetPerGpuAllocatableDevices, getMigDevices): each named
  `gpu-<parent minor>-mig-<profile, dots removed, RFC 1123>-<GI profile ID>-<placement start>`
  (mig.go ToCanonicalName), with the parent's attributes plus `parentUUID` and `profile`
  (mig.go CommonAttributesMig) and the GPU instance profile's capacities (CommonCapacitiesMig:
  engine counts, memory as the profile's MiB in bytes) and a `memorySlice<i>` of 1 per memory
  slice of its placement (deviceinfo.go MigDeviceInfo.GetDevice); a MIG device whose compute
  instance is smaller than its GPU instance has no profile the plugin knows (getGpuInfo keeps
  only GI=CI profiles), and the plugin fails to start;

Not simulated (EMULATION.md): DynamicMIG, VFIO, time-slicing and MPS, opaque claim configs,
the checkpoint, the gRPC registration and DRA services, the pcieRoot and addressingMode
attributes, and device health.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from gpuprov.lab.kube.backend import Gpu, GpuFacts, MigDevice
from gpuprov.nvidia.hardware import GO_NVLIB_ARCHITECTURES, GO_NVLIB_BRANDS

DRIVER = "gpu.nvidia.com"
CDI_VENDOR = "k8s." + DRIVER  # cdi.go cdiVendor
CDI_CLASS = "claim"  # cdi.go cdiClaimClass
CDI_ROOT = "/var/run/cdi"

_BUS_ID_PREFIX = re.compile(r"^0000[0-9a-f]{4}:")  # go-nvlib pciBusIDPrefixRE
_BINARY_SI = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


class PluginError(Exception):
    """The plugin cannot start on this node (the real one exits with the error)."""


def semver(text: str) -> str:
    """Masterminds semver's NewVersion then String(): missing parts are 0, leading zeros go
    ("580.95.05" -> "580.95.5", "9.0" -> "9.0.0")."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise PluginError(f"invalid semantic version: {text!r}")
    parts += ["0"] * (3 - len(parts))
    return ".".join(str(int(p)) for p in parts)


def binary_si(value: int) -> str:
    """A byte count as resource.NewQuantity(v, BinarySI) writes it: the largest power of
    1024 that divides it exactly, else the plain number."""
    for suffix in reversed(_BINARY_SI[1:]):
        unit = 1024 ** (_BINARY_SI.index(suffix))
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def pci_bus_id(nvml_bus_id: str) -> str:
    """go-nvlib GetPCIBusID: lower case, the 8-digit domain cut to 4."""
    found = nvml_bus_id.lower()
    return found[4:] if _BUS_ID_PREFIX.match(found) else found


def device_name(facts: GpuFacts) -> str:
    return f"gpu-{facts.minor}"


def _facts(gpu: Gpu) -> GpuFacts:
    f = gpu.facts
    if f is None:
        raise PluginError(f"error getting GPU info for {gpu.uuid or 'a GPU'}: NVML did not "
                          "answer")
    if f.architecture not in GO_NVLIB_ARCHITECTURES:
        raise PluginError(f"error interpreting device architecture as string: "
                          f"{f.architecture}")
    if f.brand not in GO_NVLIB_BRANDS:
        raise PluginError(f"error interpreting device brand as string: {f.brand}")
    return f


def _common_attributes(f: GpuFacts) -> dict:
    """The attributes a GPU and its MIG devices share (the parent's, as getGpuInfo reads
    them)."""
    cuda = f"{f.cuda_driver_version // 1000}.{(f.cuda_driver_version % 1000) // 10}"
    return {
        "productName": {"string": f.name},
        "brand": {"string": GO_NVLIB_BRANDS[f.brand]},
        "architecture": {"string": GO_NVLIB_ARCHITECTURES[f.architecture]},
        "cudaComputeCapability": {"version": semver(f.compute_capability)},
        "driverVersion": {"version": semver(f.driver_version)},
        "cudaDriverVersion": {"version": semver(cuda)},
        "resource.kubernetes.io/pciBusID": {"string": pci_bus_id(f.pci_bus_id)},
    }


def gpu_device(gpu: Gpu) -> dict:
    """The slice's device for a full GPU."""
    f = _facts(gpu)
    return {
        "name": device_name(f),
        "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu.uuid},
                       **_common_attributes(f)},
        "capacity": {"memory": {"value": binary_si(f.memory_total)}},
    }


def rfc1123(name: str) -> str:
    """mig.go toRFC1123Compliant: lower case, anything but [a-z0-9-.] to "-", no leading or
    trailing "-", no trailing ".", at most 253 characters."""
    name = re.sub(r"[^a-z0-9-.]", "-", name.lower()).strip("-")
    return name.removesuffix(".")[:253]


def mig_device_name(parent_minor: int, mig: MigDevice) -> str:
    """mig.go MigSpecTuple.ToCanonicalName."""
    if mig.gi_profile is None or mig.placement is None:
        raise PluginError(f"error getting GPU instance info for MIG device {mig.uuid}")
    profile = rfc1123(mig.profile.replace(".", ""))
    return f"gpu-{parent_minor}-mig-{profile}-{mig.gi_profile.id}-{mig.placement[0]}"


def mig_device(gpu: Gpu, mig: MigDevice) -> dict:
    """The slice's device for a MIG device of `gpu` (deviceinfo.go MigDeviceInfo.GetDevice)."""
    f = _facts(gpu)
    # go-nvlib's profile string has a "<c>c." prefix where the compute instance is smaller
    # than its GPU instance: getGpuInfo knows no such profile (it keeps GI=CI only).
    if re.match(r"^\d+c\.", mig.profile):
        raise PluginError(f"error getting profile info for MIG device: {mig.uuid}")
    name = mig_device_name(f.minor, mig)
    p = mig.gi_profile
    assert p is not None and mig.placement is not None  # mig_device_name checked them
    capacity = {"multiprocessors": p.multiprocessors, "copyEngines": p.copy_engines,
                "decoders": p.decoders, "encoders": p.encoders, "jpegEngines": p.jpeg,
                "ofaEngines": p.ofa, "memory": p.memory_mb * 1024 * 1024}
    start, size = mig.placement
    capacity |= {f"memorySlice{i}": 1 for i in range(start, start + size)}
    return {
        "name": name,
        "attributes": {"type": {"string": "mig"}, "uuid": {"string": mig.uuid},
                       "parentUUID": {"string": gpu.uuid}, "profile": {"string": mig.profile},
                       **_common_attributes(f)},
        "capacity": {k: {"value": binary_si(v)} for k, v in capacity.items()},
    }


def gpu_devices(gpu: Gpu) -> list[dict]:
    """A GPU's devices in the slice: itself with MIG off, else its MIG devices."""
    if not gpu.mig_enabled:
        return [gpu_device(gpu)]
    return [mig_device(gpu, m) for m in gpu.mig_devices]


def node_slice(node: str, gpus: Iterable[Gpu], generation: int = 1) -> dict:
    """The node's ResourceSlice (driver.go publishResources: one slice, pool = node): each
    healthy GPU's devices (gpu_devices)."""
    devices = [d for g in gpus if g.healthy for d in gpu_devices(g)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"generateName": f"{node}-{DRIVER}-"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation,
                              "resourceSliceCount": 1},
                     "devices": devices}}


def spec_path(claim_uid: str) -> str:
    """cdi.go: GenerateTransientSpecName(vendor, class, claimUID) + ".yaml" under the CDI
    root (the CDI library's transient name: `<vendor>-<class>_<id>`)."""
    return f"{CDI_ROOT}/{CDI_VENDOR}-{CDI_CLASS}_{claim_uid}.yaml"


def cdi_device(claim_uid: str, device: str) -> str:
    """The spec's device name for an allocated device."""
    return f"{claim_uid}-{device}"


def cdi_id(claim_uid: str, device: str) -> str:
    """cdi.go GetClaimDeviceName: the fully qualified CDI device the kubelet hands the
    runtime."""
    return f"{CDI_VENDOR}/{CDI_CLASS}={cdi_device(claim_uid, device)}"


def claim_devices(claim: Mapping, gpus: Iterable[Gpu]) -> dict[str, tuple[str, str]]:
    """Device name -> (request, GPU or MIG device UUID) of the claim's results for this
    driver; PluginError for a device the node's NVML does not have."""
    gpus = list(gpus)
    by_name = {device_name(g.facts): g.uuid for g in gpus if g.facts is not None}
    by_name |= {mig_device_name(g.facts.minor, m): m.uuid for g in gpus
                if g.facts is not None and g.mig_enabled for m in g.mig_devices
                if m.gi_profile is not None and m.placement is not None}
    out: dict[str, tuple[str, str]] = {}
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices")
               or {}).get("results") or []
    for r in results:
        if r.get("driver") != DRIVER:
            continue
        if r.get("device") not in by_name:
            raise PluginError(f"allocated device {r.get('device')} not found on the node")
        out[r["device"]] = (r.get("request", ""), by_name[r["device"]])
    return out
