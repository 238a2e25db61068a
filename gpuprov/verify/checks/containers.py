"""Container checks: what the smoke containers of gpuprov.verify.containers saw on each Docker
host, and what the engine answered for each. The same promises as the pod checks, as a user of
plain Docker meets them: ask for k GPUs (by --gpus or by CDI name) and get exactly those k;
concurrent one-GPU containers see different GPUs; a container that asked for none gets none."""

from __future__ import annotations

from gpuprov.verify.checks.pods import judge_cuda_compat
from gpuprov.verify.facts import ContainerFacts
from gpuprov.verify.findings import Verdict, check, errored, passed, problem, skipped


def _records(facts: ContainerFacts, kind: str) -> tuple[tuple | None, Verdict | None]:
    if facts.skipped:
        return None, skipped(facts.skipped)
    if facts.run is None:
        return None, skipped("not run")
    if facts.run.error:
        return None, errored(facts.run.error)
    records = facts.run.records.get(kind)
    if not records:
        return None, skipped("not run (no GPU on the host)" if kind != "no-request"
                             else "not run")
    return records, None


def _said(record) -> str:
    if record.error:
        return f"the engine answered: {record.error}"
    return f"it exited {record.exit_code} and printed: {record.output or '(nothing)'}"


@check(
    "containers.gpu-count",
    phase="container",
    severity="error",
    description="a container asking for all of a Docker host's k GPUs (by --gpus, and by CDI "
    "names where Docker injects CDI devices) sees exactly those k, by NVML UUID",
    remediation="run the toolkit stage on the host (ansible-playbook site.yml --limit HOST): "
    "NVIDIA's runtime in /etc/docker/daemon.json, features.cdi on Docker >= 25, the toolkit "
    "installed; then `docker run --rm --gpus all IMAGE nvidia-smi -L` on the host",
)
def gpu_count(facts: ContainerFacts) -> Verdict:
    records, reason = _records(facts, "gpu-count")
    if reason:
        return reason
    node = facts.gpu_uuids
    details = {"requests": {r.request: list(r.uuids) for r in records}, "node": node}
    for record in records:
        if record.error or record.exit_code != 0:
            return problem(f"`{record.request}`: {_said(record)}", **details)
        if sorted(record.uuids) != sorted(node):
            return problem(f"`{record.request}` saw {len(record.uuids)} GPU(s) "
                           f"({', '.join(record.uuids) or 'none'}), the host has {len(node)} "
                           f"({', '.join(node)})", **details)
    return passed(f"{len(node)} GPU(s) seen by UUID through "
                  + " and ".join(f"`{r.request.split(' ', 1)[0]}`" for r in records), **details)


@check(
    "containers.isolation",
    phase="container",
    severity="error",
    description="concurrent one-GPU containers (--gpus device=<index>) each see exactly the "
    "GPU they asked for, all different",
    remediation="check the toolkit's config.toml on the host and that no container on it runs "
    "privileged with every device; docker run --rm --gpus device=0 IMAGE nvidia-smi -L",
)
def isolation(facts: ContainerFacts) -> Verdict:
    records, reason = _records(facts, "isolation")
    if reason:
        return reason
    node = facts.gpu_uuids
    seen = {r.request: list(r.uuids) for r in records}
    for record in records:
        if record.error:
            return problem(f"`{record.request}`: {_said(record)}", seen=seen)
        index = int(record.request.rsplit("=", 1)[1])
        want = node[index] if index < len(node) else None
        if list(record.uuids) != [want]:
            return problem(f"`{record.request}` saw {', '.join(record.uuids) or 'no GPU'}, "
                           f"not GPU {index} ({want})", seen=seen)
    return passed(f"{len(records)} concurrent one-GPU container(s) each saw its own GPU",
                  seen=seen)


@check(
    "containers.no-request",
    phase="container",
    severity="error",
    description="a container that asks for no GPU but sets NVIDIA_VISIBLE_DEVICES=all (as "
    "CUDA images do) sees no GPU under Docker's default runtime",
    remediation="set nvidia_container_toolkit_docker_default_runtime: false for the host (NVIDIA's "
    "runtime not Docker's default) and run site.yml --limit HOST; on Docker the toolkit honours "
    "NVIDIA_VISIBLE_DEVICES from unprivileged containers (accept-nvidia-visible-devices-envvar-"
    "when-unprivileged = true, which --gpus needs), so the default runtime is what keeps it out",
)
def no_request(facts: ContainerFacts) -> Verdict:
    if facts.node.swarm:
        return skipped("a Swarm GPU node: judged by swarm.no-request")
    return judge_no_request(facts)


def judge_no_request(facts: ContainerFacts) -> Verdict:
    records, reason = _records(facts, "no-request")
    if reason:
        return reason
    (record,) = records
    details = {"seen": list(record.uuids), "default_runtime": facts.run.default_runtime}
    if record.error:
        return problem(f"`{record.request}`: {_said(record)}", **details)
    if record.uuids:
        return problem(f"a container that asked for no GPU saw {len(record.uuids)} GPU(s) by "
                       f"setting NVIDIA_VISIBLE_DEVICES=all: Docker's default runtime is "
                       f"{facts.run.default_runtime!r} and the toolkit honours the variable from "
                       "unprivileged containers (accept-nvidia-visible-devices-envvar-when-"
                       "unprivileged = true)", **details)
    return passed(f"a container that asked for no GPU (NVIDIA_VISIBLE_DEVICES=all, default "
                  f"runtime {facts.run.default_runtime}) saw none", **details)


@check(
    "containers.cuda-compat",
    phase="container",
    severity="error",
    description="the Docker host's driver supports the CUDA version of the --image given",
    remediation="upgrade the host's driver branch (nvidia_driver_branch) to one whose CUDA "
    "version is at least the image's, or use an image built for an older CUDA",
)
def cuda_compat(facts: ContainerFacts) -> Verdict:
    return judge_cuda_compat(facts.report, facts.image)
