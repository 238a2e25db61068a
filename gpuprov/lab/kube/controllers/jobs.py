"""The Job controller (kubernetes pkg/controller/job): runs pods from the template until
`completions` succeeded, `parallelism` at a time; counts failures (and container restarts)
against backoffLimit; sets the SuccessCriteriaMet/Complete or FailureTarget/Failed conditions
with their events; deletes a finished Job after ttlSecondsAfterFinished (the TTL-after-finished
controller). A suspended Job creates no pods.
"""

from __future__ import annotations

import copy
import datetime
from typing import TYPE_CHECKING

from gpuprov.lab.kube.controllers import guarded
from gpuprov.lab.kube.objects import condition, owned_by, owner_ref, set_condition
from gpuprov.lab.kube.registry import PODS, R, is_terminal, pod_ready
from gpuprov.lab.kube.store import now

if TYPE_CHECKING:
    from gpuprov.lab.kube.cluster import Cluster


def sync_jobs(cluster: Cluster) -> None:
    for job in cluster.registry.list(R["Job"])[0]:
        if not job["metadata"].get("deletionTimestamp"):
            guarded(_sync_job, cluster, job)


def _sync_job(cluster: Cluster, job: dict) -> None:
    meta, spec = job["metadata"], job["spec"]
    ns = meta["namespace"]
    status = copy.deepcopy(job.get("status") or {})
    conds = status.get("conditions") or []
    finished = any(c["type"] in ("Complete", "Failed") and c["status"] == "True"
                   for c in conds)
    pods = [p for p in cluster.registry.list(PODS, ns)[0] if owned_by(p, meta["uid"])]
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
            cluster.registry.delete(R["Job"], ns, meta["name"],
                                    {"propagationPolicy": "Background"})
        return
    status.setdefault("startTime", now())
    if failed > spec.get("backoffLimit", 6):
        for p in active:
            cluster.registry.delete(PODS, ns, p["metadata"]["name"])
        message = "Job has reached the specified backoff limit"
        conds = set_condition(conds, condition("FailureTarget", True, "BackoffLimitExceeded",
                                               message))
        conds = set_condition(conds, condition("Failed", True, "BackoffLimitExceeded",
                                               message))
        active = []
        cluster.event(job, "BackoffLimitExceeded", message, "Warning", "job-controller")
    elif succeeded >= spec.get("completions", 1):
        conds = set_condition(conds, condition("SuccessCriteriaMet", True,
                                               "CompletionsReached", "Reached expected "
                                               "number of succeeded pods"))
        conds = set_condition(conds, condition("Complete", True, "CompletionsReached",
                                               "Reached expected number of succeeded pods"))
        status["completionTime"] = now()
        cluster.event(job, "Completed", "Job completed", "Normal", "job-controller")
    elif not spec.get("suspend"):
        missing = min(spec.get("parallelism", 1),
                      spec.get("completions", 1) - succeeded) - len(active)
        for _ in range(max(0, missing)):
            template = copy.deepcopy(spec["template"])
            tmeta = template.get("metadata") or {}
            created = cluster.registry.create(PODS, ns, {
                "metadata": {"generateName": meta["name"] + "-",
                             "labels": tmeta.get("labels") or {},
                             "annotations": tmeta.get("annotations") or {},
                             "ownerReferences": [owner_ref(job)]},
                "spec": template["spec"]})
            active.append(created)
            cluster.event(job, "SuccessfulCreate",
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
        cluster.registry.replace(R["Job"], ns, meta["name"], {**job, "status": status},
                                 "status")


def _age(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    then = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc)
    return (datetime.datetime.now(datetime.timezone.utc) - then).total_seconds()
