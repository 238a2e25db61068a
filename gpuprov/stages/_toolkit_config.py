"""NVIDIA container toolkit's own config.toml: the settings that decide who gets GPUs,
merged into the file the package installed (the admin's keys and comments kept).

NVIDIA's runtime and hook read /etc/nvidia-container-runtime/config.toml at every container
start. By NVIDIA's defaults (api/config/v1/config.go `GetDefault` in
NVIDIA/nvidia-container-toolkit) any unprivileged container that sets
NVIDIA_VISIBLE_DEVICES=all, as every CUDA image does, gets every GPU of the node without
asking the scheduler: the cross-tenant leak NVIDIA's "Preventing unprivileged access to GPUs"
describes. The cure is two keys: ignore the variable from unprivileged containers, and take
the device list from the volume mounts only the kubelet sets (the device plugin's
volume-mounts strategy). `nvidia-ctk config default` writes keys at their default as
comments, so the keys are written uncommented here; a commented line is not a setting.

The nvidia_container_toolkit role calls `merge` through the gpuprov_toolkit_config filter
(plugins/filter/nvidia_container_toolkit.py) and writes the result back with a backup.
"""

from __future__ import annotations

from collections.abc import Mapping

try:
    import tomllib
except ImportError:  # Python < 3.11 on the controller
    import tomli as tomllib  # type: ignore[no-redef]

import tomlkit

from gpuprov.node.probe.runtime import TOOLKIT_CONFIG, TOOLKIT_KEYS

# The variable(s) NVIDIA's hook and runtime read a Swarm task's GPUs from (api/config/v1/config.go
# `SwarmResource`): a string, where the keys above are booleans.
SWARM_RESOURCE = "swarm-resource"
ENVVAR_UNPRIVILEGED = "accept-nvidia-visible-devices-envvar-when-unprivileged"
AS_VOLUME_MOUNTS = "accept-nvidia-visible-devices-as-volume-mounts"
# gpuprov's defaults: no GPU for a container that did not get one from the device plugin.
SECURE = {ENVVAR_UNPRIVILEGED: False, AS_VOLUME_MOUNTS: True}


class ToolkitConfigError(ValueError):
    """The node's file cannot be merged safely; the message says what to change."""


def merge(text: str | None, settings: Mapping[str, bool],
          path: str = TOOLKIT_CONFIG) -> dict:
    """{"text": the file with `settings` set, "changed": whether it differs from `text`}.

    `text` None: the file is missing (the package not installed yet, in check mode); the
    result then holds the settings alone. Keys other than TOOLKIT_KEYS are refused: this
    sets who gets GPUs, nothing else."""
    unknown = sorted(set(settings) - set(TOOLKIT_KEYS) - {SWARM_RESOURCE})
    if unknown:
        raise ToolkitConfigError(f"not a toolkit setting gpuprov manages: {', '.join(unknown)}")
    try:
        tomllib.loads(text or "")
    except tomllib.TOMLDecodeError as exc:
        raise ToolkitConfigError(f"{path} is not valid TOML ({exc}): fix it (or remove it "
                                 "and reinstall nvidia-container-toolkit-base) first") from None
    doc = tomlkit.parse(text or "")
    for key, value in settings.items():
        if key == SWARM_RESOURCE:
            if not isinstance(value, str) or not value:
                raise ToolkitConfigError(f"{key} must be a variable name (is {value!r})")
            if doc.get(key) != value:
                doc[key] = value
            continue
        if not isinstance(value, bool):
            raise ToolkitConfigError(f"{key} must be true or false (is {value!r})")
        if doc.get(key) is not value:
            doc[key] = value
    out = tomlkit.dumps(doc)
    return {"text": out, "changed": out != (text or "")}


def strategy_problems(strategy: str, nodes: Mapping[str, Mapping[str, bool]]) -> list[str]:
    """What goes wrong with the device plugin's DEVICE_LIST_STRATEGY on nodes whose toolkit
    has these settings (node -> {key: bool}, absent keys at NVIDIA's defaults), one line per
    problem, saying what to change; empty when every node can take it."""
    settings = {node: {**TOOLKIT_KEYS, **(values or {})} for node, values in nodes.items()}
    strategies = {s.strip() for s in strategy.split(",")}
    problems = []
    if "volume-mounts" in strategies:
        refusing = sorted(n for n, s in settings.items() if not s[AS_VOLUME_MOUNTS])
        if refusing:
            problems.append(
                f"the device plugin's volume-mounts strategy needs {AS_VOLUME_MOUNTS} = true in "
                f"the toolkit's config.toml, which {', '.join(refusing)} would not have: their "
                "GPU pods would fail to start (unknown device); set "
                "nvidia_container_toolkit_accept_volume_mounts: true for them")
    elif "envvar" in strategies:
        refusing = sorted(n for n, s in settings.items() if not s[ENVVAR_UNPRIVILEGED])
        if refusing:
            problems.append(
                f"the device plugin's envvar strategy passes GPUs by NVIDIA_VISIBLE_DEVICES, "
                f"which {', '.join(refusing)} would ignore from unprivileged pods "
                f"({ENVVAR_UNPRIVILEGED} = false): their GPU pods would see no GPU; set "
                "nvidia_device_plugin_device_list_strategy: volume-mounts (recommended)")
    return problems
