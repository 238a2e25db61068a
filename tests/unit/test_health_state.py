"""The health agent's state machine (gpuprov/node/health/state.py): a restart never heals, each
clearing rule, escalation, conditions; with property tests over orders of events."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuprov.node.health import state as hs
from gpuprov.nvidia import xid_catalog

PCI = "0000:3b:00"


def fresh(boot: str = "boot-a", at: float = 100.0) -> hs.State:
    s = hs.State()
    hs.step(s, hs.Started(boot, at))
    return s


def status(s: hs.State, ctype: str = hs.GPU_FAULT, now: float = 1000.0) -> str:
    return next(c for c in hs.conditions(s, now) if c["type"] == ctype)["status"]


def roundtrip(s: hs.State) -> hs.State:
    return hs.State.from_json(json.loads(json.dumps(s.to_json())))


def test_condition_types_are_an_api():
    # Renaming one strands a True condition on every node (NVSentinel's clean-up hook exists
    # for that): a rename needs a migration, and this test changed with it.
    assert hs.CONDITION_TYPES == ("gpuprov.io/GPUFault", "gpuprov.io/DriverProblem",
                                  "gpuprov.io/RuntimeProblem", "gpuprov.io/GPUDegraded")
    assert all(t.startswith(hs.PREFIX) for t in hs.CONDITION_TYPES)


def test_unknown_until_the_first_cycle_then_false():
    s = fresh()
    assert status(s) == "Unknown"
    hs.step(s, hs.CycleDone(110))
    assert status(s) == "False"


def test_critical_xid_raises_and_restart_keeps_it():
    s = fresh()
    notes = hs.step(s, hs.XidSeen(PCI, 79, "GPU has fallen off the bus.", 120, seq=5))
    assert [n["event"] for n in notes] == ["raised"]
    s = roundtrip(s)
    hs.step(s, hs.Started("boot-a", 200))  # the agent restarted, same boot
    assert status(s) == "True"
    hs.step(s, hs.CycleDone(210))
    for i in range(10):  # every check passing says nothing about an XID
        hs.step(s, hs.CheckResult("gpu.ecc", "pass", "ok", 220 + i))
    assert status(s) == "True"
    assert s.kmsg_seq == 5


def test_app_xid_is_counted_not_a_fault():
    s = fresh()
    for xid in xid_catalog.APP_XIDS_DEVICE_PLUGIN:
        assert hs.step(s, hs.XidSeen(PCI, xid, "app", 120))[0]["event"] == "counted"
    assert hs.step(s, hs.XidSeen(PCI, 999, "new", 121))[0]["severity"] == xid_catalog.UNKNOWN
    assert s.faults == {}


def test_storm_is_one_fault_with_a_count():
    s = fresh()
    for i in range(1000):
        hs.step(s, hs.XidSeen(PCI, 48, "DBE", 120 + i, seq=i))
    (fault,) = s.faults.values()
    assert fault.count == 1000 and fault.first_seen == 120 and fault.last_seen == 1119
    assert s.raised_total[hs.GPU_FAULT] == 1


def test_new_boot_clears_edge_faults_not_level_faults():
    s = fresh()
    hs.step(s, hs.XidSeen(PCI, 79, "x", 120))
    hs.step(s, hs.CheckResult("gpu.ecc", "fail", "1 uncorrectable", 121))
    notes = hs.step(s, hs.Started("boot-b", 500))
    assert [n["key"] for n in notes] == [f"xid:79:{PCI}"]
    assert list(s.faults) == ["check:gpu.ecc"]
    assert s.kmsg_seq == -1  # a new boot's kernel log starts again


def test_level_fault_clears_after_n_consecutive_passes_only():
    s = fresh()
    hs.step(s, hs.CheckResult("runtime.nvidia", "fail", "no nvidia runtime", 1))
    for _ in range(hs.CLEAR_AFTER_PASSES - 1):
        hs.step(s, hs.CheckResult("runtime.nvidia", "pass", "ok", 2))
    hs.step(s, hs.CheckResult("runtime.nvidia", "fail", "no nvidia runtime", 3))  # resets
    for _ in range(hs.CLEAR_AFTER_PASSES - 1):
        hs.step(s, hs.CheckResult("runtime.nvidia", "skip", "?", 4))  # neither heals nor hurts
        hs.step(s, hs.CheckResult("runtime.nvidia", "pass", "ok", 4))
    assert "check:runtime.nvidia" in s.faults
    hs.step(s, hs.CheckResult("runtime.nvidia", "pass", "ok", 5))
    assert "check:runtime.nvidia" not in s.faults


def test_reset_clears_only_faults_seen_before_it():
    s = fresh()
    hs.step(s, hs.XidSeen(PCI, 48, "DBE", 120))
    hs.step(s, hs.XidSeen("0000:3c:00", 48, "DBE", 120))
    assert hs.step(s, hs.GpuReset(PCI, 110)) == []  # before the fault: not a cure
    assert hs.step(s, hs.GpuReset(PCI, 130, ok=False))[0]["event"] == "reset-failed"
    assert len(s.faults) == 2
    hs.step(s, hs.GpuReset(PCI, 130))
    assert list(s.faults) == ["xid:48:0000:3c:00"]


def test_a_reported_reset_clears_when_the_gpu_answers_again():
    s = fresh()
    hs.step(s, hs.XidSeen(PCI, 79, "fallen off the bus", 120, seq=5))
    notes = hs.step(s, hs.ResetReported(PCI, 130, seq=6))
    assert notes[0]["event"] == "reset-reported" and s.kmsg_seq == 6
    hs.step(s, hs.XidSeen(PCI, 48, "DBE", 135, seq=7))  # after the reset: not cured by it
    s = roundtrip(s)  # the report survives an agent restart
    assert hs.step(s, hs.GpuAnswered("0000:99:00", True, 140)) == []  # another GPU
    cleared = hs.step(s, hs.GpuAnswered(PCI, True, 140))
    assert [(n["event"], n["key"]) for n in cleared] == [("cleared", f"xid:79:{PCI}")]
    assert list(s.faults) == [f"xid:48:{PCI}"] and not s.pending_resets
    assert hs.step(s, hs.GpuAnswered(PCI, True, 150)) == []  # one report, one clearing


def test_a_reset_that_failed_or_was_not_answered_clears_nothing():
    s = fresh()
    hs.step(s, hs.XidSeen(PCI, 79, "x", 120))
    assert hs.step(s, hs.ResetReported(PCI, 130, ok=False))[0]["event"] == "reset-failed"
    assert hs.step(s, hs.GpuAnswered(PCI, True, 140)) == []  # nothing reported as done
    hs.step(s, hs.ResetReported(PCI, 150))
    assert hs.step(s, hs.GpuAnswered(PCI, False, 160))[0]["event"] == "reset-failed"
    assert list(s.faults) == [f"xid:79:{PCI}"]
    hs.step(s, hs.ResetReported(PCI, 170))
    hs.step(s, hs.Started("boot-a", 175))  # the agent restarted: the report stays
    assert s.pending_resets == {PCI: 170}
    hs.step(s, hs.Started("boot-b", 180))  # a new boot clears the fault and the report
    assert not s.faults and not s.pending_resets


def test_ack_rules():
    s = fresh()
    hs.step(s, hs.XidSeen(PCI, 79, "x", 120))
    future = hs.step(s, hs.Ack("a1", 10_000, "checked", "admin", now=130))
    assert future[0]["event"] == "ack-refused" and s.faults
    before = hs.step(s, hs.Ack("a2", 110, "checked", "admin", now=130))
    assert before[0]["event"] == "ack-refused" and s.faults
    other = hs.step(s, hs.Ack("a3", 125, "checked", "admin", now=130, gpu="0000:99:00"))
    assert other == [] and s.faults
    done = hs.step(s, hs.Ack("a4", 125, "reseated", "admin", now=130, gpu=PCI))
    assert done[0]["event"] == "cleared" and not s.faults
    assert hs.step(s, hs.Ack("a4", 125, "again", "admin", now=130)) == []  # applied once


def test_ack_by_uuid():
    s = fresh()
    s.uuids[PCI] = "GPU-abc"
    hs.step(s, hs.XidSeen(PCI, 79, "x", 120))
    hs.step(s, hs.Ack("a", 125, "ok", "admin", now=130, gpu="GPU-ABC"))
    assert not s.faults


def test_same_fault_after_two_reboots_escalates_and_survives_reboot_and_reset():
    s = fresh("b1", 0)
    for i, boot in enumerate(("b1", "b2", "b3")):
        hs.step(s, hs.Started(boot, 1000 * i))
        notes = hs.step(s, hs.XidSeen(PCI, 79, "x", 1000 * i + 10))
    assert notes[0]["escalated"] is True
    fault = s.faults[f"xid:79:{PCI}"]
    assert "inspect or replace" in fault.action
    hs.step(s, hs.Started("b4", 5000))
    hs.step(s, hs.GpuReset(PCI, 5001))
    assert fault.key in s.faults
    hs.step(s, hs.Ack("ok", 5002, "replaced", "admin", now=5003))
    assert not s.faults and fault.key not in s.history


def test_xid94_does_not_escalate():
    s = fresh("b1", 0)
    for i, boot in enumerate(("b1", "b2", "b3", "b4")):
        hs.step(s, hs.Started(boot, 1000 * i))
        notes = hs.step(s, hs.XidSeen(PCI, 94, "contained", 1000 * i + 10, gpu_instance=5))
    assert notes[0]["escalated"] is False


def test_last_transition_time_moves_only_on_a_transition():
    s = fresh()
    hs.step(s, hs.CycleDone(1))
    first = {c["type"]: c["since"] for c in hs.conditions(s, 10)}
    hs.step(s, hs.XidSeen(PCI, 79, "x", 20))
    second = {c["type"]: c["since"] for c in hs.conditions(s, 30)}
    hs.step(s, hs.XidSeen(PCI, 79, "x", 40))
    hs.step(s, hs.XidSeen(PCI, 48, "y", 41))  # another fault, same condition: no transition
    third = {c["type"]: c["since"] for c in hs.conditions(s, 50)}
    assert second[hs.GPU_FAULT] == third[hs.GPU_FAULT] == 30
    assert first[hs.DRIVER_PROBLEM] == third[hs.DRIVER_PROBLEM] == 10


def test_message_names_gpu_uuid_evidence_and_action():
    s = fresh()
    s.uuids[PCI] = "GPU-1234"
    hs.step(s, hs.XidSeen(PCI, 79, "GPU has fallen off the bus.", 20, evidence="ev-1"))
    (fault_condition,) = [c for c in hs.conditions(s, 30, {PCI: 2}) if c["status"] == "True"]
    assert fault_condition["reason"] == "XID79"
    for part in ("GPU 2", "GPU-1234", PCI, "ev-1", "RESTART_BM", "fallen off the bus"):
        assert part in fault_condition["message"]


# -- properties over orders of events -----------------------------------------------------

GPUS = ("0000:01:00", "0000:02:00")
events = st.one_of(
    st.builds(lambda b: ("start", b), st.sampled_from(("b1", "b2", "b3"))),
    st.builds(lambda g, x: ("xid", g, x), st.sampled_from(GPUS), st.sampled_from((79, 48, 13, 94))),
    st.builds(lambda g: ("fallen", g), st.sampled_from(GPUS)),
    st.builds(lambda c, ok: ("check", c, ok), st.sampled_from(("gpu.ecc", "nvml.init")),
              st.booleans()),
    st.just(("cycle",)),
    st.builds(lambda g, ok: ("reset", g, ok), st.sampled_from(GPUS), st.booleans()),
    st.builds(lambda g, ok: ("report", g, ok), st.sampled_from(GPUS), st.booleans()),
    st.builds(lambda g, ok: ("answer", g, ok), st.sampled_from(GPUS), st.booleans()),
    st.builds(lambda g, d: ("ack", g, d), st.sampled_from(GPUS + (None,)),
              st.sampled_from((-5, 0, 100_000))),
)


def play(script: list[tuple]) -> list[tuple[hs.State, list[dict], tuple]]:
    """Apply a script with a clock that moves 1 s per event; every state is persisted and read
    back between events, as the agent does. Returns (state after, notes, event) per step."""
    s = fresh("b1", 0)
    out = []
    for t, item in enumerate(script, 1):
        s = roundtrip(s)
        kind = item[0]
        if kind == "start":
            event = hs.Started(item[1], t)
        elif kind == "xid":
            event = hs.XidSeen(item[1], item[2], "m", t)
        elif kind == "fallen":
            event = hs.FallenOffBus(item[1], "m", t)
        elif kind == "check":
            event = hs.CheckResult(item[1], "pass" if item[2] else "fail", "m", t)
        elif kind == "cycle":
            event = hs.CycleDone(t)
        elif kind == "reset":
            event = hs.GpuReset(item[1], t, item[2])
        elif kind == "report":
            event = hs.ResetReported(item[1], t, item[2])
        elif kind == "answer":
            event = hs.GpuAnswered(item[1], item[2], t)
        else:
            event = hs.Ack(f"ack-{t}", t + item[2], "r", "admin", now=t, gpu=item[1])
        out.append((s, hs.step(s, event), item))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=40))
def test_only_the_allowed_triggers_clear_a_fault(script):
    reported: dict[str, int] = {}  # GPU -> the step of its pending reset report (the model)
    boot = "b1"
    for t, (_, notes, item) in enumerate(play(script), 1):
        for note in notes:
            if note["event"] != "cleared":
                continue
            if note["key"].startswith("xid:"):
                # an edge fault: a new boot, a successful reset of its GPU (done, or reported
                # and then answered), or an ack
                assert item[0] in ("start", "ack") or (item[0] == "reset" and item[2]) or (
                    item[0] == "answer" and item[2] and item[1] in reported), item
                if item[0] in ("reset", "answer"):
                    assert item[1] == note["gpu"]
            else:  # a level fault: a passing check of its own
                assert item[0] == "check" and item[2] and note["key"] == f"check:{item[1]}"
        if item[0] == "report":
            if item[2]:
                reported[item[1]] = t
            else:
                reported.pop(item[1], None)
        elif item[0] == "answer":
            reported.pop(item[1], None)
        elif item[0] == "start" and item[1] != boot:
            boot = item[1]
            reported.clear()


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=40))
def test_a_reset_clears_no_fault_seen_after_its_report(script):
    last_seen: dict[str, int] = {}  # fault key -> the step of its latest record
    reported: dict[str, int] = {}
    for t, (_, notes, item) in enumerate(play(script), 1):  # play's clock: step t at time t
        for note in notes:
            if note["event"] == "cleared" and item[0] == "answer":
                assert last_seen[note["key"]] <= reported[item[1]], (note, item)
        if item[0] == "xid":
            last_seen[f"xid:{item[2]}:{item[1]}"] = t
        elif item[0] == "fallen":
            last_seen[f"xid:79:{item[1]}"] = t
        elif item[0] == "report" and item[2]:
            reported[item[1]] = t


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=40), st.sampled_from(("b1", "b2")))
def test_a_restart_never_heals(script, boot):
    s = play(script)[-1][0] if script else fresh("b1", 0)
    before = {k: f.escalated for k, f in s.faults.items()}
    true_before = {c["type"] for c in hs.conditions(s, 10_000) if c["status"] == "True"}
    restarted = roundtrip(s)
    hs.step(restarted, hs.Started(s.boot_id, 10_001))  # same boot: the agent restarted
    assert {k: f.escalated for k, f in restarted.faults.items()} == before
    after = {c["type"]: c["status"] for c in hs.conditions(restarted, 10_002)}
    assert all(after[t] == "True" for t in true_before)
    assert "False" not in after.values()  # before its first cycle: Unknown, never False


@settings(max_examples=200, deadline=None)
@given(st.lists(events, max_size=40))
def test_escalated_faults_clear_on_ack_only(script):
    escalated: set[str] = set()
    for s, notes, item in play(script):
        for note in notes:
            if note["event"] == "cleared" and note["key"] in escalated:
                assert item[0] == "ack"
                escalated.discard(note["key"])
        escalated |= {k for k, f in s.faults.items() if f.escalated}


# -- the condition message's 1024 characters -------------------------------------------------


def _many(s: hs.State, gpus: int, xids=(79, 48, 95, 63)) -> None:
    for g in range(gpus):
        pci = f"0000:{g + 0x10:02x}:00"
        s.uuids[pci] = f"GPU-{g:08d}-aaaa-bbbb-cccc-dddddddddddd"
        for i, xid in enumerate(xids):
            hs.step(s, hs.XidSeen(pci, xid, "a long driver message " * 4, 200 + g + i,
                                  evidence=f"ev-{g}-{xid}"))


def _accounted(message: str, faults: list[hs.Fault]) -> tuple[int, int]:
    """(faults shown in full, the N of "and N more")."""
    full = message.count("; evidence ")
    found = re.search(r"(?:^| \| )and (\d+) more: ", message)
    more = int(found.group(1)) if found else 0
    return full, more


def test_every_fault_is_counted_within_the_cap_most_severe_first():
    s = fresh("b1", 0)
    _many(s, 8)
    for boot in ("b2", "b3"):  # the same XID 79 on GPU 7 in three boots: escalated
        hs.step(s, hs.Started(boot, 1000))
        hs.step(s, hs.XidSeen("0000:17:00", 79, "again", 1001, evidence=f"ev-{boot}"))
    (gpu,) = [c for c in hs.conditions(s, 2000, {}) if c["type"] == hs.GPU_FAULT]
    faults = [f for f in s.faults.values() if f.condition == hs.GPU_FAULT]
    assert len(gpu["message"]) <= hs.MAX_MESSAGE
    assert gpu["message"].startswith("XID79 [ESCALATED]")
    full, more = _accounted(gpu["message"], faults)
    assert full >= 1 and full + more == len(faults) == 1  # a new boot cleared the others
    _many(s, 8)
    faults = [f for f in s.faults.values() if f.condition == hs.GPU_FAULT]
    index = {f"0000:{g + 0x10:02x}:00": g for g in range(8)}  # as NVML numbers them
    (gpu,) = [c for c in hs.conditions(s, 3000, index) if c["type"] == hs.GPU_FAULT]
    full, more = _accounted(gpu["message"], faults)
    assert len(gpu["message"]) <= hs.MAX_MESSAGE and full + more == len(faults) == 32
    assert gpu["message"].startswith("XID79 [ESCALATED]") and full >= 1 and more > 0
    for fault in faults:  # each one in full or by reason and GPU in the tail
        assert fault.evidence in gpu["message"] or \
            f"{fault.reason} GPU {index[fault.gpu]}" in gpu["message"], fault.key
    assert hs.FAULTS_ANNOTATION in gpu["message"]
    records = hs.fault_records(s)
    assert len(records) == 32 and records[0]["escalated"] is True


def test_too_many_for_names_are_counted_by_reason():
    s = fresh("b1", 0)
    _many(s, 120, xids=(79, 48))
    (gpu,) = [c for c in hs.conditions(s, 3000, {}) if c["type"] == hs.GPU_FAULT]
    full, more = _accounted(gpu["message"], [])
    assert len(gpu["message"]) <= hs.MAX_MESSAGE and full + more == 240
    rest = re.split(r"and \d+ more: ", gpu["message"], maxsplit=1)[1]
    counted = sum(int(part.split(" on ")[1].split()[0]) if " on " in part else 1
                  for part in rest.split(" (all of them")[0].split(", "))
    assert counted == more


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from((79, 48, 95, 94, 63)),
                          st.integers(1, 400)), max_size=120))
def test_the_message_fits_and_counts_every_fault(xids):
    s = fresh("b1", 0)
    for gpu, xid, length in xids:
        hs.step(s, hs.XidSeen(f"0000:{gpu:02x}:00", xid, "m" * length, 200,
                              evidence=f"e{gpu}-{xid}"))
    faults = [f for f in s.faults.values() if f.condition == hs.GPU_FAULT]
    for c in hs.conditions(s, 1000, {}):
        if c["type"] == hs.GPU_FAULT and faults:
            assert len(c["message"]) <= hs.MAX_MESSAGE
            full = sum(1 for f in faults if f"; evidence {f.evidence};" in c["message"])
            more = _accounted(c["message"], faults)[1]
            assert full + more == len(faults)
