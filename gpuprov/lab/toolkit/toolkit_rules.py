"""SIMULATION: which GPUs NVIDIA's container runtime gives a container, by NVIDIA's rules.

Test infrastructure (gpuprov lab), never imported by production code. The lab's emulated
kubelet calls `container_gpus` where a real node's containerd would start the container
through NVIDIA's runtime (or through plain runc: then no GPU at all), with what that runtime
would find: the toolkit's config.toml on the node (as gpuprov's probe reads it), the
container's environment (the image's, then the pod's, then the device plugin's Allocate
answer), its mounts, CDI devices and annotations, and whether it is privileged.

The rules follow NVIDIA/nvidia-container-toolkit (read at v1.17/v1.18):
- internal/config/image/cuda_image.go, `CUDA.VisibleDevices`: when
  accept-nvidia-visible-devices-as-volume-mounts is on, device requests come from mounts first
  (`DevicesFromMounts`: a mount whose source is /dev/null and whose destination is under
  /var/run/nvidia-container-devices/ names the device by the rest of its path); only when
  there is none, from NVIDIA_VISIBLE_DEVICES, and those are honoured only for a privileged
  container or when accept-nvidia-visible-devices-envvar-when-unprivileged is on.
- same file, `DevicesFromEnvvar`: unset with a legacy CUDA image (CUDA_VERSION set,
  NVIDIA_REQUIRE_CUDA not) means "all"; unset, empty or containing "void" means no request;
  "none" is a request for no GPU (the driver's files only); else a comma list, de-duplicated.
- internal/config/image/privileged.go / cmd/nvidia-container-runtime-hook `isPrivileged`:
  privileged means CAP_SYS_ADMIN is in the process's bounding capability set.
- CDI: devices named `<kind>=<index|uuid|all>` (CDI_KINDS) reach the container through the CRI
  (the device plugin's `cdi-cri` strategy) or `cdi.k8s.io/*` annotations (`cdi-annotations`);
  a CDI-enabled containerd resolves both itself, and they are not gated by privilege
  (NVIDIA's runtime reads the annotations only in mode `cdi`: internal/modifier/cdi.go).
- MIG devices (libnvidia-container src/cli/common.c `select_devices`, `select_mig_device`):
  a MIG device is named by its UUID ("MIG-...") or "<gpu index>:<mig index>" (its index in
  the MIG devices NVML enumerates under that GPU), and selecting it selects its parent GPU
  too; "all" selects every GPU and every MIG device. The container gets the parent GPU's
  device node and the /dev/nvidia-caps access nodes of the MIG device's GPU and compute
  instance (NVIDIA's MIG user guide, "Device Nodes and Capabilities"), so NVML in it shows
  the parent GPU with that MIG device only. `container_gpus` returns the MIG device's UUID;
  the lab's simulated NVML reads it so (GPUPROV_SIM_CONTAINER_GPUS, simnvml.c
  apply_visible_devices). Simplified: a GPU named itself (index or UUID) shows its MIG
  devices too, where the real toolkit selects the GPU alone.
- A device name that is no index, UUID, MIG index or "all" fails the container
  (libnvidia-container src/cli/common.c `select_devices`): e.g. the plugin's volume-mounts answer
  (NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices) on a node whose toolkit does
  not accept mounts but does accept the variable.

What it does not do: no device nodes, libraries or hooks are injected (the lab's simulated
NVML reads GPUPROV_SIM_CONTAINER_GPUS instead, SIMULATION.md); CDI names are resolved by the
GPU they name without reading the spec file, and containerd's enable_cdi is not checked (the
lab's containerd configs are issue 18's); no IMEX devices; NVIDIA_MIG_CONFIG_DEVICES /
NVIDIA_MIG_MONITOR_DEVICES (the MIG management caps), NVIDIA_REQUIRE_* checks and driver
capabilities are not simulated.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

VOLUME_MOUNT_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNT_SOURCE = "/dev/null"
# CDI kinds naming GPUs: nvidia-ctk's spec (nvidia.com/gpu, the runtime's default-kind), the
# device plugin's own spec (k8s.device-plugin.nvidia.com/gpu, internal/cdi/cdi.go) and the
# runtime's just-in-time one (runtime.nvidia.com/gpu, toolkit >= 1.18 mode jit-cdi).
CDI_KINDS = ("nvidia.com/gpu", "k8s.device-plugin.nvidia.com/gpu", "runtime.nvidia.com/gpu")
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
ENVVAR_UNPRIVILEGED = "accept-nvidia-visible-devices-envvar-when-unprivileged"
AS_VOLUME_MOUNTS = "accept-nvidia-visible-devices-as-volume-mounts"
# The variable(s) a Docker Swarm task's assigned GPUs come in (api/config/v1/config.go
# SwarmResource; a comma list): no default, so absent from TOOLKIT_DEFAULTS.
SWARM_RESOURCE = "swarm-resource"
# What the toolkit assumes when its config.toml lacks a key. gpuprov.node.probe.runtime has the
# same table; this module also runs on the lab's nodes (the runtime stand-in), where gpuprov
# is not installed, so it keeps its own copy and a unit test keeps the two equal.
TOOLKIT_DEFAULTS = {ENVVAR_UNPRIVILEGED: True, AS_VOLUME_MOUNTS: False}
# The capabilities containerd gives a container that is not privileged
# (containerd/containerd pkg/oci/spec.go defaultUnixCaps... `oci.WithDefaultUnixDevices`).
DEFAULT_CAPABILITIES = frozenset({
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
})


@dataclass(frozen=True)
class Mount:
    source: str
    destination: str


@dataclass(frozen=True)
class Container:
    """What the runtime sees of a container (the parts of the OCI spec that matter here)."""

    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    privileged: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()  # injected by the CRI runtime itself (cdi-cri)


def capabilities(security_context: Mapping | None) -> frozenset[str]:
    """The bounding set containerd's CRI gives a container that is not privileged (a
    privileged one gets every capability): the defaults, less `drop` (ALL: every one), plus
    `add`, which containerd applies after dropping."""
    caps = (security_context or {}).get("capabilities") or {}

    def names(items: Iterable[str]) -> set[str]:
        return {n if n.startswith("CAP_") else f"CAP_{n}" for n in (s.upper() for s in items)}

    drop, add = names(caps.get("drop") or []), names(caps.get("add") or [])
    kept = set() if "CAP_ALL" in drop else set(DEFAULT_CAPABILITIES) - drop
    return frozenset(kept | add)


def is_privileged(security_context: Mapping | None) -> bool:
    """CAP_SYS_ADMIN in the bounding set, as NVIDIA's runtime decides it."""
    ctx = security_context or {}
    return bool(ctx.get("privileged")) or "CAP_SYS_ADMIN" in capabilities(ctx)


def _split(value: str) -> list[str]:
    out: list[str] = []
    for part in value.split(","):
        part = part.strip()
        if part and part not in out:
            out.append(part)
    return out


def devices_from_envvar(env: Mapping[str, str],
                        preferred: Sequence[str] = ()) -> list[str] | None:
    """NVIDIA_VISIBLE_DEVICES as a device request: None for no request, [] for "none"
    (driver files, no GPU). "void" anywhere wins; else the first "all" or "none" decides.
    `preferred`: the toolkit's swarm-resource variables; where the container has any of them,
    their values (joined) are the request instead (internal/config/image/cuda_image.go
    `visibleEnvVars`, `devicesFromEnvvars`)."""
    names = [name for name in preferred if name in env] or ["NVIDIA_VISIBLE_DEVICES"]
    values = [env[name] for name in names if name in env]
    value = ",".join(values) if values else None
    if value is None:
        legacy = bool(env.get("CUDA_VERSION")) and not env.get("NVIDIA_REQUIRE_CUDA")
        return ["all"] if legacy else None
    devices = _split(value)
    if not devices or "void" in devices:
        return None
    for device in devices:
        if device in ("all", "none"):
            return [] if device == "none" else ["all"]
    return devices


def devices_from_mounts(mounts: Iterable[Mount]) -> list[str]:
    root = posixpath.normpath(VOLUME_MOUNT_ROOT)
    out: list[str] = []
    for m in mounts:
        if posixpath.normpath(m.source) != VOLUME_MOUNT_SOURCE:
            continue
        dest = posixpath.normpath(m.destination)
        if not dest.startswith(root + "/"):
            continue
        device = dest[len(root):].strip("/")
        if device and device not in out:
            out.append(device)
    return out


def _cdi_names(names: Iterable[str]) -> list[str]:
    out = []
    for name in names:
        kind, _, device = name.partition("=")
        if kind in CDI_KINDS and device and device not in out:
            out.append(device)
    return out


def requested_devices(container: Container, settings: Mapping[str, bool]) -> list[str]:
    """The device names NVIDIA's runtime injects (indices, UUIDs or "all"), [] for none."""
    config = {**TOOLKIT_DEFAULTS, **settings}
    devices = _cdi_names(container.cdi_devices)
    annotated = [v for k, v in container.annotations.items() if k.startswith(CDI_ANNOTATION_PREFIX)]
    devices += [d for d in _cdi_names(n for v in annotated for n in _split(v)) if d not in devices]
    if config[AS_VOLUME_MOUNTS]:
        mounted = devices_from_mounts(container.mounts)
        if mounted:
            return devices + [d for d in mounted if d not in devices]
    requested = devices_from_envvar(container.env,
                                    _split(str(settings.get(SWARM_RESOURCE) or ""))) or []
    if requested and not (container.privileged or config[ENVVAR_UNPRIVILEGED]):
        requested = []  # "Ignoring devices specified in NVIDIA_VISIBLE_DEVICES"
    return devices + [d for d in requested if d not in devices]


def settings_from_config(doc: Mapping) -> dict:
    """The keys of the toolkit's config.toml (parsed) that decide who gets GPUs: the boolean
    ones of TOOLKIT_DEFAULTS (absent: NVIDIA's defaults) and swarm-resource where set."""
    settings: dict = {key: doc[key] for key in TOOLKIT_DEFAULTS if isinstance(doc.get(key), bool)}
    if isinstance(doc.get(SWARM_RESOURCE), str):
        settings[SWARM_RESOURCE] = doc[SWARM_RESOURCE]
    return settings


def container_from_spec(spec: Mapping) -> Container:
    """What NVIDIA's runtime and hook read of an OCI spec (config.json): the process's
    environment (a later entry wins, as Go's map does), its mounts, whether CAP_SYS_ADMIN is in
    its bounding set (privileged), and its annotations."""
    process = spec.get("process") or {}
    env = dict(item.split("=", 1) for item in process.get("env") or [] if "=" in item)
    mounts = tuple(Mount(m.get("source", ""), m.get("destination", ""))
                   for m in spec.get("mounts") or [])
    bounding = ((process.get("capabilities") or {}).get("bounding")) or []
    return Container(env, mounts, "CAP_SYS_ADMIN" in bounding, spec.get("annotations") or {})


class UnknownDevice(ValueError):
    """A requested device names no GPU: NVIDIA's runtime refuses to start the container
    (libnvidia-container src/cli/common.c select_devices: "<name>: unknown device")."""


def container_gpus(container: Container, settings: Mapping[str, bool], node_gpus: list[str],
                   nvidia_runtime: bool,
                   mig_devices: Mapping[str, Sequence[tuple[int, str]]] | None = None
                   ) -> list[str]:
    """The node's GPUs (UUIDs, in node order) that the container gets, each followed by the
    MIG devices (UUIDs) it gets of that GPU; `mig_devices`: GPU UUID -> [(MIG index, MIG
    UUID)] of the GPUs with MIG on. Plain runc gives none by itself; CDI devices come from the
    CRI runtime whatever the OCI runtime is."""
    cdi = _cdi_names(container.cdi_devices)
    names = requested_devices(container, settings) if nvidia_runtime else cdi
    if "all" in names:
        return list(node_gpus)
    migs = mig_devices or {}
    by_index = {f"{i}:{j}": uuid for i, gpu in enumerate(node_gpus)
                for j, uuid in migs.get(gpu, ())}
    mig_uuids = set(by_index.values())
    chosen = set()
    for name in names:
        if name.isdigit() and int(name) < len(node_gpus):
            chosen.add(node_gpus[int(name)])
        elif name in node_gpus or name in mig_uuids:
            chosen.add(name)
        elif name in by_index:
            chosen.add(by_index[name])
        else:
            raise UnknownDevice(f"nvidia-container-cli: device error: {name}: unknown device")
    out = []
    for gpu in node_gpus:
        out += [gpu] if gpu in chosen else []
        out += [uuid for _, uuid in migs.get(gpu, ()) if uuid in chosen]
    return out
