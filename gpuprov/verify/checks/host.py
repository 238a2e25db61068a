"""Host checks: the probe reached the node, and no CUDA toolkit on it."""

from __future__ import annotations

from gpuprov.verify.facts import NodeFacts
from gpuprov.verify.findings import Verdict, check, passed, problem, skipped

PROBE_CHECK = "host.probe"


@check(
    PROBE_CHECK,
    phase="node",
    severity="error",
    gpu_only=False,
    description="gpuprov's probe runs on the node over SSH (or locally) and reports",
    remediation="make the node reachable as the inventory says (ansible -m ping NODE), "
    "with python3 >= 3.9 on it",
)
def probe_ran(facts: NodeFacts) -> Verdict:
    # The runner reports unreachable nodes and failed probes itself (it has no report then).
    probe = facts.report.get("probe") or {}
    broken = sorted((probe.get("errors") or {}).items())
    if broken:
        return problem(
            "probe sections failed: " + "; ".join(f"{k}: {v.get('message')}" for k, v in broken),
            errors=dict(broken),
        )
    return passed(f"probe {probe.get('version')} ran in {probe.get('duration_s')} s")


@check(
    "host.no-cuda-toolkit",
    phase="node",
    severity="error",
    gpu_only=False,
    description="no CUDA toolkit is installed on the host: CUDA lives in container images",
    remediation="remove the CUDA toolkit packages (apt-get purge 'cuda-toolkit*' "
    "nvidia-cuda-toolkit / dnf remove 'cuda-toolkit*'); images bring their own CUDA",
)
def no_cuda_toolkit(facts: NodeFacts) -> Verdict:
    packages = facts.report.get("packages") or {}
    if packages.get("manager") is None:
        return skipped("no dpkg or rpm database on the node")
    if packages.get("error"):
        return skipped(f"package list unreadable: {packages['error']}")
    toolkit = packages.get("cuda_toolkit") or []
    if toolkit:
        names = ", ".join(f"{p['name']} {p.get('version')}" for p in toolkit)
        return problem(f"CUDA toolkit installed on the host: {names}",
                       packages=[p["name"] for p in toolkit])
    return passed(f"no CUDA toolkit package ({packages['manager']})")
