"""What checks look at: one node's probe report (node phase) and, for the cluster phase,
its Kubernetes Node object and the pods bound to it. Checks read facts only; they never
talk to a node or the API themselves."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # inventory needs fabric; the node phase also runs on nodes (node_phase.py)
    from gpuprov.verify.inventory import Node


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    node: Node
    report: Mapping[str, Any]  # the probe report (gpuprov/node/probe/__init__.py)
    # Every reachable node's facts, by name: checks that compare nodes (driver.branch).
    fleet: Mapping[str, NodeFacts] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def nvml(self) -> Mapping[str, Any]:
        return self.report.get("nvml") or {}

    @property
    def gpus(self) -> list[Mapping[str, Any]]:
        return list(self.nvml.get("gpus") or [])

    @property
    def healthy_gpus(self) -> list[Mapping[str, Any]]:
        return [g for g in self.gpus if g.get("error") is None]

    @property
    def pci(self) -> list[Mapping[str, Any]]:
        return list(self.report.get("pci") or [])


@dataclasses.dataclass(frozen=True)
class ClusterFacts:
    node: Node
    report: Mapping[str, Any] | None  # None: the node phase got no report for this node
    k8s_node: Mapping[str, Any] | None  # the Node object (JSON); None: no such node
    pods: tuple[Mapping[str, Any], ...] = ()  # non-terminated pods bound to the node
    # A DRA node's ResourceSlices of NVIDIA's driver (gpuprov.verify.cluster.node_slices), or
    # why they could not be read.
    slices: tuple[Mapping[str, Any], ...] | str = ()

    @property
    def healthy_gpu_count(self) -> int | None:
        if self.report is None:
            return None
        return (self.report.get("summary") or {}).get("nvml_healthy_gpu_count")


@dataclasses.dataclass(frozen=True)
class PodFacts:
    node: Node
    report: Mapping[str, Any] | None
    runs: Mapping[str, Any]  # kind -> gpuprov.verify.pods.SmokeRun
    skipped: str | None = None  # why the node got no smoke workloads at all
    image: str | None = None  # --image, for pods.cuda-compat

    def device_uuids(self, resource: str) -> set[str]:
        """The UUIDs a smoke pod asking for `resource` may see: the GPUs for nvidia.com/gpu,
        the MIG devices of that profile for nvidia.com/mig-<profile> ("+" written ".")."""
        gpus = ((self.report or {}).get("nvml") or {}).get("gpus") or []
        if not resource.startswith("nvidia.com/mig-"):
            return {g["uuid"] for g in gpus if g.get("uuid")}
        profile = resource.removeprefix("nvidia.com/mig-")
        return {d["uuid"] for g in gpus for d in (g.get("mig") or {}).get("devices") or []
                if d.get("uuid") and str(d.get("profile") or "").replace("+", ".") == profile}


@dataclasses.dataclass(frozen=True)
class ContainerFacts:
    """A Docker host's smoke containers (gpuprov.verify.containers.ContainerRun)."""

    node: Node
    report: Mapping[str, Any] | None
    run: Any = None  # ContainerRun; None with `skipped`
    skipped: str | None = None  # why the host got no smoke containers
    image: str | None = None  # --image, for containers.cuda-compat

    @property
    def gpu_uuids(self) -> list[str]:
        gpus = ((self.report or {}).get("nvml") or {}).get("gpus") or []
        return [str(g["uuid"]) for g in gpus if g.get("uuid")]


@dataclasses.dataclass(frozen=True)
class SwarmFacts:
    """What the swarm's manager says of one Swarm GPU node (gpuprov.verify.swarm.SwarmView)."""

    node: Node
    report: Mapping[str, Any] | None
    view: Any = None  # SwarmView; None with `skipped`
    skipped: str | None = None
    run: Any = None  # the node's ContainerRun (swarm.no-request)

    @property
    def healthy_uuids(self) -> list[str]:
        gpus = ((self.report or {}).get("nvml") or {}).get("gpus") or []
        return [str(g["uuid"]) for g in gpus if g.get("uuid") and g.get("error") is None]
