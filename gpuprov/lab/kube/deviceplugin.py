"""SIMULATION: NVIDIA's device plugin's Allocate answer, per DEVICE_LIST_STRATEGY.

Test infrastructure. The emulated kubelet asks this for each container that requests
nvidia.com/gpu, as a real kubelet calls the plugin's Allocate over gRPC, and turns the answer
into the container's environment, mounts, annotations and CDI devices: the container
runtime (gpuprov/lab/toolkit/toolkit_rules.py) then decides from those which GPUs the container
really gets. Followed: NVIDIA/k8s-device-plugin internal/plugin/server.go
(`getAllocateResponse`, `updateResponseForDeviceListEnvVar`, `updateResponseForDeviceMounts`,
`updateResponseForCDI`) and api/config/v1/strategy.go (the strategy names), v0.17-v0.20.

The plugin's settings are read from its own pod, as the plugin reads its environment:
DEVICE_LIST_STRATEGY (comma list; default envvar), DEVICE_ID_STRATEGY (uuid | index;
default uuid). Not simulated: PASS_DEVICE_SPECS (device nodes), GDS/MOFED, MIG, time-slicing
replicas' annotated IDs, the CONFIG_FILE form of the same settings.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

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
# The kind of the CDI spec the plugin generates for its devices (internal/cdi/cdi.go).
CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"


class AllocateError(ValueError):
    """The plugin's settings are not ones it accepts (it would fail to start)."""


@dataclass(frozen=True)
class Settings:
    strategies: tuple[str, ...] = (ENVVAR,)
    id_strategy: str = "uuid"


@dataclass(frozen=True)
class AllocateResponse:
    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[toolkit_rules.Mount, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


def settings_from_pod(pod: Mapping) -> Settings:
    env: dict[str, str] = {}
    for container in pod.get("spec", {}).get("containers") or []:
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
    strategies = tuple(s.strip() for s in env.get("DEVICE_LIST_STRATEGY", ENVVAR).split(",")
                       if s.strip())
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise AllocateError(f"invalid DEVICE_LIST_STRATEGY {env.get('DEVICE_LIST_STRATEGY')!r}")
    id_strategy = env.get("DEVICE_ID_STRATEGY", "uuid")
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
