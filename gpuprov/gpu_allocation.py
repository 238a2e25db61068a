"""How a node's GPUs are handed to pods: NVIDIA's device plugin or NVIDIA's DRA driver.

One decision per node (`gpu_allocation`, a host or group variable), with several callers: the
preflight (which refuses DRA on a node that cannot have it, before anything changes), the
labels that make each DaemonSet select only its nodes (gpuprov.nvidia.labels.allocation_labels)
and, later, verify (which checks each node in its own mode).

A node is in one mode, never both: the DRA driver's chart refuses GPU allocation by default
because "this DRA driver cannot be deployed alongside the standard GPU device plugin on the same
node" (kubernetes-sigs/dra-driver-nvidia-gpu deployments/helm/dra-driver-nvidia-gpu/templates/
validation.yaml), and KEP-5004 allows one node on DRA beside another on the device plugin, never
both on one node (kubernetes/enhancements keps/sig-scheduling/5004-dra-extended-resource).

What a DRA node needs, from the driver's own prerequisites (kubernetes-sigs/dra-driver-nvidia-gpu
docs/prerequisites.md, stored commit 181f0aff9a, read 2026-11-26):
- Kubernetes v1.34.2 or later: resource.k8s.io/v1 is GA from 1.34, and 1.34.0/1.34.1 kubelets
  report "DRA driver ... is not registered" (kubernetes-sigs/dra-driver-nvidia-gpu#814, fixed by
  kubernetes/kubernetes#133920). Both the API server and the node's kubelet must be that new:
  the scheduler allocates, the kubelet prepares.
- CDI on in the container runtime: the driver hands the kubelet CDI device names only, and the
  kubelet passes them in the CRI's CDIDevices field. containerd has CDI from 1.7 (off by default
  there, `enable_cdi`), on by default from 2.0; CRI-O always (gpuprov.runtime_mode says where).
  A runtime without CDI starts the container without a GPU and says nothing.
- NVIDIA driver v565 or later for GPU allocation (v570.158.01 for ComputeDomains, which gpuprov
  does not deploy).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuprov import runtime_mode

DEVICE_PLUGIN, DRA = "device-plugin", "dra"
MODES = (DEVICE_PLUGIN, DRA)
DEFAULT = DEVICE_PLUGIN
SETTING = "gpu_allocation"
# NVIDIA's DRA driver for GPUs: its name, the driver of its ResourceSlices, of the allocation
# results of its claims and of its devices' attributes (kubernetes-sigs/dra-driver-nvidia-gpu
# v0.4.1 cmd/gpu-kubelet-plugin/main.go DriverName).
DRA_DRIVER = "gpu.nvidia.com"

KUBERNETES_SINCE = (1, 34, 2)
DRIVER_BRANCH_SINCE = 565
# Where the requirements above come from, named in every refusal so that an admin can check.
SOURCE = "kubernetes-sigs/dra-driver-nvidia-gpu docs/prerequisites.md"


class SettingError(ValueError):
    """gpu_allocation is not one of MODES."""


def mode(value: Any) -> str:
    """The node's allocation mode from its gpu_allocation (unset: the device plugin)."""
    if value is None or value == "":
        return DEFAULT
    text = str(value).strip().lower()
    if text not in MODES:
        raise SettingError(f"{SETTING} must be one of {', '.join(MODES)}, got {value!r}: set it "
                           f"per host or group to {DEVICE_PLUGIN} (the default) or {DRA}")
    return text


def kube_version(text: Any) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a Kubernetes gitVersion ("v1.34.2", "v1.34.2-gke.1100",
    "1.33.0+k3s1") as the API server's /version and a node's status.nodeInfo.kubeletVersion
    report it; None when it is not one."""
    match = re.match(r"^v?(\d+)\.(\d+)\.(\d+)", str(text or "").strip())
    return tuple(int(part) for part in match.groups()) if match else None  # type: ignore[return-value]


def driver_branch(text: Any) -> int | None:
    """The branch of a driver version ("580.95.05" -> 580) or of a branch ("580", 580)."""
    match = re.match(r"^(\d+)(?:\.|$)", str(text if text is not None else "").strip())
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class NodeFacts:
    """What decides whether a node can have DRA, each from its one reader: the API server's
    /version, the node's status.nodeInfo.kubeletVersion, the probe report's runtime package
    (runtime_mode.packaged_version) and containerd's merged CRI settings
    (container_runtime.containerd.enable_cdi), and the driver: NVML's version where a driver
    runs, else the branch gpu_preflight chose for the node."""
    api_server: Any = None
    kubelet: Any = None
    runtime: str = "containerd"
    runtime_version: Any = None
    enable_cdi: bool | None = None
    driver: Any = None
    # nvidia_container_toolkit_mode: in cdi mode (auto's choice on containerd >= 1.7) the
    # toolkit role turns enable_cdi on itself (gpuprov/stages/_runtime_config.py), after the
    # preflight; only a node kept in legacy mode keeps CDI as it is.
    toolkit_mode: Any = runtime_mode.AUTO


def from_report(report: Mapping | None, *, api_server: Any = None, kubelet: Any = None,
                runtime: str = "containerd", branch: Any = None,
                toolkit_mode: Any = runtime_mode.AUTO) -> NodeFacts:
    """The facts of one node from its probe report (gpuprov/node/probe: packages.runtime,
    container_runtime.<runtime>.enable_cdi, nvml.driver_version) and what the cluster says."""
    report = report or {}
    section = (report.get("container_runtime") or {}).get(runtime) or {}
    driver = (report.get("nvml") or {}).get("driver_version") or branch
    return NodeFacts(api_server=api_server, kubelet=kubelet, runtime=runtime,
                     runtime_version=runtime_mode.packaged_version(
                         runtime, report.get("packages") or {}),
                     enable_cdi=section.get("enable_cdi"), driver=driver,
                     toolkit_mode=toolkit_mode)


def _too_old(what: str, text: Any) -> str | None:
    version = kube_version(text)
    need = "v" + ".".join(map(str, KUBERNETES_SINCE))
    if version is None:
        return f"{what} version unknown ({text!r}; {need} or later is needed)"
    if version < KUBERNETES_SINCE:
        return f"{what} is {text}, older than {need}"
    return None


def dra_problems(facts: NodeFacts) -> list[str]:
    """Why the node cannot have DRA, one reason each ([]: it can)."""
    problems = [p for p in (_too_old("the API server", facts.api_server),
                            _too_old("the kubelet", facts.kubelet)) if p]
    version = runtime_mode.runtime_version(facts.runtime_version)
    capable = runtime_mode.cdi_capable(facts.runtime, version)
    named = facts.runtime if version is None else f"{facts.runtime} {version[0]}.{version[1]}"
    if facts.runtime == "docker":
        problems.append("Docker is not a Kubernetes runtime: DRA needs containerd >= 1.7 with "
                        "CDI on, or CRI-O")
    elif capable is None:
        problems.append(f"{facts.runtime}'s version is unknown (containerd >= 1.7 with CDI on "
                        "is needed)")
    elif not capable:
        problems.append(f"{named} has no CDI (containerd >= 1.7 is needed)")
    elif facts.runtime == "containerd":
        enabled = facts.enable_cdi
        if enabled is None:
            enabled = runtime_mode.containerd_cdi_default(version)
        toolkit = runtime_mode.choose(facts.toolkit_mode, facts.runtime, facts.runtime_version)
        if not enabled and toolkit.mode != runtime_mode.CDI:
            problems.append(f"{named} has CDI off (enable_cdi in its CRI plugin's settings) and "
                            f"the toolkit stage leaves it so ({toolkit.reason or toolkit.problem}"
                            "): set nvidia_container_toolkit_mode to auto or cdi")
    branch = driver_branch(facts.driver)
    if branch is None:
        problems.append(f"driver branch unknown ({facts.driver!r}; R{DRIVER_BRANCH_SINCE} or "
                        "later is needed)")
    elif branch < DRIVER_BRANCH_SINCE:
        problems.append(f"driver branch R{branch} is older than R{DRIVER_BRANCH_SINCE}, the "
                        "oldest NVIDIA's DRA driver supports for GPU allocation")
    return problems


def refusal(host: str, setting: Any, facts: NodeFacts) -> str | None:
    """One line for a node whose gpu_allocation cannot be had, with what to do (None: fine)."""
    try:
        chosen = mode(setting)
    except SettingError as exc:
        return f"{host}: {exc}"
    if chosen != DRA:
        return None
    problems = dra_problems(facts)
    if not problems:
        return None
    return (f"{host}: {SETTING} is {DRA}, but {'; '.join(problems)} ({SOURCE}). Fix these, or "
            f"set {SETTING}: {DEVICE_PLUGIN} for this node")
