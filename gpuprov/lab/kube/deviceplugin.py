"""SIMULATION: NVIDIA's device plugin: the devices it serves per MIG strategy, and its Allocate
answer per DEVICE_LIST_STRATEGY.

Test infrastructure. The emulated kubelet asks this for each container that requests
nvidia.com/gpu or nvidia.com/mig-<profile>, as a real kubelet calls the plugin's Allocate
over gRPC, and turns the answer into the container's environment, mounts, annotations and CDI
devices: the container runtime (gpuprov/lab/toolkit/toolkit_rules.py) then decides from those
which GPUs and MIG devices the container really gets. Followed: NVIDIA/k8s-device-plugin
internal/plugin/server.go (`getAllocateResponse`, `updateResponseForDeviceListEnvVar`,
`updateResponseForDeviceMounts`, `updateResponseForCDI`) and api/config/v1/strategy.go (the
strategy names), v0.17-v0.20.

The plugin's settings are read from its own pod, as the plugin reads them: its config file
(CONFIG_FILE, api/config/v1: flags.plugin.deviceListStrategy, deviceIDStrategy), then its
environment, which wins where set (DEVICE_LIST_STRATEGY: comma list, default envvar;
DEVICE_ID_STRATEGY: uuid | index, default uuid). The config file is the one NVIDIA's
config-manager (cmd/config-manager/main.go) links for the node: the ConfigMap key named by the
node's label (NODE_LABEL, nvidia.com/device-plugin.config), else DEFAULT_CONFIG; a label naming
no config fails, as config-manager does.

MIG (`advertised`): the MIG strategy is read the same way (MIG_STRATEGY, else the config
file's flags.migStrategy; none | single | mixed, default none; cmd/nvidia-device-plugin/main.go
flag "mig-strategy" and validateFlags: anything else is "unknown MIG strategy" and the plugin
does not start). The resources and their devices follow internal/rm/rm.go
AddDefaultResourcesToConfig (single: every MIG device as "gpu"; mixed: one "mig-<profile>"
resource, "+" written ".", for each profile whose compute and GPU slices are equal, from
VisitMigProfiles) and internal/rm/device_map.go (buildGPUDeviceMap, buildMigDeviceMap,
assertAllMigDevicesAreValid), v0.20.0:
- none: every GPU as nvidia.com/gpu, whatever its MIG mode;
- single: GPUs with MIG off as nvidia.com/gpu, MIG devices as nvidia.com/gpu; the plugin fails
  to start (advertises nothing) where GPUs with MIG on and off are mixed ("all devices on the
  node must be configured with the same migEnabled value"), where MIG devices of more than one
  type exist ("more than one MIG device type present on node": NVIDIA compares the devices'
  NVML attributes, the emulator their profiles, which those attributes make), and where a
  GPU with MIG on has no MIG device ("device N has no MIG devices configured");
- mixed: GPUs with MIG off as nvidia.com/gpu, each MIG device as nvidia.com/mig-<profile>; a
  GPU with MIG on and no device only warns; a MIG device whose compute instance is smaller
  than its GPU instance ("1c.2g.20gb") matches no resource and the plugin fails to start
  ("MIG profile ... does not match any resource patterns").
Device IDs are the UUIDs (GPU-..., MIG-...); indices are "<gpu>" and "<gpu>:<mig slot>"
(internal/rm/nvml_devices.go newGPUDevice/newMigDevice); with DEVICE_ID_STRATEGY=index the
Allocate answer names those (server.go uniqueDeviceIDsFromAnnotatedDeviceIDs), for CDI too
(internal/cdi/cdi.go QualifiedName("gpu", id)).

Not simulated: PASS_DEVICE_SPECS (device nodes; for MIG the parent's /dev/nvidia<N> and the
/dev/nvidia-caps nodes of its GPU and compute instance, nvml_devices.go GetPaths), GDS/MOFED,
time-slicing/MPS replicas and their annotated IDs, resource renaming in the config file
(NVIDIA disables it too: DisableResourceNamingInConfig), config changes while the plugin runs
(config-manager's signal): a new plugin pod reads the config again. A GPU NVML cannot query
(the emulator's unhealthy GPU) counts as a GPU with MIG off, where the real plugin would fail
to build its device map.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import yaml

from gpuprov.lab.kube import objects
from gpuprov.lab.kube.backend import Gpu
from gpuprov.lab.toolkit import toolkit_rules
from gpuprov.nvidia import xid_catalog

ENVVAR = "envvar"
VOLUME_MOUNTS = "volume-mounts"
CDI_ANNOTATIONS = "cdi-annotations"
CDI_CRI = "cdi-cri"
STRATEGIES = (ENVVAR, VOLUME_MOUNTS, CDI_ANNOTATIONS, CDI_CRI)
DEVICE_LIST_ENVVAR = "NVIDIA_VISIBLE_DEVICES"
# The plugin's annotation key: its CDI annotation prefix + "nvidia-device-plugin_" + a
# response ID (server.go, cdiapi.UpdateAnnotations).
ANNOTATION_PLUGIN_NAME = "nvidia-device-plugin"
# The kind of the CDI spec the plugin generates for its devices (internal/cdi/cdi.go: vendor
# k8s.device-plugin.nvidia.com, class gpu), and where: /var/run/cdi/<vendor>-<class>.json
# (cdiapi.GenerateNameForSpec).
CDI_VENDOR, CDI_CLASS = "k8s.device-plugin.nvidia.com", "gpu"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
CDI_SPEC = f"/var/run/cdi/{CDI_VENDOR}-{CDI_CLASS}.json"
# The node label config-manager reads by default (cmd/config-manager DefaultConfigLabel).
CONFIG_LABEL = "nvidia.com/device-plugin.config"
# api/config/v1/consts.go MigStrategy*; the flag's default is none (main.go).
MIG_NONE, MIG_SINGLE, MIG_MIXED = "none", "single", "mixed"
MIG_STRATEGIES = (MIG_NONE, MIG_SINGLE, MIG_MIXED)
# Every resource the plugin serves is "nvidia.com/<name>" (api/config/v1/resources.go
# ResourceNamePrefix); whole GPUs are "gpu" (rm.go AddGPUResource("*", "gpu")).
RESOURCE_PREFIX = "nvidia.com/"
GPU_RESOURCE = f"{RESOURCE_PREFIX}gpu"


class AllocateError(ValueError):
    """The plugin's settings are not ones it accepts (it would fail to start)."""


@dataclass(frozen=True)
class Settings:
    strategies: tuple[str, ...] = (ENVVAR,)
    id_strategy: str = "uuid"
    mig_strategy: str = MIG_NONE
    env: Mapping[str, str] = field(default_factory=dict, compare=False)  # its container's

    @property
    def cdi(self) -> bool:
        """The plugin writes its CDI spec (internal/cdi/cdi.go New: AnyCDIEnabled)."""
        return CDI_CRI in self.strategies or CDI_ANNOTATIONS in self.strategies


@dataclass(frozen=True)
class AllocateResponse:
    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[toolkit_rules.Mount, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


def _env(container: Mapping) -> dict[str, str]:
    return {item["name"]: str(item["value"]) for item in container.get("env") or []
            if "value" in item}


def config_file(pod: Mapping, node_labels: Mapping[str, str],
                config_map: Callable[[str, str], Mapping | None]) -> dict:
    """The plugin's config file as config-manager links it for this node ({}: none);
    config_map(namespace, name) -> the ConfigMap or None."""
    spec = pod.get("spec", {})
    managers = [c for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])
                if "config-manager" in (c.get("command") or [])]
    if not managers:
        return {}
    env = _env(managers[0])
    source_dir = env.get("CONFIG_FILE_SRCDIR", "")
    mount = next((m for m in managers[0].get("volumeMounts") or []
                  if m.get("mountPath") == source_dir), None)
    volume = next((v for v in spec.get("volumes") or []
                   if mount and v.get("name") == mount.get("name")), {})
    name = (volume.get("configMap") or {}).get("name")
    data = ((config_map(pod["metadata"].get("namespace", ""), name) or {}).get("data") or {}
            if name else {})
    chosen = node_labels.get(env.get("NODE_LABEL", CONFIG_LABEL)) or env.get("DEFAULT_CONFIG")
    if not chosen and len(data) == 1:  # FALLBACK_STRATEGIES "single"
        chosen = next(iter(data))
    if chosen not in data:
        raise AllocateError(f"config-manager: specified config {chosen!r} does not exist in "
                            f"{source_dir} (ConfigMap {name}: {', '.join(sorted(data))})")
    try:
        doc = yaml.safe_load(data[chosen]) or {}
    except yaml.YAMLError as exc:
        raise AllocateError(f"unable to parse config file {chosen}: {exc}") from None
    return doc if isinstance(doc, dict) else {}


def disabled_xids(env: Mapping[str, str]) -> tuple[bool, frozenset[int], frozenset[int]]:
    """The XIDs the plugin's health check ignores, as NVIDIA's v0.20.x reads them
    (internal/rm/health.go getDisabledHealthCheckXids): its application XIDs (13, 31, 43, 45,
    68, 109) plus DP_DISABLE_HEALTHCHECKS's comma list ("all" or "xids": every XID), less
    DP_ENABLE_HEALTHCHECKS's list, which wins. Returns (all disabled, disabled, enabled)."""

    def parse(text: str) -> tuple[bool, set[int]]:
        found: set[int] = set()
        for word in text.lower().split(","):
            word = word.strip()
            if word in ("all", "xids"):
                return True, set()
            if word.isdigit():
                found.add(int(word))
        return False, found

    all_off, off = parse(env.get("DP_DISABLE_HEALTHCHECKS", ""))
    all_on, on = parse(env.get("DP_ENABLE_HEALTHCHECKS", ""))
    off |= set(xid_catalog.APP_XIDS_DEVICE_PLUGIN)
    if all_on:
        return False, frozenset(), frozenset()
    return all_off, frozenset(off - on), frozenset(on)


def xid_marks_unhealthy(xid: int, env: Mapping[str, str]) -> bool:
    """Whether the plugin marks a GPU unhealthy for this critical XID (health.go IsDisabled)."""
    all_off, off, on = disabled_xids(env)
    if xid in on:
        return True
    return not all_off and xid not in off


def settings_from_pod(pod: Mapping, node_labels: Mapping[str, str] | None = None,
                      config_map: Callable[[str, str], Mapping | None] | None = None) -> Settings:
    env = _env(objects.device_plugin_container(pod))
    all_flags = config_file(pod, node_labels or {}, config_map or (lambda _ns, _name: None)
                            ).get("flags") or {}
    flags = all_flags.get("plugin") or {}
    listed = flags.get("deviceListStrategy", ENVVAR)
    listed = ",".join(listed) if isinstance(listed, list) else str(listed)
    listed = env.get("DEVICE_LIST_STRATEGY", listed)
    strategies = tuple(s.strip() for s in listed.split(",") if s.strip())
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise AllocateError(f"invalid DEVICE_LIST_STRATEGY {listed!r}")
    id_strategy = env.get("DEVICE_ID_STRATEGY", str(flags.get("deviceIDStrategy", "uuid")))
    if id_strategy not in ("uuid", "index"):
        raise AllocateError(f"invalid DEVICE_ID_STRATEGY {id_strategy!r}")
    mig_strategy = env.get("MIG_STRATEGY", str(all_flags.get("migStrategy", MIG_NONE)))
    if mig_strategy not in MIG_STRATEGIES:
        raise AllocateError(f"unable to validate flags: unknown MIG strategy: {mig_strategy}")
    return Settings(strategies, id_strategy, mig_strategy, dict(env))


@dataclass(frozen=True)
class Device:
    """One device the plugin serves (internal/rm/devices.go Device): ID is its UUID, `index`
    "<gpu>" or "<gpu>:<mig slot>", `gpu` the NVML index of the GPU it is or is part of."""

    resource: str
    id: str
    index: str
    gpu: int


def _gpu_device(i: int, gpu: Gpu) -> Device:
    return Device(GPU_RESOURCE, gpu.uuid, str(i), i)


def mig_resource(profile: str) -> str:
    """rm.go: strings.ReplaceAll("mig-"+profile, "+", ".")."""
    return f"{RESOURCE_PREFIX}mig-{profile}".replace("+", ".")


def _full_instance(profile: str) -> bool:
    """go-nvlib MigProfileInfo: C == G profiles are written without a "<C>c." prefix."""
    head = profile.split(".", 1)[0]
    return not (head.endswith("c") and head[:-1].isdigit())


def advertised(mig_strategy: str, gpus: list[Gpu]) -> dict[str, tuple[Device, ...]]:
    """The plugin's device map: resource -> its devices, as NewDeviceMap builds it from NVML
    when the plugin starts (device_map.go buildDeviceMapFromConfigResources); raises
    AllocateError where the plugin fails to start instead. Resources without devices are left
    out (NewNVMLResourceManagers serves none for them)."""
    prefix = "error building device map: error building device map from config.resources: "
    found: dict[str, list[Device]] = {}
    for i, gpu in enumerate(gpus):  # buildGPUDeviceMap
        if gpu.mig_enabled and mig_strategy != MIG_NONE:
            continue
        found.setdefault(GPU_RESOURCE, []).append(_gpu_device(i, gpu))
    if mig_strategy == MIG_NONE:
        return {r: tuple(d) for r, d in found.items()}
    mig: dict[str, list[Device]] = {}
    for i, gpu in enumerate(gpus):  # buildMigDeviceMap (VisitMigDevices: MIG-enabled GPUs)
        if not gpu.mig_enabled:
            continue
        for device in gpu.mig_devices:
            if mig_strategy == MIG_SINGLE:
                resource = GPU_RESOURCE  # AddMIGResource("*", "gpu")
            elif _full_instance(device.profile):
                resource = mig_resource(device.profile)
            else:
                raise AllocateError(f"{prefix}error building MIG device map: MIG profile "
                                    f"'{device.profile}' does not match any resource patterns")
            mig.setdefault(resource, []).append(
                Device(resource, device.uuid, f"{i}:{device.index}", i))
    if mig_strategy == MIG_SINGLE:  # assertAllMigDevicesAreValid(uniform=true)
        invalid = f"{prefix}invalid MIG configuration: "
        for i, gpu in enumerate(gpus):
            if gpu.mig_enabled and not gpu.mig_devices:
                raise AllocateError(f"{invalid}at least one device with migEnabled=true was "
                                    f"not configured correctly: device {i} has no MIG "
                                    "devices configured")
        profiles = {d.profile for g in gpus if g.mig_enabled for d in g.mig_devices}
        if len(profiles) > 1:
            raise AllocateError(f"{invalid}more than one MIG device type present on node")
        if found and mig:
            raise AllocateError(f"{prefix}all devices on the node must be configured with "
                                "the same migEnabled value")
    for resource, devices in mig.items():
        found.setdefault(resource, []).extend(devices)
    return {r: tuple(d) for r, d in found.items()}


def allocate(settings: Settings, gpus: list[str], node_gpus: list[str],
             indices: Mapping[str, str] | None = None) -> AllocateResponse:
    """The answer for one container given `gpus` (device UUIDs, GPU-... or MIG-...) out of
    the node's (in index order); `indices` maps a device's UUID to its index ("<gpu>" or
    "<gpu>:<mig>"), by default its position in node_gpus."""
    ids = [g if settings.id_strategy == "uuid"
           else (indices[g] if indices and g in indices else str(node_gpus.index(g)))
           for g in gpus]
    envs: dict[str, str] = {}
    mounts: list[toolkit_rules.Mount] = []
    annotations: dict[str, str] = {}
    cdi: list[str] = []
    names = [f"{CDI_KIND}={i}" for i in ids]
    if CDI_ANNOTATIONS in settings.strategies:
        key = f"{toolkit_rules.CDI_ANNOTATION_PREFIX}{ANNOTATION_PLUGIN_NAME}_{uuid.uuid4()}"
        annotations[key] = ",".join(names)
    if CDI_CRI in settings.strategies:
        cdi += names
    if ENVVAR in settings.strategies:
        envs[DEVICE_LIST_ENVVAR] = ",".join(ids)
    if VOLUME_MOUNTS in settings.strategies:
        # The variable then names the mount root, not the devices.
        envs[DEVICE_LIST_ENVVAR] = toolkit_rules.VOLUME_MOUNT_ROOT
        mounts += [toolkit_rules.Mount(toolkit_rules.VOLUME_MOUNT_SOURCE,
                                       f"{toolkit_rules.VOLUME_MOUNT_ROOT}/{i}") for i in ids]
    return AllocateResponse(envs, tuple(mounts), annotations, tuple(cdi))
