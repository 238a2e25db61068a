"""`gpuprov health remediate`: the one place that cordons (and, if asked, taints and drains) GPU
nodes whose agent reports a fault, with fleet brakes, and gives back what it took.

plan() is pure (Node objects in, actions out); apply() performs a plan through the API, one
Kubernetes Event on the node per action. The rules (issue 33; why: research/health-anchors.md):
- A node with gpuprov.io/GPUFault or DriverProblem True is cordoned through gpuprov's one
  node-maintenance piece (gpuprov/cordon.py, owner "health-remediate"): its record holds the
  reason with the evidence ids, and the time. A node an admin (or another gpuprov step, such
  as a driver upgrade) cordoned before is recorded as such and stays cordoned after it
  recovers.
- Brakes: at most max_unavailable nodes cordoned by gpuprov at once (a count or a percentage of
  the GPU nodes; default the larger of 1 and 10 %). The oldest faults go first; the others are
  held and reported. Releases are never braked, and each release frees a place at once.
- Gives back what it took: when the conditions clear, uncordon the nodes gpuprov cordoned,
  remove its taint and annotation. An admin who uncordoned a node meanwhile took it over: the
  annotation goes, nothing else.
- The device plugin's "unhealthy forever" (k8s-device-plugin internal/plugin/server.go v0.20.x:
  no way back from Unhealthy but a restart): a node whose allocatable nvidia.com/gpu is below
  its capacity while its agent reports no GPUFault gets its plugin pod restarted, at most once
  an hour per node.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

from gpuprov import cordon
from gpuprov.errors import GpuprovError
from gpuprov.health import fleet

PLUGIN_RESTART_EVERY_S = 3600.0
PLUGIN_LABELS = ("app.kubernetes.io/name=nvidia-device-plugin", "name=nvidia-device-plugin-ds")
EVENT_SOURCE = "gpuprov-health-remediate"


@dataclasses.dataclass(frozen=True)
class Options:
    max_unavailable: str | None = None  # "3" or "10%"; None: max(1, 10 %)
    taint: bool = False
    drain: bool = False
    dry_run: bool = False
    plugin_namespace: str = "kube-system"


@dataclasses.dataclass(frozen=True)
class Action:
    kind: str  # cordon | adopt | release | forget | hold | restart-plugin
    node: str
    why: str
    annotation: dict | None = None

    def line(self) -> str:
        return f"{self.kind} {self.node}: {self.why}"


def limit(text: str | None, gpu_nodes: int) -> int:
    """--max-unavailable as a node count; GpuprovError (exit 2) for what is not one."""
    if text is None:
        return max(1, math.floor(gpu_nodes * 0.10))
    value = str(text).strip()
    try:
        if value.endswith("%"):
            percent = float(value[:-1])
            if not 0 <= percent <= 100:
                raise ValueError
            return math.floor(gpu_nodes * percent / 100)
        count = int(value)
        if count < 0:
            raise ValueError
        return count
    except ValueError:
        raise GpuprovError(f"--max-unavailable {text!r}: give a node count (3) or a percentage "
                           "of the GPU nodes (10%)") from None


def _reason(problems: list[dict]) -> str:
    return "; ".join(f"{c['type']}={c.get('reason')}" for c in problems)


def _evidence(problems: list[dict]) -> list[str]:
    found = []
    for c in problems:
        message = c.get("message", "")
        while "evidence " in message:
            message = message.split("evidence ", 1)[1]
            found.append(message.split(";")[0].split()[0])
    return found


def plan(nodes: Iterable[Mapping[str, Any]], options: Options, now: float) -> list[Action]:
    healths = [h for h in fleet.fleet(nodes) if h.gpu_node]
    budget = limit(options.max_unavailable, len(healths))
    actions: list[Action] = []
    taken = 0
    wanting = []
    for h in healths:
        faulty = bool(h.actionable)
        if h.cordon is not None:
            if not faulty:
                if h.cordon.get("preexisting"):
                    actions.append(Action("forget", h.name, "recovered; the cordon that was "
                                          "there before stays", h.cordon))
                elif not h.unschedulable:
                    actions.append(Action("forget", h.name, "recovered; an admin uncordoned it "
                                          "meanwhile (took it over)", h.cordon))
                else:
                    actions.append(Action("release", h.name, "recovered: "
                                          "gpuprov's cordon and taint given back",
                                          h.cordon))
                # and on to the plugin's unhealthy-forever below: a node given back gets
                # its GPUs back in the same round
            else:
                if not h.cordon.get("preexisting"):
                    taken += 1
                continue
        if faulty:
            first = min(c.get("lastTransitionTime", "") for c in h.actionable)
            wanting.append((first, h))
        elif (h.capacity_gpus and h.allocatable_gpus < h.capacity_gpus
              and fleet.GPU_FAULT in h.conditions and not h.problems
              and not h.unknown):
            last = h.plugin_restarted_at
            if last is None or now - last >= PLUGIN_RESTART_EVERY_S:
                actions.append(Action(
                    "restart-plugin", h.name,
                    f"allocatable {h.allocatable_gpus} of {h.capacity_gpus} GPUs while the "
                    "agent finds no fault: the device plugin's unhealthy-forever"))
            else:
                actions.append(Action("hold", h.name, "plugin restarted less than an hour ago"))
    # Releases first free their places.
    free = budget - taken
    for first, h in sorted(wanting, key=lambda pair: (pair[0], pair[1].name)):
        evidence = _evidence(h.actionable)
        annotation = {"at": now, "reason": _reason(h.actionable)
                      + (f"; evidence {', '.join(evidence)}" if evidence else ""),
                      "evidence": evidence, "preexisting": h.unschedulable,
                      "taint": bool(options.taint and not h.unschedulable)}
        if h.unschedulable:
            actions.append(Action("adopt", h.name, "faulty, already cordoned by an admin: "
                                  "recorded, left as it is", annotation))
        elif free > 0:
            free -= 1
            actions.append(Action("cordon", h.name, annotation["reason"], annotation))
        else:
            actions.append(Action("hold", h.name, f"faulty since {first}, held back: "
                                  f"{budget} node(s) at most cordoned by gpuprov "
                                  "(--max-unavailable)"))
    return actions


# -- doing it ---------------------------------------------------------------------------


def _event(core: Any, node: str, reason: str, message: str, now: float) -> None:
    from kubernetes import client

    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    core.create_namespaced_event("default", client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name=f"{node}.gpuprov-"),
        # uid = the node's name, as the kubelet sets it on node events and as `kubectl
        # describe node` searches them (kubectl describe.go: ref.UID = types.UID(ref.Name)).
        involved_object=client.V1ObjectReference(kind="Node", name=node, uid=node,
                                                 api_version="v1"),
        reason=reason, message=message[:1000], type="Warning" if reason != "GpuprovRelease"
        else "Normal", source=client.V1EventSource(component=EVENT_SOURCE),
        first_timestamp=stamp, last_timestamp=stamp, count=1))


def _taints_without(node: Mapping[str, Any]) -> list[dict]:
    return [t for t in (node.get("spec") or {}).get("taints") or []
            if t.get("key") != fleet.TAINT_KEY]


def apply(api: Any, actions: list[Action], nodes: Mapping[str, Mapping[str, Any]],
          options: Options, now: float) -> list[str]:
    """Perform the actions (--dry-run: print only); returns one log line per action."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    lines = []
    for action in actions:
        prefix = "would " if options.dry_run else ""
        lines.append(prefix + action.line())
        if options.dry_run or action.kind == "hold":
            continue
        node = nodes[action.node]
        moment = datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
        body: dict[str, Any] = {"metadata": {"annotations": {}}}
        if action.kind in ("cordon", "adopt"):
            body = cordon.take(node, fleet.OWNER, action.annotation["reason"], moment)
            if action.annotation.get("taint"):
                body["spec"]["taints"] = _taints_without(node) + [
                    {"key": fleet.TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
                body["metadata"]["annotations"][fleet.TAINT_ANNOTATION] = "true"
        elif action.kind in ("release", "forget"):
            body = cordon.give_back(node, fleet.OWNER)
            body["metadata"]["annotations"][fleet.TAINT_ANNOTATION] = None
            if (action.annotation or {}).get("taint"):
                body.setdefault("spec", {})["taints"] = _taints_without(node)
        elif action.kind == "restart-plugin":
            restarted = _restart_plugin(core, action.node, options.plugin_namespace)
            lines[-1] += f" ({restarted})"
            body["metadata"]["annotations"][fleet.PLUGIN_RESTART_ANNOTATION] = str(now)
        core.patch_node(action.node, body)
        _event(core, action.node, "Gpuprov" + action.kind.title().replace("-", ""),
               action.line(), now)
        if action.kind == "cordon" and options.drain:
            lines += drain(core, action.node)
    return lines


def _restart_plugin(core: Any, node: str, namespace: str) -> str:
    for selector in PLUGIN_LABELS:
        pods = core.list_namespaced_pod(namespace, label_selector=selector,
                                        field_selector=f"spec.nodeName={node}").items
        if pods:
            for pod in pods:
                core.delete_namespaced_pod(pod.metadata.name, namespace)
            return "deleted " + ", ".join(p.metadata.name for p in pods)
    return f"no device plugin pod on the node in {namespace}"


def drain(core: Any, node: str) -> list[str]:
    """Evict the node's pods (not DaemonSets' or mirror pods): PodDisruptionBudgets hold."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    lines = []
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    for pod in pods:
        owners = pod.metadata.owner_references or []
        if any(o.kind == "DaemonSet" for o in owners) or \
                "kubernetes.io/config.mirror" in (pod.metadata.annotations or {}):
            continue
        if pod.status and pod.status.phase in ("Succeeded", "Failed"):
            continue
        try:
            core.create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace,
                                                client.V1Eviction(metadata=client.V1ObjectMeta(
                                                    name=pod.metadata.name,
                                                    namespace=pod.metadata.namespace)))
            lines.append(f"  evicted {pod.metadata.namespace}/{pod.metadata.name}")
        except ApiException as exc:
            lines.append(f"  not evicted {pod.metadata.namespace}/{pod.metadata.name}: "
                         f"{exc.status} {exc.reason} (a PodDisruptionBudget?)")
    return lines
