"""Pod checks: what the smoke workloads of gpuprov.verify.pods saw on each GPU node.

The reference platform's promises, as a user meets them: ask for k GPUs and get exactly k
of this node's GPUs; concurrent containers each see only their own GPU; a batch Job runs to
completion; the image's CUDA runs on the node's driver.
"""

from __future__ import annotations

import re

from gpuprov.verify.facts import PodFacts
from gpuprov.verify.findings import Verdict, check, errored, passed, problem, skipped
from gpuprov.verify.pods import GPU_RESOURCE, SmokeRun

# The CUDA version in an image reference, by the two tag conventions: NVIDIA's CUDA images
# ("nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04" -> 12.4) and "cudaX.Y" inside a framework
# image's tag ("pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime" -> 12.1). Other tags (NGC's
# "pytorch:24.01-py3") carry no CUDA version: the check says so instead of guessing.
_CUDA_IMAGE_TAG = re.compile(r"^(?P<major>\d+)\.(?P<minor>\d+)(?:[.-]|$)")
_CUDA_IN_TAG = re.compile(r"(?:^|[-_.])cuda-?(?P<major>\d+)\.(?P<minor>\d+)(?:[.-]|$)")


def _run_or_reason(facts: PodFacts, kind: str) -> tuple[object | None, Verdict | None]:
    if facts.skipped:
        return None, skipped(facts.skipped)
    run = facts.runs.get(kind)
    if run is None:
        if getattr(facts.node, "dra", False):
            return None, skipped("gpu_allocation dra: GPUs are claimed, not requested (see "
                                 "dra.claim-*)")
        return None, skipped("not run")
    if run.error:
        return None, errored(f"could not run the smoke workload: {run.error}")
    if run.skipped:
        return None, skipped(run.skipped)
    return run, None


def _not_finished(pod) -> str:
    why = f": {pod.message}" if pod.message else ""
    if pod.phase == "Timeout":
        return f"pod {pod.name} did not finish in time{why}"
    return f"pod {pod.name} ended {pod.phase}{why}"


def _noun(run: SmokeRun) -> str:
    return "GPU(s)" if run.resource == GPU_RESOURCE else f"{run.resource} device(s)"


def _of(run: SmokeRun, word: str = "") -> str:
    """" nvidia.com/mig-1g.10gb" where the pods asked for MIG devices, else ""."""
    return f"{word} {run.resource}" if run.resource != GPU_RESOURCE else ""


@check(
    "pods.gpu-count",
    phase="pod",
    severity="error",
    description="a pod requesting all of a node's GPUs sees exactly that many, all of them "
    "this node's (by NVML UUID)",
    remediation="kubectl describe pod in the verify namespace (gpuprov verify -v); check the "
    "device plugin's log and the container runtime's NVIDIA runtime on the node",
)
def gpu_count(facts: PodFacts) -> Verdict:
    run, reason = _run_or_reason(facts, "gpu-count")
    if reason:
        return reason
    (pod,) = run.pods or (None,)
    if pod is None:
        return problem("the smoke pod was not created")
    seen = list(pod.uuids)
    foreign = sorted(set(seen) - facts.device_uuids(run.resource))
    details = {"requested": run.requested, "seen": seen, "pod": pod.name}
    if pod.phase != "Succeeded" and not seen:
        return problem(_not_finished(pod), **details)
    if len(seen) != run.requested or len(set(seen)) != len(seen):
        return problem(f"asked for {run.requested} {_noun(run)}, the pod saw {len(seen)}",
                       **details)
    if foreign:
        return problem(f"the pod saw {_noun(run)} that are not this node's: "
                       f"{', '.join(foreign)}",
                       **details)
    return passed(f"asked for {run.requested}{_of(run)}, saw exactly those {len(seen)} of this "
                  "node",
                  **details)


@check(
    "pods.isolation",
    phase="pod",
    severity="error",
    description="concurrent 1-GPU pods on a node each see exactly one GPU, all different",
    remediation="two pods sharing a GPU means the device plugin hands out a GPU twice or the "
    "runtime ignores NVIDIA_VISIBLE_DEVICES: check the plugin's config (time-slicing "
    "replicas?) and the runtime's accept-nvidia-visible-devices settings",
)
def isolation(facts: PodFacts) -> Verdict:
    run, reason = _run_or_reason(facts, "isolation")
    if reason:
        return reason
    seen = {pod.name: list(pod.uuids) for pod in run.pods}
    details = {"pods": seen}
    unfinished = [p for p in run.pods if not p.uuids]
    if unfinished:
        return problem("; ".join(_not_finished(p) for p in unfinished), **details)
    wrong_count = {name: uuids for name, uuids in seen.items() if len(uuids) != 1}
    if wrong_count:
        text = ", ".join(f"{n} saw {len(u)}" for n, u in wrong_count.items())
        return problem(f"each pod asked for 1 GPU: {text}", **details)
    owners: dict[str, list[str]] = {}
    for name, (uuid,) in seen.items():
        owners.setdefault(uuid, []).append(name)
    shared = {uuid: names for uuid, names in owners.items() if len(names) > 1}
    if shared:
        text = "; ".join(f"{', '.join(names)} all got {uuid}" for uuid, names in shared.items())
        return problem(f"GPU shared between concurrent pods: {text}", **details)
    foreign = sorted(set(owners) - facts.device_uuids(run.resource))
    if foreign:
        return problem(f"pods saw GPU(s) that are not this node's: {', '.join(foreign)}",
                       **details)
    return passed(f"{len(seen)} concurrent pods{_of(run, ' on')}, {len(owners)} different "
                  f"{'MIG devices' if _of(run) else 'GPUs'}", **details)


@check(
    "pods.batch-job",
    phase="pod",
    severity="error",
    description="a batch/v1 Job requesting one GPU on the node completes",
    remediation="kubectl describe job and its pod in the verify namespace; a Job that never "
    "starts usually lacks a free GPU or a matching RuntimeClass",
)
def batch_job(facts: PodFacts) -> Verdict:
    run, reason = _run_or_reason(facts, "batch-job")
    if reason:
        return reason
    seen = [u for pod in run.pods for u in pod.uuids]
    details = {"completed": run.completed, "seen": seen, "pods": [p.name for p in run.pods]}
    if run.completed is None:
        why = "; ".join(_not_finished(p) for p in run.pods) or "no pod was created"
        return problem(f"the Job did not finish in time ({why})", **details)
    if not run.completed:
        why = "; ".join(_not_finished(p) for p in run.pods if p.phase != "Succeeded")
        return problem(f"the Job failed ({why or 'no pod succeeded'})", **details)
    if len(seen) != 1 or not set(seen) <= facts.device_uuids(run.resource):
        return problem(f"the Job completed but its pod saw {len(seen)} GPU(s), not one of "
                       "this node's", **details)
    return passed(f"Job completed on 1 {'MIG device' if _of(run) else 'GPU'}{_of(run, ' of')}"
                  " of this node", **details)


@check(
    "pods.no-request",
    phase="pod",
    severity="error",
    description="an unprivileged pod that requests no GPU but sets NVIDIA_VISIBLE_DEVICES=all "
    "(as CUDA images do), run with the NVIDIA RuntimeClass, sees no GPU",
    remediation="set accept-nvidia-visible-devices-envvar-when-unprivileged = false and "
    "accept-nvidia-visible-devices-as-volume-mounts = true in the node's "
    "/etc/nvidia-container-runtime/config.toml, with the device plugin's volume-mounts "
    "strategy (the nvidia_container_toolkit and nvidia_device_plugin roles' defaults: "
    "ansible-playbook site.yml --limit NODE)",
)
def no_request(facts: PodFacts) -> Verdict:
    run, reason = _run_or_reason(facts, "no-request")
    if reason:
        return reason
    (pod,) = run.pods or (None,)
    if pod is None:
        return problem("the no-request pod was not created")
    seen = list(pod.uuids)
    details = {"seen": seen, "pod": pod.name}
    if seen:
        return problem(f"a pod that requested no GPU saw {len(seen)} GPU(s) by setting "
                       "NVIDIA_VISIBLE_DEVICES=all: the node's toolkit honours the variable "
                       "from unprivileged containers "
                       "(accept-nvidia-visible-devices-envvar-when-unprivileged)", **details)
    if pod.phase != "Succeeded":
        return problem(_not_finished(pod), **details)
    return passed("a pod that requested no GPU (NVIDIA_VISIBLE_DEVICES=all) saw none",
                  **details)


def image_cuda_version(image: str) -> tuple[int, int] | None:
    name, _, tag = image.split("@", 1)[0].rpartition(":")
    if not name or "/" in tag:  # no tag ("registry:5000/cuda" splits at the port)
        return None
    match = _CUDA_IN_TAG.search(tag)
    if match is None and name.rsplit("/", 1)[-1] == "cuda":
        match = _CUDA_IMAGE_TAG.match(tag)
    return (int(match["major"]), int(match["minor"])) if match else None


@check(
    "pods.cuda-compat",
    phase="pod",
    severity="error",
    description="the node's driver supports the CUDA version of the --image given",
    remediation="upgrade the node's driver branch (nvidia_driver_branch) to one whose CUDA "
    "version is at least the image's, or use an image built for an older CUDA",
)
def cuda_compat(facts: PodFacts) -> Verdict:
    return judge_cuda_compat(facts.report, facts.image)


def judge_cuda_compat(report: dict | None, image: str | None) -> Verdict:
    """The node's driver against the CUDA version of `image` (pods and containers alike)."""
    if not image:
        return skipped("no --image given")
    wanted = image_cuda_version(image)
    if wanted is None:
        return skipped(f"no CUDA version in the tag of {image} (expected e.g. "
                       "cuda:12.4.1-base-ubuntu22.04)")
    nvml = (report or {}).get("nvml") or {}
    have_text = nvml.get("cuda_driver_version")
    if not have_text:
        return problem("the node's NVML reports no CUDA driver version (see nvml.init)")
    have = tuple(int(part) for part in str(have_text).split(".")[:2])
    image_text = f"{wanted[0]}.{wanted[1]}"
    details = {"driver_cuda": have_text, "image_cuda": image_text}
    if have < wanted:
        return problem(f"driver supports CUDA {have_text} < image CUDA {image_text}", **details)
    return passed(f"driver supports CUDA {have_text} >= image CUDA {image_text}", **details)
