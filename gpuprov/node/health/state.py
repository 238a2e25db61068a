"""The health agent's memory: faults, how each one may clear, and the node conditions they make.

Pure: `step(state, event) -> notes` changes a State and says what happened; the agent feeds it
events (its own start, kernel-log records, check results, GPU resets, admin acks) and
persists the State as JSON under /var/lib/gpuprov/health/ after every change.

The rules (issue 33; why: ../../../../shared/research/health-anchors.md, section 9):
- A restart never heals. The State survives the agent (and the node: the file is on disk).
  On start nothing clears; a condition with no fault and no finished check cycle since the
  start reads Unknown, never False.
- Edge faults (an XID line, "fallen off the bus") have no "healthy again" signal. They clear
  only on a new boot id, a GPU reset seen to succeed after the fault, or an admin's dated
  acknowledgement given after the fault (not in the future). A storm of one XID on one GPU is
  one fault with a count.
- A GPU reset: NVIDIA's driver prints no kernel-log record for one (NVSentinel found the same:
  NVIDIA/NVSentinel docs/designs/020-nvsentinel-gpu-reset.md, "there does not exist a
  corresponding syslog entry"; its reset job writes "GPU reset executed: GPU-<uuid>, success:
  true|false" itself). So a reset is reported (ResetReported, from that record in the kernel
  log: only root can write /dev/kmsg) and then seen: the next check cycle finds the GPU
  answering NVML again (GpuAnswered). Only then does it clear the GPU's edge faults seen
  before the report (GpuReset); a GPU that does not answer is a failed reset.
- Level faults (a check of verify's node phase that fails: ECC, pending remap, NVML init,
  driver/library mismatch, runtime config) clear after CLEAR_AFTER_PASSES consecutive passes;
  a skipped or crashed check neither heals nor hurts.
- The same edge fault raised in a boot after ESCALATE reboots (by default 2: three boots) is
  escalated: "inspect or replace the GPU". An escalated fault clears on an admin ack only.

Standard library only: this runs on the node (gpuprov/node/).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...nvidia import xid_catalog

PREFIX = "gpuprov.io/"
GPU_FAULT = PREFIX + "GPUFault"
DRIVER_PROBLEM = PREFIX + "DriverProblem"
RUNTIME_PROBLEM = PREFIX + "RuntimeProblem"
GPU_DEGRADED = PREFIX + "GPUDegraded"
# The condition types the agent owns: an API (tests/unit/test_health_state.py pins them).
CONDITION_TYPES = (GPU_FAULT, DRIVER_PROBLEM, RUNTIME_PROBLEM, GPU_DEGRADED)

# verify's node-phase checks whose failure is an ongoing problem, and the condition it raises.
# The others are published as metrics only. gpu.xid is not run by the agent: the kernel-log
# follower sees every XID as it comes (kmsg.py) and the table above decides.
CHECK_CONDITIONS = {
    "nvml.init": DRIVER_PROBLEM,
    "driver.version-match": DRIVER_PROBLEM,
    "driver.next-boot": DRIVER_PROBLEM,
    "nvml.gpu-count": GPU_FAULT,
    "gpu.ecc": GPU_FAULT,
    "gpu.memory-remap": GPU_FAULT,
    "gpu.thermal": GPU_DEGRADED,
    "runtime.nvidia": RUNTIME_PROBLEM,
}

CLEAR_AFTER_PASSES = 3
HISTORY_WINDOW_S = 7 * 24 * 3600  # escalation looks at boots within a week (NVSentinel's window)
ACK_SKEW_S = 300  # an ack dated this far ahead of the node's clock is still "now"
MAX_MESSAGE = 1024  # a condition's message; the full list is FAULTS_ANNOTATION's
# The agent's full list of faults on its own Node (fault_records), for when a condition's
# message has to shorten some of them.
FAULTS_ANNOTATION = PREFIX + "health-faults"

EDGE, LEVEL = "edge", "level"


@dataclasses.dataclass
class Fault:
    key: str
    kind: str  # EDGE | LEVEL
    condition: str
    reason: str  # the check id, or "XID79", "FallenOffBus"
    gpu: str  # "0000:3b:00" for edge faults; "" for a node-wide level fault
    summary: str  # one line: what is wrong
    action: str  # what to do
    first_seen: float
    last_seen: float
    boot_id: str
    count: int = 1
    passes: int = 0  # LEVEL: consecutive passes since the last failure
    escalated: bool = False
    evidence: str = ""  # the evidence record's id
    escalate_after: int | None = xid_catalog.ESCALATE_AFTER_REBOOTS


@dataclasses.dataclass
class State:
    boot_id: str = ""
    faults: dict[str, Fault] = dataclasses.field(default_factory=dict)
    # edge fault key -> [[boot_id, time]] of the boots it was raised in (escalation)
    history: dict[str, list[list[Any]]] = dataclasses.field(default_factory=dict)
    # condition type -> {"status": "True" | "False" | "Unknown", "since": time}
    transitions: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    checked: bool = False  # a full check cycle finished since this agent started
    kmsg_seq: int = -1  # the last kernel-log record handled in this boot
    acks_applied: list[str] = dataclasses.field(default_factory=list)  # ack ids, newest last
    uuids: dict[str, str] = dataclasses.field(default_factory=dict)  # pci -> GPU UUID
    xid_counts: dict[str, int] = dataclasses.field(default_factory=dict)  # "pci|xid" -> records
    cleared_total: dict[str, int] = dataclasses.field(default_factory=dict)  # by condition
    raised_total: dict[str, int] = dataclasses.field(default_factory=dict)
    # pci -> when a reset of that GPU was reported; cleared when the GPU answers (or not)
    pending_resets: dict[str, float] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> State:
        data = dict(data)
        faults = {k: Fault(**v) for k, v in (data.pop("faults", None) or {}).items()}
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(faults=faults, **{k: v for k, v in data.items() if k in known})


# -- events ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Started:
    """The agent started (again), in the boot with this id."""

    boot_id: str
    at: float


@dataclasses.dataclass(frozen=True)
class XidSeen:
    pci: str
    xid: int
    message: str
    at: float
    seq: int = -1
    gpu_instance: int | None = None
    evidence: str = ""


@dataclasses.dataclass(frozen=True)
class FallenOffBus:
    pci: str
    message: str
    at: float
    seq: int = -1
    evidence: str = ""


@dataclasses.dataclass(frozen=True)
class CheckResult:
    check: str
    status: str  # pass | fail | warn | skip | error (verify's Finding statuses)
    message: str
    at: float
    evidence: str = ""


@dataclasses.dataclass(frozen=True)
class CycleDone:
    """Every check of one cycle has been fed in."""

    at: float


@dataclasses.dataclass(frozen=True)
class GpuReset:
    """A reset of this GPU that the agent saw succeed (ok=False: seen to fail)."""

    pci: str
    at: float
    ok: bool = True


@dataclasses.dataclass(frozen=True)
class ResetReported:
    """A kernel-log record says this GPU was reset (ok) or that its reset failed."""

    pci: str
    at: float
    ok: bool = True
    seq: int = -1


@dataclasses.dataclass(frozen=True)
class GpuAnswered:
    """A check cycle's view of a GPU with a reported reset: it answered NVML (ok) or not."""

    pci: str
    ok: bool
    at: float


@dataclasses.dataclass(frozen=True)
class Ack:
    """An admin's acknowledgement: the GPU (or the node, gpu None) was verified at `at`."""

    id: str
    at: float
    reason: str
    by: str
    now: float  # the node's clock when the agent read it
    gpu: str | None = None  # a PCI address, a UUID, or None for every GPU


# -- the machine -------------------------------------------------------------------------


def _note(kind: str, fault: Fault | None = None, **more: Any) -> dict:
    note = {"event": kind}
    if fault is not None:
        note.update(key=fault.key, condition=fault.condition, reason=fault.reason,
                    gpu=fault.gpu, summary=fault.summary)
    note.update(more)
    return note


def _clear(state: State, key: str, why: str) -> dict:
    fault = state.faults.pop(key)
    state.cleared_total[fault.condition] = state.cleared_total.get(fault.condition, 0) + 1
    return _note("cleared", fault, why=why)


def _raise_edge(state: State, key: str, reason: str, pci: str, summary: str, action: str,
                at: float, evidence: str, escalate_after: int | None) -> list[dict]:
    fault = state.faults.get(key)
    if fault is not None:
        fault.count += 1
        fault.last_seen = max(fault.last_seen, at)
        return []
    fault = Fault(key, EDGE, GPU_FAULT, reason, pci, summary, action, at, at, state.boot_id,
                  evidence=evidence, escalate_after=escalate_after)
    boots = [entry for entry in state.history.get(key, [])
             if entry[0] != state.boot_id and at - entry[1] <= HISTORY_WINDOW_S]
    boots.append([state.boot_id, at])
    state.history[key] = boots[-10:]
    if escalate_after is not None and len(boots) > escalate_after:
        fault.escalated = True
        fault.action = (f"inspect or replace the GPU: the same fault after {len(boots) - 1} "
                        "reboot(s); automatic repair stops here (clear with gpuprov health ack)")
    state.faults[key] = fault
    state.raised_total[GPU_FAULT] = state.raised_total.get(GPU_FAULT, 0) + 1
    return [_note("raised", fault, escalated=fault.escalated)]


def _gpu_matches(fault: Fault, gpu: str | None, state: State) -> bool:
    if gpu is None:
        return True
    return gpu.lower() in (fault.gpu, state.uuids.get(fault.gpu, "").lower())


def _on_started(state: State, event: Started) -> list[dict]:
    notes: list[dict] = []
    state.checked = False
    if event.boot_id != state.boot_id:
        previous = state.boot_id
        state.boot_id = event.boot_id
        state.kmsg_seq = -1
        state.pending_resets = {}  # the new boot reset every GPU anyway
        if previous:  # a reboot: edge faults of the old boot clear, unless escalated
            for key in [k for k, f in state.faults.items() if f.kind == EDGE and not f.escalated]:
                notes.append(_clear(state, key, f"new boot {event.boot_id}"))
    return notes


def _on_xid(state: State, event: XidSeen) -> list[dict]:
    if event.seq >= 0:
        state.kmsg_seq = max(state.kmsg_seq, event.seq)
    counted = f"{event.pci}|{event.xid}"
    state.xid_counts[counted] = state.xid_counts.get(counted, 0) + 1
    policy = xid_catalog.lookup(event.xid)
    if policy.severity != xid_catalog.FAULT:
        return [_note("counted", None, xid=event.xid, gpu=event.pci, severity=policy.severity)]
    instance = f":gi{event.gpu_instance}" if event.gpu_instance is not None else ""
    summary = f"XID {event.xid} ({policy.name}): {event.message}"[:300]
    action = policy.action + (f" [NVIDIA catalog: {policy.bucket}]" if policy.bucket else "")
    return _raise_edge(state, f"xid:{event.xid}:{event.pci}{instance}", f"XID{event.xid}",
                       event.pci, summary, action, event.at, event.evidence,
                       policy.escalate_after_reboots)


def _on_fallen(state: State, event: FallenOffBus) -> list[dict]:
    if event.seq >= 0:
        state.kmsg_seq = max(state.kmsg_seq, event.seq)
    # One fault with XID 79 on the same GPU: the driver often prints both.
    policy = xid_catalog.lookup(79)
    action = policy.action + (f" [NVIDIA catalog: {policy.bucket}]" if policy.bucket else "")
    return _raise_edge(state, f"xid:79:{event.pci}", "FallenOffBus", event.pci,
                       f"GPU has fallen off the bus: {event.message}"[:300], action,
                       event.at, event.evidence, policy.escalate_after_reboots)


def _on_check(state: State, event: CheckResult) -> list[dict]:
    condition = CHECK_CONDITIONS.get(event.check)
    if condition is None:
        return []
    key = f"check:{event.check}"
    fault = state.faults.get(key)
    if event.status == "fail":
        if fault is None:
            fault = Fault(key, LEVEL, condition, event.check, "", event.message[:300], "",
                          event.at, event.at, state.boot_id, evidence=event.evidence,
                          escalate_after=None)
            state.faults[key] = fault
            state.raised_total[condition] = state.raised_total.get(condition, 0) + 1
            return [_note("raised", fault)]
        fault.summary, fault.last_seen = event.message[:300], event.at
        fault.count += 1
        fault.passes = 0
    elif event.status == "pass" and fault is not None:
        fault.passes += 1
        if fault.passes >= CLEAR_AFTER_PASSES:
            return [_clear(state, key, f"{fault.passes} consecutive passes")]
    return []


def _on_cycle(state: State, event: CycleDone) -> list[dict]:
    state.checked = True
    return []


def _on_reset(state: State, event: GpuReset) -> list[dict]:
    if not event.ok:
        return [_note("reset-failed", None, gpu=event.pci)]
    return [_clear(state, key, f"GPU {event.pci} reset at {event.at:.0f}")
            for key in [k for k, f in state.faults.items()
                        if f.kind == EDGE and f.gpu == event.pci and not f.escalated
                        and f.last_seen <= event.at]]


def _on_reset_reported(state: State, event: ResetReported) -> list[dict]:
    if event.seq >= 0:
        state.kmsg_seq = max(state.kmsg_seq, event.seq)
    if not event.ok:
        state.pending_resets.pop(event.pci, None)
        return [_note("reset-failed", None, gpu=event.pci, why="reported failed")]
    state.pending_resets[event.pci] = event.at
    return [_note("reset-reported", None, gpu=event.pci)]


def _on_answered(state: State, event: GpuAnswered) -> list[dict]:
    reported = state.pending_resets.pop(event.pci, None)
    if reported is None:
        return []
    if not event.ok:
        return [_note("reset-failed", None, gpu=event.pci,
                      why="the GPU did not answer NVML after its reported reset")]
    # Faults seen up to the report clear; one seen after it (before this cycle) stays.
    return _on_reset(state, GpuReset(event.pci, reported))


def _on_ack(state: State, event: Ack) -> list[dict]:
    if event.id in state.acks_applied:
        return []
    state.acks_applied = (state.acks_applied + [event.id])[-50:]
    if event.at > event.now + ACK_SKEW_S:
        return [_note("ack-refused", None, ack=event.id,
                      why=f"dated {event.at - event.now:.0f} s in the future")]
    notes = []
    for key in [k for k, f in state.faults.items()
                if f.kind == EDGE and _gpu_matches(f, event.gpu, state)]:
        fault = state.faults[key]
        if fault.last_seen > event.at:
            notes.append(_note("ack-refused", fault, ack=event.id,
                               why="the fault was seen again after the ack's time"))
            continue
        state.history.pop(key, None)
        notes.append(_clear(state, key, f"acknowledged by {event.by}: {event.reason}"))
    return notes


_HANDLERS: dict[type, Any] = {Started: _on_started, XidSeen: _on_xid, FallenOffBus: _on_fallen,
                              CheckResult: _on_check, CycleDone: _on_cycle, GpuReset: _on_reset,
                              ResetReported: _on_reset_reported, GpuAnswered: _on_answered,
                              Ack: _on_ack}


def step(state: State, event: Any) -> list[dict]:
    """Apply one event; returns notes (raised / counted / cleared / ack-refused ...)."""
    handler = _HANDLERS.get(type(event))
    if handler is None:
        raise TypeError(f"unknown event {event!r}")
    return handler(state, event)


# -- what the node shows -----------------------------------------------------------------


def _where(fault: Fault, uuids: dict[str, str], gpu_index: dict[str, int]) -> tuple[str, str]:
    """(long, short) names of the fault's GPU: "GPU 2 (GPU-..., 0000:3b:00)", "GPU 2"."""
    if not fault.gpu:
        return "", ""
    index = gpu_index.get(fault.gpu)
    short = f"GPU {index}" if index is not None else f"GPU {fault.gpu}"
    uuid = uuids.get(fault.gpu)
    return (f"GPU {index if index is not None else '?'} "
            f"({', '.join(x for x in (uuid, fault.gpu) if x)})"), short


def severity(fault: Fault) -> tuple:
    """Most severe first: escalated (a person must look), then edge faults (a GPU event that
    never goes away by itself), then level faults; the oldest first within each."""
    return (not fault.escalated, fault.kind != EDGE, fault.first_seen, fault.key)


def _message(faults: list[Fault], uuids: dict[str, str], gpu_index: dict[str, int]) -> str:
    """Every fault of one condition, most severe first, in at most MAX_MESSAGE characters:
    each in full while they fit, then the rest by reason and GPU ("and 3 more: XID48 GPU 5,
    ..."), or by reason with counts where even that does not fit. Nothing is left out
    unsaid; the full record of each is in the Node's FAULTS_ANNOTATION and evidence."""
    full = []
    for fault in faults:
        where = _where(fault, uuids, gpu_index)[0]
        times = f" x{fault.count}" if fault.count > 1 else ""
        evidence = f"; evidence {fault.evidence}" if fault.evidence else ""
        action = f"; action: {fault.action}" if fault.action else ""
        escalated = " [ESCALATED]" if fault.escalated else ""
        full.append(f"{fault.reason}{escalated}: {where + ': ' if where else ''}"
                    f"{fault.summary}{times}{evidence}{action}")
    text = " | ".join(full)
    if len(text) <= MAX_MESSAGE:
        return text
    # Shown in full: as many of the most severe as leave room for the rest named by reason and
    # GPU (every fault's GPU named beats one more in full); else by reason with counts.
    for by_gpu in (True, False):
        for shown in range(len(faults) - 1, -1, -1):
            head = " | ".join(full[:shown])
            tail = _tail(faults[shown:], uuids, gpu_index, by_gpu)
            candidate = f"{head} | {tail}" if head else tail
            if len(candidate) <= MAX_MESSAGE:
                return candidate
    return _tail(faults, uuids, gpu_index, False)[:MAX_MESSAGE]


def _tail(rest: list[Fault], uuids: dict[str, str], gpu_index: dict[str, int],
          by_gpu: bool) -> str:
    if by_gpu:
        names = [f"{f.reason}{' [ESCALATED]' if f.escalated else ''}"
                 f"{' ' + _where(f, uuids, gpu_index)[1] if f.gpu else ''}"
                 f"{' x' + str(f.count) if f.count > 1 else ''}" for f in rest]
    else:
        counts: dict[str, int] = {}
        for f in rest:
            counts[f.reason] = counts.get(f.reason, 0) + 1
        names = [f"{reason} on {n} GPU(s)" if n > 1 else reason for reason, n in counts.items()]
    return (f"and {len(rest)} more: {', '.join(names)} (all of them: the Node's "
            f"{FAULTS_ANNOTATION} annotation)")


def fault_records(state: State, gpu_index: dict[str, int] | None = None) -> list[dict]:
    """Every fault, most severe first, as the FAULTS_ANNOTATION lists them."""
    out = []
    for fault in sorted(state.faults.values(), key=lambda f: (f.condition, severity(f))):
        record = {"condition": fault.condition, "reason": fault.reason, "gpu": fault.gpu,
                  "uuid": state.uuids.get(fault.gpu, ""), "index": (gpu_index or {}).get(
                      fault.gpu), "summary": fault.summary, "count": fault.count,
                  "first_seen": fault.first_seen, "last_seen": fault.last_seen,
                  "evidence": fault.evidence, "action": fault.action,
                  "escalated": fault.escalated}
        out.append({k: v for k, v in record.items() if v not in ("", None)})
    return out


def conditions(state: State, now: float, gpu_index: dict[str, int] | None = None) -> list[dict]:
    """The node conditions, one per owned type, with lastTransitionTime moved only on a change
    of status (state.transitions keeps it)."""
    out = []
    for ctype in CONDITION_TYPES:
        faults = sorted((f for f in state.faults.values() if f.condition == ctype),
                        key=severity)
        if faults:
            status, reason = "True", faults[0].reason
            message = _message(faults, state.uuids, gpu_index or {})
        elif state.checked:
            status, reason, message = "False", "NoProblem", "gpuprov health agent: no problem"
        else:
            status, reason = "Unknown", "NotCheckedYet"
            message = "gpuprov health agent started; its first check cycle has not finished"
        previous = state.transitions.get(ctype)
        if previous is None or previous.get("status") != status:
            state.transitions[ctype] = {"status": status, "since": now}
        out.append({"type": ctype, "status": status, "reason": reason, "message": message,
                    "since": state.transitions[ctype]["since"]})
    return out
