"""The kernel log as the health agent reads it: /dev/kmsg records, followed as they arrive.

/dev/kmsg (Documentation/ABI/testing/dev-kmsg in the kernel tree) serves one record per
read(2): "prio,seq,usec,flags[,...];message\\n", then continuation lines " KEY=value\\n".
A new reader starts at the oldest record still in the ring buffer; a read blocks until the
next record; a reader that fell behind while records were overwritten gets EPIPE once and
then continues from the oldest record still there. The follower below does exactly that,
and counts the overwritten gaps (from the jump in seq).

Where the path is a plain file (the lab's simulated kernel log, gpuprov/lab/simhw.py
KMSG_FILE, bind-mounted at /dev/kmsg), read(2) returns b"" at the end instead of blocking:
the follower then waits POLL_S and reads again, and a file that got shorter (rewritten)
is read again from its start, its records deduplicated by seq as after a restart.

What an NVIDIA record means is parsed here too: XID lines (the probe's own XID_LINE, MIG
form included), "fallen off the bus" lines without an XID, and the "GPU reset executed" record
a reset tool writes.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import time
from collections.abc import Callable, Iterator

from ..probe.host import XID_LINE

POLL_S = 0.2  # plain-file follower only: how long to wait at the end of the file

# "NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-..." : the driver names a GPU's UUID (RmInitAdapter).
GPU_AT = re.compile(r"NVRM: GPU at PCI:([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}): "
                    r"(GPU-[0-9A-Fa-f-]+)")
# Lines the driver prints when a GPU drops off PCIe, with or without an XID 79 beside them:
#   "NVRM: GPU at 0000:01:00.0 has fallen off the bus."      (older drivers)
#   "NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus."   (current drivers)
# Lines with "Xid" are the XID parser's (NVSentinel's gpufallen handler does the same).
FALLEN_OFF = re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:"
                        r"[0-9A-Fa-f]{2})(?:\.[0-7])?:? (?:GPU )?has fallen off the bus")
# A GPU reset leaves no record of the driver's (state.py says where that is from), so the tool
# that resets a GPU writes one; the wording is NVSentinel's reset job's (NVIDIA/NVSentinel
# gpu-reset/gpu_reset.sh: `logger ... "GPU reset executed: ${UUID}, success: ${SYSLOG_SUCCESS}"`
# to syslog; its first version wrote the line on success only, without ", success: ..."). The
# agent follows the kernel log, so here it is written to /dev/kmsg (root only), e.g.
#   echo "GPU reset executed: GPU-<uuid>, success: true" > /dev/kmsg
RESET_EXECUTED = re.compile(r"GPU reset executed: (GPU-[0-9A-Fa-f-]+)(?:, success: (\w+))?")


@dataclasses.dataclass(frozen=True)
class Record:
    seq: int
    usec: int  # since boot
    prio: int
    message: str


@dataclasses.dataclass(frozen=True)
class GpuEvent:
    """An NVIDIA record that concerns one GPU: an XID, or the GPU fell off the bus."""

    kind: str  # "xid" | "fallen-off-bus"
    pci: str  # "0000:3b:00" (domain:bus:device, as the driver prints it)
    xid: int | None
    message: str  # the record's text after the XID number, or the whole line
    gpu_instance: int | None = None  # MIG: the GPU instance the driver attributes it to
    compute_instance: int | None = None
    seq: int = -1
    usec: int = 0


def parse_record(raw: bytes) -> Record | None:
    """One /dev/kmsg record (continuation lines ignored); None for what is not one."""
    text = raw.decode("utf-8", "replace")
    header, sep, rest = text.partition(";")
    if not sep:
        return None
    fields = header.split(",")
    try:
        prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    except (IndexError, ValueError):
        return None
    message = rest.split("\n", 1)[0]
    return Record(seq, usec, prio & 7, message)


def gpu_event(record: Record) -> GpuEvent | None:
    """The GPU event in a record, or None."""
    message = record.message
    if "NVRM" not in message:  # cheap test first: a storm of other lines stays cheap
        return None
    match = XID_LINE.search(message)
    if match:
        return GpuEvent("xid", match.group(1).lower(), int(match.group(4)),
                        match.group(5).strip(),
                        int(match.group(2)) if match.group(2) else None,
                        int(match.group(3)) if match.group(3) else None,
                        record.seq, record.usec)
    if "Xid" in message:
        return None
    match = FALLEN_OFF.search(message)
    if match:
        return GpuEvent("fallen-off-bus", match.group(1).lower(), None, message.strip(),
                        seq=record.seq, usec=record.usec)
    return None


def reset_report(record: Record) -> tuple[str, bool] | None:
    """(uuid, succeeded) from a "GPU reset executed" record; a record without the success
    field reports a success (NVSentinel's first wording wrote it only on success)."""
    if "GPU reset executed" not in record.message:
        return None
    match = RESET_EXECUTED.search(record.message)
    if not match:
        return None
    return match.group(1), (match.group(2) or "true").lower() == "true"


def gpu_uuid(record: Record) -> tuple[str, str] | None:
    """(pci, uuid) from the driver's "NVRM: GPU at PCI:...: GPU-..." line."""
    match = GPU_AT.search(record.message)
    return (match.group(1).lower(), match.group(2)) if match else None


def split_records(data: bytes) -> tuple[list[bytes], bytes]:
    """Whole records in a buffer (a record and its continuation lines), and the rest."""
    records: list[bytes] = []
    start = 0
    while True:
        end = data.find(b"\n", start)
        if end < 0:
            break
        # continuation lines (" KEY=value") belong to the record before them
        while data[end + 1:end + 2] == b" ":
            nxt = data.find(b"\n", end + 1)
            if nxt < 0:
                return records, data[start:]
            end = nxt
        records.append(data[start:end + 1])
        start = end + 1
    return records, data[start:]


class Follower:
    """Follows a kmsg-like path from its oldest record: iterate for Records, forever.

    `stop()` (from another thread) ends the iteration at the next record or poll.
    `lost` counts records overwritten before they were read (the seq gaps EPIPE leaves).
    """

    def __init__(self, path: str = "/dev/kmsg", sleep: Callable[[float], None] = time.sleep):
        self.path = path
        self.sleep = sleep
        self.lost = 0
        self.read = 0
        self._stopped = False
        self._last_seq = -1

    def stop(self) -> None:
        self._stopped = True

    def records(self) -> Iterator[Record]:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            plain = not os.path.exists(self.path) or os.path.isfile(self.path)
            buffer = b""
            offset = 0
            while not self._stopped:
                try:
                    chunk = os.read(fd, 65536)
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # overwritten under us: go on from the oldest
                        continue
                    if exc.errno == errno.EINTR:
                        continue
                    raise
                if not chunk:
                    if not plain:
                        return
                    if os.fstat(fd).st_size < offset:  # rewritten shorter: read it again
                        os.lseek(fd, 0, os.SEEK_SET)
                        offset, buffer = 0, b""
                        continue
                    self.sleep(POLL_S)
                    continue
                offset += len(chunk)
                whole, buffer = split_records(buffer + chunk)
                for raw in whole:
                    record = parse_record(raw)
                    if record is None:
                        continue
                    if self._last_seq >= 0 and record.seq > self._last_seq + 1:
                        self.lost += record.seq - self._last_seq - 1
                    self._last_seq = max(self._last_seq, record.seq)
                    self.read += 1
                    yield record
        finally:
            os.close(fd)
