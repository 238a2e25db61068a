"""SIMULATION: NVIDIA's device plugin's Allocate answer, per DEVICE_LIST_STRATEGY.

Test infrastructure. The emulated kubelet asks this for each container that requests
nvidia.com/gpu, as a real kubelet calls the plugin's Allocate over gRPC, and turns the answer
into the container's environment, mounts, annotations and CDI devices: the container
runtime (gpuprov/lab/toolkit/toolkit_rules.py) then decides from those which GPUs the container
really gets. Followed: NVIDIA/k8s-device-plugin internal/plugin/server.go
(`getAllocateResponse`, `updateResponseForDeviceListEnvVar`, `updateResponseForDeviceMounts`,
`updateResponseForCDI`) and api/config/v1/strategy.go (the strategy names), v0.17-v0.20.

The plugin's settings are read from its own pod, as the plugin reads them: its config file
(CONFIG_FILE, api/config/v1: flags.plugin.deviceListStrategy, deviceIDStrategy), then its
environment, which wins where set (DEVICE_LIST_STRATEGY: comma list, default envvar;
DEVICE_ID_STRATEGY: uuid | index, default uuid). The config file is the one NVIDIA's
config-manager (cmd/config-manager/main.go) links for the node: the ConfigMap key named by the
node's label (NODE_LABEL, nvidia.com/device-plugin.config), else DEFAULT_CONFIG; a label naming
no config fails, as config-manager does. Not simulated: PASS_DEVICE_SPECS (device nodes),
GDS/MOFED, MIG, time-slicing replicas' annotated IDs, config changes while the plugin runs
(config-manager's signal): a new plugin pod reads the config again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import yaml

from gpuprov.lab.kube import objects
from gpuprov.lab.toolkit import toolkit_rules

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


class AllocateError(ValueError):
    """The plugin's settings are not ones it accepts (it would fail to start)."""


@dataclass(frozen=True)
class Settings:
    strategies: tuple[str, ...] = (ENVVAR,)
    id_strategy: str = "uuid"

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


def settings_from_pod(pod: Mapping, node_labels: Mapping[str, str] | None = None,
                      config_map: Callable[[str, str], Mapping | None] | None = None) -> Settings:
    env = _env(objects.device_plugin_container(pod))
    flags = (config_file(pod, node_labels or {}, config_map or (lambda _ns, _name: None))
             .get("flags") or {}).get("plugin") or {}
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
    return Settings(strategies, id_strategy)


def allocate(settings: Settings, gpus: list[str], node_gpus: list[str]) -> AllocateResponse:
    """The answer for one container given `gpus` (UUIDs) out of the node's (in index order)."""
    ids = [g if settings.id_strategy == "uuid" else str(node_gpus.index(g)) for g in gpus]
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
