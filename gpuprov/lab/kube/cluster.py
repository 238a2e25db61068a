"""Simulated cluster behaviour: the controllers a real control plane and kubelets would run.

One thread runs level-triggered passes (after every change, and on a short tick): node
status and device plugin registration, DaemonSet controller, Job controller, scheduler,
kubelets, PodDisruptionBudget status, garbage collection and namespace termination. Container
processes run in their own threads and report back through the registry, like any client.
Every write goes through the registry, so it is defaulted and validated like a client's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.lab.kube import deviceplugin, faults, selectors
from gpuprov.lab.kube.backend import (
    ContainerRequest,
    Gpu,
    NodeBackend,
    NodeSpec,
    Process,
    StartError,
    host_kernel,
)
from gpuprov.lab.kube.errors import ApiError
from gpuprov.lab.kube.registry import (
    BUILTIN_PRIORITY_CLASSES,
    GPU,
    NAMESPACES,
    NODES,
    PODS,
    SYSTEM_NAMESPACES,
    R,
    Registry,
    gpu_request,
    is_terminal,
    pod_ready,
    random_suffix,
)
from gpuprov.lab.kube.resources import GIT_VERSION, RESOURCES
from gpuprov.lab.kube.store import now
from gpuprov.lab.toolkit import toolkit_rules

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
# Containers started at once, all nodes together (a runtime's start is mostly waiting).
STARTERS = 8
# How NVIDIA's device plugin is recognised: its container image (nvcr.io/nvidia/k8s-device-
# plugin:<version> upstream; mirrors keep the repository name).
DEVICE_PLUGIN_IMAGE = "k8s-device-plugin"
# The environment NVIDIA's device plugin image sets (NVIDIA/k8s-device-plugin
# deployments/container/Dockerfile): the plugin asks NVIDIA's runtime for every GPU.
DEVICE_PLUGIN_IMAGE_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
# Tolerations the DaemonSet controller adds to every daemon pod.
DAEMON_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]
# Restart back-off for crashing containers: the kubelet's 10 s .. 5 min, shortened so tests
# and the lab see restarts within seconds.
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 10.0


def is_device_plugin(pod: dict) -> bool:
    return any(DEVICE_PLUGIN_IMAGE in str(c.get("image", ""))
               for c in pod["spec"].get("containers") or [])


def _requests_gpu(container: dict) -> bool:
    limits = (container.get("resources") or {}).get("limits") or {}
    return int(str(limits.get(GPU, 0))) > 0


def owned_by(obj: dict, uid: str) -> bool:
    return any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])


def owner_ref(owner: dict) -> dict:
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"],
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


def condition(type_: str, status: bool, reason: str = "", message: str = "") -> dict:
    cond = {"type": type_, "status": "True" if status else "False",
            "lastTransitionTime": now()}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def set_condition(conditions: list[dict], new: dict) -> list[dict]:
    """Replace the condition of new's type; keep its transition time when status is equal."""
    out = []
    for cond in conditions:
        if cond.get("type") == new["type"]:
            if cond.get("status") == new["status"]:
                new = {**new, "lastTransitionTime": cond.get("lastTransitionTime", now())}
            continue
        out.append(cond)
    out.append(new)
    return out


def node_ready(node: dict) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def node_taints(node: dict) -> list[dict]:
    taints = list((node.get("spec") or {}).get("taints") or [])
    if node.get("spec", {}).get("unschedulable"):
        taints.append(UNSCHEDULABLE_TAINT)
    return taints


def fits_node(spec: dict, node: dict) -> str:
    """Why a pod spec cannot go to a node ('' when it can), in the scheduler's words."""
    if not node_ready(node):
        return "node(s) were not ready"
    view = {**node, "spec": {**node.get("spec", {}), "taints": node_taints(node)}}
    untolerated = selectors.untolerated_taints(spec, view)
    if untolerated:
        t = untolerated[0]
        if t["key"] == UNSCHEDULABLE_TAINT["key"]:
            return "node(s) were unschedulable"
        return f"node(s) had untolerated taint {{{t['key']}: {t.get('value', '')}}}"
    if not selectors.node_selector_matches(spec, node) or \
            not selectors.node_affinity_matches(spec, node):
        return "node(s) didn't match Pod's node affinity/selector"
    return ""


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
    gpus: list[str]
    containers: list[ContainerRun] = field(default_factory=list)
    simulated: bool = False  # the device plugin: no process, running until deleted


class Kubelet:
    """One node's kubelet and device manager."""

    def __init__(self, cluster: Cluster, spec: NodeSpec) -> None:
        self.cluster = cluster
        self.spec = spec
        self.name = spec.name
        self.runs: dict[str, PodRun] = {}

    @property
    def backend(self) -> NodeBackend:
        return self.cluster.backend

    def healthy_gpus(self) -> list[Gpu]:
        return [g for g in self.cluster.gpus_of(self.name) if g.healthy]

    def allocate(self, uid: str, count: int) -> list[str] | None:
        if count == 0:
            return []
        held = set()
        if "double-allocate" not in self.cluster.faults(self.name):
            for run in self.runs.values():
                if run.uid != uid:
                    held.update(run.gpus)
        free = [g.uuid for g in self.healthy_gpus() if g.uuid not in held]
        return free[:count] if len(free) >= count else None

    def sync(self, pods: list[dict]) -> None:
        alive = {p["metadata"]["uid"] for p in pods}
        for uid in list(self.runs):
            if uid not in alive:
                self._stop(self.runs.pop(uid))
        # Sandboxes of pods that are gone, or being deleted, go (the pod's containers with them).
        self.backend.collect(self.name, {p["metadata"]["uid"] for p in pods
                                         if not p["metadata"].get("deletionTimestamp")})
        node_faults = self.cluster.faults(self.name)
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
        want = gpu_request(spec)
        if want:
            node = self.cluster.registry.find(NODES, "", self.name) or {}
            capacity = int((node.get("status", {}).get("allocatable") or {}).get(GPU, 0))
            if capacity < want:
                self._fail(pod, f"OutOf{GPU}", f"Node didn't have enough resource: {GPU}, "
                           f"requested: {want}, used: 0, capacity: {capacity}")
                return None
        gpus = self.allocate(meta["uid"], want)
        if gpus is None:
            self._fail(pod, "UnexpectedAdmissionError",
                       f"Allocate failed due to requested number of devices unavailable for "
                       f"{GPU}. Requested: {want}")
            return None
        run = PodRun(meta["uid"], meta["namespace"], meta["name"], gpus)
        if is_device_plugin(pod):
            run.simulated = True
            return run
        node_gpus = [g.uuid for g in self.cluster.gpus_of(self.name)]
        answer = self._plugin_allocate(gpus, node_gpus) if gpus else None
        if isinstance(answer, str):
            self._fail(pod, "UnexpectedAdmissionError", answer)
            return None
        handler = self._runtime_handler(spec) or ""
        contexts = [self.security_context(pod, c) for c in spec.get("containers") or []]
        sandbox_privileged = any(ctx.get("privileged") for ctx in contexts)
        for c, context in zip(spec.get("containers") or [], contexts, strict=True):
            env = self.container_env(pod, c)
            allocated = answer if answer is not None and _requests_gpu(c) else None
            capabilities = context.get("capabilities") or {}
            # The kubelet adds the plugin's answer to the container's own settings; its
            # environment variables come last and win.
            request = ContainerRequest(
                meta["uid"], meta["name"], meta["namespace"], c["name"], c.get("image", ""),
                tuple(c.get("command") or []) + tuple(c.get("args") or []),
                {**env, **(allocated.envs if allocated else {})},
                mounts=allocated.mounts if allocated else (),
                annotations=dict(allocated.annotations) if allocated else {},
                cdi_devices=allocated.cdi_devices if allocated else (),
                privileged=bool(context.get("privileged")),
                add_capabilities=tuple(capabilities.get("add") or ()),
                drop_capabilities=tuple(capabilities.get("drop") or ()),
                handler=handler, sandbox_privileged=sandbox_privileged)
            run.containers.append(ContainerRun(c["name"], request))
        return run

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

    def _plugin_allocate(self, gpus: list[str],
                         node_gpus: list[str]) -> deviceplugin.AllocateResponse | str:
        """The node's device plugin's Allocate answer for these GPUs (of the node's, in NVML
        order), or why it failed."""
        pods = self.cluster.registry.list(PODS, field_selector=f"spec.nodeName={self.name}")[0]
        plugin = next((p for p in pods if is_device_plugin(p)
                       and not p["metadata"].get("deletionTimestamp")), None)
        if plugin is None:
            return "no device plugin runs on the node"
        try:
            settings = deviceplugin.settings_from_pod(plugin)
        except deviceplugin.AllocateError as exc:
            return f"device plugin: {exc}"
        return deviceplugin.allocate(settings, gpus, node_gpus)

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
        if run.simulated:
            return (f"I0000 simulated NVIDIA device plugin on {self.name}: "
                    f"{len(self.healthy_gpus())} GPU(s), registered with the kubelet\n", True)
        for c in run.containers:
            if c.name == container:
                if c.process is not None:
                    c.log = c.process.output()
                return (c.previous_log if previous else c.log), c.process is not None
        return None


class Cluster:
    def __init__(self, registry: Registry, backend: NodeBackend,
                 state_dir: Path | None = None, tick: float = TICK_SECONDS) -> None:
        self.registry = registry
        self.backend = backend
        self.state_dir = state_dir
        self.tick = tick
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
                reg.create(NODES, "", self._node_object(kubelet.spec))

    def _node_object(self, spec: NodeSpec) -> dict:
        resources = {"cpu": spec.cpu, "memory": spec.memory, "pods": "110",
                     "ephemeral-storage": "100Gi"}
        return {
            "metadata": {"name": spec.name, "labels": {
                "kubernetes.io/hostname": spec.name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64"},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                "gpuprov.io/emulated": "true"}},
            "spec": {},
            "status": {
                "capacity": dict(resources), "allocatable": dict(resources),
                "conditions": self._node_conditions(True),
                "addresses": [{"type": "Hostname", "address": spec.name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {
                    "architecture": "amd64", "bootID": "", "containerRuntimeVersion":
                    "containerd://emulated", "kernelVersion": host_kernel(),
                    "kubeProxyVersion": "", "kubeletVersion": GIT_VERSION,
                    "machineID": "", "operatingSystem": "linux",
                    "osImage": "Debian GNU/Linux 12 (bookworm)", "systemUUID": ""},
            },
        }

    @staticmethod
    def _node_conditions(ready: bool) -> list[dict]:
        stamp = now()
        conds = []
        for type_, reason in (("MemoryPressure", "KubeletHasSufficientMemory"),
                              ("DiskPressure", "KubeletHasNoDiskPressure"),
                              ("PIDPressure", "KubeletHasSufficientPID")):
            conds.append({"type": type_, "status": "False", "reason": reason,
                          "lastHeartbeatTime": stamp, "lastTransitionTime": stamp})
        conds.append({"type": "Ready", "status": "True" if ready else "False",
                      "reason": "KubeletReady" if ready else "KubeletNotReady",
                      "message": "kubelet is posting ready status" if ready
                      else "container runtime network not ready (fault node-notready)",
                      "lastHeartbeatTime": stamp, "lastTransitionTime": stamp})
        return conds

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
        for step in (self._nodes, self._daemonsets, self._jobs, self._schedule,
                     self._kubelets, self._pdbs, self._collect_garbage):
            try:
                step()
            except ApiError as err:  # lost a race with a client: the next pass retries
                log.debug("%s: %s", step.__name__, err.message)
            except Exception:
                log.exception("controller %s failed", step.__name__)

    # -- helpers -----------------------------------------------------------------------------------
    def faults(self, node: str) -> list[str]:
        return faults.active_faults(self.state_dir, node)

    def gpus_of(self, node: str) -> list[Gpu]:
        if node not in self._gpu_cache:
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

    # -- controllers -------------------------------------------------------------------------------
    def _plugin_registered(self, node: str, pods: list[dict]) -> bool:
        if "plugin-unregistered" in self.faults(node):
            return False
        kubelet = self.kubelets[node]
        runtime = self.backend.runtime(node)
        node_gpus = [g.uuid for g in self.gpus_of(node)]
        for pod in pods:
            if (is_device_plugin(pod) and pod["spec"].get("nodeName") == node
                    and pod.get("status", {}).get("phase") == "Running"
                    and not pod["metadata"].get("deletionTimestamp")
                    and runtime.handler_is_nvidia(kubelet._runtime_handler(pod["spec"]))):
                # The plugin sees the GPUs NVIDIA's runtime gives its container (its image asks
                # for all of them by NVIDIA_VISIBLE_DEVICES); one that finds no GPU, or cannot
                # initialise NVML, registers nothing.
                container = kubelet.container_view(pod, pod["spec"]["containers"][0])
                try:
                    return bool(toolkit_rules.container_gpus(
                        container, runtime.toolkit_settings, node_gpus, True))
                except toolkit_rules.UnknownDevice:
                    return False
        return False

    def _nodes(self) -> None:
        pods = self.registry.list(PODS)[0]
        for name, kubelet in self.kubelets.items():
            node = self.registry.find(NODES, "", name)
            if node is None:
                continue
            ready = "node-notready" not in self.faults(name)
            status = copy.deepcopy(node.get("status") or {})
            conds = status.get("conditions") or []
            if node_ready(node) != ready:
                conds = [c for c in conds if c.get("type") != "Ready"]
                conds += [c for c in self._node_conditions(ready) if c["type"] == "Ready"]
            status["conditions"] = conds
            capacity = dict(status.get("capacity") or {})
            allocatable = dict(status.get("allocatable") or {})
            if self._plugin_registered(name, pods):
                gpus = self.gpus_of(name)
                capacity[GPU] = str(len(gpus))
                allocatable[GPU] = str(len(kubelet.healthy_gpus()))
            elif GPU in capacity:
                # The kubelet keeps a resource whose plugin went away, with nothing allocatable.
                allocatable[GPU] = "0"
            status["capacity"], status["allocatable"] = capacity, allocatable
            spec = copy.deepcopy(node.get("spec") or {})
            taints = [t for t in spec.get("taints") or [] if t.get("key") != NOT_READY_TAINT["key"]]
            if not ready:
                taints.append({**NOT_READY_TAINT, "timeAdded": now()})
            old_taints = [t for t in (node.get("spec") or {}).get("taints") or []]
            if [(t["key"], t["effect"]) for t in taints] != \
                    [(t["key"], t["effect"]) for t in old_taints]:
                if taints:
                    spec["taints"] = taints
                else:
                    spec.pop("taints", None)
                node = self.registry.replace(NODES, "", name, {**node, "spec": spec})
            if status != node.get("status"):
                self.registry.replace(NODES, "", name, {**node, "status": status}, "status")

    def _daemonsets(self) -> None:
        nodes = self.registry.list(NODES)[0]
        for ds in self.registry.list(R["DaemonSet"])[0]:
            if not ds["metadata"].get("deletionTimestamp"):
                _guarded(self._sync_daemonset, ds, nodes)

    def _sync_daemonset(self, ds: dict, nodes: list[dict]) -> None:
        meta, spec = ds["metadata"], ds["spec"]
        ns, uid, generation = meta["namespace"], meta["uid"], meta.get("generation", 1)
        template = spec["template"]
        tmpl_spec = {**template["spec"],
                     "tolerations": (template["spec"].get("tolerations") or [])
                     + DAEMON_TOLERATIONS}
        pods = [p for p in self.registry.list(PODS, ns)[0] if owned_by(p, uid)]
        desired = scheduled = misscheduled = ready = updated = 0
        max_unavailable = (spec.get("updateStrategy") or {}).get("rollingUpdate", {}) \
            .get("maxUnavailable", 1)
        wanted_nodes = []
        for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
            name = node["metadata"]["name"]
            view = {**node, "spec": {**node.get("spec", {}),
                                     "taints": (node.get("spec") or {}).get("taints") or []}}
            should = (selectors.node_selector_matches(tmpl_spec, node)
                      and selectors.node_affinity_matches(tmpl_spec, node)
                      and not selectors.untolerated_taints(tmpl_spec, view))
            mine = [p for p in pods if _daemon_node(p) == name
                    and not p["metadata"].get("deletionTimestamp")]
            if should:
                desired += 1
                wanted_nodes.append(name)
            for p in mine:
                if not should or (p.get("status") or {}).get("phase") == "Failed":
                    self.registry.delete(PODS, ns, p["metadata"]["name"])
            mine = [p for p in mine if should and p["status"].get("phase") != "Failed"]
            if should and not mine:
                self._create_daemon_pod(ds, name, generation)
                continue
            if not should and mine:
                misscheduled += 1
            if mine:
                scheduled += 1
                current = [p for p in mine if p["metadata"].get("labels", {})
                           .get("pod-template-generation") == str(generation)]
                updated += bool(current)
                ready += any(pod_ready(p) for p in mine)
        outdated = [p for p in pods if _daemon_node(p) in wanted_nodes
                    and not p["metadata"].get("deletionTimestamp")
                    and p["metadata"].get("labels", {}).get("pod-template-generation")
                    != str(generation)]
        budget = _count(max_unavailable, desired) - (desired - ready)
        if (spec.get("updateStrategy") or {}).get("type", "RollingUpdate") == "RollingUpdate":
            for p in outdated[:max(0, budget)]:
                self.registry.delete(PODS, ns, p["metadata"]["name"])
        status = {"currentNumberScheduled": scheduled, "numberMisscheduled": misscheduled,
                  "desiredNumberScheduled": desired, "numberReady": ready,
                  "observedGeneration": generation, "updatedNumberScheduled": updated,
                  "numberAvailable": ready}
        if desired - ready:
            status["numberUnavailable"] = desired - ready
        if status != ds.get("status"):
            self.registry.replace(R["DaemonSet"], ns, meta["name"], {**ds, "status": status},
                                  "status")

    def _create_daemon_pod(self, ds: dict, node: str, generation: int) -> None:
        template = copy.deepcopy(ds["spec"]["template"])
        spec = template["spec"]
        spec["tolerations"] = (spec.get("tolerations") or []) + [
            t for t in DAEMON_TOLERATIONS if t not in (spec.get("tolerations") or [])]
        affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
        meta = template.get("metadata") or {}
        labels = {**(meta.get("labels") or {}), "pod-template-generation": str(generation),
                  "controller-revision-hash": f"{generation:x}"}
        self.registry.create(PODS, ds["metadata"]["namespace"], {
            "metadata": {"generateName": ds["metadata"]["name"] + "-", "labels": labels,
                         "annotations": meta.get("annotations") or {},
                         "ownerReferences": [owner_ref(ds)]},
            "spec": spec})

    def _jobs(self) -> None:
        for job in self.registry.list(R["Job"])[0]:
            if not job["metadata"].get("deletionTimestamp"):
                _guarded(self._sync_job, job)

    def _sync_job(self, job: dict) -> None:
        meta, spec = job["metadata"], job["spec"]
        ns = meta["namespace"]
        status = copy.deepcopy(job.get("status") or {})
        conds = status.get("conditions") or []
        finished = any(c["type"] in ("Complete", "Failed") and c["status"] == "True"
                       for c in conds)
        pods = [p for p in self.registry.list(PODS, ns)[0] if owned_by(p, meta["uid"])]
        active = [p for p in pods if not is_terminal(p)
                  and not p["metadata"].get("deletionTimestamp")]
        succeeded = max(status.get("succeeded", 0),
                        sum(1 for p in pods if p["status"].get("phase") == "Succeeded"))
        restarts = sum(cs.get("restartCount", 0) for p in pods
                       for cs in p["status"].get("containerStatuses") or [])
        failed = max(status.get("failed", 0),
                     sum(1 for p in pods if p["status"].get("phase") == "Failed") + restarts)
        if finished:
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None and _age(status.get("completionTime")) >= ttl:
                self.registry.delete(R["Job"], ns, meta["name"],
                                     {"propagationPolicy": "Background"})
            return
        status.setdefault("startTime", now())
        if failed > spec.get("backoffLimit", 6):
            for p in active:
                self.registry.delete(PODS, ns, p["metadata"]["name"])
            message = "Job has reached the specified backoff limit"
            conds = set_condition(conds, condition("FailureTarget", True, "BackoffLimitExceeded",
                                                   message))
            conds = set_condition(conds, condition("Failed", True, "BackoffLimitExceeded",
                                                   message))
            active = []
            self.event(job, "BackoffLimitExceeded", message, "Warning", "job-controller")
        elif succeeded >= spec.get("completions", 1):
            conds = set_condition(conds, condition("SuccessCriteriaMet", True,
                                                   "CompletionsReached", "Reached expected "
                                                   "number of succeeded pods"))
            conds = set_condition(conds, condition("Complete", True, "CompletionsReached",
                                                   "Reached expected number of succeeded pods"))
            status["completionTime"] = now()
            self.event(job, "Completed", "Job completed", "Normal", "job-controller")
        elif not spec.get("suspend"):
            missing = min(spec.get("parallelism", 1),
                          spec.get("completions", 1) - succeeded) - len(active)
            for _ in range(max(0, missing)):
                template = copy.deepcopy(spec["template"])
                tmeta = template.get("metadata") or {}
                created = self.registry.create(PODS, ns, {
                    "metadata": {"generateName": meta["name"] + "-",
                                 "labels": tmeta.get("labels") or {},
                                 "annotations": tmeta.get("annotations") or {},
                                 "ownerReferences": [owner_ref(job)]},
                    "spec": template["spec"]})
                active.append(created)
                self.event(job, "SuccessfulCreate",
                           f"Created pod: {created['metadata']['name']}", "Normal",
                           "job-controller")
        status.update({"active": len(active), "succeeded": succeeded, "failed": failed,
                       "ready": sum(1 for p in active if pod_ready(p)), "terminating": 0,
                       "uncountedTerminatedPods": {}})
        for key in ("active", "succeeded", "failed"):
            if not status[key]:
                del status[key]
        if conds:
            status["conditions"] = conds
        if status != job.get("status"):
            self.registry.replace(R["Job"], ns, meta["name"], {**job, "status": status},
                                  "status")

    def _schedule(self) -> None:
        pods = self.registry.list(PODS)[0]
        nodes = sorted(self.registry.list(NODES)[0], key=lambda n: n["metadata"]["name"])
        used: dict[str, int] = {}
        count: dict[str, int] = {}
        for p in pods:
            node = p["spec"].get("nodeName")
            if node and not is_terminal(p):
                used[node] = used.get(node, 0) + gpu_request(p["spec"])
                count[node] = count.get(node, 0) + 1
        for pod in pods:
            _guarded(self._schedule_pod, pod, nodes, used, count)

    def _schedule_pod(self, pod: dict, nodes: list[dict], used: dict[str, int],
                      count: dict[str, int]) -> None:
        spec = pod["spec"]
        if (spec.get("nodeName") or is_terminal(pod)
                or pod["metadata"].get("deletionTimestamp")
                or spec.get("schedulerName", "default-scheduler") != "default-scheduler"):
            return
        want = gpu_request(spec)
        reasons: dict[str, int] = {}
        best = None
        for node in nodes:
            name = node["metadata"]["name"]
            why = fits_node(spec, node)
            if not why and want:
                free = int((node.get("status", {}).get("allocatable") or {})
                           .get(GPU, 0)) - used.get(name, 0)
                if free < want:
                    why = f"Insufficient {GPU}"
            if why:
                reasons[why] = reasons.get(why, 0) + 1
                continue
            free = int((node.get("status", {}).get("allocatable") or {}).get(GPU, 0)) \
                - used.get(name, 0)
            rank = (-free if want else 0, count.get(name, 0), name)
            if best is None or rank < best[0]:
                best = (rank, name)
        if best is None:
            detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
            message = (f"0/{len(nodes)} nodes are available: {detail}. preemption: "
                       f"0/{len(nodes)} nodes are available: {len(nodes)} Preemption is "
                       "not helpful for scheduling.")
            cond = condition("PodScheduled", False, "Unschedulable", message)

            def unschedulable(status: dict, cond: dict = cond) -> None:
                old = [c for c in status.get("conditions") or []
                       if c.get("type") == "PodScheduled"]
                if old and old[0].get("message") == cond["message"]:
                    return
                status["conditions"] = set_condition(status.get("conditions") or [], cond)

            before = self.mutate_status(pod, unschedulable)
            if before is not None and before is not pod:
                self.event(pod, "FailedScheduling", message, "Warning", "default-scheduler")
            return
        name = best[1]
        self.registry.bind(pod["metadata"]["namespace"], pod["metadata"]["name"],
                           {"target": {"kind": "Node", "name": name}})
        self.mutate_status(pod, lambda s: s.update(conditions=set_condition(
            s.get("conditions") or [], condition("PodScheduled", True))))
        used[name] = used.get(name, 0) + want
        count[name] = count.get(name, 0) + 1
        self.event(pod, "Scheduled", f"Successfully assigned "
                   f"{pod['metadata']['namespace']}/{pod['metadata']['name']} to {name}",
                   "Normal", "default-scheduler")

    def _kubelets(self) -> None:
        pods = self.registry.list(PODS)[0]
        by_node: dict[str, list[dict]] = {name: [] for name in self.kubelets}
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if node in by_node:
                by_node[node].append(pod)
            elif node and pod["metadata"].get("deletionTimestamp"):
                # No kubelet will ever confirm: the pod GC force-deletes it.
                self.registry.finish_pod_deletion(pod)
        for name, kubelet in self.kubelets.items():
            _guarded(kubelet.sync, by_node[name])

    def _pdbs(self) -> None:
        for pdb in self.registry.list(R["PodDisruptionBudget"])[0]:
            healthy, expected = self.registry.pdb_counts(pdb)
            desired = self.registry.pdb_desired(pdb, expected)
            status = {**(pdb.get("status") or {}), "currentHealthy": healthy,
                      "desiredHealthy": desired, "expectedPods": expected,
                      "disruptionsAllowed": max(0, healthy - desired),
                      "observedGeneration": pdb["metadata"].get("generation", 1)}
            if status != pdb.get("status"):
                self.registry.replace(R["PodDisruptionBudget"], pdb["metadata"]["namespace"],
                                      pdb["metadata"]["name"], {**pdb, "status": status},
                                      "status")

    def _collect_garbage(self) -> None:
        everything = {rt.key: self.registry.list(rt)[0] for rt in RESOURCES}
        uids = {o["metadata"]["uid"] for objs in everything.values() for o in objs}
        for rt in RESOURCES:
            for obj in everything[rt.key]:
                meta = obj["metadata"]
                ns = meta.get("namespace", "")
                refs = meta.get("ownerReferences") or []
                if refs and not any(r.get("uid") in uids for r in refs) \
                        and not meta.get("deletionTimestamp"):
                    self.registry.delete(rt, ns, meta["name"])
                elif "foregroundDeletion" in (meta.get("finalizers") or []):
                    dependents = [(drt, d) for drt in RESOURCES for d in everything[drt.key]
                                  if owned_by(d, meta["uid"])]
                    for drt, d in dependents:
                        if not d["metadata"].get("deletionTimestamp"):
                            self.registry.delete(drt, d["metadata"].get("namespace", ""),
                                                 d["metadata"]["name"])
                    if not dependents:
                        rest = [f for f in meta["finalizers"] if f != "foregroundDeletion"]
                        self.registry.replace(rt, ns, meta["name"], {
                            **obj, "metadata": {**meta, "finalizers": rest}})
        for ns in everything[NAMESPACES.key]:
            if not ns["metadata"].get("deletionTimestamp"):
                continue
            name = ns["metadata"]["name"]
            left = 0
            for rt in RESOURCES:
                if not rt.namespaced:
                    continue
                for obj in everything[rt.key]:
                    if obj["metadata"].get("namespace") != name:
                        continue
                    left += 1
                    if not obj["metadata"].get("deletionTimestamp"):
                        self.registry.delete(rt, name, obj["metadata"]["name"],
                                             {"propagationPolicy": "Background"})
            if not left:
                self.registry.store.remove(NAMESPACES, "", name)


def _kill_started(starting: concurrent.futures.Future) -> None:
    if starting.exception() is None:
        starting.result().kill()


def _guarded(step: Callable, *args: object) -> None:
    """Run one object's reconciliation; a failure is logged and retried on the next pass
    without holding up the other objects."""
    try:
        step(*args)
    except ApiError as err:
        log.debug("%s: %s", step.__name__, err.message)
    except Exception:
        log.exception("%s failed", step.__name__)


def _daemon_node(pod: dict) -> str:
    if pod["spec"].get("nodeName"):
        return pod["spec"]["nodeName"]
    terms = ((((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
             .get("nodeSelectorTerms") or [])
    for term in terms:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return f["values"][0]
    return ""


def _count(value: object, total: int) -> int:
    text = str(value)
    if text.endswith("%"):
        return max(1, total * int(text[:-1]) // 100)
    return int(text)


def _age(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    import datetime

    then = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc)
    return (datetime.datetime.now(datetime.timezone.utc) - then).total_seconds()
