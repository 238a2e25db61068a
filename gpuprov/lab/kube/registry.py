"""API semantics on top of the store: what a real API server does between the HTTP request and
etcd. Defaulting, validation (validation.py: the official schemas plus the semantic rules the
emulated workloads rely on), namespaces, preconditions, subresources, graceful deletion,
propagation, eviction. The HTTP layer and the simulated controllers both go through here, so a
controller cannot write an object a client could not.
"""

from __future__ import annotations

import copy
import datetime
import random
import uuid
from collections.abc import Callable
from typing import Any

from gpuprov.lab.kube import patch as patching
from gpuprov.lab.kube import resources, schema, selectors, validation
from gpuprov.lab.kube.errors import ApiError
from gpuprov.lab.kube.objects import condition_true
from gpuprov.lab.kube.resources import ResourceType
from gpuprov.lab.kube.store import Store, now

R = {r.kind: r for r in resources.RESOURCES}
NAMESPACES, PODS, NODES = R["Namespace"], R["Pod"], R["Node"]

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
BUILTIN_PRIORITY_CLASSES = {"system-node-critical": 2000001000,
                            "system-cluster-critical": 2000000000}
GPU = "nvidia.com/gpu"

_NAME_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet of Kubernetes' generateName
# Kinds whose spec changes bump metadata.generation.
_GENERATION_KINDS = {"DaemonSet", "Job", "PodDisruptionBudget"}
# Kinds whose status is reset on create (Node keeps it: a kubelet registers with status).
_RESET_STATUS = {"Pod", "DaemonSet", "Job", "PodDisruptionBudget", "Namespace"}
_TERMINAL = ("Succeeded", "Failed")


def random_suffix(n: int = 5) -> str:
    return "".join(random.choice(_NAME_SUFFIX) for _ in range(n))


def qualified(rt: ResourceType) -> str:
    return f"{rt.plural}.{rt.group}" if rt.group else rt.plural


def is_terminal(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in _TERMINAL


def later(seconds: float) -> str:
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


# The extended resources the emulated NVIDIA device plugin serves: nvidia.com/gpu and, with a
# MIG strategy, nvidia.com/mig-<profile> (deviceplugin.advertised).
DEVICE_RESOURCE_PREFIX = "nvidia.com/"


def is_device_resource(name: str) -> bool:
    return name.startswith(DEVICE_RESOURCE_PREFIX)


def container_device_requests(container: dict) -> dict[str, int]:
    """The container's device-plugin resources and counts (their limits: validation makes
    requests equal them), zero counts left out."""
    limits = (container.get("resources") or {}).get("limits") or {}
    return {name: int(str(value)) for name, value in sorted(limits.items())
            if is_device_resource(name) and int(str(value)) > 0}


def device_requests(pod_spec: dict) -> dict[str, int]:
    """The pod's device-plugin resources, summed over its containers (the scheduler's view;
    init containers are not run by the emulator)."""
    total: dict[str, int] = {}
    for c in pod_spec.get("containers") or []:
        for name, count in container_device_requests(c).items():
            total[name] = total.get(name, 0) + count
    return total


def gpu_request(pod_spec: dict) -> int:
    return device_requests(pod_spec).get(GPU, 0)


class Registry:
    def __init__(self, store: Store) -> None:
        self.store = store
        # Hook the controllers set to veto or react; kept as plain callables so this module
        # does not import the controllers.
        self.on_pod_deleted: Callable[[dict], None] | None = None

    # -- reads -------------------------------------------------------------------------------
    def get(self, rt: ResourceType, namespace: str, name: str) -> dict:
        obj = self.store.get(rt, namespace if rt.namespaced else "", name)
        if obj is None:
            raise ApiError.not_found(rt.group, rt.plural, name)
        return obj

    def find(self, rt: ResourceType, namespace: str, name: str) -> dict | None:
        return self.store.get(rt, namespace if rt.namespaced else "", name)

    def list(self, rt: ResourceType, namespace: str | None = None,
             label_selector: str | None = None,
             field_selector: str | None = None) -> tuple[list[dict], int]:
        accept = None
        if label_selector or field_selector:
            accept = selectors.object_filter(label_selector, field_selector,
                                             rt.selectable_fields)
        return self.store.list(rt, namespace if rt.namespaced else None, accept)

    # -- create ------------------------------------------------------------------------------
    def create(self, rt: ResourceType, namespace: str, body: Any, dry_run: bool = False,
               uid: str | None = None) -> dict:
        obj = self._decode(rt, namespace, body)
        meta = obj["metadata"]
        for managed in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                        "deletionGracePeriodSeconds", "generation", "managedFields",
                        "selfLink"):
            meta.pop(managed, None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError.invalid(rt.group, rt.kind, "", [(
                    "FieldValueRequired", "metadata.name",
                    "Required value: name or generateName is required")])
            meta["name"] = meta["generateName"] + random_suffix()
        meta["uid"] = uid or str(uuid.uuid4())
        if rt.kind in _GENERATION_KINDS:
            meta["generation"] = 1
        if rt.kind in _RESET_STATUS:
            obj.pop("status", None)
        self._check_namespace(rt, obj)
        self._default(rt, obj)
        self._admit(rt, obj, None)
        validation.validate(rt, obj, self)
        if dry_run:
            if self.find(rt, meta.get("namespace", ""), meta["name"]) is not None:
                raise ApiError.already_exists(rt.group, rt.plural, meta["name"])
            return {**obj, "metadata": {**meta, "creationTimestamp": now()}}
        created = self.store.create(rt, obj)
        if rt is NAMESPACES:
            self._seed_namespace(meta["name"])
        return created

    def _seed_namespace(self, name: str) -> None:
        # The service account controller's job: every namespace has `default`.
        sa = R["ServiceAccount"]
        if self.find(sa, name, "default") is None:
            self.create(sa, name, {"metadata": {"name": "default"}})

    # -- update ------------------------------------------------------------------------------
    def replace(self, rt: ResourceType, namespace: str, name: str, body: Any,
                subresource: str = "", dry_run: bool = False) -> dict:
        new = self._decode(rt, namespace, body)
        if new["metadata"].get("name", name) != name:
            raise ApiError.bad_request(
                f"the name of the object ({new['metadata']['name']}) does not match the name "
                f"on the URL ({name})")
        new["metadata"]["name"] = name
        return self._update(rt, new, subresource, dry_run)

    def patch(self, rt: ResourceType, namespace: str, name: str, content_type: str,
              body: Any, subresource: str = "", dry_run: bool = False) -> dict:
        current = self.find(rt, namespace, name)
        if current is None:
            if content_type.startswith("application/apply-patch"):
                body = dict(body or {})
                body.setdefault("metadata", {})["name"] = name
                return self.create(rt, namespace, body, dry_run)
            raise ApiError.not_found(rt.group, rt.plural, name)
        patched = patching.apply_patch(content_type, copy.deepcopy(current), body)
        patched.setdefault("metadata", {})
        if patched["metadata"].get("name") != name:
            raise ApiError.bad_request("a patch may not change metadata.name")
        return self._update(rt, patched, subresource, dry_run)

    def _update(self, rt: ResourceType, new: dict, subresource: str, dry_run: bool) -> dict:
        meta = new["metadata"]
        old = self.get(rt, meta.get("namespace", ""), meta["name"])
        expect_rv = meta.get("resourceVersion") or None
        if expect_rv and expect_rv != old["metadata"]["resourceVersion"]:
            raise ApiError.conflict(rt.group, rt.plural, meta["name"])
        if subresource == "status":
            # Only status changes through /status.
            new = {**copy.deepcopy(old), "status": new.get("status", {})}
        elif rt.subresource("status") is not None and "status" in old:
            new["status"] = copy.deepcopy(old["status"])
        new["metadata"].pop("managedFields", None)
        for fixed in ("uid", "creationTimestamp", "generation", "deletionTimestamp",
                      "deletionGracePeriodSeconds"):
            if fixed in old["metadata"]:
                new["metadata"][fixed] = old["metadata"][fixed]
        self._default(rt, new)
        self._admit(rt, new, old)
        validation.validate(rt, new, self)
        if dry_run:
            return new
        if (old["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers")
                and rt is not PODS and rt is not NAMESPACES):
            return self.store.remove(rt, meta.get("namespace", ""), meta["name"])
        return self.store.update(rt, new, expect_rv)

    # -- delete ------------------------------------------------------------------------------
    def delete(self, rt: ResourceType, namespace: str, name: str,
               options: dict | None = None, dry_run: bool = False) -> dict:
        options = options or {}
        obj = self.get(rt, namespace, name)
        _check_preconditions(rt, obj, options.get("preconditions") or {})
        if rt is NAMESPACES and name in SYSTEM_NAMESPACES[:3]:
            raise ApiError.forbidden("", "namespaces", name, "this namespace may not be deleted")
        if dry_run:
            return obj
        policy = _propagation_policy(rt, options)
        if policy == "Orphan":
            self._orphan_dependents(obj)
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return obj
        if rt is NAMESPACES:
            # The namespace controller empties it, then removes it.
            return self.store.update(rt, {
                **obj, "metadata": {**meta, "deletionTimestamp": now()},
                "status": {**obj.get("status", {}), "phase": "Terminating"}})
        finalizers = list(meta.get("finalizers") or [])
        if policy == "Foreground":
            finalizers.append("foregroundDeletion")
        if rt is PODS:
            return self._delete_pod(obj, options, finalizers)
        if finalizers:
            return self.store.update(rt, {**obj, "metadata": {
                **meta, "deletionTimestamp": now(), "deletionGracePeriodSeconds": 0,
                "finalizers": finalizers}})
        return self.store.remove(rt, namespace if rt.namespaced else "", name)

    def _delete_pod(self, pod: dict, options: dict, finalizers: list[str]) -> dict:
        meta = pod["metadata"]
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        running = pod["spec"].get("nodeName") and not is_terminal(pod)
        if (running and int(grace) > 0) or finalizers:
            # The kubelet stops the containers, then removes the pod.
            marked = {**meta, "deletionTimestamp": later(int(grace)),
                      "deletionGracePeriodSeconds": int(grace)}
            if finalizers:
                marked["finalizers"] = finalizers
            return self.store.update(PODS, {**pod, "metadata": marked})
        gone = self.store.remove(PODS, meta["namespace"], meta["name"])
        if self.on_pod_deleted is not None:
            self.on_pod_deleted(gone)
        return gone

    def finish_pod_deletion(self, pod: dict) -> None:
        """The kubelet's last step: the containers are stopped, the pod object goes."""
        meta = pod["metadata"]
        current = self.find(PODS, meta["namespace"], meta["name"])
        if current is None or current["metadata"]["uid"] != meta["uid"]:
            return
        if current["metadata"].get("finalizers"):
            return
        gone = self.store.remove(PODS, meta["namespace"], meta["name"])
        if self.on_pod_deleted is not None:
            self.on_pod_deleted(gone)

    def delete_collection(self, rt: ResourceType, namespace: str | None,
                          label_selector: str | None, field_selector: str | None,
                          options: dict | None, dry_run: bool = False) -> list[dict]:
        items, _ = self.list(rt, namespace, label_selector, field_selector)
        out = []
        for obj in items:
            try:
                out.append(self.delete(rt, obj["metadata"].get("namespace", ""),
                                       obj["metadata"]["name"], options, dry_run))
            except ApiError as err:
                if err.code != 404:
                    raise
        return out

    def _orphan_dependents(self, owner: dict) -> None:
        uid = owner["metadata"]["uid"]
        for rt in resources.RESOURCES:
            if not rt.namespaced:
                continue
            items, _ = self.store.list(rt, owner["metadata"].get("namespace"))
            for obj in items:
                refs = obj["metadata"].get("ownerReferences") or []
                kept = [r for r in refs if r.get("uid") != uid]
                if len(kept) != len(refs):
                    meta = {**obj["metadata"], "ownerReferences": kept}
                    if not kept:
                        del meta["ownerReferences"]
                    self.store.update(rt, {**obj, "metadata": meta})

    # -- pods subresources ---------------------------------------------------------------------
    def evict(self, namespace: str, name: str, body: Any) -> dict:
        body = dict(body or {})
        body.setdefault("apiVersion", "policy/v1")
        body.setdefault("kind", "Eviction")
        causes = schema.validate(body)
        if causes:
            raise ApiError.invalid("policy", "Eviction", name, causes)
        pod = self.get(PODS, namespace, name)
        if not is_terminal(pod) and (pod.get("status") or {}).get("phase") == "Running":
            for pdb in self.list(R["PodDisruptionBudget"], namespace)[0]:
                blocked = self._pdb_blocks(pdb, pod)
                if blocked:
                    raise ApiError(429, "TooManyRequests",
                                   "Cannot evict pod as it would violate the pod's disruption "
                                   "budget.", {"causes": [{"reason": "DisruptionBudget",
                                                           "message": blocked}]})
        self.delete(PODS, namespace, name, body.get("deleteOptions"))
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "code": 201}

    def _pdb_blocks(self, pdb: dict, pod: dict) -> str:
        reqs = selectors.from_label_selector_object(pdb["spec"].get("selector"))
        if reqs is None or not selectors.matches_all(reqs, pod["metadata"].get("labels")):
            return ""
        healthy, expected = self.pdb_counts(pdb)
        desired = self.pdb_desired(pdb, expected)
        if healthy - desired >= 1:
            return ""
        return (f"The disruption budget {pdb['metadata']['name']} needs {desired} healthy pods "
                f"and has {healthy} currently")

    def pdb_counts(self, pdb: dict) -> tuple[int, int]:
        reqs = selectors.from_label_selector_object(pdb["spec"].get("selector")) or []
        pods = [p for p in self.list(PODS, pdb["metadata"]["namespace"])[0]
                if selectors.matches_all(reqs, p["metadata"].get("labels"))
                and not p["metadata"].get("deletionTimestamp")]
        healthy = sum(1 for p in pods if pod_ready(p))
        return healthy, len(pods)

    @staticmethod
    def pdb_desired(pdb: dict, expected: int) -> int:
        spec = pdb["spec"]

        def count(value: Any) -> int:
            text = str(value)
            if text.endswith("%"):
                return -(-expected * int(text[:-1]) // 100)
            return int(text)

        if "minAvailable" in spec:
            return count(spec["minAvailable"])
        if "maxUnavailable" in spec:
            return max(0, expected - count(spec["maxUnavailable"]))
        return expected

    def bind(self, namespace: str, name: str, body: Any) -> dict:
        pod = self.get(PODS, namespace, name)
        target = ((body or {}).get("target") or {}).get("name")
        if not target:
            raise ApiError.invalid("", "Binding", name, [
                ("FieldValueRequired", "target.name", "Required value")])
        if pod["spec"].get("nodeName"):
            raise ApiError(409, "Conflict", f'pod {name} is already assigned to node '
                           f'"{pod["spec"]["nodeName"]}"')
        self.store.update(PODS, {**pod, "spec": {**pod["spec"], "nodeName": target}})
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "code": 201}

    # -- decoding, defaulting, validation --------------------------------------------------------
    def _decode(self, rt: ResourceType, namespace: str, body: Any) -> dict:
        if not isinstance(body, dict):
            raise ApiError.bad_request("the request body must be a JSON object")
        obj = copy.deepcopy(body)
        obj.setdefault("apiVersion", rt.api_version)
        obj.setdefault("kind", rt.kind)
        if obj["apiVersion"] != rt.api_version or obj["kind"] != rt.kind:
            raise ApiError.bad_request(
                f"the API version in the data ({obj['apiVersion']}) and kind ({obj['kind']}) "
                f"do not match the request ({rt.api_version} {rt.kind})")
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise ApiError.bad_request("metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise ApiError.bad_request("the namespace of the provided object does not "
                                           "match the namespace sent on the request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        return obj

    def _check_namespace(self, rt: ResourceType, obj: dict) -> None:
        if not rt.namespaced:
            return
        ns_name = obj["metadata"]["namespace"]
        ns = self.find(NAMESPACES, "", ns_name)
        if ns is None:
            raise ApiError.not_found("", "namespaces", ns_name)
        if ns["metadata"].get("deletionTimestamp"):
            raise ApiError.forbidden(rt.group, rt.plural, obj["metadata"]["name"],
                                     f"unable to create new content in namespace {ns_name} "
                                     "because it is being terminated")

    def _default(self, rt: ResourceType, obj: dict) -> None:
        kind = rt.kind
        meta = obj["metadata"]
        if kind == "Namespace":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            obj.setdefault("status", {}).setdefault("phase", "Active")
        elif kind == "Pod":
            default_pod_spec(obj.setdefault("spec", {}))
            status = obj.setdefault("status", {})
            status.setdefault("phase", "Pending")
            status.setdefault("qosClass", qos_class(obj["spec"]))
        elif kind == "DaemonSet":
            spec = obj.setdefault("spec", {})
            strategy = spec.setdefault("updateStrategy", {"type": "RollingUpdate"})
            if strategy.get("type", "RollingUpdate") == "RollingUpdate":
                strategy.setdefault("type", "RollingUpdate")
                ru = strategy.setdefault("rollingUpdate", {})
                ru.setdefault("maxUnavailable", 1)
                ru.setdefault("maxSurge", 0)
            spec.setdefault("revisionHistoryLimit", 10)
            default_pod_spec(spec.setdefault("template", {}).setdefault("spec", {}))
            obj.setdefault("status", {"currentNumberScheduled": 0, "numberMisscheduled": 0,
                                      "desiredNumberScheduled": 0, "numberReady": 0})
        elif kind == "Job":
            spec = obj.setdefault("spec", {})
            for key, value in (("parallelism", 1), ("completions", 1), ("backoffLimit", 6),
                               ("completionMode", "NonIndexed"), ("suspend", False),
                               ("podReplacementPolicy", "TerminatingOrFailed"),
                               ("manualSelector", False)):
                spec.setdefault(key, value)
            uid = meta["uid"]
            template = spec.setdefault("template", {})
            labels = template.setdefault("metadata", {}).setdefault("labels", {})
            if not spec.get("selector"):
                spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
                labels.update({"batch.kubernetes.io/controller-uid": uid,
                               "batch.kubernetes.io/job-name": meta["name"],
                               "controller-uid": uid, "job-name": meta["name"]})
            default_pod_spec(template.setdefault("spec", {}))
            obj.setdefault("status", {})
        elif kind == "Node":
            obj.setdefault("spec", {})
        elif kind == "PriorityClass":
            obj.setdefault("preemptionPolicy", "PreemptLowerPriority")

    def _admit(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        """Admission plugins a real cluster runs for the objects emulated here."""
        if rt is not PODS or old is not None:
            return
        spec = obj["spec"]
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        sa = spec.get("serviceAccountName", "default")
        if self.find(R["ServiceAccount"], ns, sa) is None:
            raise ApiError.forbidden("", "pods", name, f"error looking up service account "
                                     f'{ns}/{sa}: serviceaccount "{sa}" not found')
        rc_name = spec.get("runtimeClassName")
        if rc_name and self.find(R["RuntimeClass"], "", rc_name) is None:
            raise ApiError.forbidden("", "pods", name,
                                     f'pod rejected: RuntimeClass "{rc_name}" not found')
        pc_name = spec.get("priorityClassName")
        if pc_name:
            pc = self.find(R["PriorityClass"], "", pc_name)
            if pc is None:
                raise ApiError.forbidden("", "pods", name,
                                         f"no PriorityClass with name {pc_name} was found")
            spec["priority"] = pc["value"]
        else:
            spec.setdefault("priority", 0)


def _check_preconditions(rt: ResourceType, obj: dict, pre: dict) -> None:
    """A delete's preconditions: 409 when the object is not the one the client meant."""
    if pre.get("uid") and pre["uid"] != obj["metadata"]["uid"]:
        raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: "
                       f"{pre['uid']}, UID in object meta: {obj['metadata']['uid']}")
    if pre.get("resourceVersion") and pre["resourceVersion"] != \
            obj["metadata"]["resourceVersion"]:
        raise ApiError.conflict(rt.group, rt.plural, obj["metadata"]["name"])


def _propagation_policy(rt: ResourceType, options: dict) -> str:
    """A delete's propagation policy, from the options or the kind's default."""
    policy = options.get("propagationPolicy")
    if policy is None and options.get("orphanDependents") is not None:
        policy = "Orphan" if options["orphanDependents"] else "Background"
    if policy is None:
        # batch/v1 Job still defaults to orphaning its pods when deleted through the API
        # (kubectl passes Background explicitly); clients that forget see stray pods.
        policy = "Orphan" if rt.kind == "Job" else "Background"
    if policy not in ("Orphan", "Background", "Foreground"):
        raise ApiError.bad_request(f"unknown propagationPolicy {policy!r}")
    return policy


def pod_ready(pod: dict) -> bool:
    return condition_true(pod, "Ready")


def default_pod_spec(spec: dict) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("serviceAccountName", spec.get("serviceAccount", "default"))
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    for group in ("initContainers", "containers"):
        for c in spec.get(group) or []:
            if not isinstance(c, dict):
                continue
            image = str(c.get("image", ""))
            tag = image.rsplit("/", 1)[-1]
            latest = "@" not in image and (":" not in tag or tag.endswith(":latest"))
            c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            res = c.setdefault("resources", {})
            if isinstance(res, dict) and res.get("limits"):
                requests = res.setdefault("requests", {})
                for key, value in res["limits"].items():
                    requests.setdefault(key, value)


def qos_class(spec: dict) -> str:
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    res = [(c.get("resources") or {}) for c in containers]
    if all(not r.get("requests") and not r.get("limits") for r in res):
        return "BestEffort"
    guaranteed = all(
        all(str((r.get("limits") or {}).get(k)) == str((r.get("requests") or {}).get(k))
            for k in ("cpu", "memory")) and {"cpu", "memory"} <= set(r.get("limits") or {})
        for r in res)
    return "Guaranteed" if guaranteed else "Burstable"
