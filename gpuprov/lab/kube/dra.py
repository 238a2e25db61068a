"""The scheduler's device allocation for ResourceClaims on one node (SIMULATION: test
infrastructure of the lab's emulated control plane; production code never imports it).

Follows kubernetes/kubernetes staging/src/k8s.io/dynamic-resource-allocation: the CEL
environment of cel/compile.go (the variable `device` with `driver`, `attributes[domain]` and
`capacity[domain]`; an attribute key without a domain belongs to the driver's domain; a domain
the device lacks gives an empty map; a missing attribute is an error that aborts the
allocation) and the allocator of structured/ (a request's devices pass the DeviceClass's
selectors and the request's own, are on the node, and are not held by another allocated claim;
`ExactCount` takes `count` devices, `All` every matching device and needs at least one;
`firstAvailable` takes the first sub-request that can be satisfied). Selectors are evaluated by
cel-python (celpy), a CEL implementation, with Kubernetes' lowerAscii added as a function.

Not emulated (EMULATION.md): constraints (`matchAttribute`, `distinctAttribute`: a claim with
constraints is refused with NotEmulated rather than allocated wrongly), `adminAccess`, device
taints and tolerations, consumable capacity and shared counters, node selectors and allNodes
slices, version attributes as semver values and capacities as quantities (both are plain
strings in CEL here: `semver()`, `quantity()` and their comparisons are not defined), `cel.bind`
and the other Kubernetes CEL extension libraries, and the CEL cost limit.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes

# What the scheduler's Filter reports for a pod whose claims fit nowhere
# (pkg/scheduler/framework/plugins/dynamicresources).
CANNOT_ALLOCATE = "cannot allocate all claims"


class NotEmulated(Exception):
    """The claim uses a part of DRA the lab does not emulate."""


class SelectorError(Exception):
    """A CEL selector failed to compile or to evaluate: the allocation is aborted."""


@dataclass(frozen=True)
class Result:
    """One entry of status.allocation.devices.results."""
    request: str
    driver: str
    pool: str
    device: str

    def to_dict(self) -> dict[str, str]:
        return {"request": self.request, "driver": self.driver, "pool": self.pool,
                "device": self.device}


def _lower_ascii(value: Any) -> celtypes.StringType:
    # Kubernetes' CEL strings library (k8s.io/apiserver/pkg/cel/library): ASCII letters only.
    return celtypes.StringType("".join(
        c.lower() if "A" <= c <= "Z" else c for c in str(value)))


_ENV = celpy.Environment()
_FUNCTIONS = {"lowerAscii": _lower_ascii}


@functools.lru_cache(maxsize=256)
def _program(expression: str) -> Any:
    try:
        return _ENV.program(_ENV.compile(expression), functions=_FUNCTIONS)
    except celpy.CELParseError as exc:
        raise SelectorError(f"compilation failed: {exc}") from None


def _attribute_value(value: Mapping) -> Any:
    for kind in ("string", "int", "bool", "version"):
        if value.get(kind) is not None:
            return value[kind]
    return None


def device_input(driver: str, device: Mapping) -> dict:
    """The CEL variable `device` for a ResourceSlice device of this driver."""
    attributes: dict[str, dict] = {}
    for key, value in (device.get("attributes") or {}).items():
        domain, _, name = key.rpartition("/")
        attributes.setdefault(domain or driver, {})[name] = _attribute_value(value)
    capacity: dict[str, dict] = {}
    for key, value in (device.get("capacity") or {}).items():
        domain, _, name = key.rpartition("/")
        capacity.setdefault(domain or driver, {})[name] = str(value.get("value"))
    return {"driver": driver, "attributes": attributes, "capacity": capacity}


class _Domains(celtypes.MapType):
    """attributes/capacity: a domain the device does not have is an empty map, not an error
    (cel/compile.go)."""

    def __getitem__(self, key: Any) -> Any:
        if key not in self:
            return celtypes.MapType({})
        return super().__getitem__(key)


def _activation(driver: str, device: Mapping) -> dict:
    data = device_input(driver, device)
    cel = celpy.json_to_cel(data)
    cel[celtypes.StringType("attributes")] = _Domains(cel[celtypes.StringType("attributes")])
    cel[celtypes.StringType("capacity")] = _Domains(cel[celtypes.StringType("capacity")])
    return {"device": cel}


def selects(expression: str, driver: str, device: Mapping) -> bool:
    """Whether the CEL selector accepts the device; SelectorError when it cannot say."""
    try:
        result = _program(expression).evaluate(_activation(driver, device))
    except celpy.CELEvalError as exc:
        raise SelectorError(f"{device.get('name')}: {exc.args[0]}") from None
    if isinstance(result, celpy.CELEvalError):
        raise SelectorError(f"{device.get('name')}: {result.args[0]}")
    if not isinstance(result, celtypes.BoolType):
        raise SelectorError(f"{expression!r} must return bool, got {type(result).__name__}")
    return bool(result)


def _expressions(selectors: Iterable[Mapping] | None) -> list[str]:
    return [s["cel"]["expression"] for s in selectors or [] if (s.get("cel") or {}).get(
        "expression")]


def _candidates(request: Mapping, classes: Mapping[str, Mapping], slices: Iterable[Mapping],
                node: str, taken: set) -> list[tuple[str, str, str]] | None:
    """(driver, pool, device) of the node's slices that the request's class and selectors
    accept and nobody holds, in slice order; None when the class does not exist."""
    device_class = classes.get(request.get("deviceClassName"))
    if device_class is None:
        return None
    expressions = (_expressions((device_class.get("spec") or {}).get("selectors"))
                   + _expressions(request.get("selectors")))
    found = []
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("nodeName") != node:
            continue
        driver, pool = spec.get("driver"), (spec.get("pool") or {}).get("name")
        for device in spec.get("devices") or []:
            key = (driver, pool, device.get("name"))
            if key not in taken and all(selects(e, driver, device) for e in expressions):
                found.append(key)
    return found


def _take(request: Mapping, candidates: list) -> list | None:
    if (request.get("allocationMode") or "ExactCount") == "All":
        return list(candidates) or None
    count = request.get("count") or 1
    return candidates[:count] if len(candidates) >= count else None


def in_use(claims: Iterable[Mapping]) -> set[tuple[str, str, str]]:
    """The devices allocated to the claims (their status.allocation results)."""
    return {(r.get("driver"), r.get("pool"), r.get("device"))
            for claim in claims
            for r in (((claim.get("status") or {}).get("allocation") or {}).get("devices")
                      or {}).get("results") or []}


def allocate(claim: Mapping, classes: Iterable[Mapping], slices: Iterable[Mapping], node: str,
             taken: set[tuple[str, str, str]] | None = None) -> list[Result] | None:
    """The devices of `node` the claim gets, one Result each, or None when it does not fit
    there. `taken`: devices other claims hold (in_use)."""
    devices = (claim.get("spec") or {}).get("devices") or {}
    if devices.get("constraints"):
        raise NotEmulated("claim constraints (matchAttribute, distinctAttribute) are not "
                          "emulated in the lab")
    by_name = {(c.get("metadata") or {}).get("name"): c for c in classes}
    slices = list(slices)
    held = set(taken or ())
    results: list[Result] = []
    for request in devices.get("requests") or []:
        if (request.get("exactly") or {}).get("adminAccess"):
            raise NotEmulated("adminAccess requests are not emulated in the lab")
        options = ([(request["name"], request["exactly"])] if request.get("exactly") else
                   [(f"{request['name']}/{sub['name']}", sub)
                    for sub in request.get("firstAvailable") or []])
        chosen = None
        for name, option in options:
            candidates = _candidates(option, by_name, slices, node, held)
            picked = _take(option, candidates) if candidates is not None else None
            if picked:
                chosen = [Result(name, *key) for key in picked]
                break
        if chosen is None:
            return None
        held |= {(r.driver, r.pool, r.device) for r in chosen}
        results += chosen
    return results
