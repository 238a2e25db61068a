"""Pod phase: smoke workloads on every GPU node, in a namespace of their own that is always
removed (Ctrl-C and SIGTERM included).

Per GPU node, one after the other (nodes in parallel):
    gpu-count   one Pod requesting every allocatable GPU of the node, `nvidia-smi -L`
    isolation   one 1-GPU Pod per GPU (up to MAX_ISOLATION_PODS), held Running together
                until each has printed the GPU it sees: concurrency is observed, not assumed
    batch-job   one batch/v1 Job requesting one GPU, which must complete
    no-request  one unprivileged Pod that requests no GPU but sets NVIDIA_VISIBLE_DEVICES=all
                (as every CUDA image does) and runs with the NVIDIA RuntimeClass: the worst
                case of a pod that did not ask, which must see no GPU

This module only runs the workloads and records what they printed (SmokeRun); the checks in
gpuprov/verify/checks/pods.py judge the records. The manifests are templates/smoke-*.yml.j2,
rendered by gpuprov.manifests (one source with the Ansible side).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from gpuprov import manifests

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
NAMESPACE_PREFIX = "gpuprov-verify-"
MANAGED_LABEL = {"app.kubernetes.io/managed-by": "gpuprov"}
SMOKE_KINDS = ("gpu-count", "isolation", "batch-job", "no-request")
MAX_ISOLATION_PODS = 8
# Waits watch for changes (no polling); a watch lasts at most WATCH_S so that Ctrl-C is
# noticed between two. Output in a running pod's log is no API change: while pods run and
# their log is awaited, and after a failed watch, the log or list is read every POLL_S.
WATCH_S = 2
POLL_S = 0.2
NAMESPACE_GONE_S = 60
# How often a claim's CDI spec is looked for after its pod is gone (one SSH command each),
# until claims.CDI_GONE_S.
CDI_POLL_S = 1.0
REQUEST_TIMEOUT = (5.0, 30.0)
# `nvidia-smi -L`: "GPU 0: Tesla P100-PCIE-16GB (UUID: GPU-5d0c...)", and under a GPU its MIG
# devices the container was given: "  MIG 1g.10gb     Device  0: (UUID: MIG-...)" (NVIDIA's MIG
# user guide, "Device Enumeration").
_GPU_LINE = re.compile(r"^GPU \d+: .*\(UUID: (?P<uuid>[^)\s]+)\)", re.MULTILINE)
_MIG_LINE = re.compile(r"^\s+MIG .*Device\s+\d+: \(UUID: (?P<uuid>MIG-[^)\s]+)\)", re.MULTILINE)
# The isolation pods print their GPU, then stay Running until the verifier deletes them.
HOLD_COMMAND = ("sh", "-c", "nvidia-smi -L && exec sleep 600")
# The no-request pod lists what GPUs it can use and always ends well: seeing none is its pass
# (nvidia-smi is not even there when NVIDIA's runtime gives the container no GPU).
NO_REQUEST_COMMAND = ("sh", "-c", "nvidia-smi -L 2>/dev/null; exit 0")


def _noun(resource: str, gpus: str = "GPUs") -> str:
    return gpus if resource == GPU_RESOURCE else resource


def gpu_uuids(log_text: str) -> list[str]:
    """The devices a container saw: its MIG devices where it has any (two containers may get
    MIG devices of one GPU, which each then lists), else its GPUs."""
    mig = [m.group("uuid") for m in _MIG_LINE.finditer(log_text or "")]
    return mig or [m.group("uuid") for m in _GPU_LINE.finditer(log_text or "")]


@dataclasses.dataclass(frozen=True)
class PodRecord:
    name: str
    phase: str  # Pending | Running | Succeeded | Failed | Timeout
    uuids: tuple[str, ...] = ()
    message: str = ""  # why it did not run or finish, from the API


@dataclasses.dataclass(frozen=True)
class SmokeRun:
    """What one smoke workload did on one node."""

    kind: str  # gpu-count | isolation | batch-job
    requested: int  # devices of `resource` per pod
    pods: tuple[PodRecord, ...] = ()
    completed: bool | None = None  # batch-job: the Job's Complete condition
    skipped: str | None = None  # why it did not run
    error: str | None = None  # the API refused or the run broke
    resource: str = GPU_RESOURCE


@dataclasses.dataclass(frozen=True)
class Target:
    node: str
    allocatable: int  # of `resource` the node offers
    allocated: int  # held by pods running there before verify started
    # nvidia.com/gpu, or on a node whose GPUs are all partitioned (the plugin's mixed
    # strategy) the MIG profile it offers most of: the smoke pods then run on MIG devices.
    resource: str = GPU_RESOURCE


class Interrupted(Exception):
    """The run was stopped (Ctrl-C): workers give up their waits at once."""


class _Api:
    """The few calls the pod phase makes, with JSON in and out (no typed models)."""

    def __init__(self, api_client: Any, stop: threading.Event) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.stop = stop

    def sleep(self, seconds: float) -> None:
        if self.stop.wait(seconds):
            raise Interrupted

    def pods(self, namespace: str, selector: str) -> list[dict]:
        return self.listed(self.core.list_namespaced_pod, namespace,
                           label_selector=selector)["items"]

    def listed(self, list_call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict:
        """A list call's document: {"items": [...], "metadata": {"resourceVersion": ...}}."""
        response = list_call(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT,
                             **kwargs)
        doc = json.loads(response.data)
        doc["items"] = doc.get("items") or []
        return doc

    def wait_until(self, done: Callable[[list[dict]], bool], timeout: float,
                   list_call: Callable[..., Any], *args: Any, **kwargs: Any) -> list[dict]:
        """The objects of a list call once done(objects) holds, or as they are at the timeout.

        Between two looks it watches from the list's resourceVersion, so it wakes at the
        first change instead of polling the API server (what `kubectl wait` does)."""
        from kubernetes import watch

        deadline = time.monotonic() + timeout
        while True:
            doc = self.listed(list_call, *args, **kwargs)
            left = deadline - time.monotonic()
            if done(doc["items"]) or left <= 0:
                return doc["items"]
            if self.stop.is_set():
                raise Interrupted
            stream = watch.Watch()
            try:
                # A short server-side timeout keeps Ctrl-C prompt: the worker looks at the
                # stop flag between watches.
                for _event in stream.stream(
                        list_call, *args, resource_version=doc["metadata"]["resourceVersion"],
                        timeout_seconds=max(1, min(int(left), WATCH_S)),
                        _request_timeout=REQUEST_TIMEOUT, **kwargs):
                    break
            except Exception as exc:  # 410 Gone, a dropped stream: list again after a pause
                log.debug("watch ended: %s", exc)
                self.sleep(POLL_S)
            finally:
                stream.stop()

    def log(self, namespace: str, pod: str) -> str:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.read_namespaced_pod_log(
                pod, namespace, _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT).data.decode(errors="replace")
        except ApiException:
            return ""


def _pod_state(pod: Mapping[str, Any]) -> tuple[str, str]:
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    reasons = [c.get("message") or c.get("reason") for c in status.get("conditions") or []
               if c.get("status") == "False" and (c.get("message") or c.get("reason"))]
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            reasons.append(f"{waiting['reason']}: {waiting.get('message', '')}".strip(": "))
    return phase, "; ".join(reasons) or status.get("message") or ""


class NodeRunner:
    """The smoke workloads of one node."""

    def __init__(self, api: _Api, namespace: str, target: Target, timeout: float,
                 values: Mapping[str, Any]) -> None:
        self.api = api
        self.ns = namespace
        self.target = target
        self.timeout = timeout
        self.values = values
        self.prefix = f"smoke-{_dns_label(target.node)}"

    def _selector(self, kind: str) -> str:
        return f"gpuprov.io/smoke={kind},gpuprov.io/node={_dns_label(self.target.node)}"

    def _labelled(self, obj: dict, kind: str) -> dict:
        extra = {"gpuprov.io/smoke": kind, "gpuprov.io/node": _dns_label(self.target.node)}
        obj["metadata"].setdefault("labels", {}).update(extra)
        template = obj.get("spec", {}).get("template")
        if template is not None:
            template.setdefault("metadata", {}).setdefault("labels", {}).update(extra)
        return obj

    def _wait(self, kind: str, count: int, done: Callable[[list[dict]], bool]) -> list[dict]:
        return self.api.wait_until(lambda pods: len(pods) >= count and done(pods), self.timeout,
                                   self.api.core.list_namespaced_pod, self.ns,
                                   label_selector=self._selector(kind))

    def _records(self, pods: list[dict], timed_out: bool,
                 logs: Mapping[str, str] | None = None) -> tuple[PodRecord, ...]:
        """What each pod did; `logs`: what pods printed already (read again only if absent)."""
        records = []
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            phase, why = _pod_state(pod)
            name = pod["metadata"]["name"]
            text = (logs or {}).get(name) or (
                self.api.log(self.ns, name) if phase != "Pending" else "")
            if timed_out and phase in ("Pending", "Running") and not gpu_uuids(text):
                phase = "Timeout"
            records.append(PodRecord(name, phase, tuple(gpu_uuids(text)), why))
        return tuple(records)

    def _create_pod(self, name: str, kind: str, gpus: int, command: Sequence[str],
                    visible_devices: str | None = None) -> None:
        pod = manifests.smoke_pod(name, self.ns, gpus=gpus, node=self.target.node,
                                  values=self.values, command=list(command),
                                  visible_devices=visible_devices,
                                  resource=self.target.resource if gpus else GPU_RESOURCE)
        self.api.core.create_namespaced_pod(self.ns, self._labelled(pod, kind),
                                            _request_timeout=REQUEST_TIMEOUT)

    def gpu_count(self) -> SmokeRun:
        n = self.target.allocatable
        if self.target.allocated:
            return SmokeRun("gpu-count", n, skipped=(
                f"{self.target.allocated} of {n} {_noun(self.target.resource)} are in use by "
                "pods: a pod asking for all of them would wait; run verify on an idle node"),
                resource=self.target.resource)
        return self._one_pod("gpu-count", f"{self.prefix}-all", n, manifests.SMOKE_COMMAND)

    def _one_pod(self, kind: str, name: str, gpus: int, command: Sequence[str],
                 visible_devices: str | None = None) -> SmokeRun:
        """One pod of this kind, run to its end (or the timeout)."""
        self._create_pod(name, kind, gpus, command, visible_devices)
        pods = self._wait(kind, 1, lambda ps: all(
            _pod_state(p)[0] in ("Succeeded", "Failed") for p in ps))
        timed_out = not pods or _pod_state(pods[0])[0] not in ("Succeeded", "Failed")
        return SmokeRun(kind, gpus, self._records(pods, timed_out),
                        resource=self.target.resource if gpus else GPU_RESOURCE)

    def _all_printed(self, pods: list[dict], printed: dict[str, str]) -> bool:
        """Whether each pod's log shows its GPUs yet (kept in `printed`, name -> log): a pod's
        log is read until it does, one request per pod still silent."""
        for pod in pods:
            name = pod["metadata"]["name"]
            if name not in printed:
                text = self.api.log(self.ns, name)
                if not gpu_uuids(text):
                    return False
                printed[name] = text
        return True

    def isolation(self) -> SmokeRun:
        free = self.target.allocatable - self.target.allocated
        count = min(free, MAX_ISOLATION_PODS)
        resource = self.target.resource
        if self.target.allocatable < 2:
            return SmokeRun("isolation", 1, skipped=f"fewer than 2 {_noun(resource)}: nothing to "
                            "isolate", resource=resource)
        if count < 2:
            return SmokeRun("isolation", 1, resource=resource,
                            skipped=f"only {free} free {_noun(resource, 'GPU(s)')}: need 2")
        # Created at once, not one request after the other: they are to run together anyway.
        with concurrent.futures.ThreadPoolExecutor(max_workers=count,
                                                   thread_name_prefix="smoke-create") as pool:
            list(pool.map(lambda i: self._create_pod(f"{self.prefix}-iso-{i}", "isolation", 1,
                                                     HOLD_COMMAND), range(count)))
        deadline = time.monotonic() + self.timeout

        def all_running(pods: list[dict]) -> bool:
            return all(_pod_state(p)[0] == "Running" for p in pods)

        printed: dict[str, str] = {}

        def all_printed(pods: list[dict]) -> bool:
            return self._all_printed(pods, printed)

        pods = self._wait("isolation", count, all_running)
        # Running together; what each printed is in its log, which no watch reports.
        while len(pods) >= count and all_running(pods) and not all_printed(pods) \
                and time.monotonic() < deadline:
            self.api.sleep(POLL_S)
            pods = self.api.pods(self.ns, self._selector("isolation"))
        timed_out = not (len(pods) >= count and all_running(pods) and all_printed(pods))
        records = self._records(pods, timed_out, printed)
        # They held their GPUs only to be seen together: release them for the next workload.
        self.api.core.delete_collection_namespaced_pod(
            self.ns, label_selector=self._selector("isolation"), grace_period_seconds=0,
            _request_timeout=REQUEST_TIMEOUT)
        self._wait("isolation", 0, lambda ps: not ps)
        return SmokeRun("isolation", 1, records, resource=resource)

    def batch_job(self) -> SmokeRun:
        if self.target.allocatable - self.target.allocated < 1:
            return SmokeRun("batch-job", 1, resource=self.target.resource,
                            skipped=f"no free {_noun(self.target.resource, 'GPU')} for the Job")
        name = f"{self.prefix}-job"
        job = manifests.smoke_job(name, self.ns, gpus=1, node=self.target.node,
                                  values=self.values,
                                  deadline_seconds=max(int(self.timeout), 1),
                                  resource=self.target.resource)
        self.api.batch.create_namespaced_job(self.ns, self._labelled(job, "batch-job"),
                                             _request_timeout=REQUEST_TIMEOUT)

        def finished(jobs: list[dict]) -> bool | None:
            conditions = ((jobs[0].get("status") or {}).get("conditions") or []) if jobs else []
            states = {c.get("type"): c.get("status") for c in conditions}
            if states.get("Complete") == "True":
                return True
            if states.get("Failed") == "True":
                return False
            return None

        jobs = self.api.wait_until(lambda js: finished(js) is not None, self.timeout,
                                   self.api.batch.list_namespaced_job, self.ns,
                                   field_selector=f"metadata.name={name}")
        completed = finished(jobs)
        pods = self.api.pods(self.ns, f"job-name={name}")
        return SmokeRun("batch-job", 1, self._records(pods, completed is None),
                        completed=completed, resource=self.target.resource)

    def no_request(self) -> SmokeRun:
        return self._one_pod("no-request", f"{self.prefix}-no-request", 0, NO_REQUEST_COMMAND,
                             visible_devices="all")

    def steps(self) -> tuple[tuple[str, Callable[[], Any], type], ...]:
        """The smoke runs in order: (kind, run, the record type an API refusal becomes)."""
        return (("gpu-count", self.gpu_count, SmokeRun), ("isolation", self.isolation, SmokeRun),
                ("batch-job", self.batch_job, SmokeRun), ("no-request", self.no_request, SmokeRun))

    def run(self, kinds: Sequence[str]) -> dict[str, Any]:
        runs: dict[str, Any] = {}
        for kind, step, record in self.steps():
            if kind not in kinds:
                continue
            try:
                runs[kind] = step()
            except Interrupted:
                raise
            except Exception as exc:  # the API refused: reported on this node's line
                log.debug("smoke %s on %s", kind, self.target.node, exc_info=True)
                runs[kind] = record(kind, 0, error=_api_error(exc))
        return runs


DRA_KINDS = ("claim-count", "claim-isolation", "claim-selector", "claim-unavailable")
# A product no GPU has: its claim must stay Pending (the scheduler's reason).
ABSENT_PRODUCT = "gpuprov-verify no such product"


@dataclasses.dataclass(frozen=True)
class ClaimRecord:
    """One claim pod: what it printed and what its claim was allocated."""

    pod: PodRecord
    claim: str | None = None  # the ResourceClaim's name
    claim_uid: str | None = None
    node: str | None = None  # where the allocation is bound
    uuids: tuple[str, ...] = ()  # the allocated devices' UUIDs, through the node's slice
    unknown: tuple[str, ...] = ()  # allocated devices no slice publishes
    unschedulable: str | None = None  # the scheduler's message, while Pending
    cdi_while_running: bool | None = None  # the claim's CDI spec on the node (None: not read)
    cdi_after: bool | None = None


@dataclasses.dataclass(frozen=True)
class ClaimRun:
    kind: str  # one of DRA_KINDS
    requested: int
    records: tuple[ClaimRecord, ...] = ()
    skipped: str | None = None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class DraTarget:
    node: str
    slices: tuple[Mapping[str, Any], ...]  # the node's ResourceSlices (gpuprov.verify.cluster)
    product: str | None  # NVML's name of the node's GPUs, for the selector claim
    # Reads whether a file exists on the node (the CDI spec); None: verify has no way there.
    file_exists: Callable[[str], bool] | None = None

    def _types(self) -> list[str]:
        return [((d.get("attributes") or {}).get("type") or {}).get("string")
                for s in self.slices for d in (s.get("spec") or {}).get("devices") or []]

    @property
    def device_type(self) -> str:
        """What the claims ask for: whole GPUs where the node publishes any, else MIG devices
        (a node whose GPUs are all partitioned publishes only those)."""
        types = self._types()
        return "gpu" if "gpu" in types or "mig" not in types else "mig"

    @property
    def device_class(self) -> str:
        from gpuprov.verify import claims

        return claims.DEVICE_CLASSES[self.device_type]

    @property
    def gpus(self) -> int:
        """How many devices of device_type the node publishes."""
        return self._types().count(self.device_type)


class DraNodeRunner(NodeRunner):
    """The claim smoke of one DRA node (gpuprov.verify.claims builds and judges the objects):
    each pod holds its claim until it has printed its GPUs and the claim has been read."""

    def __init__(self, api: _Api, namespace: str, target: DraTarget, timeout: float,
                 values: Mapping[str, Any]) -> None:
        super().__init__(api, namespace, Target(target.node, 0, 0), timeout, values)
        from kubernetes import client

        self.dra = target
        self.resource = client.ResourceV1Api(api.core.api_client)

    def _claim_pods(self, kind: str, count: int, gpus: int, selector: str | None = None,
                    pods: int = 1) -> list[str]:
        from gpuprov.verify import claims

        template = f"{self.prefix}-{kind}"
        self.resource.create_namespaced_resource_claim_template(
            self.ns, claims.claim_template(template, gpus, selector,
                                           device_class=self.dra.device_class),
            _request_timeout=REQUEST_TIMEOUT)
        names = [f"{self.prefix}-{kind}-{i}" for i in range(pods)]
        for name in names:
            pod = manifests.smoke_pod(name, self.ns, gpus=0, node=self.target.node,
                                      values=self.values, command=list(HOLD_COMMAND),
                                      visible_devices="void")
            self.api.core.create_namespaced_pod(
                self.ns, self._labelled(claims.with_claim(pod, template), kind),
                _request_timeout=REQUEST_TIMEOUT)
        return names

    def _claim(self, pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        from gpuprov.verify import claims

        name = claims.pod_claim_name(pod)
        if name is None:
            return None
        try:
            response = self.resource.read_namespaced_resource_claim(
                name, self.ns, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        except ApiException:
            return None
        return json.loads(response.data)

    def _held(self, kind: str, count: int) -> ClaimRun:
        """Pods of `kind` held Running until each printed its GPUs; their claims read then,
        the CDI spec looked for, the pods deleted, the spec looked for again."""
        from gpuprov.verify import claims

        printed: dict[str, str] = {}

        def ready(pods: list[dict]) -> bool:
            """Each pod Running and its GPUs printed, or ended (it failed: no use waiting)."""
            if any(_pod_state(p)[0] in ("Succeeded", "Failed") for p in pods):
                return True
            if not all(_pod_state(p)[0] == "Running" for p in pods):
                return False
            return self._all_printed(pods, printed)

        pods = self._wait(kind, count, ready)
        deadline = time.monotonic() + self.timeout
        while not (len(pods) >= count and ready(pods)) and time.monotonic() < deadline:
            self.api.sleep(POLL_S)
            pods = self.api.pods(self.ns, self._selector(kind))
        timed_out = not (len(pods) >= count and ready(pods))
        records = []
        by_name = {r.name: r for r in self._records(pods, timed_out, printed)}
        for pod in pods:
            claim = self._claim(pod) or {}
            uuids, unknown = claims.device_uuids(claim, self.dra.slices)
            uid = (claim.get("metadata") or {}).get("uid")
            path = claims.cdi_spec_path(uid) if uid else None
            records.append(dict(
                pod=by_name[pod["metadata"]["name"]], claim=(claim.get("metadata") or {}).get(
                    "name"), claim_uid=uid, node=claims.allocated_node(claim),
                uuids=tuple(uuids), unknown=tuple(unknown),
                unschedulable=claims.unschedulable(pod),
                cdi_while_running=(self.dra.file_exists(path) if path and
                                   self.dra.file_exists else None)))
        self.api.core.delete_collection_namespaced_pod(
            self.ns, label_selector=self._selector(kind), grace_period_seconds=0,
            _request_timeout=REQUEST_TIMEOUT)
        self._wait(kind, 0, lambda ps: not ps)
        for record in records:
            uid = record["claim_uid"]
            if uid and self.dra.file_exists:
                record["cdi_after"] = self._cdi_spec_stays(claims.cdi_spec_path(uid))
        return ClaimRun(kind, 0, tuple(ClaimRecord(**r) for r in records))

    def _cdi_spec_stays(self, path: str) -> bool:
        """Whether the claim's CDI spec is still on the node claims.CDI_GONE_S after its pod
        is gone. The pods are deleted at once (grace 0): their objects go before the kubelet
        has unprepared their claims, which it does when it sees the pods ended, so the spec
        is waited for, not looked for once."""
        from gpuprov.verify import claims

        exists = self.dra.file_exists
        assert exists is not None
        return stays(lambda: exists(path), claims.CDI_GONE_S, CDI_POLL_S, self.api.sleep)

    def claim_count(self) -> ClaimRun:
        k = self.dra.gpus
        if k < 1:
            return ClaimRun("claim-count", 0, skipped="the node's slice publishes no GPU or MIG "
                            "device")
        self._claim_pods("claim-count", 1, k)
        return dataclasses.replace(self._held("claim-count", 1), requested=k)

    def claim_isolation(self) -> ClaimRun:
        count = min(self.dra.gpus, MAX_ISOLATION_PODS)
        if count < 2:
            return ClaimRun("claim-isolation", 1, skipped="fewer than 2 GPUs: nothing to "
                            "isolate")
        self._claim_pods("claim-isolation", count, 1, pods=count)
        return dataclasses.replace(self._held("claim-isolation", count), requested=1)

    def claim_selector(self) -> ClaimRun:
        from gpuprov.verify import claims

        if not self.dra.product:
            return ClaimRun("claim-selector", 1, skipped="NVML names no product on the node")
        self._claim_pods("claim-selector", 1, 1, claims.product_selector(self.dra.product))
        return dataclasses.replace(self._held("claim-selector", 1), requested=1)

    def claim_unavailable(self) -> ClaimRun:
        """A claim for a product no node has: Pending with the scheduler's reason, which is
        awaited (not a timeout's guess)."""
        from gpuprov.verify import claims

        kind = "claim-unavailable"
        self._claim_pods(kind, 1, 1, claims.product_selector(ABSENT_PRODUCT))
        pods = self._wait(kind, 1, lambda ps: claims.unschedulable(ps[0]) is not None
                          or _pod_state(ps[0])[0] != "Pending")
        records = tuple(ClaimRecord(pod=r, unschedulable=claims.unschedulable(p))
                        for r, p in zip(self._records(pods, False),
                                        sorted(pods, key=lambda p: p["metadata"]["name"]),
                                        strict=True))
        self.api.core.delete_collection_namespaced_pod(
            self.ns, label_selector=self._selector(kind), grace_period_seconds=0,
            _request_timeout=REQUEST_TIMEOUT)
        self._wait(kind, 0, lambda ps: not ps)
        return ClaimRun(kind, 1, records)

    def steps(self) -> tuple[tuple[str, Callable[[], Any], type], ...]:
        return (("claim-count", self.claim_count, ClaimRun),
                ("claim-isolation", self.claim_isolation, ClaimRun),
                ("claim-selector", self.claim_selector, ClaimRun),
                ("claim-unavailable", self.claim_unavailable, ClaimRun),
                ("no-request", self.no_request, SmokeRun))


def stays(there: Callable[[], bool], timeout: float, interval: float,
          sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether `there()` still holds after `timeout` seconds: asked at once, then every
    `interval` until it no longer holds or the time is up (asked once more at the end)."""
    deadline = time.monotonic() + timeout
    while there():
        if time.monotonic() >= deadline:
            return True
        sleep(min(interval, max(0.0, deadline - time.monotonic())))
    return False


def _api_error(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    body = getattr(exc, "body", None)
    if status is not None:
        try:
            text = json.loads(body).get("message") if body else None
        except (ValueError, AttributeError):
            text = None
        return f"API {status} {getattr(exc, 'reason', '')}: {text or ''}".strip(": ")
    return f"{type(exc).__name__}: {exc}"


def _dns_label(name: str) -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return label[:40] or "node"


@contextlib.contextmanager
def smoke_namespace(api_client: Any) -> Iterator[str]:
    """A fresh namespace, deleted on the way out whatever happened, and waited for."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api_client)
    name = NAMESPACE_PREFIX + secrets.token_hex(4)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": name, "labels": dict(MANAGED_LABEL)}},
                          _request_timeout=REQUEST_TIMEOUT)
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name, propagation_policy="Foreground",
                                  grace_period_seconds=0, _request_timeout=REQUEST_TIMEOUT)
            # Its own stop flag: the workers' one is set by now, and Ctrl-C here comes as
            # KeyboardInterrupt in this thread anyway.
            left = _Api(api_client, threading.Event()).wait_until(
                lambda namespaces: not namespaces, NAMESPACE_GONE_S, core.list_namespace,
                field_selector=f"metadata.name={name}")
            if left:
                log.warning("namespace %s is still terminating; it goes away by itself", name)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("could not delete namespace %s: %s", name, _api_error(exc))
        except KeyboardInterrupt:
            # A second Ctrl-C while cleaning up: the delete was sent, say so and stop.
            log.warning("namespace %s was asked to go away; not waiting", name)
            raise


def run(api_client: Any, targets: Sequence[Target | DraTarget], kinds: Sequence[str],
        timeout: float, concurrency: int, image: str | None = None) -> dict[str, dict[str, Any]]:
    """node -> kind -> SmokeRun, for every target; the namespace is gone on return."""
    if not targets or not kinds:
        return {}
    values = dict(manifests.load_values())
    if image:
        values["nvidia_device_plugin_smoke_image"] = image
    stop = threading.Event()
    api = _Api(api_client, stop)
    results: dict[str, dict[str, Any]] = {}
    with smoke_namespace(api_client) as namespace:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency),
                                                     thread_name_prefix="smoke")
        try:
            futures = {pool.submit((DraNodeRunner if isinstance(t, DraTarget) else NodeRunner)(
                api, namespace, t, timeout, values).run, kinds): t.node  # type: ignore[arg-type]
                for t in targets}
            for future in concurrent.futures.as_completed(futures):
                results[futures[future]] = future.result()
        finally:
            # Ctrl-C lands here first: the workers stop waiting, then the namespace goes.
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
    return results
