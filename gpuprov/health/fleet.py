"""The fleet's GPU health as the API has it: the agents' gpuprov.io/ conditions on each Node,
and what gpuprov's remediation did to it. Read with one LIST of nodes, so a thousand nodes cost
about what four do (bench/health_show.py).

Pure functions over Node objects (JSON dicts, as the API serves them): `gpuprov health show`,
`gpuprov health remediate`, verify's k8s.health and `gpuprov status` read them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from gpuprov import cordon as cordon_module
from gpuprov.node.health.state import (
    CONDITION_TYPES,
    DRIVER_PROBLEM,
    FAULTS_ANNOTATION,
    GPU_FAULT,
    PREFIX,
)

SCHEMA_VERSION = 1
# The agent reads it (gpuprov/node/health/agent.py ACK_ANNOTATION); `gpuprov health ack` writes.
ACK_ANNOTATION = "gpuprov.io/health-ack"
# Remediation takes nodes out through gpuprov's one node-maintenance piece (gpuprov/cordon.py)
# as this owner: its record (gpuprov.io/health-remediate-was-cordoned, -cordon-reason with the
# evidence, -cordoned-at) says what to give back; TAINT_ANNOTATION whether it added its taint.
OWNER = "health-remediate"
TAINT_ANNOTATION = "gpuprov.io/health-remediate-taint"
PLUGIN_RESTART_ANNOTATION = "gpuprov.io/health-plugin-restart"  # unix time of the last one
TAINT_KEY = "gpuprov.io/gpu-unhealthy"
# The conditions remediation acts on; the others are reported only.
ACTIONABLE = (GPU_FAULT, DRIVER_PROBLEM)
GPU_RESOURCE = "nvidia.com/gpu"


@dataclasses.dataclass(frozen=True)
class NodeHealth:
    name: str
    conditions: dict  # type -> the condition (JSON), gpuprov.io/ types only
    unschedulable: bool
    cordon: dict | None  # remediation's record (cordon.keys(OWNER)); None: it holds nothing
    capacity_gpus: int
    allocatable_gpus: int
    gpu_node: bool
    plugin_restarted_at: float | None
    holders: tuple = ()  # other gpuprov owners holding the node (cordon.holders)
    # every fault in full, from the agent's annotation (a condition's message may shorten some)
    faults: tuple = ()

    @property
    def problems(self) -> list[dict]:
        return [c for t, c in self.conditions.items() if c.get("status") == "True"]

    @property
    def actionable(self) -> list[dict]:
        return [c for c in self.problems if c.get("type") in ACTIONABLE]

    @property
    def unknown(self) -> bool:
        return any(c.get("status") == "Unknown" for c in self.conditions.values())

    @property
    def state(self) -> str:
        if self.problems:
            return ",".join(c["type"].removeprefix(PREFIX) for c in self.problems)
        if not self.conditions:
            return "no-agent" if self.gpu_node else "-"
        return "unknown" if self.unknown else "ok"

    @property
    def cordoned_by(self) -> str:
        if self.cordon and not self.cordon.get("preexisting"):
            return "gpuprov"
        if self.unschedulable:
            return "gpuprov:" + ",".join(self.holders) if self.holders else "admin"
        return "-"

    def to_json(self) -> dict:
        return {"node": self.name, "state": self.state, "gpu_node": self.gpu_node,
                "conditions": [self.conditions[t] for t in CONDITION_TYPES
                               if t in self.conditions],
                "unschedulable": self.unschedulable, "cordoned_by": self.cordoned_by,
                "gpuprov_cordon": self.cordon, "gpus": {"capacity": self.capacity_gpus,
                                                         "allocatable": self.allocatable_gpus},
                "faults": list(self.faults)}


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _record(node: Mapping[str, Any]) -> dict | None:
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    names = cordon_module.keys(OWNER)
    if names.was_cordoned not in annotations:
        return None
    return {"preexisting": annotations[names.was_cordoned] == "true",
            "reason": annotations.get(names.reason, ""), "since": annotations.get(names.since),
            "taint": annotations.get(TAINT_ANNOTATION) == "true",
            "failed": annotations.get(names.failed)}


def _faults(annotations: Mapping[str, Any]) -> tuple:
    try:
        faults = json.loads(annotations.get(FAULTS_ANNOTATION) or "[]")
    except ValueError:
        return ()
    return tuple(f for f in faults if isinstance(f, dict)) if isinstance(faults, list) else ()


def node_health(node: Mapping[str, Any]) -> NodeHealth:
    meta, spec, status = (node.get("metadata") or {}), (node.get("spec") or {}), (
        node.get("status") or {})
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    conditions = {c["type"]: dict(c) for c in status.get("conditions") or []
                  if str(c.get("type", "")).startswith(PREFIX)}
    capacity = _int((status.get("capacity") or {}).get(GPU_RESOURCE))
    restarted = annotations.get(PLUGIN_RESTART_ANNOTATION)
    return NodeHealth(
        name=meta.get("name", ""), conditions=conditions,
        unschedulable=bool(spec.get("unschedulable")),
        cordon=_record(node),
        capacity_gpus=capacity,
        allocatable_gpus=_int((status.get("allocatable") or {}).get(GPU_RESOURCE)),
        gpu_node=bool(capacity or conditions or labels.get("nvidia.com/gpu.present") == "true"),
        plugin_restarted_at=float(restarted) if restarted and restarted.replace(
            ".", "", 1).isdigit() else None,
        holders=tuple(h for h in cordon_module.holders(node) if h != OWNER),
        faults=_faults(annotations))


def fleet(nodes: Iterable[Mapping[str, Any]]) -> list[NodeHealth]:
    return sorted((node_health(n) for n in nodes), key=lambda h: h.name)


def show_rows(healths: Iterable[NodeHealth]) -> list[list[str]]:
    rows = []
    for h in healths:
        problems = h.problems
        first = min(problems, key=lambda c: c.get("lastTransitionTime", "")) if problems else None
        since = (first or {}).get("lastTransitionTime", "")
        message = (first or {}).get("message", "")
        evidence = ""
        if "evidence " in message:
            evidence = message.split("evidence ", 1)[1].split(";")[0].split()[0]
        rows.append([h.name, h.state, since, (first or {}).get("reason", ""), evidence,
                     h.cordoned_by, f"{h.allocatable_gpus}/{h.capacity_gpus}",
                     message[:100]])
    return rows


SHOW_HEADERS = ["NODE", "HEALTH", "SINCE", "REASON", "EVIDENCE", "CORDON", "GPUS", "MESSAGE"]
