"""Cluster checks of a node in DRA mode (gpu_allocation: dra): NVIDIA's DRA kubelet plugin runs
there and the device plugin does not, its ResourceSlice pool is complete, every device it
publishes is what NVML says of the node, and the container runtime has CDI on.

What the driver publishes, and how, is NVIDIA's (kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1,
research/dra.md section 1.5): cmd/gpu-kubelet-plugin/deviceinfo.go (device names and
attributes), nvlib.go (their NVML sources), partitions.go (memory capacity), mig.go (MIG
devices); site/content/docs/reference/resourceslice-attributes.md shows a published device.
On a device-plugin node these checks are skipped, as the device plugin's are on a DRA node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuprov import gpu_allocation, runtime_mode
from gpuprov.nvidia.hardware import GO_NVLIB_ARCHITECTURES, GO_NVLIB_BRANDS
from gpuprov.verify import claims
from gpuprov.verify.checks import k8s
from gpuprov.verify.checks._util import gpu_label
from gpuprov.verify.facts import ClusterFacts
from gpuprov.verify.findings import Verdict, check, errored, passed, problem, skipped

# NVIDIA's DRA kubelet plugin's pods are recognised by their image, as the device plugin's are
# (checks/k8s.py): registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu, the role's default
# (roles/nvidia_dra_driver/defaults/main.yml) and the upstream chart's.
DRA_PLUGIN_IMAGE = "dra-driver-nvidia-gpu"

PCI_BUS_ID = "resource.kubernetes.io/pciBusID"


def is_dra_plugin(pod: Mapping[str, Any]) -> bool:
    containers = (pod.get("spec") or {}).get("containers") or []
    return any(DRA_PLUGIN_IMAGE in str(c.get("image", "")) for c in containers)


def _device_plugin_node(facts: ClusterFacts) -> Verdict | None:
    if not facts.node.dra:
        return skipped(f"gpu_allocation {facts.node.gpu_allocation}: the device plugin "
                       "allocates this node's GPUs (see k8s.device-plugin)")
    if facts.k8s_node is None:
        return problem(f"no Kubernetes node named {facts.node.node_name} (see k8s.node-ready)")
    return None


@check(
    "dra.plugin",
    phase="cluster",
    severity="error",
    description="on a DRA node, NVIDIA's DRA kubelet plugin pod is Running, no device plugin "
    "pod runs, and the node offers no nvidia.com/gpu",
    remediation="kubectl -n nvidia-dra-driver get pods -o wide; re-run site.yml --limit NODE "
    "(the nvidia_dra_driver role and the node's labels: nvidia.com/gpu.deploy.dra-driver=true, "
    "nvidia.com/gpu.deploy.device-plugin=false); both allocators on one node over-admit GPUs",
)
def plugin(facts: ClusterFacts) -> Verdict:
    if (verdict := _device_plugin_node(facts)) is not None:
        return verdict
    states = {p["metadata"]["namespace"] + "/" + p["metadata"]["name"]:
              (p.get("status") or {}).get("phase") for p in facts.pods if is_dra_plugin(p)}
    device_plugins = sorted(p["metadata"]["namespace"] + "/" + p["metadata"]["name"]
                            for p in facts.pods if k8s.is_device_plugin(p))
    offered = ((facts.k8s_node.get("status") or {}).get("allocatable") or {}).get(
        k8s.GPU_RESOURCE)
    details = {"pods": states, "device_plugin_pods": device_plugins,
               "allocatable": offered}
    found = []
    running = [name for name, phase in states.items() if phase == "Running"]
    if not states:
        found.append("no DRA kubelet plugin pod on the node")
    elif not running:
        found.append("DRA plugin pod not Running: "
                     + ", ".join(f"{n} {s}" for n, s in states.items()))
    if device_plugins:
        found.append(f"a device plugin pod runs here too ({', '.join(device_plugins)})")
    if offered not in (None, "0", 0):
        found.append(f"the node offers {k8s.GPU_RESOURCE} {offered} (the device plugin "
                     "registered it)")
    if found:
        return problem("; ".join(found), **details)
    return passed(f"{running[0]} Running, no device plugin, no {k8s.GPU_RESOURCE}", **details)


def _slices(facts: ClusterFacts) -> tuple[list[Mapping[str, Any]], Verdict | None]:
    """The slices of the node's current pool generation, or the verdict on why there are none
    to compare."""
    if isinstance(facts.slices, str):
        return [], problem(facts.slices)
    if not facts.slices:
        return [], problem(f"no ResourceSlice of {gpu_allocation.DRA_DRIVER} for the node: the "
                           "DRA plugin has not published it (kubectl logs its pod)")
    newest = max(int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0)
                 for s in facts.slices)
    return [s for s in facts.slices
            if int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0)
            == newest], None


@check(
    "dra.slice",
    phase="cluster",
    severity="error",
    description="on a DRA node, its ResourceSlice pool is complete: resourceSliceCount slices "
    "of one generation, pool named after the node",
    remediation="kubectl get resourceslices --field-selector spec.nodeName=NODE -o yaml; "
    "restart the DRA plugin pod on the node (kubectl delete pod ...) to republish",
)
def pool(facts: ClusterFacts) -> Verdict:
    if (verdict := _device_plugin_node(facts)) is not None:
        return verdict
    current, verdict = _slices(facts)
    if verdict is not None:
        return verdict
    pools = {((s.get("spec") or {}).get("pool") or {}).get("name") for s in current}
    spec_pool = (current[0].get("spec") or {}).get("pool") or {}
    generation, want = spec_pool.get("generation"), spec_pool.get("resourceSliceCount")
    counts = {((s.get("spec") or {}).get("pool") or {}).get("resourceSliceCount")
              for s in current}
    devices = sum(len((s.get("spec") or {}).get("devices") or []) for s in current)
    details = {"pools": sorted(str(p) for p in pools), "generation": generation,
               "resourceSliceCount": want, "slices": len(current),
               "older_slices": len(facts.slices) - len(current), "devices": devices}
    if len(pools) != 1:
        return problem(f"slices of generation {generation} name {len(pools)} pools: "
                       f"{', '.join(sorted(map(str, pools)))}", **details)
    if len(counts) != 1 or want != len(current):
        return problem(f"pool {next(iter(pools))} generation {generation} incomplete: "
                       f"{len(current)} of {', '.join(sorted(map(str, counts)))} slice(s)",
                       **details)
    return passed(f"pool {next(iter(pools))} generation {generation}: {len(current)} "
                  f"slice(s), {devices} device(s)", **details)


def _attribute(device: Mapping[str, Any], name: str) -> Any:
    """A published attribute's value, whatever its type (string, version, int, bool)."""
    value = (device.get("attributes") or {}).get(name) or {}
    return next(iter(value.values()), None) if isinstance(value, Mapping) else None


def _capacity(device: Mapping[str, Any], name: str) -> Any:
    value = (device.get("capacity") or {}).get(name)
    return value.get("value") if isinstance(value, Mapping) else value


def same_version(published: Any, nvml: Any) -> bool:
    """Versions equal as the driver's semver parsing makes them: 580.95.05 == 580.95.5,
    9.0 == 9.0.0 (packaging's Version drops leading and trailing zeros alike)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(str(published)) == Version(str(nvml))
    except InvalidVersion:
        return str(published) == str(nvml)


def same_quantity(published: Any, nvml_bytes: Any) -> bool:
    from kubernetes.utils import parse_quantity

    try:
        return parse_quantity(str(published)) == int(nvml_bytes)
    except (ValueError, TypeError):
        return False


def _expected_gpu(gpu: Mapping[str, Any], nvml: Mapping[str, Any]) -> dict[str, Any]:
    """What the driver publishes for a full GPU, from the probe's NVML record (a report of a
    probe older than `brand_nvml` leaves the brand out of the comparison)."""
    return {"type": "gpu", "uuid": gpu.get("uuid"), "productName": gpu.get("name"),
            "brand": GO_NVLIB_BRANDS.get(gpu.get("brand_nvml")),
            "architecture": GO_NVLIB_ARCHITECTURES.get(gpu.get("architecture_nvml")),
            "cudaComputeCapability": gpu.get("compute_capability"),
            "driverVersion": nvml.get("driver_version"),
            "cudaDriverVersion": nvml.get("cuda_driver_version"),
            PCI_BUS_ID: _bus_id(gpu.get("pci_bus_id"))}


def _bus_id(nvml_bus: Any) -> str | None:
    """NVML's 00000000:65:00.0 as the driver publishes it, 0000:65:00.0: go-nvlib's
    GetPCIBusID lowercases NVML's busId and drops the domain's leading "0000"
    (NVIDIA/go-nvlib pkg/nvlib/device/device.go)."""
    if not nvml_bus:
        return None
    domain, _, rest = str(nvml_bus).lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"


VERSIONS = ("cudaComputeCapability", "driverVersion", "cudaDriverVersion")

REMEDIES = {
    "missing": "restart the DRA plugin pod (it enumerates GPUs once, at start: after a MIG "
               "change or a GPU reset it publishes the old set)",
    "extra": "the plugin publishes a device NVML does not show: restart the DRA plugin pod; if "
             "it stays, check the node's device nodes (nvidia-modprobe) and NVML",
    "attribute": "restart the DRA plugin pod after a driver upgrade; a productName or uuid "
                 "mismatch means the slice describes other hardware",
}


def _compare(name: str, device: Mapping[str, Any], want: Mapping[str, Any],
             memory: Any) -> list[dict[str, Any]]:
    found = []
    for key, value in want.items():
        if value is None:
            continue  # NVML did not answer this one (its error is nvml.*'s finding)
        have = _attribute(device, key)
        if key in VERSIONS:
            same = same_version(have, value)
        elif key == PCI_BUS_ID:  # hex digits: the case is not the address
            same = str(have).lower() == str(value).lower()
        else:
            same = str(have) == str(value)
        if not same:
            found.append({"device": name, "attribute": key, "published": have, "nvml": value,
                          "remedy": REMEDIES["attribute"]})
    published = _capacity(device, "memory")
    if memory is not None and not same_quantity(published, memory):
        found.append({"device": name, "attribute": "capacity memory", "published": published,
                      "nvml": memory, "remedy": REMEDIES["attribute"]})
    return found


@check(
    "dra.devices-vs-nvml",
    phase="cluster",
    severity="error",
    description="on a DRA node, the published devices are NVML's: gpu-<minor> per GPU with MIG "
    "off, one type=mig device per MIG device; uuid, productName, brand, architecture, versions, "
    "memory and PCI bus ID as NVML reports them",
    remediation="restart the DRA plugin pod on the node (kubectl delete pod ...): it reads NVML "
    "once at start; each finding's remedy says more",
)
def devices_vs_nvml(facts: ClusterFacts) -> Verdict:
    if (verdict := _device_plugin_node(facts)) is not None:
        return verdict
    if facts.report is None:
        return skipped("no probe report for the node (see host.probe)")
    current, verdict = _slices(facts)
    if verdict is not None:
        return skipped(f"no slice to compare ({verdict.message}; see dra.slice)")
    nvml = facts.report.get("nvml") or {}
    gpus = [g for g in nvml.get("gpus") or [] if g.get("error") is None]
    if not gpus:
        return skipped("no GPU answers NVML (see nvml.init, nvml.gpu-count)")
    published = {d.get("name"): d for s in current for d in (s.get("spec") or {}).get("devices")
                 or []}
    by_uuid = {_attribute(d, "uuid"): name for name, d in published.items()}
    found: list[dict[str, Any]] = []
    matched: set[str] = set()
    for gpu in gpus:
        mig = gpu.get("mig") or {}
        if not mig.get("current"):
            name = f"gpu-{gpu.get('minor_number')}"
            device = published.get(name)
            if device is None:
                found.append({"device": name, "gpu": gpu_label(gpu), "problem": "not published",
                              "remedy": REMEDIES["missing"]})
                continue
            matched.add(name)
            found += _compare(name, device, _expected_gpu(gpu, nvml),
                              (gpu.get("memory") or {}).get("total"))
            continue
        for mig_device in mig.get("devices") or []:
            name = by_uuid.get(mig_device.get("uuid"))
            if name is None:
                found.append({"device": mig_device.get("uuid"), "gpu": gpu_label(gpu),
                              "problem": f"MIG device {mig_device.get('profile')} not "
                              "published", "remedy": REMEDIES["missing"]})
                continue
            matched.add(name)
            want = {**_expected_gpu(gpu, nvml), "type": "mig", "uuid": mig_device.get("uuid"),
                    "parentUUID": gpu.get("uuid"), "profile": mig_device.get("profile")}
            mib = mig_device.get("memory_mb")
            # mig.go CommonCapacitiesMig: memory is the profile's MiB times 2^20.
            found += _compare(name, published[name], want,
                              None if mib is None else int(mib) * 2**20)
    for name in sorted(set(published) - matched):
        if _attribute(published[name], "type") in ("gpu", "mig"):
            found.append({"device": name, "uuid": _attribute(published[name], "uuid"),
                          "problem": "published, but NVML has no such GPU or MIG device",
                          "remedy": REMEDIES["extra"]})
    details = {"published": sorted(map(str, published)), "matched": len(matched),
               "findings": found}
    if found:
        return problem(f"{len(found)} mismatch(es): " + "; ".join(
            f"{f['device']}: " + (f.get("problem") or f"{f['attribute']} published "
                                  f"{f['published']!r}, NVML {f['nvml']!r}") for f in found),
            **details)
    return passed(f"{len(matched)} published device(s) match NVML", **details)


@check(
    "dra.runtime",
    phase="cluster",
    severity="error",
    description="on a DRA node, the container runtime has CDI on (containerd >= 1.7 with "
    "enable_cdi, /var/run/cdi among cdi_spec_dirs; CRI-O always): the driver hands pods their "
    "GPUs as CDI devices only",
    remediation="re-run site.yml --limit NODE (the toolkit role turns CDI on in cdi mode: "
    "nvidia_container_toolkit_mode auto or cdi); a runtime without CDI starts the pod without "
    "its GPU and says nothing",
)
def runtime(facts: ClusterFacts) -> Verdict:
    if (verdict := _device_plugin_node(facts)) is not None:
        return verdict
    if facts.report is None:
        return skipped("no probe report for the node (see host.probe)")
    name = facts.node.container_runtime or "containerd"
    text = runtime_mode.packaged_version(name, facts.report.get("packages") or {})
    version = runtime_mode.runtime_version(text)
    capable = runtime_mode.cdi_capable(name, version)
    section = (facts.report.get("container_runtime") or {}).get(name) or {}
    details = {"runtime": name, "version": text}
    if name == "docker":
        return problem("Docker is not a Kubernetes runtime: DRA needs containerd >= 1.7 with "
                       "CDI on, or CRI-O", **details)
    if capable is None:
        return problem(f"{name}'s version is unknown (no package): containerd >= 1.7 with CDI "
                       "on is needed", **details)
    if not capable:
        return problem(f"{name} {text} has no CDI (containerd >= 1.7 is needed)", **details)
    if name != "containerd":
        return passed(f"{name} {text}: CDI always on", **details)
    if section.get("version_error"):
        return problem(section["version_error"], **details)
    settings, wrong = runtime_mode.containerd_cdi_problem(section, version)
    details.update(settings)
    if wrong:
        return problem(f"containerd {text}: {wrong}: claimed GPUs never reach the pod",
                       **details)
    return passed(f"containerd {text}, CDI on", **details)


# The claim smoke (gpuprov.verify.pods.DraNodeRunner, objects and rules in
# gpuprov.verify.claims): pod-phase checks of a DRA node.

def _claim_run(facts: Any, kind: str) -> tuple[Any, Verdict | None]:
    if not facts.node.dra:
        return None, skipped(f"gpu_allocation {facts.node.gpu_allocation}: no claims here "
                             "(see pods.*)")
    if facts.skipped:
        return None, skipped(facts.skipped)
    run = facts.runs.get(kind)
    if run is None:
        return None, skipped("not run")
    if run.error:
        return None, errored(f"could not run the claim smoke: {run.error}")
    if run.skipped:
        return None, skipped(run.skipped)
    if not run.records:
        return None, problem("the claim pod was not created")
    return run, None


def _not_seen(record: Any) -> str | None:
    pod = record.pod
    if pod.phase == "Running" and pod.uuids:
        return None
    why = f": {pod.message}" if pod.message else ""
    return (f"pod {pod.name} {pod.phase}{why}" + (f" (scheduler: {record.unschedulable})"
                                                    if record.unschedulable else ""))


def _noun(uuids: Any) -> str:
    """What the claims got: MIG devices (their UUIDs are MIG-...) or GPUs."""
    uuids = list(uuids)
    return "MIG device(s)" if uuids and all(str(u).startswith("MIG-") for u in uuids) \
        else "GPU(s)"


def _record_details(record: Any) -> dict[str, Any]:
    return {"pod": record.pod.name, "claim": record.claim, "allocated_node": record.node,
            "claimed": list(record.uuids), "seen": list(record.pod.uuids),
            "unpublished": list(record.unknown)}


def _one_claim_seen(facts: Any, kind: str) -> tuple[Any, Any, dict[str, Any], Verdict | None]:
    """The run of a one-pod claim smoke, its record and details, or the verdict that ends the
    check first: not run, or the pod not running with GPUs seen."""
    run, reason = _claim_run(facts, kind)
    if reason:
        return run, None, {}, reason
    record = run.records[0]
    details = _record_details(record)
    if (why := _not_seen(record)) is not None:
        return run, record, details, problem(why, **details)
    return run, record, details, None


@check(
    "dra.claim-count",
    phase="pod",
    severity="error",
    description="a pod holding a claim for all k GPUs of the node (ResourceClaimTemplate, "
    "deviceClassName gpu.nvidia.com, count k) sees exactly the k allocated devices",
    remediation="kubectl describe resourceclaim and the pod; the DRA plugin's log on the node "
    "(NodePrepareResources); containerd must have CDI on (dra.runtime)",
)
def claim_count(facts: Any) -> Verdict:
    run, record, details, reason = _one_claim_seen(facts, "claim-count")
    if reason:
        return reason
    if record.unknown:
        return problem(f"allocated devices no slice publishes: {', '.join(record.unknown)}",
                       **details)
    wrong = claims.judge_count(record.pod.uuids, record.uuids, run.requested)
    if wrong:
        return problem(wrong, **details)
    return passed(f"the pod sees exactly its {run.requested} claimed {_noun(record.uuids)}",
                  **details)


@check(
    "dra.claim-isolation",
    phase="pod",
    severity="error",
    description="concurrent pods with one-GPU claims each see one GPU, no two the same, the "
    "one allocated to their claim",
    remediation="two claims were given one GPU: check that no device plugin runs on the node "
    "(dra.plugin) and the DRA plugin's checkpoint (/var/lib/kubelet/plugins/gpu.nvidia.com/"
    "checkpoint.json)",
)
def claim_isolation(facts: Any) -> Verdict:
    run, reason = _claim_run(facts, "claim-isolation")
    if reason:
        return reason
    seen = {r.pod.name: list(r.pod.uuids) for r in run.records}
    details = {"seen": seen, "claimed": {r.pod.name: list(r.uuids) for r in run.records}}
    stuck = [why for r in run.records if (why := _not_seen(r)) is not None]
    if stuck:
        return problem("; ".join(stuck), **details)
    wrong = claims.judge_isolation(seen) or claims.judge_isolation(details["claimed"])
    if wrong:
        return problem(wrong, **details)
    strays = [r.pod.name for r in run.records if sorted(r.pod.uuids) != sorted(r.uuids)]
    if strays:
        return problem(f"pods see another GPU than their claim's: {', '.join(strays)}",
                       **details)
    devices = _noun([u for r in run.records for u in r.uuids]).replace("(s)", "s")
    return passed(f"{len(run.records)} pods, {len(run.records)} distinct {devices}, each its "
                  "claim's", **details)


@check(
    "dra.claim-selector",
    phase="pod",
    severity="error",
    description="a claim with a CEL selector on the node's NVML product name is allocated on "
    "this node, and the pod sees that GPU",
    remediation="the published productName differs from NVML's (dra.devices-vs-nvml), or the "
    "node's devices are all held: kubectl get resourceclaims -A",
)
def claim_selector(facts: Any) -> Verdict:
    _, record, details, reason = _one_claim_seen(facts, "claim-selector")
    if reason:
        return reason
    if record.node != facts.node.node_name:
        return problem(f"the claim was allocated on {record.node}, not here", **details)
    if sorted(record.pod.uuids) != sorted(record.uuids) or len(record.uuids) != 1:
        return problem(f"the pod sees {record.pod.uuids}, its claim has {record.uuids}",
                       **details)
    return passed(f"allocated here, {record.uuids[0]}", **details)


@check(
    "dra.claim-unavailable",
    phase="pod",
    severity="error",
    description="a claim for a product no node has stays Pending with the scheduler's reason "
    "(cannot allocate all claims)",
    remediation="a claim for a product nobody has was allocated: the published productName "
    "attributes are wrong (dra.devices-vs-nvml) or the DeviceClass selects too much",
)
def claim_unavailable(facts: Any) -> Verdict:
    run, reason = _claim_run(facts, "claim-unavailable")
    if reason:
        return reason
    record = run.records[0]
    details = {"pod": record.pod.name, "phase": record.pod.phase,
               "scheduler": record.unschedulable}
    pod = {"status": {"phase": record.pod.phase, "conditions": [] if record.unschedulable is None
                      else [{"type": "PodScheduled", "status": "False",
                             "reason": "Unschedulable", "message": record.unschedulable}]}}
    wrong = claims.judge_pending(pod)
    if wrong:
        return problem(wrong, **details)
    return passed(f"Pending: {record.unschedulable}", **details)


@check(
    "dra.claim-cdi",
    phase="pod",
    severity="error",
    description="the claim's CDI spec (/var/run/cdi/k8s.gpu.nvidia.com-claim_<uid>.yaml) is on "
    "the node while its pod runs, and gone after",
    remediation="a spec left behind: the DRA plugin did not unprepare the claim (its log, "
    "NodeUnprepareResources); none while running: the plugin did not prepare it",
)
def claim_cdi(facts: Any) -> Verdict:
    run, reason = _claim_run(facts, "claim-count")
    if reason:
        return reason
    record = run.records[0]
    if record.claim_uid is None:
        return skipped("no claim was read (see dra.claim-count)")
    path = claims.cdi_spec_path(record.claim_uid)
    details = {"path": path, "while_running": record.cdi_while_running,
               "after": record.cdi_after}
    if record.cdi_while_running is None:
        return skipped("verify reads no file on this node (no SSH path to it)", **details)
    if not record.cdi_while_running:
        return problem(f"{path} missing while the pod ran", **details)
    if record.cdi_after:
        return problem(f"{path} still there {claims.CDI_GONE_S} s after the pod ended",
                       **details)
    return passed(f"{path} there while the pod ran, gone after", **details)
