"""The one result type (Finding) and the registry of checks that produce it.

Every check returns a Verdict about one node; the runner turns it into a Finding that
carries the check's id and remediation, and every formatter (table, JSON, JUnit) reads
only Findings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

PASS, WARN, FAIL, ERROR, SKIP = "pass", "warn", "fail", "error", "skip"
STATUSES = (PASS, WARN, FAIL, ERROR, SKIP)

# A check's severity decides what a problem it finds is: "error" -> fail (exit 1),
# "warning" -> warn (reported, exit 0).
SEVERITIES = ("error", "warning")

PHASES = ("node", "cluster", "pod", "container", "swarm")


@dataclasses.dataclass(frozen=True)
class Finding:
    check: str
    node: str
    status: str
    message: str
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    remediation: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")
        # Read-only view: a Finding is shared by every formatter.
        object.__setattr__(self, "details", MappingProxyType(dict(self.details)))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a check concluded about one node; "problem" becomes fail or warn by severity."""

    status: str  # pass | problem | skip | error
    message: str
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # A problem's severity where it is not the check's: "warning" for one the admin accepted.
    severity: str | None = None


def passed(message: str, **details: Any) -> Verdict:
    return Verdict(PASS, message, details)


def problem(message: str, **details: Any) -> Verdict:
    return Verdict("problem", message, details)


def warned(message: str, **details: Any) -> Verdict:
    """A problem reported as a warning whatever the check's severity (one the admin accepted
    in the inventory: the check says which setting)."""
    return Verdict("problem", message, details, severity="warning")


def skipped(message: str, **details: Any) -> Verdict:
    return Verdict(SKIP, message, details)


def errored(message: str, **details: Any) -> Verdict:
    return Verdict(ERROR, message, details)


@dataclasses.dataclass(frozen=True)
class Check:
    id: str
    phase: str
    severity: str
    description: str  # one line: what must hold
    remediation: str  # one line: what to do when it does not
    func: Callable[..., Verdict]
    gpu_only: bool = True  # on a node without NVIDIA GPUs on PCI the check is skipped

    def finding(self, node: str, verdict: Verdict) -> Finding:
        status = verdict.status
        if status == "problem":
            status = FAIL if (verdict.severity or self.severity) == "error" else WARN
        return Finding(
            check=self.id,
            node=node,
            status=status,
            message=verdict.message,
            details=verdict.details,
            remediation=self.remediation if status in (FAIL, WARN, ERROR) else None,
        )


# id -> Check, in registration order (the order reports list them in).
CHECKS: dict[str, Check] = {}


def check(
    id: str,  # noqa: A002 (the check's id is its public name)
    *,
    phase: str,
    severity: str,
    description: str,
    remediation: str,
    gpu_only: bool = True,
) -> Callable[[Callable[..., Verdict]], Callable[..., Verdict]]:
    """Register a check; the decorated function is returned unchanged (tests call it)."""
    if phase not in PHASES or severity not in SEVERITIES:
        raise ValueError(f"check {id}: bad phase {phase!r} or severity {severity!r}")

    def register(func: Callable[..., Verdict]) -> Callable[..., Verdict]:
        if id in CHECKS:
            raise ValueError(f"check {id} registered twice")
        CHECKS[id] = Check(id, phase, severity, description, remediation, func, gpu_only)
        return func

    return register
