"""The kubelet of each emulated node, with its device manager: admits the pods bound to its node
(allocating the devices of each nvidia.com/* resource they ask for, `nvidia.com/gpu` or
`nvidia.com/mig-<profile>`, through the node's device plugin), runs their containers through
the node's runtime (the NodeBackend), restarts them with back-off, reports container statuses
and the pod phase, keeps their logs, and removes pods being deleted once their containers are
stopped. kubernetes pkg/kubelet (and kwok's pod controller, which plays the kubelet's part for
the pods of fake nodes). Containers are started in the cluster's pool of starters and followed
by the backend's threads, which wake the cluster when one exits; every write goes through the
registry, like any client's.

The device plugin's devices (deviceplugin.advertised: which resources, which GPUs or MIG
devices) are read when its pod is admitted, from the node's GPUs and MIG state as NVML reports
them then, as NVIDIA's plugin enumerates them when it starts; a MIG layout changed while it runs
changes nothing until its pod is recreated. Their health is NVML's at every pass (a GPU's MIG
devices share its health, as the plugin's health check marks them: internal/rm/health.go).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuprov.lab.kube import deviceplugin, draplugin, selectors
from gpuprov.lab.kube.backend import (
    ContainerRequest,
    NodeBackend,
    NodeInfo,
    NodeSpec,
    Process,
    StartError,
)
from gpuprov.lab.kube.controllers import guarded
from gpuprov.lab.kube.controllers.resourceclaims import CLAIMS, claim_names
from gpuprov.lab.kube.objects import is_device_plugin, is_dra_plugin
from gpuprov.lab.kube.registry import (
    NODES,
    PODS,
    R,
    container_device_requests,
    device_requests,
    is_terminal,
)
from gpuprov.lab.kube.store import now
from gpuprov.lab.toolkit import toolkit_rules

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from gpuprov.lab.kube.cluster import Cluster

# The environment NVIDIA's device plugin image sets (NVIDIA/k8s-device-plugin
# deployments/container/Dockerfile): the plugin asks NVIDIA's runtime for every GPU.
DEVICE_PLUGIN_IMAGE_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
# Restart back-off for crashing containers: the kubelet's 10 s .. 5 min, shortened so tests
# and the lab see restarts within seconds.
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 10.0


def sync_kubelets(cluster: Cluster) -> None:
    """Hand each node's kubelet the pods bound to its node."""
    pods = cluster.registry.list(PODS)[0]
    by_node: dict[str, list[dict]] = {name: [] for name in cluster.kubelets}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if node in by_node:
            by_node[node].append(pod)
        elif node and pod["metadata"].get("deletionTimestamp"):
            # No kubelet will ever confirm: the pod GC force-deletes it.
            cluster.registry.finish_pod_deletion(pod)
    for name, kubelet in cluster.kubelets.items():
        guarded(kubelet.sync, by_node[name])


@dataclass
class ContainerRun:
    name: str
    request: ContainerRequest
    process: Process | None = None
    starting: concurrent.futures.Future | None = None  # the runtime's start, under way
    container_id: str = ""
    waiting: tuple[str, str] = ("ContainerCreating", "")  # (reason, message) before a start
    started_at: str = ""
    restarts: int = 0
    exit_code: int | None = None
    finished_at: str = ""
    previous_log: str = ""
    log: str = ""
    next_start: float = 0.0
    done: bool = False


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    devices: dict[str, list[str]]  # resource -> the device IDs (UUIDs) allocated to the pod
    containers: list[ContainerRun] = field(default_factory=list)
    simulated: bool = False  # the device plugin: no process, running until deleted
    claims: tuple[str, ...] = ()  # UIDs of the ResourceClaims prepared for it


@dataclass(frozen=True)
class PluginDevices:
    """What a device plugin pod serves, read when it was admitted (its start): resource ->
    devices; `error`: why it did not start (bad settings, a MIG layout its strategy refuses),
    then it serves nothing."""

    resources: Mapping[str, tuple[deviceplugin.Device, ...]]
    error: str = ""
    # Its health check (internal/rm/health.go v0.20.x): the kernel log's last record when it
    # started (it sees XIDs from then on) and its container's environment (the XIDs it skips).
    kmsg_seq: int = -1
    env: Mapping[str, str] = field(default_factory=dict)
    # The GPUs it marked unhealthy: a mark stays until the plugin restarts, whatever the
    # kernel log holds later (a lab fault cleared takes its records out of the simulated log,
    # as a ring buffer loses old records; the plugin's mark is in its memory, not the log).
    marked: set[int] = field(default_factory=set)

    @property
    def indices(self) -> dict[str, str]:
        return {d.id: d.index for devices in self.resources.values() for d in devices}


class Kubelet:
    """One node's kubelet and device manager."""

    def __init__(self, cluster: Cluster, spec: NodeSpec) -> None:
        self.cluster = cluster
        self.spec = spec
        self.name = spec.name
        self.runs: dict[str, PodRun] = {}
        # Device plugin pods on this node (UID) -> what each serves; the one registered now
        # (set by the nodes controller at each pass, None while none is).
        self.plugins: dict[str, PluginDevices] = {}
        self.registered: str | None = None
        # The node as this kubelet last read it, and when (controllers/nodes.py heartbeat).
        self.node_info: NodeInfo | None = None
        self.heartbeat_at = float("-inf")
        self.runtime_down_logged = ""  # the runtime error last logged
        # NVIDIA's DRA plugin: the pod (UID) registered on this node, the GPUs it read when
        # it started, the claims it has prepared (UID -> spec path), and the last prepare
        # failure said per pod (an event once per cause, not at every pass).
        self.dra_plugin: str | None = None
        self.dra_gpus: list = []
        self.prepared: dict[str, str] = {}
        self.prepare_failed: dict[str, str] = {}

    @property
    def backend(self) -> NodeBackend:
        return self.cluster.backend

    def served(self, plugin_uid: str | None = None) -> PluginDevices | None:
        """What the given (default: the registered) device plugin pod serves."""
        return self.plugins.get(plugin_uid or self.registered or "")

    def healthy(self, device: deviceplugin.Device) -> bool:
        """NVML's health now of the GPU the device is or is part of (by NVML index: a GPU
        NVML cannot query has no UUID), and the plugin's own verdict: a critical XID on that
        GPU since the registered plugin started marks it unhealthy until the plugin is
        restarted (v0.20.x: "there is no way to recover from the Unhealthy state",
        internal/plugin/server.go; the XIDs its health.go skips do not count)."""
        gpus = self.cluster.gpus_of(self.name)
        if not (device.gpu < len(gpus) and gpus[device.gpu].healthy):
            return False
        return device.gpu not in self.xid_unhealthy()

    def xid_unhealthy(self) -> set[int]:
        """NVML indices of the GPUs the registered plugin has marked unhealthy for an XID."""
        served = self.served()
        if served is None:
            return set()
        records = getattr(self.backend, "xid_records", None)
        served.marked.update(
            gpu for seq, gpu, xid in (records(self.name) if records else [])
            if seq > served.kmsg_seq and deviceplugin.xid_marks_unhealthy(xid, served.env))
        return set(served.marked)

    def allocate(self, uid: str, resource: str, count: int) -> list[str] | None:
        """`count` distinct healthy devices of `resource` not held by other pods (any, with
        the double-allocate fault), or None."""
        if count == 0:
            return []
        served = self.served()
        if served is None:
            return None
        held = set()
        if "double-allocate" not in self.cluster.faults(self.name):
            for run in self.runs.values():
                if run.uid != uid:
                    held.update(run.devices.get(resource, ()))
        free = [d.id for d in served.resources.get(resource, ())
                if self.healthy(d) and d.id not in held]
        return free[:count] if len(free) >= count else None

    def sync(self, pods: list[dict]) -> None:
        down = self.node_info.runtime_error if self.node_info is not None else ""
        if down:
            # As the kubelet's syncLoop: "skipping pod synchronization - container runtime is
            # down" (pkg/kubelet/kubelet.go); the node is NotReady meanwhile (controllers/
            # nodes.py), and the next heartbeat asks the runtime again. Said once per cause.
            if down != self.runtime_down_logged:
                log.warning("%s: skipping pod synchronization: container runtime is down: %s",
                            self.name, down)
                self.runtime_down_logged = down
            return
        self.runtime_down_logged = ""
        alive = {p["metadata"]["uid"] for p in pods}
        for uid in list(self.runs):
            if uid not in alive:
                self._stop(self.runs.pop(uid))
        for uid in list(self.plugins):
            if uid not in self.runs:
                del self.plugins[uid]
        # Sandboxes of pods that are gone, or being deleted, go (the pod's containers with them).
        self.backend.collect(self.name, {p["metadata"]["uid"] for p in pods
                                         if not p["metadata"].get("deletionTimestamp")})
        node_faults = self.cluster.faults(self.name)
        try:
            self._sync_pods(pods, node_faults)
        finally:
            self._dra_cleanup()

    def _sync_pods(self, pods: list[dict], node_faults: list[str]) -> None:
        for pod in pods:
            uid = pod["metadata"]["uid"]
            run = self.runs.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                if run is not None:
                    self._stop(self.runs.pop(uid))
                self.cluster.registry.finish_pod_deletion(pod)
                continue
            if is_terminal(pod):
                if run is not None:
                    self.runs.pop(uid)
                continue
            if run is None:
                if "pod-stuck-pending" in node_faults or "node-notready" in node_faults:
                    self._waiting(pod, "ContainerCreating")
                    continue
                run = self._admit(pod)
                if run is None:
                    continue
                self.runs[uid] = run
            self._advance(pod, run)

    # -- starting pods ---------------------------------------------------------------------------
    def _admit(self, pod: dict) -> PodRun | None:
        meta, spec = pod["metadata"], pod["spec"]
        wants = device_requests(spec)
        node = self.cluster.registry.find(NODES, "", self.name) or {}
        for resource, want in wants.items():
            capacity = int((node.get("status", {}).get("allocatable") or {}).get(resource, 0))
            if capacity < want:
                self._fail(pod, f"OutOf{resource}", f"Node didn't have enough resource: "
                           f"{resource}, requested: {want}, used: 0, capacity: {capacity}")
                return None
        devices: dict[str, list[str]] = {}
        for resource, want in wants.items():
            got = self.allocate(meta["uid"], resource, want)
            if got is None:
                self._fail(pod, "UnexpectedAdmissionError",
                           f"Allocate failed due to requested number of devices unavailable "
                           f"for {resource}. Requested: {want}")
                return None
            devices[resource] = got
        run = PodRun(meta["uid"], meta["namespace"], meta["name"], devices)
        if is_device_plugin(pod):
            run.simulated = True
            self._plugin_start(pod)
            return run
        if is_dra_plugin(pod):
            run.simulated = True
            self._dra_start(pod)
            return run
        claimed: dict[str, list[tuple[str, str]]] = {}
        if spec.get("resourceClaims"):
            prepared = self._prepare_claims(pod)
            if prepared is None:
                return None
            claimed, run.claims = prepared
        answers: dict[str, deviceplugin.AllocateResponse] = {}
        for resource, ids in devices.items():
            answer = self._plugin_allocate(ids)
            if isinstance(answer, str):
                self._fail(pod, "UnexpectedAdmissionError", answer)
                return None
            answers[resource] = answer
        handler = self._runtime_handler(spec) or ""
        contexts = [self.security_context(pod, c) for c in spec.get("containers") or []]
        sandbox_privileged = any(ctx.get("privileged") for ctx in contexts)
        for c, context in zip(spec.get("containers") or [], contexts, strict=True):
            env = self.container_env(pod, c)
            allocated = _merge([answers[r] for r in container_device_requests(c)
                                if r in answers])
            capabilities = context.get("capabilities") or {}
            # The kubelet adds the plugin's answer to the container's own settings; its
            # environment variables come last and win.
            request = ContainerRequest(
                meta["uid"], meta["name"], meta["namespace"], c["name"], c.get("image", ""),
                tuple(c.get("command") or []) + tuple(c.get("args") or []),
                {**env, **(allocated.envs if allocated else {})},
                mounts=allocated.mounts if allocated else (),
                annotations=dict(allocated.annotations) if allocated else {},
                cdi_devices=(allocated.cdi_devices if allocated else ())
                + _claim_cdi_ids(c, claimed),
                privileged=bool(context.get("privileged")),
                add_capabilities=tuple(capabilities.get("add") or ()),
                drop_capabilities=tuple(capabilities.get("drop") or ()),
                handler=handler, sandbox_privileged=sandbox_privileged)
            run.containers.append(ContainerRun(c["name"], request))
        return run

    # -- NVIDIA's DRA plugin and the kubelet's DRA manager (pkg/kubelet/cm/dra) ---------------
    def _dra_start(self, plugin: dict) -> None:
        """The plugin pod starts: it reads the node's GPUs through NVML once and publishes the
        node's ResourceSlice (a slice it published before is replaced, its pool's generation
        one higher); a GPU NVML cannot describe stops it (the real plugin exits), with a
        Warning event and no slice."""
        gpus = self.cluster.gpus_of(self.name, refresh=True)
        try:
            new = draplugin.node_slice(self.name, gpus)
        except draplugin.PluginError as exc:
            self.cluster.event(plugin, "DRAPluginFailed", f"error creating driver: {exc}",
                               "Warning")
            return
        old = self._node_slices()
        new["spec"]["pool"]["generation"] = 1 + max(
            (s["spec"]["pool"].get("generation", 0) for s in old), default=0)
        for item in old:
            self.cluster.registry.delete(R["ResourceSlice"], "", item["metadata"]["name"])
        self.cluster.registry.create(R["ResourceSlice"], "", new)
        self.dra_plugin, self.dra_gpus = plugin["metadata"]["uid"], list(gpus)

    def _node_slices(self) -> list[dict]:
        return self.cluster.registry.list(
            R["ResourceSlice"],
            field_selector=f"spec.nodeName={self.name},spec.driver={draplugin.DRIVER}")[0]

    def _prepare_claims(self, pod: dict
                        ) -> tuple[dict[str, list[tuple[str, str]]], tuple[str, ...]] | None:
        """Each claim entry -> [(request, CDI ID)] of its devices, and the claims' UIDs; None
        while the pod cannot start: a claim not allocated or not reserved for it yet (the
        scheduler does both before the bind), or a prepare that failed (Warning event
        FailedPrepareDynamicResources, retried at the next pass)."""
        meta = pod["metadata"]
        out: dict[str, list[tuple[str, str]]] = {}
        uids = []
        for entry, name in claim_names(pod).items():
            claim = (self.cluster.registry.find(CLAIMS, meta["namespace"], name)
                     if name else None)
            status = (claim or {}).get("status") or {}
            if claim is None or not status.get("allocation") or not any(
                    r.get("uid") == meta["uid"] for r in status.get("reservedFor") or []):
                self._waiting(pod, "ContainerCreating")
                return None
            problem = self._prepare(claim)
            if isinstance(problem, str):
                message = (f"Failed to prepare dynamic resources: NodePrepareResources "
                           f"failed for ResourceClaim {name}: {problem}")
                if self.prepare_failed.get(meta["uid"]) != message:
                    self.prepare_failed[meta["uid"]] = message
                    self.cluster.event(pod, "FailedPrepareDynamicResources", message,
                                       "Warning")
                self._waiting(pod, "ContainerCreating")
                return None
            out[entry] = problem
            uids.append(claim["metadata"]["uid"])
        self.prepare_failed.pop(meta["uid"], None)
        return out, tuple(uids)

    def _prepare(self, claim: dict) -> list[tuple[str, str]] | str:
        """NodePrepareResources of one claim by the node's DRA plugin: its CDI spec written
        (once: a prepared claim is a no-op, as the plugin's checkpoint makes it) and the
        [(request, CDI ID)] of its devices, or the error."""
        node_faults = self.cluster.faults(self.name)
        if self.dra_plugin is None or "dra-plugin-unregistered" in node_faults:
            # The kubelet's words (dra-driver-nvidia-gpu#814, kubernetes#133920): the driver
            # has not registered on this node.
            return f"DRA driver {draplugin.DRIVER} is not registered"
        if "dra-prepare-fails" in node_faults:
            return "prepare devices failed: lab fault dra-prepare-fails"
        uid = claim["metadata"]["uid"]
        try:
            devices = draplugin.claim_devices(claim, self.dra_gpus)
        except draplugin.PluginError as exc:
            return str(exc)
        if uid not in self.prepared:
            path = draplugin.spec_path(uid)
            problem = self.backend.write_claim_cdi_spec(
                # dra-cdi-spec-empty: the devices are in the spec without their device nodes
                # (#1380): the container starts with no GPU.
                self.name, path, {draplugin.cdi_device(uid, d): (
                    "" if "dra-cdi-spec-empty" in node_faults else gpu)
                    for d, (_, gpu) in devices.items()})
            if problem:
                return f"failed to create CDI spec file for claim: {problem}"
            self.prepared[uid] = path
        return [(request, draplugin.cdi_id(uid, d)) for d, (request, _) in devices.items()]

    def _dra_cleanup(self) -> None:
        """Unprepare the claims no pod of this node runs with any more (their spec files go),
        and, once the DRA plugin's pod is gone, delete the node's slices of its driver (the
        kubelet does when a plugin deregisters)."""
        used = {uid for run in self.runs.values() for uid in run.claims}
        for uid in [u for u in self.prepared if u not in used]:
            self.backend.delete_claim_cdi_spec(self.name, self.prepared.pop(uid))
        for uid in [u for u in self.prepare_failed if u not in self.runs]:
            self.prepare_failed.pop(uid)
        if self.dra_plugin is not None and self.dra_plugin not in self.runs:
            self.dra_plugin, self.dra_gpus = None, []
            for item in self._node_slices():
                self.cluster.registry.delete(R["ResourceSlice"], "", item["metadata"]["name"])

    def container_env(self, pod: dict, c: dict) -> dict[str, str]:
        """The container's environment from the pod spec (and, for the simulated device
        plugin, what its image sets)."""
        env = {"HOSTNAME": pod["metadata"]["name"]}
        if is_device_plugin(pod):
            env.update(DEVICE_PLUGIN_IMAGE_ENV)
        for item in c.get("env") or []:
            env[item["name"]] = self._env_value(pod, item)
        return env

    @staticmethod
    def security_context(pod: dict, c: dict) -> dict:
        return {**(pod["spec"].get("securityContext") or {}), **(c.get("securityContext") or {})}

    def container_view(self, pod: dict, c: dict) -> toolkit_rules.Container:
        """What NVIDIA's runtime sees of a container before any device is allocated: its
        environment (the image's, where the lab knows it, then the pod's) and privilege."""
        return toolkit_rules.Container(
            self.container_env(pod, c),
            privileged=toolkit_rules.is_privileged(self.security_context(pod, c)))

    def _plugin_settings(self, plugin: dict) -> deviceplugin.Settings:
        """The plugin pod's settings as it reads them on this node (raises AllocateError)."""
        node = self.cluster.registry.find(NODES, "", self.name) or {}
        return deviceplugin.settings_from_pod(
            plugin, node.get("metadata", {}).get("labels") or {},
            lambda ns, name: self.cluster.registry.find(R["ConfigMap"], ns, name))

    def _plugin_cdi_spec(self, plugin: dict, settings: deviceplugin.Settings | None = None
                         ) -> None:
        """A plugin with a CDI strategy writes the spec of its devices when it starts (the
        real one from NVML through nvcdi; here the node's nvidia-ctk, the same library's
        command): the node's runtime resolves the names Allocate returns from it. Asked
        again before each Allocate, where the spec is missing: a node that rebooted lost
        /var/run/cdi, and its real plugin, restarted with the node, wrote it again."""
        if settings is None:
            try:
                settings = self._plugin_settings(plugin)
            except deviceplugin.AllocateError:
                return  # Allocate reports it for every pod
        if not settings.cdi:
            return
        problem = self.backend.write_cdi_spec(self.name, deviceplugin.CDI_VENDOR,
                                              deviceplugin.CDI_CLASS, settings.id_strategy,
                                              deviceplugin.CDI_SPEC)
        if problem:
            self.cluster.event(plugin, "CDISpecFailed",
                               f"failed to create CDI spec file: {problem}", "Warning")

    def _plugin_start(self, plugin: dict) -> None:
        """The plugin pod starts: it reads its settings, enumerates the node's GPUs and MIG
        devices through NVML (read again now, not the pass's cached view) and builds its
        device map; a failure leaves it serving nothing (the real plugin exits), with a
        Warning event. A plugin with a CDI strategy writes its spec."""
        gpus = self.cluster.gpus_of(self.name, refresh=True)
        try:
            settings = self._plugin_settings(plugin)
            records = getattr(self.backend, "xid_records", None)
            seqs = [seq for seq, _, _ in (records(self.name) if records else [])]
            served = PluginDevices(deviceplugin.advertised(settings.mig_strategy, gpus),
                                   kmsg_seq=max(seqs, default=-1), env=settings.env)
        except deviceplugin.AllocateError as exc:
            served = PluginDevices({}, f"error starting plugins: {exc}")
            self.cluster.event(plugin, "DevicePluginFailed", served.error, "Warning")
        self.plugins[plugin["metadata"]["uid"]] = served
        self._plugin_cdi_spec(plugin)

    def _plugin_allocate(self, ids: list[str]) -> deviceplugin.AllocateResponse | str:
        """The node's device plugin's Allocate answer for these devices (UUIDs of one
        resource), or why it failed."""
        pods = self.cluster.registry.list(PODS, field_selector=f"spec.nodeName={self.name}")[0]
        plugin = next((p for p in pods if is_device_plugin(p)
                       and not p["metadata"].get("deletionTimestamp")), None)
        if plugin is None:
            return "no device plugin runs on the node"
        try:
            settings = self._plugin_settings(plugin)
        except deviceplugin.AllocateError as exc:
            return f"device plugin: {exc}"
        self._plugin_cdi_spec(plugin, settings)
        served = self.served(plugin["metadata"]["uid"]) or self.served()
        node_gpus = [g.uuid for g in self.cluster.gpus_of(self.name)]
        return deviceplugin.allocate(settings, ids, node_gpus,
                                     served.indices if served else None)

    def _runtime_handler(self, spec: dict) -> str | None:
        name = spec.get("runtimeClassName")
        if not name:
            return None
        rc = self.cluster.registry.find(R["RuntimeClass"], "", name)
        return rc["handler"] if rc else name

    @staticmethod
    def _env_value(pod: dict, item: dict) -> str:
        if "value" in item:
            return str(item["value"])
        ref = (item.get("valueFrom") or {}).get("fieldRef") or {}
        return selectors.field_value(pod, ref.get("fieldPath", "")) if ref else ""

    # -- running pods ----------------------------------------------------------------------------
    def _advance(self, pod: dict, run: PodRun) -> None:
        policy = pod["spec"].get("restartPolicy", "Always")
        clock = time.monotonic()
        for c in run.containers:
            if c.done:
                continue
            if c.starting is not None and c.starting.done():
                self._started(c, c.starting, clock)
            elif c.process is None and c.starting is None and clock >= c.next_start:
                self._start(c)
            if c.process is None:
                continue
            c.log = c.process.output()
            code = c.process.poll()
            if code is None:
                continue
            c.log = c.process.output()
            c.exit_code, c.finished_at, c.process = code, now(), None
            if policy == "Always" or (policy == "OnFailure" and code != 0):
                c.restarts += 1
                c.previous_log = c.log
                c.next_start = clock + min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (c.restarts - 1))
            else:
                c.done = True
        self._report(pod, run)

    def _start(self, c: ContainerRun) -> None:
        """Ask the runtime for the container, in the cluster's pool of starters: a runtime
        takes a few tenths of a second per container (sandbox, NVIDIA's runtime, runc), and
        the pods of all nodes start side by side, as each node's kubelet starts its own."""
        c.starting = self.cluster.starters.submit(
            self.backend.start, self.name, dataclasses.replace(c.request, attempt=c.restarts),
            on_exit=self.cluster.wake)
        c.starting.add_done_callback(lambda _: self.cluster.wake())

    @staticmethod
    def _started(c: ContainerRun, starting: concurrent.futures.Future, clock: float) -> None:
        """The start's outcome; a refusal leaves the container waiting with the reason, tried
        again after a back-off (as the kubelet's ErrImagePull / CreateContainerError)."""
        c.starting = None
        exc = starting.exception()
        if isinstance(exc, StartError):
            c.waiting = (exc.reason, str(exc))
            c.next_start = clock + BACKOFF_FIRST
            return
        if exc is not None:
            raise exc
        c.process = starting.result()
        c.container_id = c.process.container_id
        c.started_at, c.exit_code = now(), None

    def _report(self, pod: dict, run: PodRun) -> None:
        statuses = []
        for c in run.containers:
            spec_c = next(x for x in pod["spec"]["containers"] if x["name"] == c.name)
            cs = {"name": c.name, "image": spec_c.get("image", ""),
                  "imageID": spec_c.get("image", ""), "restartCount": c.restarts,
                  "ready": c.process is not None, "started": c.process is not None}
            if c.container_id:
                cs["containerID"] = f"containerd://{c.container_id}"
            terminated = {"exitCode": c.exit_code, "startedAt": c.started_at,
                          "finishedAt": c.finished_at,
                          "reason": "Completed" if c.exit_code == 0 else "Error"}
            if c.process is not None:
                cs["state"] = {"running": {"startedAt": c.started_at}}
                if c.restarts:
                    cs["lastState"] = {"terminated": terminated}
            elif c.done:
                cs["state"] = {"terminated": terminated}
            elif c.exit_code is not None:
                cs["state"] = {"waiting": {"reason": "CrashLoopBackOff",
                                           "message": f"back-off restarting failed container "
                                                      f"{c.name}"}}
                cs["lastState"] = {"terminated": terminated}
            else:
                reason, message = c.waiting
                cs["state"] = {"waiting": {"reason": reason, **({"message": message}
                                                                 if message else {})}}
            statuses.append(cs)
        if run.simulated:
            statuses = [{"name": c["name"], "image": c.get("image", ""),
                         "imageID": c.get("image", ""), "restartCount": 0, "ready": True,
                         "started": True, "state": {"running": {"startedAt": now()}},
                         "containerID": f"containerd://{run.uid.replace('-', '')}"}
                        for c in pod["spec"]["containers"]]
        all_done = run.containers and all(c.done for c in run.containers)
        if all_done:
            phase = "Succeeded" if all(c.exit_code == 0 for c in run.containers) else "Failed"
        else:
            phase = "Running" if any(s["state"].get("running") or s["state"].get("terminated")
                                     or s["state"].get("waiting", {}).get("reason") ==
                                     "CrashLoopBackOff" for s in statuses) else "Pending"
        ready = phase == "Running" and all(s["ready"] for s in statuses)
        self.cluster.update_pod_status(pod, phase, statuses, ready, run)
        if phase in ("Succeeded", "Failed"):
            self.runs.pop(run.uid, None)
            self.backend.stop_pod(self.name, run.uid)

    def _waiting(self, pod: dict, reason: str, message: str = "") -> None:
        waiting = {"reason": reason, **({"message": message} if message else {})}
        statuses = [{"name": c["name"], "image": c.get("image", ""),
                     "imageID": "", "restartCount": 0, "ready": False, "started": False,
                     "state": {"waiting": waiting}} for c in pod["spec"]["containers"]]
        self.cluster.update_pod_status(pod, "Pending", statuses, False, None)

    def _fail(self, pod: dict, reason: str, message: str) -> None:
        def mutate(status: dict) -> None:
            status.update({"phase": "Failed", "reason": reason, "message": message})

        self.cluster.mutate_status(pod, mutate)
        self.cluster.event(pod, reason, message, "Warning")

    def _stop(self, run: PodRun) -> None:
        for c in run.containers:
            if c.process is not None:
                c.process.kill()
                c.process = None
            if c.starting is not None:  # a start under way: stop what it starts
                c.starting.add_done_callback(_kill_started)
                c.starting = None

    def logs(self, uid: str, container: str, previous: bool) -> tuple[str, bool] | None:
        run = self.runs.get(uid)
        if run is None:
            return None
        if run.simulated and uid == self.dra_plugin:
            return (f"I0000 simulated NVIDIA DRA kubelet plugin on {self.name}: published "
                    f"{len(self.dra_gpus)} GPUs in the node's ResourceSlice\n", True)
        if run.simulated:
            served = self.served(uid)
            if served is not None and served.error:
                return f"E0000 simulated NVIDIA device plugin on {self.name}: " \
                       f"{served.error}\n", True
            resources = ", ".join(f"{len(d)} {r}" for r, d in sorted(
                (served.resources if served else {}).items())) or "no devices"
            return (f"I0000 simulated NVIDIA device plugin on {self.name}: {resources}, "
                    "registered with the kubelet\n", True)
        for c in run.containers:
            if c.name == container:
                if c.process is not None:
                    c.log = c.process.output()
                return (c.previous_log if previous else c.log), c.process is not None
        return None


def _claim_cdi_ids(container: dict, claimed: Mapping[str, list[tuple[str, str]]]
                   ) -> tuple[str, ...]:
    """The CDI IDs of the claims the container names in resources.claims, filtered by each
    entry's `request` (a firstAvailable result "<request>/<sub>" counts for its request), as
    the kubelet's DRA manager lists them for the CRI CDIDevices field (claiminfo.go
    cdiDevicesAsList)."""
    ids: list[str] = []
    for ref in (container.get("resources") or {}).get("claims") or []:
        want = ref.get("request")
        for request, cdi in claimed.get(ref.get("name"), ()):
            if (not want or request == want or request.startswith(want + "/")) \
                    and cdi not in ids:
                ids.append(cdi)
    return tuple(ids)


def _merge(answers: list[deviceplugin.AllocateResponse]
           ) -> deviceplugin.AllocateResponse | None:
    """The Allocate answers of a container's resources, as the kubelet's device manager adds
    them to the container (kubernetes pkg/kubelet/cm/devicemanager/manager.go
    deviceRunContainerOptions): a variable already set by an earlier answer is kept ("Skip
    existing env"; the kubelet's order is a Go map's, here the resources' names); mounts,
    annotations and CDI devices are all added."""
    if not answers:
        return None
    envs: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for answer in answers:
        for key, value in answer.envs.items():
            envs.setdefault(key, value)
        annotations.update(answer.annotations)
    return deviceplugin.AllocateResponse(
        envs, tuple(m for a in answers for m in a.mounts), annotations,
        tuple(d for a in answers for d in a.cdi_devices))


def _kill_started(starting: concurrent.futures.Future) -> None:
    if starting.exception() is None:
        starting.result().kill()
