"""Validation of the objects written through the registry, as the API server validates them:
object names and labels, the official schema (schema.py), then the semantic rules the schema
cannot express for the fields the emulated workloads use (containers, extended resources,
selector/template match, restartPolicy, immutable pod and Job fields). A failure is a 422
Invalid Status listing every cause.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gpuprov.lab.kube import schema, selectors
from gpuprov.lab.kube.errors import ApiError
from gpuprov.lab.kube.resources import ResourceType

if TYPE_CHECKING:
    from gpuprov.lab.kube.registry import Registry

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def validate(rt: ResourceType, obj: dict, registry: Registry) -> None:
    """Raise 422 Invalid with every cause found; registry answers what is stored already."""
    meta = obj["metadata"]
    name = meta.get("name", "")
    causes: list[tuple[str, str, str]] = []
    pattern = _DNS_LABEL if rt.kind == "Namespace" else _DNS_SUBDOMAIN
    limit = 63 if rt.kind == "Namespace" else 253
    if not pattern.match(name) or len(name) > limit:
        causes.append(("FieldValueInvalid", "metadata.name",
                       f"Invalid value: {name!r}: a lowercase RFC 1123 "
                       f"{'label' if limit == 63 else 'subdomain'} must consist of lower "
                       "case alphanumeric characters, '-' or '.', and must start and end "
                       "with an alphanumeric character"))
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, label = key.rpartition("/")
        if (not _LABEL_NAME.match(label) or len(label) > 63
                or (prefix and not _DNS_SUBDOMAIN.match(prefix))):
            causes.append(("FieldValueInvalid", "metadata.labels",
                           f"Invalid value: {key!r}: name part must consist of "
                           "alphanumeric characters, '-', '_' or '.'"))
        if not isinstance(value, str) or not _LABEL_VALUE.match(value) or len(value) > 63:
            causes.append(("FieldValueInvalid", "metadata.labels",
                           f"Invalid value: {value!r}: a valid label must be an empty "
                           "string or consist of alphanumeric characters, '-', '_' or "
                           "'.', and must start and end with an alphanumeric character"))
    causes += schema.validate(obj)
    if not causes:
        causes += _semantic_causes(rt, obj, registry)
    if causes:
        raise ApiError.invalid(rt.group, rt.kind, name, causes)


def _semantic_causes(rt: ResourceType, obj: dict, registry: Registry) -> list:
    """The semantic rules (beyond the schema) for the fields the emulated workloads use."""
    causes: list[tuple[str, str, str]] = []
    if rt.kind == "Pod":
        causes += _pod_spec_causes(obj["spec"], "spec")
        old = registry.find(rt, obj["metadata"]["namespace"], obj["metadata"]["name"])
        if old is not None and old["metadata"]["uid"] == obj["metadata"]["uid"]:
            causes += _pod_update_causes(old["spec"], obj["spec"])
    elif rt.kind in ("DaemonSet", "Job"):
        spec = obj["spec"]
        template = spec.get("template") or {}
        causes += _pod_spec_causes(template.get("spec") or {}, "spec.template.spec")
        policy = (template.get("spec") or {}).get("restartPolicy")
        allowed = ("Always",) if rt.kind == "DaemonSet" else ("OnFailure", "Never")
        if policy not in allowed:
            causes.append(("FieldValueNotSupported", "spec.template.spec.restartPolicy",
                           f"Unsupported value: {policy!r}: supported values: "
                           + ", ".join(f'"{a}"' for a in allowed)))
        reqs = selectors.from_label_selector_object(spec.get("selector"))
        if reqs is None:
            causes.append(("FieldValueRequired", "spec.selector", "Required value"))
        elif not reqs or not selectors.matches_all(
                reqs, (template.get("metadata") or {}).get("labels")):
            causes.append(("FieldValueInvalid", "spec.template.metadata.labels",
                           "Invalid value: `selector` does not match template `labels`"))
        old = registry.find(rt, obj["metadata"]["namespace"], obj["metadata"]["name"])
        if old is not None and old["metadata"]["uid"] == obj["metadata"]["uid"]:
            immutable = ["selector"] + (["template"] if rt.kind == "Job" else [])
            for key in immutable:
                if old["spec"].get(key) != spec.get(key):
                    causes.append(("FieldValueInvalid", f"spec.{key}",
                                   "Invalid value: field is immutable"))
    elif rt.group == "resource.k8s.io":
        causes += _resource_causes(rt, obj, registry)
    return causes


# Dynamic Resource Allocation: the rules of kubernetes/kubernetes
# pkg/apis/resource/validation/validation.go (stored commit 009801d930) that the strict schemas
# lack (they carry the limits only in descriptions), for the fields DRA drivers and claims use:
# a slice's node selection and its size, a device's attributes, a request's kind and count,
# unique request names, constraints and config naming known requests, and immutable claim and
# template specs. Not checked: CEL compilation and cost, name formats of drivers, pools,
# devices and qualified attribute names, counters, taints, consumable capacity, status updates.
RESOURCE_SLICE_MAX_DEVICES = 128  # resource.ResourceSliceMaxDevices
ATTRIBUTES_AND_CAPACITIES_MAX = 32  # resource.ResourceSliceMaxAttributesAndCapacitiesPerDevice
DEVICE_REQUESTS_MAX = 32  # resource.DeviceRequestsMaxSize
_NODE_SELECTION = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
_ATTRIBUTE_VALUES = ("bool", "int", "string", "version")


def _resource_causes(rt: ResourceType, obj: dict, registry: Registry) -> list:
    spec = obj.get("spec") or {}
    causes: list[tuple[str, str, str]] = []
    if rt.kind == "ResourceSlice":
        causes += _slice_causes(spec)
    elif rt.kind == "ResourceClaim":
        causes += _device_claim_causes(spec.get("devices") or {}, "spec.devices")
    elif rt.kind == "ResourceClaimTemplate":
        causes += _device_claim_causes(((spec.get("spec") or {}).get("devices") or {}),
                                       "spec.spec.devices")
    if rt.kind in ("ResourceClaim", "ResourceClaimTemplate"):
        old = registry.find(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if old is not None and old["metadata"]["uid"] == obj["metadata"].get("uid") and (
                old.get("spec") != obj.get("spec")):
            # The spec is immutable; on update only that is reported.
            causes = [("FieldValueInvalid", "spec", "Invalid value: field is immutable")]
    return causes


def _slice_causes(spec: dict) -> list:
    causes = []
    # false and "" count as unset, as the Go pointer fields' zero values.
    chosen = [f"`{f}`" for f in _NODE_SELECTION if spec.get(f) not in (None, False, "")]
    if not chosen:
        causes.append(("FieldValueRequired", "spec", "Required value: exactly one of "
                       "`nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is "
                       "required"))
    elif len(chosen) > 1:
        causes.append(("FieldValueInvalid", "spec", f"Invalid value: \"{{{', '.join(chosen)}}}\": "
                       "exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                       "`perDeviceNodeSelection` is required, but multiple fields are set"))
    pool = spec.get("pool") or {}
    if (pool.get("resourceSliceCount") or 0) <= 0:
        causes.append(("FieldValueInvalid", "spec.pool.resourceSliceCount",
                       f"Invalid value: {pool.get('resourceSliceCount')}: must be greater "
                       "than zero"))
    devices = spec.get("devices") or []
    if len(devices) > RESOURCE_SLICE_MAX_DEVICES:
        causes.append(("FieldValueTooMany", "spec.devices",
                       f"Too many: {len(devices)}: must have at most "
                       f"{RESOURCE_SLICE_MAX_DEVICES} items"))
    seen: set[str] = set()
    for i, device in enumerate(devices):
        path = f"spec.devices[{i}]"
        name = device.get("name")
        if name in seen:
            causes.append(("FieldValueDuplicate", f"{path}.name", f"Duplicate value: {name!r}"))
        seen.add(name)
        attributes = device.get("attributes") or {}
        total = len(attributes) + len(device.get("capacity") or {})
        if total > ATTRIBUTES_AND_CAPACITIES_MAX:
            causes.append(("FieldValueTooMany", path, f"Too many: {total}: must have at most "
                           f"{ATTRIBUTES_AND_CAPACITIES_MAX} attributes and capacities "
                           "combined"))
        for key, value in attributes.items():
            set_values = [k for k in _ATTRIBUTE_VALUES if (value or {}).get(k) is not None]
            if len(set_values) != 1:
                causes.append(("FieldValueInvalid", f"{path}.attributes[{key}]",
                               "Invalid value: exactly one value must be specified"))
    return causes


def _device_claim_causes(devices: dict, path: str) -> list:
    causes = []
    requests = devices.get("requests") or []
    if len(requests) > DEVICE_REQUESTS_MAX:
        causes.append(("FieldValueTooMany", f"{path}.requests", f"Too many: {len(requests)}: "
                       f"must have at most {DEVICE_REQUESTS_MAX} items"))
    names: dict[str, set[str]] = {}
    for i, request in enumerate(requests):
        where = f"{path}.requests[{i}]"
        name = request.get("name")
        if name in names:
            causes.append(("FieldValueDuplicate", f"{where}.name", f"Duplicate value: {name!r}"))
        exactly, first = request.get("exactly"), request.get("firstAvailable") or []
        names[name] = {sub.get("name") for sub in first}
        if exactly is None and not first:
            causes.append(("FieldValueRequired", where, "Required value: exactly one of "
                           "`exactly` or `firstAvailable` is required"))
        elif exactly is not None and first:
            causes.append(("FieldValueInvalid", where, "Invalid value: null: exactly one of "
                           "`exactly` or `firstAvailable` is required, but multiple fields are "
                           "set"))
        elif exactly is not None:
            causes += _allocation_mode_causes(exactly, f"{where}.exactly")
        else:
            for j, sub in enumerate(first):
                causes += _allocation_mode_causes(sub, f"{where}.firstAvailable[{j}]")

    def known(reference: str) -> bool:
        request, _, sub = reference.partition("/")
        return request in names and (not sub or sub in names[request])

    for key in ("constraints", "config"):
        for i, entry in enumerate(devices.get(key) or []):
            for j, reference in enumerate(entry.get("requests") or []):
                if not known(reference):
                    causes.append(("FieldValueInvalid", f"{path}.{key}[{i}].requests[{j}]",
                                   f"Invalid value: {reference!r}: must be the name of a "
                                   "request in the claim or the name of a request and a "
                                   "subrequest separated by '/'"))
    return causes


def _allocation_mode_causes(request: dict, where: str) -> list:
    # The defaults the API server applies before validating: ExactCount, and count 1 with it.
    mode = request.get("allocationMode") or "ExactCount"
    count = request.get("count")
    if mode == "All" and count not in (None, 0):
        return [("FieldValueInvalid", f"{where}.count", f"Invalid value: {count}: must not be "
                 "specified when allocationMode is 'All'")]
    if mode == "ExactCount" and count is not None and count <= 0:
        return [("FieldValueInvalid", f"{where}.count", f"Invalid value: {count}: must be "
                 "greater than zero")]
    if mode not in ("All", "ExactCount"):
        return [("FieldValueNotSupported", f"{where}.allocationMode",
                 f"Unsupported value: {mode!r}: supported values: \"All\", \"ExactCount\"")]
    return []


def _pod_spec_causes(spec: dict, path: str) -> list:
    causes = []
    containers = spec.get("containers") or []
    if not containers:
        causes.append(("FieldValueRequired", f"{path}.containers", "Required value"))
    seen = set()
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            where = f"{path}.{group}[{i}]"
            name = c.get("name", "")
            if not _DNS_LABEL.match(name):
                causes.append(("FieldValueInvalid", f"{where}.name",
                               f"Invalid value: {name!r}: a lowercase RFC 1123 label"))
            if name in seen:
                causes.append(("FieldValueDuplicate", f"{where}.name",
                               f"Duplicate value: {name!r}"))
            seen.add(name)
            if not c.get("image"):
                causes.append(("FieldValueRequired", f"{where}.image", "Required value"))
            res = c.get("resources") or {}
            limits, requests = res.get("limits") or {}, res.get("requests") or {}
            for key in set(limits) | set(requests):
                if "/" not in key or key.startswith("kubernetes.io/"):
                    continue  # extended resources only: cpu/memory are not emulated
                if key not in limits:
                    causes.append(("FieldValueRequired", f"{where}.resources.limits",
                                   f"Required value: Limit must be set for non overcommitable "
                                   f"resources: {key}"))
                elif key in requests and str(requests[key]) != str(limits[key]):
                    causes.append(("FieldValueInvalid", f"{where}.resources.requests[{key}]",
                                   f"Invalid value: {requests[key]!r}: must be equal to {key} "
                                   "limit"))
                elif not str(limits[key]).isdigit():
                    causes.append(("FieldValueInvalid", f"{where}.resources.limits[{key}]",
                                   f"Invalid value: {limits[key]!r}: must be an integer"))
    return causes


_POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds",
                "nodeName", "schedulingGates")


def _pod_update_causes(old: dict, new: dict) -> list:
    def frozen(spec: dict) -> dict:
        out = {k: v for k, v in spec.items() if k not in _POD_MUTABLE}
        out["containers"] = [{k: v for k, v in c.items() if k != "image"}
                             for c in spec.get("containers") or []]
        return out

    causes = []
    if frozen(old) != frozen(new):
        causes.append(("FieldValueForbidden", "spec",
                       "Forbidden: pod updates may not change fields other than "
                       "`spec.containers[*].image`, `spec.activeDeadlineSeconds`, "
                       "`spec.tolerations` (only additions to existing tolerations), "
                       "`spec.terminationGracePeriodSeconds`"))
    if old.get("nodeName") and new.get("nodeName") != old.get("nodeName"):
        causes.append(("FieldValueForbidden", "spec.nodeName",
                       "Forbidden: pod updates may not change nodeName"))
    return causes
