"""Take a node out and give it back: the Node patches of a cordon that gpuprov records, and the
host's GPU clients to stop and start around a change of the GPUs. One piece for every part of
gpuprov that takes a node out of service: the driver upgrade (owner "gpu-node-upgrade"), the
MIG stage ("gpu-mig"), health remediation ("health-remediate"). The roles use it through
roles/gpu_node_maintenance (gpuprov/stages/gpu_node_maintenance.py); plain Python (the
kubernetes client) calls it directly: a Node as a dict in (`ApiClient().sanitize_for_
serialization(node)` or `read_node(...).to_dict()`, camelCase or snake_case keys both read),
a merge patch out (`patch_node(name, patch)`). Nothing here talks to the cluster.

    keys(owner)                      Keys: the owner's annotation names (was_cordoned, reason,
                                     since, failed; `all`)
    take(node, owner, reason, now=None)
                                     the patch that cordons the node and records why, when, and
                                     whether it was cordoned before (by an admin, or by another
                                     owner: then what that owner recorded)
    give_back(node, owner)           the patch that removes the owner's record and uncordons only
                                     if the owner put the cordon there and no other owner still
                                     holds the node; call it with the Node as read now
    failed(owner, reason, now=None)  the patch that keeps the node cordoned, the record in place
                                     (so a later give_back still knows what to undo), and the
                                     failure's reason recorded
    was_cordoned(node, owner)        whether giving the node back leaves it cordoned
    holders(node)                    the annotation prefixes of every owner that holds the node
    unfinished(node, owner)          the owner's annotations on the node: an earlier take that
                                     was not given back (or that failed)
    host_clients(active, units=HOST_GPU_CLIENTS, started_elsewhere=())
                                     {"running", "stop", "start"} from `systemctl list-units
                                     --state=active --plain --no-legend <units>`'s output

Owners are names such as "gpu-mig": lower-case letters, digits and "-". The driver upgrade and
the MIG stage keep the annotation names they had before this module (gpuprov.io/upgrade-*,
gpuprov.io/mig-*: inventories and runbooks name them); any other owner's are
gpuprov.io/<owner>-*. A reason is one line (whitespace folded), at most REASON_MAX characters.

Nested holds: if the upgrade cordons a node and health remediation takes it too, the second
records what the first recorded (the state before gpuprov), and whichever gives the node back
last uncordons it; a cordon an admin set before either is recorded as such and kept.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any, NamedTuple

DOMAIN = "gpuprov.io"
# The names the two roles wrote before this module existed, kept (roles/gpu_node_upgrade/
# README.md and roles/gpu_mig/README.md document them; a node left cordoned by an older
# gpuprov is given back by this one).
_LEGACY_PREFIX = {"gpu-node-upgrade": "upgrade", "gpu-mig": "mig"}
_OWNER = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
_WAS_CORDONED = re.compile(rf"^{re.escape(DOMAIN)}/(.+)-was-cordoned$")
# An annotation holds one line: what failed or why the node is out, enough to act on.
REASON_MAX = 400

# Host services that hold the GPUs open, in the order they start: NVIDIA's persistence
# daemon, the fabric manager (NVSwitch systems: HGX/DGX; it must run before a process can use
# the GPUs there, DCGM included), DCGM's host engine under the names of NVIDIA's package
# (nvidia-dcgm) and of older ones (dcgm). Stopped in the reverse order, as NVIDIA's
# mig-manager stops its driver services (NVIDIA/mig-parted deployments/systemd/hooks.sh,
# reverse_array before stop_systemd_services, read 2026-11-26). Last, gpuprov's own health
# agent (roles/gpu_health): it opens the GPUs through NVML every cycle, and a driver swapped or
# a MIG layout changed under it would be a fault it keeps until it passes again (a restart
# never heals): it is stopped first and started last, around the maintenance. Only those that
# run are stopped, and only those are started again.
HOST_GPU_CLIENTS = (
    "nvidia-persistenced.service",
    "nvidia-fabricmanager.service",
    "nvidia-dcgm.service",
    "dcgm.service",
    "gpuprov-health-agent.service",
)


class Keys(NamedTuple):
    was_cordoned: str
    reason: str
    since: str
    failed: str

    @property
    def all(self) -> tuple[str, ...]:
        return tuple(self)


def _prefix(owner: str) -> str:
    if not isinstance(owner, str) or not _OWNER.match(owner):
        raise ValueError(f"owner {owner!r}: lower-case letters, digits and '-', at most 40")
    return _LEGACY_PREFIX.get(owner, owner)


def keys(owner: str) -> Keys:
    prefix = f"{DOMAIN}/{_prefix(owner)}"
    return Keys(f"{prefix}-was-cordoned", f"{prefix}-cordon-reason", f"{prefix}-cordoned-at",
                f"{prefix}-failed")


def _annotations(node: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((node or {}).get("metadata") or {}).get("annotations") or {}


def _unschedulable(node: Mapping[str, Any] | None) -> bool:
    return bool(((node or {}).get("spec") or {}).get("unschedulable"))


def one_line(text: Any) -> str:
    """`text` as one annotation line: whitespace folded, cut to REASON_MAX characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= REASON_MAX else line[:REASON_MAX - 3].rstrip() + "..."


def _timestamp(now: datetime | None) -> str:
    """RFC 3339 in UTC, to the second (what kubectl shows for Kubernetes' own times)."""
    moment = now or datetime.now(timezone.utc)
    if moment.tzinfo is None:
        raise ValueError("now must carry a time zone")
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def holders(node: Mapping[str, Any] | None) -> list[str]:
    """The prefix of each owner whose record is on the node ("upgrade", "mig", ...)."""
    return sorted(match.group(1) for key in _annotations(node)
                  if (match := _WAS_CORDONED.match(key)))


def unfinished(node: Mapping[str, Any] | None, owner: str) -> list[str]:
    annotations = _annotations(node)
    return [key for key in keys(owner).all if key in annotations]


def was_cordoned(node: Mapping[str, Any] | None, owner: str) -> bool:
    """Whether the node was cordoned before `owner` took it: the owner's own record (an
    earlier take), else another owner's record (the state before gpuprov took the node), else
    the node's cordon as it is now (an admin's)."""
    annotations = _annotations(node)
    own = keys(owner).was_cordoned
    if own in annotations:
        return annotations[own] == "true"
    others = [annotations[f"{DOMAIN}/{prefix}-was-cordoned"] for prefix in holders(node)]
    if others:
        return "true" in others
    return _unschedulable(node)


def take(node: Mapping[str, Any] | None, owner: str, reason: str,
         now: datetime | None = None) -> dict[str, Any]:
    """Cordon, with why, since when and what the node was before; taking a node the owner
    already holds (a run that stopped midway) keeps the first record and its time."""
    names = keys(owner)
    annotations = _annotations(node)
    since = annotations.get(names.since) or _timestamp(now)
    return {"spec": {"unschedulable": True},
            "metadata": {"annotations": {
                names.was_cordoned: str(was_cordoned(node, owner)).lower(),
                names.reason: one_line(reason),
                names.since: since}}}


def give_back(node: Mapping[str, Any] | None, owner: str) -> dict[str, Any]:
    """The owner's record goes; the cordon goes only if this owner put it there and no other
    owner holds the node."""
    others = [prefix for prefix in holders(node) if prefix != _prefix(owner)]
    patch: dict[str, Any] = {"metadata": {"annotations": dict.fromkeys(keys(owner).all)}}
    if not was_cordoned(node, owner) and not others:
        patch["spec"] = {"unschedulable": False}
    return patch


def failed(owner: str, reason: str) -> dict[str, Any]:
    """Cordoned, with the reason; the take's record stays, so that the run that fixes the node
    gives back only what was taken."""
    return {"spec": {"unschedulable": True},
            "metadata": {"annotations": {keys(owner).failed: one_line(reason)}}}


def host_clients(active: str, units: Iterable[str] = HOST_GPU_CLIENTS,
                 started_elsewhere: Iterable[str] = ()) -> dict[str, list[str]]:
    """Which of `units` run (from systemctl's list of active units): "running" in start order,
    "stop" in reverse start order, "start" in start order less those another step starts
    itself (the driver role starts nvidia-persistenced); after a failure every running one is
    started again."""
    if not isinstance(active, str):
        raise TypeError(f"expected systemctl's output, got {type(active).__name__}")
    running = {line.split()[0] for line in active.splitlines() if line.split()}
    wanted = [unit for unit in units if unit in running]
    elsewhere = set(started_elsewhere)
    return {"running": wanted, "stop": wanted[::-1],
            "start": [unit for unit in wanted if unit not in elsewhere]}
