"""The agent's Prometheus metrics, written as a node_exporter textfile
(https://github.com/prometheus/node_exporter#textfile-collector) with prometheus_client's own
writer, which writes a temporary file and renames it (write_to_textfile): node_exporter never
reads half a file.

prometheus_client is not on a bare node: the health agent's payload ships its pure-Python
modules (gpuprov/payload.py), so it is imported here, inside the function, as pynvml is.

Counters come from the persisted State, so they survive agent restarts (a Prometheus counter
may reset, but need not): XID records per GPU and code, faults raised and cleared per
condition. Gauges: each condition's status, each check's last status, the time of the last
complete check cycle, and what the kernel-log follower read and lost. Labels are bounded:
GPUs x XID codes seen, conditions, check ids.
"""

from __future__ import annotations

from typing import Any

from .state import CONDITION_TYPES


def write(path: str, agent: Any) -> None:
    from prometheus_client import CollectorRegistry, write_to_textfile
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    state = agent.state

    class _Collector:
        def collect(self):
            xids = CounterMetricFamily("gpuprov_health_xid_records",
                                       "NVIDIA XID records in the kernel log, per GPU and code",
                                       labels=["pci", "uuid", "xid"])
            for key, count in sorted(state.xid_counts.items()):
                pci, xid = key.split("|")
                xids.add_metric([pci, state.uuids.get(pci, ""), xid], count)
            yield xids
            raised = CounterMetricFamily("gpuprov_health_faults_raised",
                                         "faults raised, per condition", labels=["condition"])
            cleared = CounterMetricFamily("gpuprov_health_faults_cleared",
                                          "faults cleared, per condition", labels=["condition"])
            for ctype in CONDITION_TYPES:
                raised.add_metric([ctype], state.raised_total.get(ctype, 0))
                cleared.add_metric([ctype], state.cleared_total.get(ctype, 0))
            yield raised
            yield cleared
            condition = GaugeMetricFamily("gpuprov_health_condition",
                                          "1 for the status each gpuprov.io/ condition has",
                                          labels=["condition", "status"])
            for c in agent.conditions():
                for status in ("True", "False", "Unknown"):
                    condition.add_metric([c["type"], status], 1.0 if c["status"] == status
                                         else 0.0)
            yield condition
            checks = GaugeMetricFamily("gpuprov_health_check_status",
                                       "1 for each check's status in the last cycle",
                                       labels=["check", "status"])
            for check, status in sorted(agent.check_status.items()):
                checks.add_metric([check, status], 1.0)
            yield checks
            last = GaugeMetricFamily("gpuprov_health_last_cycle_timestamp_seconds",
                                     "when the last complete check cycle finished")
            last.add_metric([], agent.last_cycle)
            yield last
            follower = agent.follower
            read = CounterMetricFamily("gpuprov_health_kmsg_records",
                                       "kernel-log records read by the follower since start")
            read.add_metric([], follower.read if follower else 0)
            yield read
            lost = CounterMetricFamily("gpuprov_health_kmsg_lost_records",
                                       "kernel-log records overwritten before they were read")
            lost.add_metric([], follower.lost if follower else 0)
            yield lost
            up = GaugeMetricFamily("gpuprov_health_kmsg_followed",
                                   "1 while the kernel log is followed")
            up.add_metric([], 0.0 if agent.kmsg_error else 1.0)
            yield up

    registry = CollectorRegistry()
    registry.register(_Collector())
    write_to_textfile(path, registry)

