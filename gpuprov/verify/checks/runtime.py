"""Container runtime check: the node's runtime can start containers with NVIDIA's runtime."""

from __future__ import annotations

from gpuprov.verify.facts import NodeFacts
from gpuprov.verify.findings import Verdict, check, passed, problem

RUNTIMES = ("containerd", "crio", "docker")


@check(
    "runtime.nvidia",
    phase="node",
    severity="error",
    description="the container runtime (containerd, CRI-O or Docker) has NVIDIA's runtime",
    remediation="re-run the nvidia_container_toolkit role (ansible-playbook site.yml "
    "--limit NODE), or nvidia-ctk runtime configure --runtime=containerd",
)
def nvidia_runtime(facts: NodeFacts) -> Verdict:
    runtime = facts.report.get("container_runtime") or {}
    present = {n: runtime.get(n) or {} for n in RUNTIMES if (runtime.get(n) or {}).get("present")}
    if not present:
        return problem("no container runtime configuration found (containerd, CRI-O, Docker)")
    binary = (runtime.get("binaries") or {}).get("nvidia-container-runtime")
    details = {name: {"nvidia_runtime": doc.get("nvidia_runtime"),
                      "default_runtime_name": doc.get("default_runtime_name")}
               for name, doc in present.items()}
    with_nvidia = [n for n, doc in present.items() if doc.get("nvidia_runtime")]
    if not with_nvidia:
        return problem(f"{', '.join(present)} without an 'nvidia' runtime "
                       "(nvidia-container-runtime)", runtimes=details)
    if not binary:
        return problem("nvidia runtime configured but nvidia-container-runtime is not "
                       "installed", runtimes=details)
    default = [n for n in with_nvidia if present[n].get("default_is_nvidia")]
    return passed(f"nvidia runtime in {', '.join(with_nvidia)}"
                  + (f" (default in {', '.join(default)})" if default else
                     " (through a RuntimeClass)"), runtimes=details, binary=binary)
