"""The resourceclaim controller of kube-controller-manager (kubernetes
pkg/controller/resourceclaim/controller.go, 1.34), for what the emulated workloads use:

- a pod's `spec.resourceClaims[]` entry with `resourceClaimTemplateName` gets a ResourceClaim
  made from the template (handlePod): generateName `<pod>-<entry>-`, the template's labels
  and annotations plus `resource.kubernetes.io/pod-claim-name: <entry>`, the pod as
  controlling owner; the claim's name goes to `pod.status.resourceClaimStatuses` (one claim
  per entry: an existing claim owned by the pod with that annotation is found again, as the
  real controller's findPodResourceClaim does, not made twice);
- a claim's `status.reservedFor` loses the pods that are gone or have ended (syncClaim); a
  claim reserved for nobody is deallocated (its allocation cleared), and a template claim
  whose pod has ended is deleted. A pod that is gone takes its template claims with it
  through the garbage collector (the owner reference).

Not emulated: the `resource.kubernetes.io/delete-protection` finalizer (a claim is deleted
at once), the extended-resource claims of KEP-5004, and the controller's metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuprov.lab.kube.controllers import guarded
from gpuprov.lab.kube.objects import owner_ref
from gpuprov.lab.kube.registry import PODS, R, is_terminal

if TYPE_CHECKING:
    from gpuprov.lab.kube.cluster import Cluster

CLAIMS = R["ResourceClaim"]
TEMPLATES = R["ResourceClaimTemplate"]
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"


def sync_claims(cluster: Cluster) -> None:
    pods = cluster.registry.list(PODS)[0]
    claims = cluster.registry.list(CLAIMS)[0]
    for pod in pods:
        if pod["spec"].get("resourceClaims") and not is_terminal(pod) \
                and not pod["metadata"].get("deletionTimestamp"):
            guarded(_handle_pod, cluster, pod, claims)
    active = {p["metadata"]["uid"] for p in pods if not is_terminal(p)
              and not p["metadata"].get("deletionTimestamp")}
    ended = {p["metadata"]["uid"] for p in pods if is_terminal(p)}
    for claim in claims:
        guarded(_sync_claim, cluster, claim, active, ended)


def claim_names(pod: dict) -> dict[str, str | None]:
    """Each of the pod's claim entries -> the ResourceClaim it names (None: a template
    claim not created yet), as resourceclaim.Name does for the kubelet and the scheduler."""
    recorded = {s.get("name"): s.get("resourceClaimName")
                for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    return {entry["name"]: entry.get("resourceClaimName") or recorded.get(entry["name"])
            for entry in pod["spec"].get("resourceClaims") or []}


def _handle_pod(cluster: Cluster, pod: dict, claims: list[dict]) -> None:
    meta = pod["metadata"]
    ns = meta["namespace"]
    statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
    known = {s.get("name") for s in statuses}
    added = False
    for entry in pod["spec"]["resourceClaims"]:
        template_name = entry.get("resourceClaimTemplateName")
        if not template_name or entry["name"] in known:
            continue
        existing = next((c for c in claims if c["metadata"].get("namespace") == ns
                         and any(r.get("uid") == meta["uid"] and r.get("controller")
                                 for r in c["metadata"].get("ownerReferences") or [])
                         and (c["metadata"].get("annotations") or {}).get(POD_CLAIM_NAME)
                         == entry["name"]), None)
        if existing is None:
            template = cluster.registry.find(TEMPLATES, ns, template_name)
            if template is None:
                # The real controller retries (and the pod stays Pending) until it exists.
                continue
            inner = template["spec"]
            tmeta = inner.get("metadata") or {}
            existing = cluster.registry.create(CLAIMS, ns, {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {
                    # controller.go: generateName is the pod's and the entry's names,
                    # shortened to leave room for the random suffix.
                    "generateName": f"{meta['name'][:28]}-{entry['name'][:28]}-",
                    "labels": dict(tmeta.get("labels") or {}),
                    "annotations": {**(tmeta.get("annotations") or {}),
                                    POD_CLAIM_NAME: entry["name"]},
                    "ownerReferences": [owner_ref(pod)]},
                "spec": inner["spec"]})
        statuses.append({"name": entry["name"],
                         "resourceClaimName": existing["metadata"]["name"]})
        added = True
    if added:
        cluster.mutate_status(pod, lambda s: s.update(resourceClaimStatuses=statuses))


def _sync_claim(cluster: Cluster, claim: dict, active: set[str], ended: set[str]) -> None:
    status = claim.get("status") or {}
    reserved = status.get("reservedFor") or []
    valid = [r for r in reserved if r.get("resource") != "pods" or r.get("uid") in active]
    owner = next((r for r in claim["metadata"].get("ownerReferences") or []
                  if r.get("kind") == "Pod" and r.get("controller")), None)
    if not valid and owner is not None and owner.get("uid") in ended:
        # A template claim whose pod is done is deleted (controller.go syncClaim).
        meta = claim["metadata"]
        cluster.registry.delete(CLAIMS, meta["namespace"], meta["name"])
        return
    if valid == reserved and (valid or not status.get("allocation")):
        return

    def release(s: dict) -> None:
        s["reservedFor"] = valid
        if not valid:
            s.pop("reservedFor", None)
            s.pop("allocation", None)  # nobody uses it any more: deallocate

    cluster.mutate_status(claim, release, CLAIMS)
