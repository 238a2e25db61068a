"""The gpu_mig role's decisions, made on the controller (plugins/filter/gpu_mig.py calls
them): which GPUs of a node need the declared MIG layout, what the node's applier does
(gpuprov/node/mig_apply.py) and what it reported, which pods hold GPUs, and the Node patches of
each step and of a failure.

The steps and the Kubernetes keys follow NVIDIA's mig-manager (NVIDIA/mig-parted
pkg/mig/reconfigure/reconfigure.go, read 2026-11-26): `nvidia.com/mig.config` names the layout
and `nvidia.com/mig.config.state` says `pending` while it changes, then `success` or `failed`;
the device plugin is taken off the node with `nvidia.com/gpu.deploy.device-plugin=
paused-for-mig-change` and given back the label's earlier value. Unlike mig-manager the node is
also cordoned and its GPU pods are evicted first (mig-manager expects the GPUs idle), and a
failure keeps it cordoned with the reason in an annotation, so that it is never left with no
GPUs and no word why (gpu-operator issue #2833).

The Node's gpuprov.io/mig-* annotations are the stage's memory between runs, as the driver
upgrade's (gpuprov/stages/gpu_node_upgrade.py): whether the node was cordoned before the stage
cordoned it, the plugin label's value before the pause, and why the last change failed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpuprov.nvidia import mig
from gpuprov.stages import _task_failure

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
PLUGIN_DEPLOY_LABEL = "nvidia.com/gpu.deploy.device-plugin"
PAUSED = "paused-for-mig-change"
FAILED = "gpuprov.io/mig-failed"
WAS_CORDONED = "gpuprov.io/mig-was-cordoned"
PLUGIN_WAS = "gpuprov.io/mig-device-plugin-deploy"  # "" where the label was not set
ANNOTATIONS = (FAILED, WAS_CORDONED, PLUGIN_WAS)
# The resources of NVIDIA's device plugin: whole GPUs, and MIG devices under mixed.
_GPU_RESOURCE = re.compile(r"^nvidia\.com/(gpu|mig-[0-9a-z.]+)$")


class StageError(ValueError):
    """The node or the settings cannot take the layout; the message says what to do."""


def _nvml_gpus(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    nvml = report.get("nvml") or {}
    gpus = nvml.get("gpus")
    if not nvml.get("available") or gpus is None:
        raise StageError("NVML does not answer on the node, so its MIG state is unknown: "
                         "run the driver stage (playbooks/driver.yml) and check `gpuprov verify "
                         "--no-pods` first")
    broken = [str(g.get("index")) for g in gpus if g.get("error")]
    if broken:
        raise StageError(f"GPU(s) {', '.join(broken)} do not answer NVML: fix them before "
                         f"changing the MIG layout (gpuprov verify --no-pods)")
    return gpus


def _device_id(gpu: Mapping[str, Any]) -> int:
    try:
        return int(str(gpu.get("pci_device_id")).split(":")[1], 16)
    except (IndexError, ValueError):
        return 0


def _annotations(node: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((node or {}).get("metadata") or {}).get("annotations") or {}


def _labels(node: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((node or {}).get("metadata") or {}).get("labels") or {}


def plan(report: Mapping[str, Any], config: str | None, configs: Any = None,
         node: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the stage does on one node. `report` is the node's probe report, `config` the
    layout name (gpu_mig_config; None: MIG is not managed on the node), `configs` a mig-parted
    document (None: gpuprov's defaults, gpuprov.nvidia.mig.default_configs()), `node` the Node.

    -> {"managed", "capable", "change": {index: why}, "skip", "unfinished", "summary",
        "apply": the applier's plan, "start_patch", "done_patch", "labels_patch"}
    StageError when the settings or the node cannot take the layout (before any change)."""
    if not config:
        return {"managed": False, "capable": [], "change": {}, "skip": True, "unfinished": [],
                "summary": "no MIG layout declared (gpu_mig_config): MIG left as it is"}
    try:
        layouts_config = mig.default_configs() if configs is None else mig.validate(configs)
        gpus = _nvml_gpus(report)
        layouts = mig.plan(layouts_config, str(config),
                           [(int(g.get("index") or 0), _device_id(g)) for g in gpus])
        apply = mig.node_plan(layouts)
    except mig.ConfigError as exc:
        raise StageError(f"gpu_mig_config {config!r}: {exc}") from None
    by_index = {int(g.get("index") or 0): g for g in gpus}
    capable = [layout.index for layout in layouts if layout.model is not None]
    change = {}
    for layout in layouts:
        if layout.model is None or layout.mig_enabled is None:
            continue
        why = mig.difference(by_index[layout.index].get("mig"), layout, layout.index)
        if why:
            change[layout.index] = why
    unfinished = [key for key in ANNOTATIONS if key in _annotations(node)]
    skip = not change and not unfinished
    annotations = _annotations(node)
    if WAS_CORDONED in annotations:
        was_cordoned = annotations[WAS_CORDONED] == "true"
    else:
        was_cordoned = bool(((node or {}).get("spec") or {}).get("unschedulable"))
    plugin_was = annotations.get(PLUGIN_WAS, _labels(node).get(PLUGIN_DEPLOY_LABEL) or "")
    if plugin_was == PAUSED:  # paused by someone else's unfinished change: give it back on
        plugin_was = ""
    restore_plugin = plugin_was or None  # None removes the label
    success = {CONFIG_LABEL: str(config), STATE_LABEL: "success"}
    if not capable:
        summary = "no MIG-capable GPU on the node: nothing to change"
    elif change:
        summary = (f"layout {config} differs on {len(change)} of {len(capable)} MIG-capable "
                   f"GPU(s): " + "; ".join(f"GPU {i}: {why}" for i, why in change.items()))
    elif unfinished:
        summary = (f"layout {config} is in place; an earlier change did not finish "
                   f"({', '.join(unfinished)}): giving the node back")
    else:
        summary = f"layout {config} is in place on {len(capable)} MIG-capable GPU(s)"
    return {
        "managed": True,
        "capable": capable,
        "change": change,
        "skip": skip,
        "unfinished": unfinished,
        "was_cordoned": was_cordoned,
        "summary": summary,
        "apply": {**apply, "gpus": [g for g in apply["gpus"] if g["index"] in change]},
        # Before any change: what to give back is recorded first, so that a run stopped at any
        # point is finished by the next one.
        "start_patch": {
            "spec": {"unschedulable": True},
            "metadata": {"labels": {CONFIG_LABEL: str(config), STATE_LABEL: "pending",
                                    PLUGIN_DEPLOY_LABEL: PAUSED},
                         "annotations": {WAS_CORDONED: str(was_cordoned).lower(),
                                         PLUGIN_WAS: plugin_was}},
        },
        "done_patch": {
            **({} if was_cordoned else {"spec": {"unschedulable": False}}),
            "metadata": {"labels": {**success, PLUGIN_DEPLOY_LABEL: restore_plugin},
                         "annotations": dict.fromkeys(ANNOTATIONS)},
        },
        # A node whose layout is in place: only mig-manager's labels (no change when they are
        # there already).
        "labels_patch": {"metadata": {"labels": success}} if capable else None,
        "failed_labels": {STATE_LABEL: "failed", PLUGIN_DEPLOY_LABEL: restore_plugin},
    }


def failure_patch(reason: str, failed_labels: Mapping[str, Any]) -> dict[str, Any]:
    """The node stays cordoned, `failed`, with the reason; the device plugin comes back, so
    that the GPUs the node still has are offered (and counted by verify) rather than none."""
    return {"spec": {"unschedulable": True},
            "metadata": {"labels": dict(failed_labels), "annotations": {FAILED: reason}}}


def _requests_gpu(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = (container or {}).get("resources") or {}
        for part in ("limits", "requests"):
            if any(_GPU_RESOURCE.match(str(k)) and str(v) not in ("0", "")
                   for k, v in ((resources.get(part) or {}).items())):
                return True
    return False


def gpu_pods(pods: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The pods to evict before a layout change: running (not Succeeded or Failed), asking
    for a GPU resource of NVIDIA's device plugin, not a DaemonSet's (its controller would put
    it back at once; NVIDIA's GPU clients are DaemonSets the stage pauses by label)."""
    found = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        owners = metadata.get("ownerReferences") or []
        if any(isinstance(o, Mapping) and o.get("kind") == "DaemonSet" for o in owners):
            continue
        if _requests_gpu(pod):
            found.append({"namespace": str(metadata.get("namespace") or "default"),
                          "name": str(metadata.get("name"))})
    return found


def applied(stdout: str, rc: Any) -> dict[str, Any]:
    """The report gpuprov/node/mig_apply.py printed (its last JSON line), with `error` set where
    it printed none or exited non-zero without saying why."""
    for line in reversed(str(stdout or "").splitlines()):
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except ValueError:
                break
            if isinstance(report, dict):
                if rc not in (0, "0") and not report.get("error"):
                    report["error"] = f"the MIG applier exited {rc}"
                return report
    return {"error": f"the MIG applier exited {rc} without a report", "gpus": []}


def failure(task: Any, result: Any, failed_labels: Mapping[str, Any]) -> dict[str, Any]:
    """In the role's rescue: the reason (the failed task and its message, one line) and the
    patch that keeps the node cordoned with it."""
    reason = _task_failure.reason(task, result)
    return {"reason": reason, "annotation": FAILED,
            "patch": failure_patch(reason, failed_labels)}
