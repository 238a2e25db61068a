"""`gpuprov health agent`: on a GPU node, verify's node-phase checks on a schedule and the kernel
log followed as it comes; node conditions, Prometheus textfile metrics, evidence records.

It runs from the payload the gpu_health role installs (gpuprov/payload.py, entry
"health-agent": this folder, NVIDIA's facts, verify's node phase and prometheus_client, run by
python3 -I), as a systemd service. The check code is injected (`evaluate`): the payload's
entry (gpuprov/verify/node_phase.py main) passes verify's node phase, so the agent runs the
same check ids and code as `gpuprov verify` and this package stays free of verify.

Threads: one follows /dev/kmsg (blocking reads) and queues what it parses; the main thread
handles the queue, runs a check cycle every `interval_s`, and after each batch saves the
state (state.json, written whole and renamed), publishes the conditions when they changed (or
every `heartbeat_s`), writes evidence for each new fault and the metrics file (at most once a
second: a storm of XID records costs one write per second, not one per record).

Files under state_dir (/var/lib/gpuprov/health): state.json (the State, see state.py),
conditions.json (what was last published, with every fault in full, for nodes without an
API), evidence.jsonl (+ .1, .2 ... rotated at evidence_max_bytes).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import logging
import os
import queue
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from . import kmsg
from . import state as hs
from .kube import Client, KubeError

log = logging.getLogger("gpuprov.health.agent")

CONFIG_PATH = "/etc/gpuprov/health.json"
ACK_ANNOTATION = "gpuprov.io/health-ack"
METRICS_FILE = "gpuprov_health.prom"
MAX_BATCH = 20000  # records handled between two saves (a storm still saves every batch)
METRICS_EVERY_S = 1.0

Evaluate = Callable[[Mapping[str, Any], Mapping[str, Any]], list]


@dataclasses.dataclass
class Config:
    node_name: str
    state_dir: str = "/var/lib/gpuprov/health"
    interval_s: float = 60.0
    kmsg: str = "/dev/kmsg"
    root: str = "/"
    kube: dict | None = None  # the kubelet's API access (kube.Client); None: publish to file
    textfile_dir: str | None = None  # node_exporter's textfile collector directory
    heartbeat_s: float = 300.0
    evidence_max_bytes: int = 1 << 20
    evidence_keep: int = 3
    settings: dict = dataclasses.field(default_factory=dict)  # node_phase.NodeSettings
    skip_checks: tuple = ("gpu.xid",)  # the follower sees XIDs as they come
    clear_after_passes: int = hs.CLEAR_AFTER_PASSES

    @classmethod
    def load(cls, path: str) -> Config:
        with open(path) as f:
            data = json.load(f)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: unknown setting(s) {', '.join(unknown)}")
        if not data.get("node_name"):
            raise ValueError(f"{path}: node_name is required")
        return cls(**data)


def _write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    directory = os.path.dirname(path) or "."
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def boot_id(root: str = "/") -> str:
    try:
        with open(os.path.join(root, "proc/sys/kernel/random/boot_id")) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


class Evidence:
    """JSON lines, rotated: evidence.jsonl, then .1 ... .keep (the oldest dropped)."""

    def __init__(self, directory: str, max_bytes: int, keep: int):
        self.path = os.path.join(directory, "evidence.jsonl")
        self.max_bytes, self.keep = max_bytes, keep

    def write(self, record: dict) -> None:
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        try:
            if os.path.getsize(self.path) + len(line) > self.max_bytes:
                self._rotate()
        except OSError:
            pass
        with open(self.path, "a") as f:
            f.write(line)

    def _rotate(self) -> None:
        for i in range(self.keep - 1, 0, -1):
            older = f"{self.path}.{i}"
            if os.path.exists(older):
                os.replace(older, f"{self.path}.{i + 1}")
        os.replace(self.path, f"{self.path}.1")


class Agent:
    def __init__(self, config: Config, evaluate: Evaluate,
                 collect: Callable[..., dict] | None = None,
                 client: Client | None = None, clock: Callable[[], float] = time.time):
        self.config = config
        self.evaluate = evaluate
        self.collect = collect or _default_collect
        self.clock = clock
        self.client = client if client is not None else (
            Client(config.kube, config.node_name) if config.kube else None)
        os.makedirs(config.state_dir, mode=0o755, exist_ok=True)
        self.state_path = os.path.join(config.state_dir, "state.json")
        self.state = self._load()
        self.evidence = Evidence(config.state_dir, config.evidence_max_bytes,
                                 config.evidence_keep)
        self.recent_nvrm: collections.deque = collections.deque(maxlen=20)
        self.last_report: Mapping[str, Any] = {}
        self.check_status: dict[str, str] = {}
        self.published: list[dict] | None = None
        self.published_faults: str | None = None  # FAULTS_ANNOTATION's value, as last written
        self.published_at = 0.0
        self.last_cycle = 0.0
        self.metrics_at = 0.0
        self.follower: kmsg.Follower | None = None
        self.kmsg_error: str | None = None
        self.queue: queue.Queue = queue.Queue(maxsize=200000)
        self.stopping = threading.Event()
        self.cycle_asked = threading.Event()  # check_now()
        hs.CLEAR_AFTER_PASSES = config.clear_after_passes

    # -- state ----------------------------------------------------------------------------

    def _load(self) -> hs.State:
        try:
            with open(self.state_path) as f:
                return hs.State.from_json(json.load(f))
        except FileNotFoundError:
            return hs.State()
        except (OSError, ValueError, TypeError) as exc:
            # A broken file must not heal the node: keep it aside and say so loudly.
            aside = f"{self.state_path}.broken-{int(time.time())}"
            os.replace(self.state_path, aside)
            log.error("state %s unreadable (%s), kept as %s: starting empty",
                      self.state_path, exc, aside)
            return hs.State()

    def save(self) -> None:
        _write_atomic(self.state_path, json.dumps(self.state.to_json(), sort_keys=True),
                      0o600)

    def start(self) -> None:
        self._handle_notes(hs.step(self.state, hs.Started(boot_id(self.config.root),
                                                            self.clock())))
        self.save()
        self.publish(force=True)

    # -- inputs ---------------------------------------------------------------------------

    def _gpu_index(self) -> dict[str, int]:
        out = {}
        for gpu in ((self.last_report.get("nvml") or {}).get("gpus") or []):
            pci = _short_pci(gpu.get("pci_bus_id"))
            if pci and gpu.get("index") is not None:
                out[pci] = int(gpu["index"])
        return out

    def run_cycle(self) -> None:
        report = self.collect(self.config.root)
        self.last_report = report
        for gpu in ((report.get("nvml") or {}).get("gpus") or []):
            pci = _short_pci(gpu.get("pci_bus_id"))
            if pci and gpu.get("uuid"):
                self.state.uuids[pci] = gpu["uuid"]
        settings = dict(self.config.settings)
        settings.setdefault("name", self.config.node_name)
        now = self.clock()
        notes = []
        findings = self.evaluate(settings, report, tuple(self.config.skip_checks))
        # A check that skips while NVML answers found nothing left to check (the next kernel
        # it worried about is gone from /boot, no runtime to check): the problem it saw is
        # gone, so the skip counts toward clearing like a pass. A skip because NVML does not
        # answer proves nothing and counts for nothing (nvml.init's own fault stays).
        nvml_answers = any(f["check"] == "nvml.init" and f["status"] == "pass"
                           for f in findings)
        for finding in findings:
            check, status, message = finding["check"], finding["status"], finding["message"]
            self.check_status[check] = status
            if status == "skip" and nvml_answers:
                status = "pass"
            evidence = ""
            if status == "fail" and check in hs.CHECK_CONDITIONS \
                    and f"check:{check}" not in self.state.faults:
                evidence = self._evidence_id(now)
            notes += hs.step(self.state, hs.CheckResult(check, status, message, now, evidence))
        notes += self._resets_answered(report, now)
        notes += hs.step(self.state, hs.CycleDone(now))
        self.last_cycle = now
        self._read_acks()
        self._handle_notes(notes)
        self.save()
        self.publish()
        self.write_metrics(force=True)

    def _read_acks(self) -> None:
        if self.client is None:
            return
        try:
            node = self.client.get_node()
        except KubeError as exc:
            log.warning("cannot read node %s for acks: %s", self.config.node_name, exc)
            return
        raw = ((node.get("metadata") or {}).get("annotations") or {}).get(ACK_ANNOTATION)
        if not raw:
            return
        try:
            ack = json.loads(raw)
            event = hs.Ack(str(ack["id"]), float(ack["at"]), str(ack.get("reason", "")),
                           str(ack.get("by", "")), self.clock(), ack.get("gpu"))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring malformed %s annotation: %s", ACK_ANNOTATION, exc)
            return
        self._handle_notes(hs.step(self.state, event))

    def handle_record(self, record: kmsg.Record) -> list[dict]:
        pair = kmsg.gpu_uuid(record)
        if pair:
            self.state.uuids[pair[0]] = pair[1]
        reset = kmsg.reset_report(record)
        if reset is not None:
            return self._reset_reported(record, *reset)
        event = kmsg.gpu_event(record)
        if event is None:
            return []
        if event.seq <= self.state.kmsg_seq:  # handled before this agent restarted
            return []
        self.recent_nvrm.append(f"{record.seq},{record.usec};{record.message}")
        now = self.clock()
        key = (f"xid:{event.xid}:{event.pci}" if event.kind == "xid"
               else f"xid:79:{event.pci}")
        evidence = "" if key in self.state.faults else self._evidence_id(now, record.seq)
        if event.kind == "xid":
            notes = hs.step(self.state, hs.XidSeen(event.pci, event.xid, event.message, now,
                                                   event.seq, event.gpu_instance, evidence))
        else:
            notes = hs.step(self.state, hs.FallenOffBus(event.pci, event.message, now,
                                                        event.seq, evidence))
        self._handle_notes(notes)
        return notes

    def _reset_reported(self, record: kmsg.Record, uuid: str, ok: bool) -> list[dict]:
        if record.seq <= self.state.kmsg_seq:  # handled before this agent restarted
            return []
        pci = next((p for p, u in self.state.uuids.items() if u.lower() == uuid.lower()), None)
        if pci is None:
            log.warning("reset reported for %s, which is none of this node's GPUs (%s)", uuid,
                        ", ".join(sorted(self.state.uuids.values())) or "none known yet")
            self.state.kmsg_seq = max(self.state.kmsg_seq, record.seq)
            return []
        self.recent_nvrm.append(f"{record.seq},{record.usec};{record.message}")
        notes = hs.step(self.state, hs.ResetReported(pci, self.clock(), ok, record.seq))
        self._handle_notes(notes)
        return notes

    def _resets_answered(self, report: Mapping[str, Any], now: float) -> list[dict]:
        """A GPU with a reported reset answered NVML in this cycle (its handle, no error), or
        did not; where NVML itself did not answer, the reset stays reported."""
        nvml = report.get("nvml") or {}
        if not self.state.pending_resets or nvml.get("error"):
            return []
        answered = {_short_pci(g.get("pci_bus_id")): not g.get("error")
                    for g in nvml.get("gpus") or [] if g.get("pci_bus_id")}
        notes = []
        for pci in list(self.state.pending_resets):
            notes += hs.step(self.state, hs.GpuAnswered(pci, answered.get(pci, False), now))
        return notes

    # -- outputs --------------------------------------------------------------------------

    def _evidence_id(self, now: float, seq: int = -1) -> str:
        suffix = str(seq) if seq >= 0 else str(int(now * 1000))
        return f"ev-{self.state.boot_id[:8]}-{suffix}"

    def _handle_notes(self, notes: list[dict]) -> None:
        for note in notes:
            if note["event"] in ("raised", "cleared", "ack-refused", "reset-reported",
                                 "reset-failed"):
                log.warning("%s", json.dumps(note, sort_keys=True))
            if note["event"] == "raised":
                fault = self.state.faults.get(note["key"])
                if fault is not None and fault.evidence:
                    self.evidence.write(self._evidence_record(fault))

    def _evidence_record(self, fault: hs.Fault) -> dict:
        gpus = (self.last_report.get("nvml") or {}).get("gpus") or []
        nvml = [g for g in gpus if not fault.gpu or _short_pci(g.get("pci_bus_id")) == fault.gpu]
        keep = ("index", "uuid", "name", "pci_bus_id", "error", "temperature", "ecc",
                "remapped_rows", "retired_pages", "pcie", "clock_event_reasons", "errors")
        return {"id": fault.evidence, "time": _iso(fault.first_seen), "node":
                self.config.node_name, "boot_id": self.state.boot_id, "fault": fault.key,
                "condition": fault.condition, "reason": fault.reason, "summary": fault.summary,
                "action": fault.action, "kernel_log": list(self.recent_nvrm),
                "nvml": [{k: g.get(k) for k in keep} for g in nvml]}

    def conditions(self) -> list[dict]:
        return hs.conditions(self.state, self.clock(), self._gpu_index())

    def publish(self, force: bool = False) -> None:
        now = self.clock()
        conditions = self.conditions()
        comparable = [{k: c[k] for k in ("type", "status", "reason", "message")}
                      for c in conditions]
        due = now - self.published_at >= self.config.heartbeat_s
        if comparable == self.published and not due and not force:
            return
        _write_atomic(os.path.join(self.config.state_dir, "conditions.json"),
                      json.dumps({"node": self.config.node_name, "time": now,
                                  "conditions": conditions,
                                  "faults": hs.fault_records(self.state, self._gpu_index())},
                                 sort_keys=True))
        if self.client is not None:
            body = [{"type": c["type"], "status": c["status"], "reason": c["reason"],
                     "message": c["message"], "lastHeartbeatTime": _iso(now),
                     "lastTransitionTime": _iso(c["since"])} for c in conditions]
            faults = json.dumps(hs.fault_records(self.state, self._gpu_index()),
                                sort_keys=True, separators=(",", ":"))
            try:
                # The full list first: whoever reads a condition True finds its faults there.
                if faults != self.published_faults:
                    self.client.patch_annotation(hs.FAULTS_ANNOTATION, faults)
                    self.published_faults = faults
                self.client.patch_conditions(body)
            except KubeError as exc:
                log.warning("cannot publish conditions: %s", exc)
                return  # published stays stale: the next batch or cycle tries again
        self.published, self.published_at = comparable, now
        self.save()  # the transitions' times were fixed by conditions()

    def write_metrics(self, force: bool = False) -> None:
        if not self.config.textfile_dir:
            return
        now = time.monotonic()
        if not force and now - self.metrics_at < METRICS_EVERY_S:
            return
        self.metrics_at = now
        try:
            from . import metrics
        except ImportError as exc:  # prometheus_client not shipped: say so once per write
            log.warning("metrics not written: %s", exc)
            return
        metrics.write(os.path.join(self.config.textfile_dir, METRICS_FILE), self)

    # -- the loop -------------------------------------------------------------------------

    def _follow(self) -> None:
        try:
            self.follower = kmsg.Follower(self.config.kmsg)
            for record in self.follower.records():
                self.queue.put(record)
                if self.stopping.is_set():
                    return
        except OSError as exc:
            self.kmsg_error = f"{self.config.kmsg}: {exc}"
            log.error("kernel log not followed: %s", self.kmsg_error)

    def check_now(self) -> None:
        """Run a check cycle (and read the admin's acks) at once, not at the next interval:
        SIGHUP, i.e. `systemctl reload gpuprov-health-agent`, after an ack or a repair."""
        self.cycle_asked.set()

    def stop(self) -> None:
        self.stopping.set()
        if self.follower is not None:
            self.follower.stop()

    def run(self, cycles: int | None = None) -> None:
        """The service's loop; cycles: stop after that many check cycles (tests, --once)."""
        self.start()
        threading.Thread(target=self._follow, name="kmsg", daemon=True).start()
        done = 0
        next_cycle = time.monotonic()
        while not self.stopping.is_set():
            # At most a second asleep: a stop (SIGTERM from systemd) is seen within a second,
            # even when it came during a check cycle.
            timeout = min(1.0, max(0.0, next_cycle - time.monotonic()))
            batch = []
            try:
                batch.append(self.queue.get(timeout=timeout))
                while len(batch) < MAX_BATCH:
                    batch.append(self.queue.get_nowait())
            except queue.Empty:
                pass
            if batch:
                changed = False
                for record in batch:
                    changed |= bool(self.handle_record(record))
                self.save()
                if changed:
                    self.publish()
                self.write_metrics()
            if self.cycle_asked.is_set():
                self.cycle_asked.clear()
                next_cycle = time.monotonic()
            if time.monotonic() >= next_cycle:
                self.run_cycle()
                done += 1
                if cycles is not None and done >= cycles:
                    break
                next_cycle = time.monotonic() + self.config.interval_s


def _short_pci(bus_id: Any) -> str | None:
    """NVML's "00000000:3B:00.0" -> the kernel log's "0000:3b:00"."""
    if not bus_id:
        return None
    parts = str(bus_id).lower().split(":")
    if len(parts) != 3:
        return None
    return f"{parts[0][-4:]}:{parts[1]}:{parts[2].split('.')[0]}"


def _default_collect(root: str) -> dict:
    from ..probe.report import collect

    return collect(root=root, kernel_log=False)


def main(argv: list[str] | None, evaluate: Evaluate) -> int:
    parser = argparse.ArgumentParser(prog="gpuprov-health-agent",
                                     description="gpuprov's node health agent")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("agent", help="run the agent (the systemd service's command)")
    run.add_argument("--config", default=CONFIG_PATH)
    run.add_argument("--once", action="store_true",
                     help="one check cycle, publish, exit (the kernel log is not followed)")
    remove = sub.add_parser("remove-conditions",
                            help="remove the agent's conditions from its Node (uninstall)")
    remove.add_argument("--config", default=CONFIG_PATH)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="gpuprov-health: %(levelname)s %(message)s")
    try:
        config = Config.load(args.config)
    except (OSError, ValueError, TypeError) as exc:
        print(f"gpuprov-health: error: config {args.config}: {exc}", file=sys.stderr)
        return 2
    if args.command == "remove-conditions":
        if not config.kube:
            return 0
        try:
            client = Client(config.kube, config.node_name)
            client.delete_conditions(list(hs.CONDITION_TYPES))
            client.patch_annotation(hs.FAULTS_ANNOTATION, None)
        except KubeError as exc:
            print(f"gpuprov-health: error: {exc}", file=sys.stderr)
            return 1
        return 0
    agent = Agent(config, evaluate)
    if args.once:
        agent.start()
        agent.run_cycle()
        return 0
    # systemd stops the service with SIGTERM: finish the batch or cycle at hand (its state is
    # saved at the end of each), then exit 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    signal.signal(signal.SIGHUP, lambda *_: agent.check_now())
    agent.run()
    return 0
