"""Simulated cluster behaviour: the controllers a real control plane and kubelets would run.

One thread runs level-triggered passes (after every change, and on a short tick): node
status and device plugin registration, DaemonSet controller, Job controller, scheduler,
kubelets, PodDisruptionBudget status, garbage collection and namespace termination.
Containers start in a pool of starter threads and are followed by the backend's threads (a
lab node's containerd, through the CRI). Every write goes through the registry, so it is
defaulted and validated like a client's.

This module holds the Cluster: its lifecycle, the loop and the services the controllers and
kubelets share (events, status writes, pod logs, a node's GPUs and faults). The controllers are
in gpuprov.lab.kube.controllers, one module each; the kubelet is gpuprov.lab.kube.kubelet.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from gpuprov.lab.kube import faults
from gpuprov.lab.kube.backend import Gpu, NodeBackend
from gpuprov.lab.kube.controllers import (
    daemonsets,
    disruption,
    garbage,
    jobs,
    log_failure,
    nodes,
    resourceclaims,
    scheduler,
)
from gpuprov.lab.kube.errors import ApiError
from gpuprov.lab.kube.kubelet import Kubelet, PodRun, sync_kubelets
from gpuprov.lab.kube.objects import condition, set_condition
from gpuprov.lab.kube.registry import (
    BUILTIN_PRIORITY_CLASSES,
    NAMESPACES,
    NODES,
    PODS,
    SYSTEM_NAMESPACES,
    R,
    Registry,
    random_suffix,
)
from gpuprov.lab.kube.store import now

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
# Containers started at once, all nodes together (a runtime's start is mostly waiting).
STARTERS = 8
# The controllers, in the order of each pass.
CONTROLLERS = (nodes.sync_nodes, daemonsets.sync_daemonsets, jobs.sync_jobs,
               resourceclaims.sync_claims, scheduler.schedule, sync_kubelets, disruption.sync_pdbs,
               garbage.collect_garbage)


class Cluster:
    def __init__(self, registry: Registry, backend: NodeBackend,
                 state_dir: Path | None = None, tick: float = TICK_SECONDS,
                 heartbeat: float = nodes.HEARTBEAT_SECONDS) -> None:
        self.registry = registry
        self.backend = backend
        self.state_dir = state_dir
        self.tick = tick
        self.heartbeat = heartbeat  # how often kubelets read their nodes and renew leases
        self.kubelets = {spec.name: Kubelet(self, spec) for spec in backend.nodes()}
        self.starters = concurrent.futures.ThreadPoolExecutor(STARTERS, "container-start")
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._gpu_cache: dict[str, list[Gpu] | None] = {}
        # Logs of pods that finished (their runs are gone): (uid, container) -> text.
        self._final_logs: dict[tuple[str, str], str] = {}
        self.passes = 0
        self._woken = False  # set by wake(): a pass is due although no object changed

    # -- lifecycle -------------------------------------------------------------------------------
    def bootstrap(self) -> None:
        reg = self.registry
        for name in SYSTEM_NAMESPACES:
            if reg.find(NAMESPACES, "", name) is None:
                reg.create(NAMESPACES, "", {"metadata": {"name": name}})
        for name, value in BUILTIN_PRIORITY_CLASSES.items():
            if reg.find(R["PriorityClass"], "", name) is None:
                reg.create(R["PriorityClass"], "", {
                    "metadata": {"name": name}, "value": value, "globalDefault": False,
                    "description": "Used for system critical pods that must not be moved "
                                   "from their current node."})
        for kubelet in self.kubelets.values():
            if reg.find(NODES, "", kubelet.name) is None:
                reg.create(NODES, "", nodes.node_object(
                    kubelet.spec, self.backend.node_info(kubelet.name)))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="kube-controllers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self.registry.store.lock:
            self.registry.store.changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for kubelet in self.kubelets.values():
            for run in list(kubelet.runs.values()):
                kubelet._stop(run)
        self.starters.shutdown(wait=True)

    def wake(self) -> None:
        """Ask for a pass now: something the store does not hold changed (a pod's process
        exited). Without it the pass would come only after the next tick."""
        store = self.registry.store
        with store.lock:
            self._woken = True
            store.changed.notify_all()

    def _loop(self) -> None:
        store = self.registry.store
        seen = -1
        while not self._stop.is_set():
            with store.lock:
                store.changed.wait_for(lambda last=seen: store.resource_version > last
                                       or store.closed or self._woken or self._stop.is_set(),
                                       self.tick)
                self._woken = False
            if self._stop.is_set():
                return
            seen = store.resource_version
            self.reconcile()

    def reconcile(self) -> None:
        """One pass of every controller."""
        self.passes += 1
        self._gpu_cache.clear()
        for step in CONTROLLERS:
            try:
                step(self)
            except ApiError as err:  # lost a race with a client: the next pass retries
                log.debug("%s: %s", step.__name__, err.message)
            except Exception as exc:
                log_failure(f"controller {step.__name__}", exc)

    # -- helpers -----------------------------------------------------------------------------------
    def faults(self, node: str) -> list[str]:
        return faults.active_faults(self.state_dir, node)

    def gpus_of(self, node: str, refresh: bool = False) -> list[Gpu]:
        """The node's GPUs (with their MIG mode and devices) as NVML reports them, read once
        per pass; `refresh`: read again now (a device plugin starting enumerates them then)."""
        if refresh or node not in self._gpu_cache:
            self._gpu_cache[node] = self.backend.gpus(node)
        return self._gpu_cache[node] or []

    def event(self, obj: dict, reason: str, message: str, type_: str = "Normal",
              component: str = "kubelet") -> None:
        meta = obj["metadata"]
        ns = meta.get("namespace") or "default"
        stamp = now()
        with contextlib.suppress(ApiError):  # events are best effort, as in Kubernetes
            self.registry.create(R["Event"], ns, {
                "metadata": {"name": f"{meta['name']}.{random_suffix(10)}"},
                "involvedObject": {"kind": obj["kind"], "apiVersion": obj["apiVersion"],
                                   "name": meta["name"], "namespace": meta.get("namespace", ""),
                                   "uid": meta["uid"]},
                "reason": reason, "message": message, "type": type_, "count": 1,
                "firstTimestamp": stamp, "lastTimestamp": stamp,
                "source": {"component": component}, "reportingComponent": component,
                "reportingInstance": ""})

    def mutate_status(self, obj: dict, mutate: Callable[[dict], None],
                      rt=PODS) -> dict | None:
        """Read-modify-write of an object's status, retried on conflicts."""
        meta = obj["metadata"]
        for _ in range(5):
            current = self.registry.find(rt, meta.get("namespace", ""), meta["name"])
            if current is None or current["metadata"]["uid"] != meta["uid"]:
                return None
            status = copy.deepcopy(current.get("status") or {})
            mutate(status)
            if status == current.get("status"):
                return current
            try:
                return self.registry.replace(rt, meta.get("namespace", ""), meta["name"],
                                             {**current, "status": status}, "status")
            except ApiError as err:
                if err.code != 409:
                    raise
        return None

    def update_pod_status(self, pod: dict, phase: str, statuses: list[dict], ready: bool,
                          run: PodRun | None) -> None:
        def mutate(status: dict) -> None:
            # Timestamps that do not change meaning are kept, so an unchanged pod is no write.
            old = {c["name"]: c for c in status.get("containerStatuses") or []}
            for cs in statuses:
                prev = old.get(cs["name"])
                if prev and "running" in cs["state"] and "running" in prev.get("state", {}):
                    cs["state"] = prev["state"]
            status["phase"] = phase
            status["containerStatuses"] = statuses
            status.setdefault("hostIP", "127.0.0.1")
            status.setdefault("hostIPs", [{"ip": "127.0.0.1"}])
            if phase != "Pending" or run is not None:
                status.setdefault("startTime", now())
            conds = status.get("conditions") or []
            started = phase != "Pending"
            conds = set_condition(conds, condition("PodReadyToStartContainers", started))
            conds = set_condition(conds, condition("Initialized", True))
            done_reason = "PodCompleted" if phase in ("Succeeded", "Failed") else (
                "" if ready else "ContainersNotReady")
            conds = set_condition(conds, condition("Ready", ready, done_reason))
            conds = set_condition(conds, condition("ContainersReady", ready, done_reason))
            status["conditions"] = conds

        before = (self.registry.find(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
                  or {}).get("status", {}).get("phase")
        updated = self.mutate_status(pod, mutate)
        if updated is not None and before != phase and phase in ("Succeeded", "Failed") \
                and run is not None:
            for c in run.containers:
                self._final_logs[(run.uid, c.name)] = c.log

    def pod_logs(self, pod: dict, container: str, query: dict) -> tuple[str, bool]:
        uid = pod["metadata"]["uid"]
        kubelet = self.kubelets.get(pod["spec"].get("nodeName") or "")
        found = kubelet.logs(uid, container, query.get("previous") == "true") \
            if kubelet else None
        if found is None:
            text, running = self._final_logs.get((uid, container), ""), False
        else:
            text, running = found
        tail = query.get("tailLines")
        if tail:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(tail):]) if int(tail) else ""
        limit = query.get("limitBytes")
        if limit:
            text = text[: int(limit)]
        return text, running
