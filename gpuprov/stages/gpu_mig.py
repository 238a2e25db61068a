"""The gpu_mig role's decisions, made on the controller (plugins/filter/gpu_mig.py calls
them): which GPUs of a node need the declared MIG layout, what the node's applier does
(gpuprov/node/mig_apply.py) and what it reported, which pods hold GPUs, and the Node patches of
each step and of a failure.

The steps and the Kubernetes keys follow NVIDIA's mig-manager (NVIDIA/mig-parted
pkg/mig/reconfigure/reconfigure.go, read 2026-11-26): `nvidia.com/mig.config` names the layout
and `nvidia.com/mig.config.state` says `pending` while it changes, then `success` or `failed`;
the device plugin is taken off the node with `nvidia.com/gpu.deploy.device-plugin=
paused-for-mig-change` and given back the label's earlier value (on a DRA node, NVIDIA's DRA
driver likewise with `nvidia.com/gpu.deploy.dra-driver`). Unlike mig-manager the node is
also cordoned and its GPU pods are evicted first (mig-manager expects the GPUs idle), and a
failure keeps it cordoned with the reason in an annotation, so that it is never left with no
GPUs and no word why (gpu-operator issue #2833).

The Node's gpuprov.io/mig-* annotations are the stage's memory between runs: the cordon's
record and the failure's reason (gpuprov/cordon.py, owner "gpu-mig", through the
gpu_node_maintenance role, as the driver upgrade's), and the plugin label's value before the
pause (this module's).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuprov import cordon
from gpuprov.nvidia import labels, mig

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
PLUGIN_DEPLOY_LABEL = labels.DEPLOY_DEVICE_PLUGIN
PAUSED = "paused-for-mig-change"
OWNER = "gpu-mig"  # gpuprov/cordon.py's owner: the gpuprov.io/mig-* annotations
FAILED = cordon.keys(OWNER).failed
WAS_CORDONED = cordon.keys(OWNER).was_cordoned
PLUGIN_WAS = "gpuprov.io/mig-device-plugin-deploy"  # "" where the label was not set
# A node on NVIDIA's DRA driver (gpu_allocation: dra): its kubelet plugin enumerates the MIG
# devices once, at start (kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1 cmd/gpu-kubelet-plugin/
# nvlib.go GetPerGpuAllocatableDevices, "called once upon startup"), so it is paused as the
# device plugin is and its new pod publishes the new layout; the label's value before is kept.
DRA_DEPLOY_LABEL = labels.DEPLOY_DRA_DRIVER
DRA_WAS = "gpuprov.io/mig-dra-driver-deploy"
ANNOTATIONS = (*cordon.keys(OWNER).all, PLUGIN_WAS, DRA_WAS)
# The pods of each GPU plugin the stage waits to leave the node (the pod labels of
# templates/nvidia-device-plugin.yml.j2 and templates/nvidia-dra-driver.yml.j2).
DEVICE_PLUGIN_SELECTOR = "app.kubernetes.io/name=nvidia-device-plugin"
DRA_PLUGIN_SELECTOR = ("app.kubernetes.io/name=nvidia-dra-driver-gpu,"
                       "dra-driver-nvidia-gpu-component=kubelet-plugin")
# playbooks/mig.yml: nodes whose layout changes (or an earlier change did not finish) go one
# batch at a time (cordoned meanwhile); the others need no batch of their own.
GROUP_CHANGE = "gpu_mig_change"
GROUP_STEADY = "gpu_mig_steady"
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


def check(gpus: Iterable[Mapping[str, Any]], config: str | None,
          configs: Any = None) -> str | None:
    """The settings before any stage changes anything (site.yml's validate stage), from the
    preflight's PCI view of the node (`gpus`: gpu_preflight_gpus, in PCI bus order; no driver
    needed): the mig-parted document, the layout's name, and whether each MIG-capable GPU can
    take the profiles its entry gives. None where they fit, else what is wrong, with the
    setting to change. Layout entries that name GPU indices are read against the PCI order
    here; the stage checks them again against NVML's numbering (plan()) before it cordons."""
    if not config:
        return None
    try:
        layouts_config = mig.default_configs() if configs is None else mig.validate(configs)
        ids = [_device_id({"pci_device_id": gpu.get("pci_id")}) for gpu in gpus]
        mig.node_plan(mig.plan(layouts_config, str(config), list(enumerate(ids))))
    except mig.ConfigError as exc:
        return f"gpu_mig_config {config!r}: {exc}"
    return None


def plan(report: Mapping[str, Any], config: str | None, configs: Any = None,
         node: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the stage does on one node. `report` is the node's probe report, `config` the
    layout name (gpu_mig_config; None: MIG is not managed on the node), `configs` a mig-parted
    document (None: gpuprov's defaults, gpuprov.nvidia.mig.default_configs()), `node` the Node.

    -> {"managed", "capable", "change": {index: why}, "skip", "unfinished", "group",
        "was_cordoned",
        "summary", "reason", "apply": the applier's plan, "take_patch", "done_patch",
        "failed_patch" (merged into gpu_node_maintenance's take, give_back and failed
        patches), "labels_patch"}
    StageError when the settings or the node cannot take the layout (before any change)."""
    if not config:
        return {"managed": False, "capable": [], "change": {}, "skip": True, "unfinished": [],
                "group": GROUP_STEADY, "labels_patch": None,
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
    annotations = _annotations(node)
    unfinished = [key for key in ANNOTATIONS if key in annotations]
    skip = not change and not unfinished
    plugin_was = annotations.get(PLUGIN_WAS, _labels(node).get(PLUGIN_DEPLOY_LABEL) or "")
    if plugin_was == PAUSED:  # paused by someone else's unfinished change: give it back on
        plugin_was = ""
    restore_plugin = plugin_was or None  # None removes the label
    # The DRA driver's label is paused only where the node has it (a DRA node), so that a
    # device-plugin node gets no label it did not have.
    dra_was = annotations.get(DRA_WAS, _labels(node).get(DRA_DEPLOY_LABEL) or "")
    if dra_was == PAUSED:
        dra_was = ""
    dra = bool(dra_was) and dra_was != "false"
    take_dra = {DRA_DEPLOY_LABEL: PAUSED} if dra else {}
    give_dra = {DRA_DEPLOY_LABEL: dra_was} if dra else {}
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
    # The cordon, its record, the host's GPU clients and the failure's reason are the
    # gpu_node_maintenance role's (gpuprov/cordon.py); these are the MIG stage's own parts of
    # the same patches.
    return {
        "managed": True,
        "capable": capable,
        "change": change,
        "skip": skip,
        "unfinished": unfinished,
        # playbooks/mig.yml's group for the play that changes layouts one node at a time.
        "group": GROUP_CHANGE if not skip else GROUP_STEADY,
        "was_cordoned": cordon.was_cordoned(node, OWNER),
        "summary": summary,
        "reason": f"gpuprov is changing the MIG layout to {config}",
        "apply": {**apply, "gpus": [g for g in apply["gpus"] if g["index"] in change]},
        # With the cordon: state pending, the device plugin paused, and the plugin label's
        # value recorded, so that a run stopped at any point is finished by the next one.
        "take_patch": {
            "metadata": {"labels": {CONFIG_LABEL: str(config), STATE_LABEL: "pending",
                                    PLUGIN_DEPLOY_LABEL: PAUSED, **take_dra},
                         "annotations": {PLUGIN_WAS: plugin_was,
                                         **({DRA_WAS: dra_was} if dra else {})}},
        },
        "done_patch": {
            "metadata": {"labels": {**success, PLUGIN_DEPLOY_LABEL: restore_plugin,
                                    **give_dra},
                         "annotations": {PLUGIN_WAS: None, DRA_WAS: None}},
        },
        # On a DRA node the DRA plugin's pod is the one to wait for (the device plugin does
        # not run there), and pods holding gpu.nvidia.com claims are GPU pods too.
        "dra": dra,
        "plugin_selector": DRA_PLUGIN_SELECTOR if dra else DEVICE_PLUGIN_SELECTOR,
        # A node whose layout is in place: only mig-manager's labels (no change when they are
        # there already).
        "labels_patch": {"metadata": {"labels": success}} if capable else None,
        # The node stays cordoned, `failed`; the device plugin comes back, so that the GPUs
        # the node still has are offered (and counted by verify) rather than none.
        "failed_patch": {"metadata": {"labels": {STATE_LABEL: "failed",
                                                 PLUGIN_DEPLOY_LABEL: restore_plugin,
                                                 **give_dra}}},
    }


def _requests_gpu(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = (container or {}).get("resources") or {}
        for part in ("limits", "requests"):
            if any(_GPU_RESOURCE.match(str(k)) and str(v) not in ("0", "")
                   for k, v in ((resources.get(part) or {}).items())):
                return True
    return False


def gpu_pods(pods: Iterable[Mapping[str, Any]],
             holds_gpu: Callable[[Mapping[str, Any]], bool] | None = None
             ) -> list[dict[str, str]]:
    """The pods to evict before a layout change: running (not Succeeded or Failed), asking
    for a GPU resource of NVIDIA's device plugin or, by `holds_gpu`, holding GPUs otherwise
    (a DRA claim: gpuprov.stages.nvidia_dra_driver.gpu_pods), not a DaemonSet's (its
    controller would put it back at once; NVIDIA's GPU clients are DaemonSets the stage
    pauses by label)."""
    found = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        owners = metadata.get("ownerReferences") or []
        if any(isinstance(o, Mapping) and o.get("kind") == "DaemonSet" for o in owners):
            continue
        if _requests_gpu(pod) or (holds_gpu is not None and holds_gpu(pod)):
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

