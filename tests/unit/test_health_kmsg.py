"""The kernel-log follower and parser (gpuprov/node/health/kmsg.py), on real kernel lines
(tests/fixtures/health, each with its source) replayed through the state machine."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from gpuprov.node.health import kmsg
from gpuprov.node.health import state as hs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "health"


def records(name: str) -> list[kmsg.Record]:
    lines = [line for line in (FIXTURES / name).read_text().splitlines(keepends=True)
             if not line.startswith("#")]
    found, rest = kmsg.split_records("".join(lines).encode())
    assert rest == b""
    return [r for r in (kmsg.parse_record(raw) for raw in found) if r is not None]


def replay(name: str) -> hs.State:
    s = hs.State()
    hs.step(s, hs.Started("boot", 0))
    for record in records(name):
        pair = kmsg.gpu_uuid(record)
        if pair:
            s.uuids[pair[0]] = pair[1]
        event = kmsg.gpu_event(record)
        if event is None:
            continue
        if event.kind == "xid":
            hs.step(s, hs.XidSeen(event.pci, event.xid, event.message, 1, event.seq,
                                  event.gpu_instance))
        else:
            hs.step(s, hs.FallenOffBus(event.pci, event.message, 1, event.seq))
    hs.step(s, hs.CycleDone(2))
    return s


def fault_condition(s: hs.State) -> dict:
    return next(c for c in hs.conditions(s, 3) if c["type"] == hs.GPU_FAULT)


def test_xid79_with_its_fallen_off_line_is_one_fault_with_the_uuid():
    s = replay("xid79-with-fallen-off.kmsg")
    assert list(s.faults) == ["xid:79:0000:2b:00"]
    assert s.faults["xid:79:0000:2b:00"].count == 2
    condition = fault_condition(s)
    assert condition["status"] == "True" and condition["reason"] == "XID79"
    assert "GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae" in condition["message"]
    assert s.kmsg_seq == 1003


def test_xid79_with_pid_and_name():
    s = replay("xid79-modal.kmsg")
    assert list(s.faults) == ["xid:79:0000:c6:00"]


def test_fallen_off_the_bus_without_an_xid_line():
    s = replay("fallen-off-no-xid.kmsg")
    assert list(s.faults) == ["xid:79:0000:01:00"]
    assert fault_condition(s)["reason"] == "FallenOffBus"


def test_mig_form_and_uncontained():
    events = [kmsg.gpu_event(r) for r in records("xid94-95-mig.kmsg")]
    assert [(e.xid, e.gpu_instance) for e in events] == [(94, 5), (94, None), (95, None)]
    s = replay("xid94-95-mig.kmsg")
    assert sorted(s.faults) == ["xid:94:0000:01:00", "xid:94:0000:01:00:gi5",
                                "xid:95:0000:01:00"]


def test_app_xid_makes_no_fault_remap_xid_does():
    s = replay("xid-app-and-remap.kmsg")
    assert list(s.faults) == ["xid:63:0000:10:1c"]


def test_other_lines_are_not_gpu_events():
    for text in ("nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context",
                 "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05",
                 "usb 1-1: new high-speed USB device"):
        assert kmsg.gpu_event(kmsg.Record(1, 1, 6, text)) is None


def test_continuation_lines_belong_to_their_record():
    data = (b"3,7,100,-;NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n"
            b" SUBSYSTEM=pci\n DEVICE=+pci:0000:01:00.0\n6,8,200,-;next\n6,9,300,-;half")
    whole, rest = kmsg.split_records(data)
    assert len(whole) == 2 and rest == b"6,9,300,-;half"
    assert kmsg.parse_record(whole[0]).message.endswith("fallen off the bus.")


def test_follower_reads_a_growing_plain_file_from_its_oldest_record(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text("6,0,0,-;Linux version\n3,1,10,-;first\n")
    follower = kmsg.Follower(str(path))
    got: list[kmsg.Record] = []

    def run():
        for record in follower.records():
            got.append(record)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    with open(path, "a") as f:
        f.write("3,5,20,-;after a gap\n")
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    follower.stop()
    thread.join(2)
    assert [r.seq for r in got] == [0, 1, 5]
    assert follower.lost == 3  # seq 2..4 never reached the reader


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg not readable here")
def test_follower_on_the_real_dev_kmsg_starts_at_the_oldest_record():
    follower = kmsg.Follower("/dev/kmsg")
    first = next(iter(follower.records()))
    follower.stop()
    assert first.seq >= 0 and first.message


def test_real_h200_kernel_log_has_no_gpu_event():
    """This project's real-GPU run (tests/fixtures/real/h200-580.159.04/kmsg-nvidia.txt: an
    H200 with driver 580.159.04, the NVIDIA records of its /dev/kmsg): loading messages and an
    FBHUB interrupt notice, no XID, no fault."""
    path = FIXTURES.parent / "real" / "h200-580.159.04" / "kmsg-nvidia.txt"
    found, _ = kmsg.split_records(path.read_bytes())
    parsed = [kmsg.parse_record(raw) for raw in found]
    assert len([r for r in parsed if r]) >= 5
    assert [kmsg.gpu_event(r) for r in parsed if r] == [None] * len([r for r in parsed if r])


def test_lab_kernel_log_faults_reach_the_agent_once_each(tmp_path):
    """The lab's kernel log (gpuprov/lab/simhw.py) as a follower sees it: a record keeps its seq
    when the file is rewritten, a new one gets a higher seq, so an agent that dedupes by seq
    sees each fault once; every lab kernel-log fault parses to what it stands for."""
    from gpuprov.lab import profiles, simhw

    node = tmp_path / "gpu-hopper"
    node.mkdir()
    simhw.write_node_state(node, "gpu-hopper", profiles.NODE_PROFILES["gpu-hopper"])
    s = hs.State()
    hs.step(s, hs.Started("b", 0))

    def feed() -> None:
        data = (node / simhw.KMSG_FILE).read_bytes()
        for raw in kmsg.split_records(data)[0]:
            record = kmsg.parse_record(raw)
            event = kmsg.gpu_event(record)
            if event is None or record.seq <= s.kmsg_seq:
                continue
            if event.kind == "xid":
                hs.step(s, hs.XidSeen(event.pci, event.xid, event.message, 1, record.seq,
                                      event.gpu_instance))
            else:
                hs.step(s, hs.FallenOffBus(event.pci, event.message, 1, record.seq))

    simhw.set_fault(node, "xid-79", gpu_index=0)
    simhw.set_fault(node, "xid-94-mig", gpu_index=1)
    feed()
    simhw.clear_fault(node, "xid-79")  # the lab's file loses the record; its seq is not reused
    simhw.set_fault(node, "fallen-off-bus", gpu_index=2)
    simhw.set_fault(node, "xid-storm", gpu_index=3)
    simhw.set_fault(node, "xid-48", gpu_index=4)
    simhw.set_fault(node, "xid-95-mig", gpu_index=1)
    feed()
    feed()  # read again from the start (a restart): nothing counted twice
    reasons = sorted((f.reason, f.count, f.key.count(":gi")) for f in s.faults.values())
    assert reasons == [("FallenOffBus", 1, 0), ("XID48", 1, 0), ("XID79", 1, 0),
                       ("XID94", 1, 1), ("XID95", 1, 0), ("XID95", 5000, 0)]


@pytest.mark.parametrize(("message", "expected"), [
    # NVSentinel's reset job's record (NVIDIA/NVSentinel gpu-reset/gpu_reset.sh), both wordings
    ("GPU reset executed: GPU-455d8f70-2051-db6c-0430-ffc457bff834, success: true",
     ("GPU-455d8f70-2051-db6c-0430-ffc457bff834", True)),
    ("GPU reset executed: GPU-455d8f70-2051-db6c-0430-ffc457bff834, success: false",
     ("GPU-455d8f70-2051-db6c-0430-ffc457bff834", False)),
    ("GPU reset executed: GPU-22222222-2222-2222-2222-222222222222",
     ("GPU-22222222-2222-2222-2222-222222222222", True)),
    ("GPU reset executed:", None),
    ("NVRM: GPU at PCI:0000:03:00: GPU-455d8f70-2051-db6c-0430-ffc457bff834", None),
])
def test_reset_records(message, expected):
    record = kmsg.Record(7, 0, 4, message)
    assert kmsg.reset_report(record) == expected
    assert kmsg.gpu_event(record) is None  # a reset record is never a fault


def test_lab_gpu_reset_writes_the_record_and_brings_the_gpu_back(tmp_path):
    from gpuprov.lab import profiles, simhw

    node = tmp_path / "gpu-hopper"
    node.mkdir()
    simhw.write_node_state(node, "gpu-hopper", profiles.NODE_PROFILES["gpu-hopper"])
    uuids = [line.split("=", 1)[1].strip() for line in
             (node / simhw.SIM_DIR / simhw.NVML_CONF).read_text().splitlines()
             if line.startswith("uuid")]

    def log() -> list[kmsg.Record]:
        return [kmsg.parse_record(raw) for raw in
                kmsg.split_records((node / simhw.KMSG_FILE).read_bytes())[0]]

    simhw.set_fault(node, "xid-79", gpu_index=1)
    simhw.set_fault(node, "gpu-lost", gpu_index=1)
    simhw.set_fault(node, "gpu-lost", gpu_index=2)
    simhw.set_fault(node, "gpu-reset", gpu_index=1)
    assert simhw.active_faults(node) == ["xid-79:1", "gpu-lost:2", "gpu-reset:1"]
    records = log()
    xid = next(r for r in records if kmsg.gpu_event(r))
    reset = next(r for r in records if kmsg.reset_report(r))
    assert kmsg.reset_report(reset) == (uuids[1], True) and reset.seq > xid.seq
    assert reset.prio == 4  # written from user space: LOG_USER's default level
    # Another reset later is another record, with a higher seq.
    simhw.clear_fault(node, "gpu-reset")
    simhw.set_fault(node, "gpu-reset", gpu_index=1)
    again = next(r for r in log() if kmsg.reset_report(r))
    assert again.seq > reset.seq
