"""The smoke workloads of a DRA node, through claims (research/dra.md 5.3): the objects they
create and what is read back of them. Running them is gpuprov.verify.pods' (one namespace of
its own, always removed); this module builds the resource.k8s.io/v1 objects and judges what
the API and the pods say, so that each rule is unit-tested on the objects' shapes.

Shapes: Kubernetes' resource.k8s.io/v1 (ResourceClaimTemplate spec.spec.devices.requests[]
.exactly, a pod's spec.resourceClaims[] and its containers' resources.claims[], a claim's
status.allocation.devices.results[]); NVIDIA's DRA driver's names (DeviceClass gpu.nvidia.com,
attributes under the domain gpu.nvidia.com in CEL, the per-claim CDI spec
/var/run/cdi/k8s.gpu.nvidia.com-claim_<uid>.yaml: cmd/gpu-kubelet-plugin/cdi.go)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuprov import gpu_allocation

GPU_CLASS = "gpu.nvidia.com"  # the DeviceClass of whole GPUs (templates/nvidia-dra-driver.yml.j2)
MIG_CLASS = "mig.nvidia.com"  # and of MIG devices (the chart's deviceclass-mig.yaml)
# A published device's `type` attribute -> the DeviceClass that selects it.
DEVICE_CLASSES = {"gpu": GPU_CLASS, "mig": MIG_CLASS}
DRIVER = gpu_allocation.DRA_DRIVER
REQUEST = "gpus"  # the request's name in every smoke template, and the pod's claim entry's
CDI_DIR = "/var/run/cdi"
# How long a claim's CDI spec may stay on the node after its pod is gone: the kubelet
# unprepares a claim when it has seen the pod end, which is after a force-deleted pod's object
# is gone.
CDI_GONE_S = 30
# The scheduler's message for a pod whose claims fit no node (kube-scheduler's
# dynamicresources plugin; the emulator says the same, contract section "facts").
UNALLOCATABLE = "cannot allocate all claims"


def product_selector(product: str) -> str:
    """CEL that matches one product name. A JSON string is a CEL string literal (double
    quotes, backslash escapes), so a name with quotes stays one literal."""
    return f"device.attributes['{DRIVER}'].productName == {json.dumps(product)}"


def claim_template(name: str, count: int, selector: str | None = None,
                   labels: Mapping[str, str] | None = None,
                   device_class: str = GPU_CLASS) -> dict[str, Any]:
    """A ResourceClaimTemplate for `count` devices of `device_class` (whole GPUs, or MIG
    devices), optionally only those `selector` (CEL) matches."""
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount",
                               "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"spec": {"devices": {"requests": [{"name": REQUEST,
                                                         "exactly": exactly}]}}}}


def with_claim(pod: dict[str, Any], template: str) -> dict[str, Any]:
    """The pod (gpuprov's smoke pod: gpuprov.manifests.smoke_pod, asking for no GPU) holding
    one claim from `template` in its first container."""
    # The claim's devices reach the container as CDI devices through the node's default
    # runtime (runc); NVIDIA's runtime class would let its legacy mode inject GPUs by itself
    # and hide a broken CDI path.
    pod["spec"].pop("runtimeClassName", None)
    pod["spec"]["resourceClaims"] = [{"name": REQUEST, "resourceClaimTemplateName": template}]
    container = pod["spec"]["containers"][0]
    container.setdefault("resources", {})["claims"] = [{"name": REQUEST}]
    return pod


def pod_claim_name(pod: Mapping[str, Any], entry: str = REQUEST) -> str | None:
    """The ResourceClaim the claim controller made for the pod's entry
    (status.resourceClaimStatuses)."""
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("name") == entry:
            return status.get("resourceClaimName")
    return None


def allocated(claim: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(driver, pool, device) of each device allocated to the claim."""
    results = ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {})
               .get("results") or [])
    return [(r.get("driver"), r.get("pool"), r.get("device")) for r in results]


def device_uuids(claim: Mapping[str, Any], slices: Iterable[Mapping[str, Any]]
                 ) -> tuple[list[str], list[str]]:
    """The UUIDs of the claim's devices, through the slices that publish them; and the
    devices no slice publishes (pool/device)."""
    published: dict[tuple[str, str, str], str] = {}
    for item in slices:
        spec = item.get("spec") or {}
        pool = (spec.get("pool") or {}).get("name")
        for device in spec.get("devices") or []:
            uuid = ((device.get("attributes") or {}).get("uuid") or {}).get("string")
            if uuid:
                published[(spec.get("driver"), pool, device.get("name"))] = uuid
    uuids, unknown = [], []
    for key in allocated(claim):
        if key in published:
            uuids.append(published[key])
        else:
            unknown.append(f"{key[1]}/{key[2]}")
    return uuids, unknown


def allocated_node(claim: Mapping[str, Any]) -> str | None:
    """The node a claim's allocation is bound to (status.allocation.nodeSelector's one
    matchFields term on metadata.name, as the scheduler writes it for node-local devices)."""
    selector = ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {}
    for term in selector.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                values = field.get("values") or []
                if len(values) == 1:
                    return values[0]
    return None


def unschedulable(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message for a pod it could not place (PodScheduled False,
    Unschedulable); None while it is placed or not yet tried."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"):
            return condition.get("message") or ""
    return None


def cdi_spec_path(claim_uid: str) -> str:
    """The transient CDI spec NVIDIA's plugin writes for a prepared claim (cdi.go:
    vendor k8s.gpu.nvidia.com, class claim, transient name claim_<uid>)."""
    return f"{CDI_DIR}/k8s.{DRIVER}-claim_{claim_uid}.yaml"


def judge_count(seen: Sequence[str], claimed: Sequence[str], count: int) -> str | None:
    """gpu-count through a claim: the pod sees exactly the claim's `count` devices (None:
    it does), else what differs."""
    if len(claimed) != count:
        return f"the claim got {len(claimed)} device(s) for {count} requested"
    if sorted(seen) != sorted(claimed):
        extra = sorted(set(seen) - set(claimed))
        missing = sorted(set(claimed) - set(seen))
        parts = [f"sees {len(seen)} GPU(s) for {count} claimed"]
        if extra:
            parts.append(f"not claimed: {', '.join(extra)}")
        if missing:
            parts.append(f"claimed but unseen: {', '.join(missing)}")
        return "; ".join(parts)
    return None


def judge_isolation(seen_by_pod: Mapping[str, Sequence[str]]) -> str | None:
    """Concurrent one-GPU claims: each pod sees one GPU, no two the same."""
    wrong = {pod: list(uuids) for pod, uuids in seen_by_pod.items() if len(uuids) != 1}
    if wrong:
        return "; ".join(f"{pod} sees {len(uuids)} GPU(s)" for pod, uuids in wrong.items())
    owners: dict[str, list[str]] = {}
    for pod, uuids in seen_by_pod.items():
        owners.setdefault(uuids[0], []).append(pod)
    shared = {uuid: pods for uuid, pods in owners.items() if len(pods) > 1}
    if shared:
        return "; ".join(f"{uuid} seen by {', '.join(sorted(pods))}"
                         for uuid, pods in shared.items())
    return None


def judge_pending(pod: Mapping[str, Any]) -> str | None:
    """A claim for a product the cluster lacks: the pod must stay Pending with the
    scheduler's reason (None: it does)."""
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if phase != "Pending":
        return f"the pod is {phase}: a claim for a product no node has was allocated"
    message = unschedulable(pod)
    if message is None:
        return "the pod is Pending without the scheduler's Unschedulable condition"
    if UNALLOCATABLE not in message:
        return f"the scheduler's reason is not about claims: {message}"
    return None
