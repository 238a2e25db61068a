"""Server-side printing: the Table a real API server answers `kubectl get` with.

kubectl asks for `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` (then v1beta1, then
plain JSON) and prints the server's columns; a server without Tables leaves it NAME and AGE.
Columns and cells follow kubernetes pkg/printers/internalversion/printers.go (AddHandlers and
printPod, printNode, printNamespace, printLease, printPodDisruptionBudget, printDaemonSet,
printConfigMap), read in the copy of the file in github.com/pohly/kubernetes at commit
120fe8a85a4dfc95ca9c7e2e903b8e7a03a5e9b6 (the newest one at hand; later upstream changes to
printPod concern restartable init containers, which the emulator does not run). A column's
description is the official schema's description of its field, as the Go code takes it from the
types' SwaggerDoc(). The API server generates every column, the wide ones too
(pkg/printers/storage/storage.go: GenerateOptions{Wide: true}); kubectl shows priority-1 columns
only with `-o wide`. Each row carries the object as PartialObjectMetadata unless the request says
includeObject=Object or None (apiserver pkg/endpoints/handlers/response.go asTable).

Kinds without a printer here are answered as plain lists, which kubectl prints as NAME and AGE.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

from gpuprov.lab.kube.openapi import field_description
from gpuprov.lab.kube.resources import ResourceType

META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
CORE = "io.k8s.api.core.v1"
# node-role.kubernetes.io/<role> and kubernetes.io/role=<role> labels (printers.go findNodeRoles).
NODE_ROLE_PREFIX = "node-role.kubernetes.io/"
NODE_ROLE_LABEL = "kubernetes.io/role"
# What the node lifecycle controller sets on the pods of an unreachable node
# (kubernetes pkg/util/node NodeUnreachablePodReason).
NODE_UNREACHABLE_POD_REASON = "NodeLost"


def _column(name: str, type_: str = "string", description: str = "", priority: int = 0,
            format_: str = "") -> dict:
    column = {"name": name, "type": type_, "format": format_, "description": description,
              "priority": priority}
    return column


def _name() -> dict:
    return _column("Name", format_="name", description=field_description(META, "name"))


def _age() -> dict:
    return _column("Age", description=field_description(META, "creationTimestamp"))


# -- time ----------------------------------------------------------------------------------------

def parse_time(stamp: str | None) -> datetime.datetime | None:
    if not stamp:
        return None
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def human_duration(seconds: float) -> str:
    """apimachinery pkg/util/duration HumanDuration: ~2-3 significant figures."""
    secs = int(seconds)
    if secs < -1:
        return "<invalid>"
    if secs < 0:
        return "0s"
    if secs < 60 * 2:
        return f"{secs}s"
    minutes = secs // 60
    if minutes < 10:
        s = secs % 60
        return f"{minutes}m" if s == 0 else f"{minutes}m{s}s"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = secs // 3600
    if hours < 8:
        m = minutes % 60
        return f"{hours}h" if m == 0 else f"{hours}h{m}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        h = hours % 24
        return f"{hours // 24}d" if h == 0 else f"{hours // 24}d{h}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if dy == 0 else f"{hours // 24 // 365}y{dy}d"
    return f"{hours // 24 // 365}y"


def since(stamp: str | None, now: datetime.datetime) -> str:
    """printers.go translateTimestampSince."""
    when = parse_time(stamp)
    if when is None:
        return "<unknown>"
    return human_duration((now - when).total_seconds())


# -- pods ----------------------------------------------------------------------------------------

def _pod_columns() -> list[dict]:
    return [
        _name(),
        _column("Ready", description="The aggregate readiness state of this pod for accepting "
                                     "traffic."),
        _column("Status", description="The aggregate status of the containers in this pod."),
        _column("Restarts", description="The number of times the containers in this pod have "
                                        "been restarted and when the last container in this "
                                        "pod has restarted."),
        _age(),
        _column("IP", priority=1, description=field_description(f"{CORE}.PodStatus", "podIP")),
        _column("Node", priority=1,
                description=field_description(f"{CORE}.PodSpec", "nodeName")),
        _column("Nominated Node", priority=1,
                description=field_description(f"{CORE}.PodStatus", "nominatedNodeName")),
        _column("Readiness Gates", priority=1,
                description=field_description(f"{CORE}.PodSpec", "readinessGates")),
    ]


def _condition_true(conditions: list[dict], type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions)


def _last_restart(statuses: list[dict]) -> datetime.datetime | None:
    """When a container of these last terminated before its restart."""
    last = None
    for cs in statuses:
        finished = parse_time(((cs.get("lastState") or {}).get("terminated") or {})
                              .get("finishedAt"))
        if finished is not None and (last is None or last < finished):
            last = finished
    return last


def _init_reason(spec: dict, status: dict) -> str | None:
    """The pod's status while an init container has not succeeded (printPod's first loop),
    None once they all have."""
    for i, cs in enumerate(status.get("initContainerStatuses") or []):
        state = cs.get("state") or {}
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if terminated is not None and terminated.get("exitCode") == 0:
            continue
        if terminated is not None:
            if terminated.get("reason"):
                return "Init:" + terminated["reason"]
            return (f"Init:Signal:{terminated['signal']}" if terminated.get("signal")
                    else f"Init:ExitCode:{terminated.get('exitCode', 0)}")
        if waiting is not None and waiting.get("reason") and \
                waiting["reason"] != "PodInitializing":
            return "Init:" + waiting["reason"]
        return f"Init:{i}/{len(spec.get('initContainers') or [])}"
    return None


def _containers_reason(reason: str, status: dict) -> tuple[str, int]:
    """The pod's status from its containers (printPod's second loop, last container first),
    and how many are ready."""
    ready, has_running = 0, False
    for cs in reversed(status.get("containerStatuses") or []):
        state = cs.get("state") or {}
        waiting, terminated = state.get("waiting"), state.get("terminated")
        if waiting is not None and waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated is not None and terminated.get("reason"):
            reason = terminated["reason"]
        elif terminated is not None:
            reason = (f"Signal:{terminated['signal']}" if terminated.get("signal")
                      else f"ExitCode:{terminated.get('exitCode', 0)}")
        elif cs.get("ready") and state.get("running") is not None:
            has_running = True
            ready += 1
    if reason == "Completed" and has_running:
        reason = "Running" if _condition_true(status.get("conditions") or [], "Ready") \
            else "NotReady"
    return reason, ready


def _pod_cells(pod: dict, now: datetime.datetime) -> tuple[list, list[dict]]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    conditions = status.get("conditions") or []
    reason = status.get("reason") or status.get("phase") or ""
    if any(c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated"
           for c in conditions):
        reason = "SchedulingGated"
    # printPod visits the init containers up to the first that has not succeeded, then, once
    # they all have, the containers: restarts count those; the last restart is of any visited.
    inits = status.get("initContainerStatuses") or []
    blocking = next((i for i, cs in enumerate(inits)
                     if ((cs.get("state") or {}).get("terminated") or {}).get("exitCode") != 0),
                    None)
    init_reason = _init_reason(spec, status)
    ready = 0
    if init_reason is not None:
        reason, counted = init_reason, inits[:(blocking or 0) + 1]
        visited = counted
    else:
        reason, ready = _containers_reason(reason, status)
        counted = status.get("containerStatuses") or []
        visited = inits + counted
    restarts = sum(int(cs.get("restartCount") or 0) for cs in counted)
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == NODE_UNREACHABLE_POD_REASON \
            else "Terminating"
    last_restart = _last_restart(visited)
    restarts_text = str(restarts) if last_restart is None else \
        f"{restarts} ({human_duration((now - last_restart).total_seconds())} ago)"
    pod_ips = status.get("podIPs") or []
    readiness = "<none>"
    gates = spec.get("readinessGates") or []
    if gates:
        true = sum(1 for g in gates if _condition_true(conditions, g.get("conditionType")))
        readiness = f"{true}/{len(gates)}"
    cells = [pod["metadata"]["name"], f"{ready}/{len(spec.get('containers') or [])}", reason,
             restarts_text, since(pod["metadata"].get("creationTimestamp"), now),
             (pod_ips[0].get("ip") if pod_ips else "") or "<none>",
             spec.get("nodeName") or "<none>", status.get("nominatedNodeName") or "<none>",
             readiness]
    phase = status.get("phase")
    if phase in ("Succeeded", "Failed"):
        message = "The pod has completed successfully." if phase == "Succeeded" \
            else "The pod failed."
        return cells, [{"type": "Completed", "status": "True", "reason": phase,
                        "message": message}]
    return cells, []


# -- nodes ---------------------------------------------------------------------------------------

def _node_columns() -> list[dict]:
    info = f"{CORE}.NodeSystemInfo"
    addresses = field_description(f"{CORE}.NodeStatus", "addresses")
    return [
        _name(),
        _column("Status", description="The status of the node"),
        _column("Roles", description="The roles of the node"),
        _age(),
        _column("Version", description=field_description(info, "kubeletVersion")),
        _column("Internal-IP", priority=1, description=addresses),
        _column("External-IP", priority=1, description=addresses),
        _column("OS-Image", priority=1, description=field_description(info, "osImage")),
        _column("Kernel-Version", priority=1,
                description=field_description(info, "kernelVersion")),
        _column("Container-Runtime", priority=1,
                description=field_description(info, "containerRuntimeVersion")),
    ]


def node_roles(node: dict) -> list[str]:
    roles = set()
    for key, value in ((node.get("metadata") or {}).get("labels") or {}).items():
        if key.startswith(NODE_ROLE_PREFIX) and key[len(NODE_ROLE_PREFIX):]:
            roles.add(key[len(NODE_ROLE_PREFIX):])
        elif key == NODE_ROLE_LABEL and value:
            roles.add(value)
    return sorted(roles)


def _node_address(node: dict, type_: str) -> str:
    for address in (node.get("status") or {}).get("addresses") or []:
        if address.get("type") == type_:
            return address.get("address", "")
    return "<none>"


def _node_cells(node: dict, now: datetime.datetime) -> tuple[list, list[dict]]:
    status = node.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    states = []
    if ready is not None:
        states.append("Ready" if ready.get("status") == "True" else "NotReady")
    if not states:
        states.append("Unknown")
    if (node.get("spec") or {}).get("unschedulable"):
        states.append("SchedulingDisabled")
    info = status.get("nodeInfo") or {}
    cells = [node["metadata"]["name"], ",".join(states), ",".join(node_roles(node)) or "<none>",
             since(node["metadata"].get("creationTimestamp"), now),
             info.get("kubeletVersion", ""),
             _node_address(node, "InternalIP"), _node_address(node, "ExternalIP"),
             info.get("osImage") or "<unknown>", info.get("kernelVersion") or "<unknown>",
             info.get("containerRuntimeVersion") or "<unknown>"]
    return cells, []


# -- the others ----------------------------------------------------------------------------------

def _namespace_cells(ns: dict, now: datetime.datetime) -> tuple[list, list[dict]]:
    return [ns["metadata"]["name"], (ns.get("status") or {}).get("phase", ""),
            since(ns["metadata"].get("creationTimestamp"), now)], []


def _lease_cells(lease: dict, now: datetime.datetime) -> tuple[list, list[dict]]:
    return [lease["metadata"]["name"], (lease.get("spec") or {}).get("holderIdentity") or "",
            since(lease["metadata"].get("creationTimestamp"), now)], []


def _pdb_cells(pdb: dict, now: datetime.datetime) -> tuple[list, list[dict]]:
    spec = pdb.get("spec") or {}
    return [pdb["metadata"]["name"],
            str(spec["minAvailable"]) if "minAvailable" in spec else "N/A",
            str(spec["maxUnavailable"]) if "maxUnavailable" in spec else "N/A",
            int((pdb.get("status") or {}).get("disruptionsAllowed") or 0),
            since(pdb["metadata"].get("creationTimestamp"), now)], []


def _format_labels(labels: dict | None) -> str:
    """apimachinery labels.FormatLabels: sorted k=v pairs, "<none>" when empty."""
    return ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items())) or "<none>"


def _format_selector(selector: dict | None) -> str:
    """apimachinery metav1.FormatLabelSelector."""
    if not selector:
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op, values = expr.get("operator", ""), expr.get("values") or []
        if op in ("In", "NotIn"):
            parts.append(f"{expr['key']} {op.lower()} ({','.join(values)})")
        elif op == "Exists":
            parts.append(expr["key"])
        elif op == "DoesNotExist":
            parts.append("!" + expr["key"])
    return ",".join(parts) or "<none>"


def _daemonset_cells(ds: dict, now: datetime.datetime) -> tuple[list, list[dict]]:
    status, spec = ds.get("status") or {}, ds.get("spec") or {}
    pod_spec = (spec.get("template") or {}).get("spec") or {}
    containers = pod_spec.get("containers") or []
    return [ds["metadata"]["name"], int(status.get("desiredNumberScheduled") or 0),
            int(status.get("currentNumberScheduled") or 0), int(status.get("numberReady") or 0),
            int(status.get("updatedNumberScheduled") or 0),
            int(status.get("numberAvailable") or 0), _format_labels(pod_spec.get("nodeSelector")),
            since(ds["metadata"].get("creationTimestamp"), now),
            ",".join(c.get("name", "") for c in containers),
            ",".join(c.get("image", "") for c in containers),
            _format_selector(spec.get("selector"))], []


def _configmap_cells(cm: dict, now: datetime.datetime) -> tuple[list, list[dict]]:
    return [cm["metadata"]["name"], len(cm.get("data") or {}) + len(cm.get("binaryData") or {}),
            since(cm["metadata"].get("creationTimestamp"), now)], []


def _daemonset_columns() -> list[dict]:
    status = "io.k8s.api.apps.v1.DaemonSetStatus"
    return [
        _name(),
        _column("Desired", "integer", field_description(status, "desiredNumberScheduled")),
        _column("Current", "integer", field_description(status, "currentNumberScheduled")),
        _column("Ready", "integer", field_description(status, "numberReady")),
        _column("Up-to-date", "integer", field_description(status, "updatedNumberScheduled")),
        _column("Available", "integer", field_description(status, "numberAvailable")),
        _column("Node Selector", description=field_description(f"{CORE}.PodSpec",
                                                               "nodeSelector")),
        _age(),
        _column("Containers", priority=1, description="Names of each container in the "
                                                      "template."),
        _column("Images", priority=1, description="Images referenced by each container in "
                                                  "the template."),
        _column("Selector", priority=1, description=field_description(
            "io.k8s.api.apps.v1.DaemonSetSpec", "selector")),
    ]


Printer = tuple[Callable[[], list[dict]], Callable[[dict, datetime.datetime], tuple[list, list]]]

PRINTERS: dict[str, Printer] = {
    "/v1/pods": (_pod_columns, _pod_cells),
    "/v1/nodes": (_node_columns, _node_cells),
    "/v1/namespaces": (lambda: [_name(), _column("Status", description="The status of the "
                                                                       "namespace"), _age()],
                       _namespace_cells),
    "/v1/configmaps": (lambda: [_name(), _column("Data", description=field_description(
        f"{CORE}.ConfigMap", "data")), _age()], _configmap_cells),
    "coordination.k8s.io/v1/leases": (
        lambda: [_name(), _column("Holder", description=field_description(
            "io.k8s.api.coordination.v1.LeaseSpec", "holderIdentity")), _age()],
        _lease_cells),
    "policy/v1/poddisruptionbudgets": (
        lambda: [_name(),
                 _column("Min Available",
                         description="The minimum number of pods that must be available."),
                 _column("Max Unavailable",
                         description="The maximum number of pods that may be unavailable."),
                 _column("Allowed Disruptions", "integer",
                         "Calculated number of pods that may be disrupted at this time."),
                 _age()],
        _pdb_cells),
    "apps/v1/daemonsets": (_daemonset_columns, _daemonset_cells),
}


def has_printer(rt: ResourceType) -> bool:
    return rt.key in PRINTERS


def _row_object(obj: dict, include: str, table_version: str) -> dict | None:
    if include == "Object":
        return obj
    if include == "None":
        return None
    return {"kind": "PartialObjectMetadata", "apiVersion": f"meta.k8s.io/{table_version}",
            "metadata": obj.get("metadata") or {}}


def table(rt: ResourceType, objects: list[dict], resource_version: str, include_object: str = "",
          table_version: str = "v1", no_headers: bool = False,
          now: datetime.datetime | None = None) -> dict:
    """A meta.k8s.io Table of the objects (one object for a GET)."""
    columns, cells_of = PRINTERS[rt.key]
    now = now or datetime.datetime.now(datetime.timezone.utc)
    rows = []
    for obj in objects:
        cells, conditions = cells_of(obj, now)
        row: dict = {"cells": cells, "object": _row_object(obj, include_object, table_version)}
        if conditions:
            row["conditions"] = conditions
        rows.append(row)
    out = {"kind": "Table", "apiVersion": f"meta.k8s.io/{table_version}",
           "metadata": {"resourceVersion": resource_version}, "rows": rows}
    out["columnDefinitions"] = [] if no_headers else columns()
    return out
