"""Node probe report -> the node labels gpuprov owns. The one label computation.

Used by the gpu_node_labels role (through plugins/filter/gpu_node_labels.py) to label nodes,
and by `gpuprov verify` (check k8s.labels) to detect drift. Standard library +
gpuprov.nvidia.hardware.

Labels (every value a string, as Kubernetes wants):

    <series key> (default "gputype")   lower-case model designation from gpuprov.nvidia.hardware
                                       (k80, p100, v100, t4, a100, h100, ...). A node mixing
                                       models gets the sorted distinct designations joined with
                                       "-" ("p100-v100"), so that `nodeSelector: {gputype: v100}`
                                       never lands a pod on a node that may hand it a P100.
    nvidia.com/gpu.present             "true" when the node has an NVIDIA GPU (on PCI or in NVML)
    nvidia.com/gpu.product             NVML name, sanitised as GFD does ("Tesla-P100-PCIE-16GB")
    nvidia.com/gpu.family              GFD's family of the compute capability ("pascal")
    nvidia.com/gpu.count               GPUs of that product
    nvidia.com/gpu.memory              its memory in MiB (NVML total // 2**20)
    nvidia.com/gpu.compute.major/minor its compute capability
    nvidia.com/cuda.driver-version.major/minor/revision/full     NVML driver version
    nvidia.com/cuda.runtime-version.major/minor/full             NVML CUDA driver version

The nvidia.com/ keys follow NVIDIA GPU Feature Discovery (GFD, NVIDIA/k8s-device-plugin
internal/lm: resource.go, nvml.go, mig-strategy.go of v0.20.0, checked 2026-11 against the
tags' git history), so workloads written for GFD's labels select gpuprov's nodes. What GFD's
label code changed from v0.17.0 to v0.20.0, and gpuprov with it: 8.9 became ada-lovelace
(v0.17.1), 10 and 12 blackwell (v0.17.2), 13 rubin (v0.20.0: the only label change of
0.18-0.20); gpu.memory is MiB (v0.17.2 renamed it, the value was MiB before) and is left out
where NVML cannot read it (v0.17.4); gpu.imex-domain was dropped (v0.17.1; gpuprov never set
it); gpu.mode may be "unknown" (v0.18.0; not a gpuprov key); v0.19.0 changed only how labels
are delivered (NodeFeature API by default). Deviations, on purpose:

- Mixed models: GFD labels product/count/memory/family from whichever model its Go map
  iteration happens to end with (non-deterministic). gpuprov labels the model with the most
  GPUs (ties: the one holding the lowest NVML index), and count is that model's count, as in
  GFD.
- Time-slicing: GFD appends "-SHARED" to the product when replicas > 1 (unless renamed) and
  sets nvidia.com/gpu.replicas / gpu.sharing-strategy. gpuprov sets neither; the product is
  the plain name.
- MIG (mig_strategy, the device plugin's nvidia_device_plugin_mig_strategy), as GFD's
  mig-strategy.go and resource.go label it: nothing for "none"; else nvidia.com/mig.strategy,
  and for "mixed" per MIG profile P ("+" written "."): nvidia.com/mig-P.product
  ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"), .count, .memory (MB), .multiprocessors,
  .slices.gi, .slices.ci, .engines.copy|decoder|encoder|jpeg|ofa (nvmlDeviceGetAttributes of
  the MIG device). For "single", where every GPU has MIG on and devices of one profile, the
  same values under nvidia.com/gpu. (product with the "-MIG-P" suffix, count the MIG devices);
  any other node gets GFD's invalid set: product "<model>-MIG-INVALID", count 0, memory 0.
  The .replicas keys GFD adds (0 for MIG-enabled GPUs, 1 for MIG resources) are not set, as
  for whole GPUs.
- Not set (GFD's alone, never touched by gpuprov): nvidia.com/gpu.replicas,
  gpu.sharing-strategy, mig.capable, mps.capable, gpu.mode, gpu.machine, the deprecated
  nvidia.com/cuda.driver.* / cuda.runtime.* keys, gfd.timestamp. nvidia.com/mig.config and
  mig.config.state are the MIG stage's (mig-manager's keys).
- nvidia.com/gpu.present is not GFD's: NFD/the GPU Operator set it. gpuprov sets it so the
  device plugin DaemonSet can select GPU nodes without NFD.
- Without NVML (no driver yet) GFD labels nothing. gpuprov labels what PCI and its hardware
  table know: present, product (the table's NVML name), family, count, compute.major/minor,
  and the series; memory and the driver/CUDA versions are left out.
- GPUs whose NVML handle fails (lost, fallen off the bus) are not counted; GFD would fail.
- Values longer than Kubernetes' 63 characters are cut (GFD would be refused by the API).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpuprov.nvidia import hardware

DEFAULT_SERIES_KEY = "gputype"

PRESENT = "nvidia.com/gpu.present"
PRODUCT = "nvidia.com/gpu.product"
FAMILY = "nvidia.com/gpu.family"
COUNT = "nvidia.com/gpu.count"
MEMORY = "nvidia.com/gpu.memory"
COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
DRIVER_MAJOR = "nvidia.com/cuda.driver-version.major"
DRIVER_MINOR = "nvidia.com/cuda.driver-version.minor"
DRIVER_REVISION = "nvidia.com/cuda.driver-version.revision"
DRIVER_FULL = "nvidia.com/cuda.driver-version.full"
RUNTIME_MAJOR = "nvidia.com/cuda.runtime-version.major"
RUNTIME_MINOR = "nvidia.com/cuda.runtime-version.minor"
RUNTIME_FULL = "nvidia.com/cuda.runtime-version.full"

# Which of NVIDIA's allocators runs on a node (gpu_allocation, gpuprov/gpu_allocation.py), with
# the GPU Operator's keys so that a node reads the same either way: its device-plugin DaemonSet
# is left out by deploy.device-plugin=false, its DRA kubelet plugin selects
# deploy.dra-driver=true (NVIDIA/gpu-operator v26.7.0 manifests/state-dra-driver/
# 0500_daemonset.yaml and controllers/state_manager.go, read 2026-11-26). gpu_mig pauses the
# device plugin with the first key too.
DEPLOY_DEVICE_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
DEPLOY_DRA_DRIVER = "nvidia.com/gpu.deploy.dra-driver"


def allocation_labels(mode: str) -> dict[str, str | None]:
    """The deploy labels of a node in this allocation mode ("device-plugin" | "dra"): the
    device plugin's key is set to "false" on a DRA node and removed (None) on a device-plugin
    node, where the DaemonSet runs without it; the DRA key is set only on a DRA node."""
    if mode == "dra":
        return {DEPLOY_DEVICE_PLUGIN: "false", DEPLOY_DRA_DRIVER: "true"}
    if mode == "device-plugin":
        return {DEPLOY_DEVICE_PLUGIN: None, DEPLOY_DRA_DRIVER: None}
    raise ValueError(f"unknown GPU allocation mode {mode!r}")


# The GFD-compatible keys gpuprov sets and therefore owns (removes when stale).
GFD_KEYS: tuple[str, ...] = (
    PRESENT, PRODUCT, FAMILY, COUNT, MEMORY, COMPUTE_MAJOR, COMPUTE_MINOR,
    DRIVER_MAJOR, DRIVER_MINOR, DRIVER_REVISION, DRIVER_FULL,
    RUNTIME_MAJOR, RUNTIME_MINOR, RUNTIME_FULL,
)

MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_STRATEGIES = ("none", "single", "mixed")
# A MIG device's attributes as GFD labels them (nvml-mig-device.go GetAttributes), and where
# the probe has each (gpuprov/node/probe/nvml.py _mig).
_MIG_ATTRIBUTES = (
    ("memory", ("memory_mb",)), ("multiprocessors", ("multiprocessors",)),
    ("slices.gi", ("gpu_instance_slices",)), ("slices.ci", ("compute_instance_slices",)),
    ("engines.copy", ("engines", "copy")), ("engines.decoder", ("engines", "decoder")),
    ("engines.encoder", ("engines", "encoder")), ("engines.jpeg", ("engines", "jpeg")),
    ("engines.ofa", ("engines", "ofa")),
)
# Keys of MIG resources under mixed ("nvidia.com/mig-1g.10gb.count") and the attribute keys
# single adds to nvidia.com/gpu.
_MIG_KEY = re.compile(r"^nvidia\.com/mig-\d+g\.[0-9a-z.]+\.(?:product|count|"
                      + "|".join(re.escape(a) for a, _ in _MIG_ATTRIBUTES) + r")$")
_SINGLE_KEYS = tuple(f"nvidia.com/gpu.{a}" for a, _ in _MIG_ATTRIBUTES if a != "memory")

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_KEY_RE = re.compile(rf"^(?:(?P<prefix>{_DNS_SUBDOMAIN})/)?(?P<name>{_NAME})$")
_VALUE_MAX = 63


def validate_series_key(key: Any) -> str:
    """The series label key, checked: a Kubernetes label key that is not one of GFD's."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"the series label key must be a non-empty string, got {key!r}")
    match = _KEY_RE.match(key)
    if (match is None or len(match.group("name")) > 63
            or len(match.group("prefix") or "") > 253):
        raise ValueError(f"{key!r} is not a valid Kubernetes label key ([prefix/]name, name "
                         "up to 63 characters of [A-Za-z0-9-_.], starting and ending "
                         "alphanumeric)")
    if key in GFD_KEYS:
        raise ValueError(f"the series label key {key!r} is one of the GFD keys gpuprov sets; "
                         f"choose another (default {DEFAULT_SERIES_KEY!r})")
    return key


def owned_keys(series_key: str = DEFAULT_SERIES_KEY) -> frozenset[str]:
    """Every fixed label key gpuprov sets, and may therefore remove when it no longer applies;
    is_owned() also takes the MIG resources' keys, which are named by profile."""
    return frozenset((validate_series_key(series_key), *GFD_KEYS, MIG_STRATEGY, *_SINGLE_KEYS))


def is_owned(key: str, series_key: str = DEFAULT_SERIES_KEY) -> bool:
    return key in owned_keys(series_key) or bool(_MIG_KEY.match(key))


def validate_mig_strategy(strategy: Any) -> str:
    if strategy not in MIG_STRATEGIES:
        raise ValueError(f"the MIG strategy must be one of {', '.join(MIG_STRATEGIES)}, not "
                         f"{strategy!r} (nvidia_device_plugin_mig_strategy)")
    return str(strategy)


def gfd_family(major: int, minor: int) -> str:
    """GFD's getArchFamily (internal/lm/resource.go of v0.20.0: 13 is rubin, added after
    v0.17): the family name of a CUDA compute capability."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper",
            10: "blackwell", 12: "blackwell", 13: "rubin"}.get(major, "undefined")


def sanitise_value(text: str) -> str:
    """GFD's sanitise(): drop characters outside [A-Za-z0-9-_. ], join the words with "-";
    then cut to a valid label value (63 characters, alphanumeric at both ends)."""
    words = re.sub(r"[^A-Za-z0-9\-_. ]", "", text).split()
    value = "-".join(words)[:_VALUE_MAX]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def _compute_capability(text: Any) -> tuple[int, int] | None:
    match = re.fullmatch(r"(\d+)\.(\d+)", str(text or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _hex(text: Any) -> int | None:
    try:
        return int(str(text).rsplit(":", 1)[-1], 16)
    except (TypeError, ValueError):
        return None


def _model(pci_id: Any, subsystem_id: Any) -> hardware.GpuModel | None:
    device = _hex(pci_id)
    if device is None or not str(pci_id).lower().startswith("10de:"):
        return None
    return hardware.lookup(device, _hex(subsystem_id)) or hardware.lookup(device)


class _Gpu:
    """One GPU as the labels need it, from NVML or from PCI + the hardware table."""

    def __init__(self, index: int, name: str | None, cc: tuple[int, int] | None,
                 memory_mib: int | None, series: str | None, architecture: str | None) -> None:
        self.index = index
        self.name = name
        self.cc = cc
        self.memory_mib = memory_mib
        self.series = series
        self.architecture = architecture


def _nvml_gpus(nvml: Mapping[str, Any]) -> list[_Gpu]:
    gpus = []
    for gpu in nvml.get("gpus") or []:
        if not isinstance(gpu, Mapping) or gpu.get("error") or not gpu.get("name"):
            continue  # its handle failed: NVML cannot use it, the device plugin will not either
        model = _model(gpu.get("pci_device_id"), gpu.get("pci_subsystem_id"))
        total = (gpu.get("memory") or {}).get("total")
        gpus.append(_Gpu(
            index=int(gpu.get("index") or 0),
            name=str(gpu["name"]),
            cc=_compute_capability(gpu.get("compute_capability"))
            or _compute_capability(model.compute_capability if model else None),
            memory_mib=int(total) // (1 << 20) if isinstance(total, int) and total else None,
            series=model.series if model else None,
            architecture=gpu.get("architecture") or (model.architecture if model else None),
        ))
    return gpus


def _pci_gpus(pci: Iterable[Any]) -> list[_Gpu]:
    gpus = []
    for index, device in enumerate(pci):
        if not isinstance(device, Mapping):
            continue
        found = device.get("classification") or {}
        model = _model(device.get("device_id"), device.get("subsystem_id"))
        gpus.append(_Gpu(
            index=index,
            name=found.get("name") or (model.name if model else None),
            cc=_compute_capability(found.get("compute_capability")
                                   or (model.compute_capability if model else None)),
            memory_mib=None,
            series=found.get("series") or (model.series if model else None),
            architecture=found.get("architecture") or (model.architecture if model else None),
        ))
    return gpus


def _primary(gpus: list[_Gpu]) -> tuple[_Gpu, int] | None:
    """The model labelled by the GFD keys: most GPUs, then the lowest index; and its count."""
    named = [g for g in gpus if g.name]
    if not named:
        return None
    counts: dict[str, int] = {}
    for gpu in named:
        counts[gpu.name] = counts.get(gpu.name, 0) + 1
    first = min(named, key=lambda g: (-counts[g.name], g.index))
    return first, counts[first.name]


def _version_labels(nvml: Mapping[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = {}
    driver = nvml.get("driver_version")
    parts = str(driver).split(".") if driver else []
    if 2 <= len(parts) <= 3 and all(parts):  # GFD: "X.Y[.Z]", anything else is an error
        labels[DRIVER_MAJOR] = parts[0]
        labels[DRIVER_MINOR] = parts[1]
        labels[DRIVER_REVISION] = parts[2] if len(parts) > 2 else ""
        labels[DRIVER_FULL] = str(driver)
    cuda = nvml.get("cuda_driver_version_int")
    if isinstance(cuda, int) and cuda > 0:
        major, minor = cuda // 1000, (cuda % 1000) // 10  # as NVML's NVML_CUDA_DRIVER_VERSION_*
        labels[RUNTIME_MAJOR] = str(major)
        labels[RUNTIME_MINOR] = str(minor)
        labels[RUNTIME_FULL] = f"{major}.{minor}"
    return labels


def _mig_attribute(device: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = device
    for part in path:
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _mig_resources(nvml: Mapping[str, Any]) -> dict[str, tuple[str, Mapping[str, Any], int]]:
    """profile -> (parent GPU name, first MIG device, count) over the node's MIG devices,
    as GFD groups them (its name: the profile with "+" written ".")."""
    found: dict[str, tuple[str, Mapping[str, Any], int]] = {}
    for gpu in nvml.get("gpus") or []:
        if not isinstance(gpu, Mapping) or gpu.get("error"):
            continue
        for device in (gpu.get("mig") or {}).get("devices") or []:
            profile = str(device.get("profile") or "").replace("+", ".")
            if not profile:
                continue
            name, first, count = found.get(profile, (str(gpu.get("name")), device, 0))
            found[profile] = (name, first, count + 1)
    return found


def _mig_resource_labels(prefix: str, name: str, profile: str, device: Mapping[str, Any],
                         count: int) -> dict[str, str]:
    labels = {f"{prefix}.product": sanitise_value(f"{name}-MIG-{profile}"),
              f"{prefix}.count": str(count)}
    for suffix, path in _MIG_ATTRIBUTES:
        value = _mig_attribute(device, path)
        if value is not None:
            labels[f"{prefix}.{suffix}"] = str(value)
    return labels


def mig_labels(nvml: Mapping[str, Any], strategy: str) -> dict[str, str]:
    """GFD's MIG labels for the strategy (see the module's docstring); they replace the
    whole-GPU product, count and memory under "single"."""
    if strategy == "none":
        return {}
    labels = {MIG_STRATEGY: strategy}
    resources = _mig_resources(nvml)
    if strategy == "mixed":
        for profile, (name, device, count) in sorted(resources.items()):
            labels.update(_mig_resource_labels(f"nvidia.com/mig-{profile}", name, profile,
                                               device, count))
        return labels
    gpus = [g for g in nvml.get("gpus") or [] if isinstance(g, Mapping) and not g.get("error")]
    enabled = [g for g in gpus if (g.get("mig") or {}).get("current")]
    if not enabled:
        return labels  # no MIG: single is none
    if (any(not (g["mig"].get("devices")) for g in enabled) or len(enabled) != len(gpus)
            or len(resources) != 1):
        return {**labels, PRODUCT: sanitise_value(f"{enabled[0].get('name')}-MIG-INVALID"),
                COUNT: "0", MEMORY: "0"}
    ((profile, (name, device, count)),) = resources.items()
    return {**labels, **_mig_resource_labels("nvidia.com/gpu", name, profile, device, count)}


def compute_labels(report: Mapping[str, Any], series_key: str = DEFAULT_SERIES_KEY,
                   mig_strategy: str = "none") -> dict[str, str]:
    """The labels gpuprov puts on the node the probe report describes ({} without GPUs)."""
    validate_series_key(series_key)
    validate_mig_strategy(mig_strategy)
    nvml = report.get("nvml") or {}
    pci = report.get("pci") or []
    gpus = _nvml_gpus(nvml) if nvml.get("available") else []
    from_nvml = bool(gpus)
    if not gpus:
        gpus = _pci_gpus(pci)
    if not gpus and not pci:
        return {}
    labels: dict[str, str] = {PRESENT: "true"}
    series = sorted({g.series for g in gpus if g.series})
    if series:
        labels[series_key] = sanitise_value("-".join(series))
    primary = _primary(gpus)
    if primary is not None:
        gpu, count = primary
        labels[PRODUCT] = sanitise_value(gpu.name or "")
        labels[COUNT] = str(count)
        if gpu.memory_mib:
            labels[MEMORY] = str(gpu.memory_mib)
        if gpu.cc is not None and gpu.cc[0] > 0:
            labels[FAMILY] = gfd_family(*gpu.cc)
            labels[COMPUTE_MAJOR] = str(gpu.cc[0])
            labels[COMPUTE_MINOR] = str(gpu.cc[1])
    if from_nvml:
        labels.update(_version_labels(nvml))
        labels.update(mig_labels(nvml, mig_strategy))
    return {k: v for k, v in labels.items() if v or k == DRIVER_REVISION}


def diff_labels(actual: Mapping[str, Any], expected: Mapping[str, str],
                series_key: str = DEFAULT_SERIES_KEY) -> dict[str, dict[str, str | None]]:
    """Owned keys whose value on the node differs from the computed one (missing, stale,
    or changed): {key: {"actual": value | None, "expected": value | None}}. Keys gpuprov
    does not own are never reported."""
    diff = {}
    keys = owned_keys(series_key) | {k for k in [*actual, *expected] if is_owned(k, series_key)}
    for key in sorted(keys):
        have, want = actual.get(key), expected.get(key)
        if have != want:
            diff[key] = {"actual": None if have is None else str(have), "expected": want}
    return diff


def label_patch(actual: Mapping[str, Any], expected: Mapping[str, str],
                series_key: str = DEFAULT_SERIES_KEY) -> dict[str, str | None]:
    """The metadata.labels of a JSON merge patch that makes the node's owned labels
    `expected`: changed values, and null for owned keys to remove. {} when nothing to do."""
    return {key: d["expected"] for key, d in diff_labels(actual, expected, series_key).items()}
