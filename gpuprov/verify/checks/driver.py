"""Driver checks: kernel module and user-space library agree, and the branch is the one
gpu_preflight chose for the node (gpuprov.driver_branches, the roles' own choice)."""

from __future__ import annotations

import collections
import functools
from collections.abc import Mapping
from typing import Any

from gpuprov.driver_branches import BranchChoice, choose_branch
from gpuprov.verify.checks._util import major, nvml_error_text
from gpuprov.verify.facts import NodeFacts
from gpuprov.verify.findings import Verdict, check, passed, problem, skipped

MISMATCH = "NVML_ERROR_LIB_RM_VERSION_MISMATCH"


def _versions(facts: NodeFacts) -> dict[str, str | None]:
    nvml = facts.nvml
    return {
        "kernel_module": (facts.report.get("kernel_module") or {}).get("version"),
        "library": (nvml.get("library") or {}).get("version"),
        "nvml_driver": nvml.get("driver_version"),
    }


@check(
    "driver.version-match",
    phase="node",
    severity="error",
    description="the loaded kernel module and the user-space driver library are one version",
    remediation="the driver packages changed under a loaded module: reboot the node (or "
    "reload the nvidia modules); keep the packages held (apt-mark hold) to prevent it",
)
def version_match(facts: NodeFacts) -> Verdict:
    versions = _versions(facts)
    error = facts.nvml.get("error") or {}
    if error.get("name") == MISMATCH:
        return problem(
            "Failed to initialize NVML: Driver/library version mismatch (kernel module "
            f"{versions['kernel_module'] or '?'}, library {versions['library'] or '?'})",
            **versions,
        )
    module, library = versions["kernel_module"], versions["library"]
    if module and library:
        if module != library:
            return problem(f"kernel module {module} != library {library}", **versions)
        return passed(f"kernel module and library {module}", **versions)
    if facts.nvml.get("available"):
        # NVML refuses to initialise against a module of another version, so an
        # initialised NVML is itself the evidence when a version is unreadable.
        known = module or library or versions["nvml_driver"]
        return passed(f"NVML initialised with driver {known} (kernel module version "
                      f"{module or 'unreadable'}, library version "
                      f"{library or 'unknown'})", **versions)
    return skipped(f"NVML unavailable ({nvml_error_text(error)}), versions unknown",
                   **versions)


def loaded_driver(facts: NodeFacts) -> str | None:
    versions = _versions(facts)
    return versions["nvml_driver"] or versions["kernel_module"] or versions["library"]


def expected_branch(facts: NodeFacts) -> BranchChoice:
    """The branch gpu_preflight chooses for this node: its PCI IDs, its OS, the pin."""
    os_info: Mapping[str, Any] = (facts.report.get("host") or {}).get("os") or {}
    return _choose(
        tuple(str(d.get("device_id")) for d in facts.pci),
        str(os_info.get("id") or ""),
        str(os_info.get("version_id") or ""),
        facts.node.driver_branch_pin,
        facts.node.driver_source,
    )


# Every node's choice is needed again for each peer comparison; nodes share few GPU mixes.
@functools.lru_cache(maxsize=1024)
def _choose(pci_ids: tuple[str, ...], os_id: str, os_version: str,
            pin: str | None, source: str | None) -> BranchChoice:
    return choose_branch(pci_ids, os_id, os_version, pinned_branch=pin, source=source)


@check(
    "driver.branch",
    phase="node",
    severity="error",
    description="the loaded driver is of the branch gpu_preflight chose for the node, and "
    "of the same version as on every other node of that branch",
    remediation="re-run site.yml for the node (ansible-playbook site.yml --limit NODE); "
    "set nvidia_driver_version to keep nodes of one branch on one version",
)
def branch(facts: NodeFacts) -> Verdict:
    try:
        choice = expected_branch(facts)
    except ValueError as exc:
        return problem(f"cannot choose a branch: {exc}")
    if not choice.ok:
        return problem(f"no driver branch for this node: {choice.reason}",
                       expected=choice.to_dict())
    version = loaded_driver(facts)
    if version is None:
        return skipped("driver version unknown (NVML unavailable, no kernel module)",
                       expected_branch=choice.branch)
    details = {"expected_branch": choice.branch, "version": version, "os": choice.os}
    if major(version) != choice.branch:
        return problem(f"driver {version} is not of branch {choice.branch} ({choice.reason})",
                       **details)
    peers = _branch_peers(facts, choice.branch)
    counts = collections.Counter(peers.values())
    most, most_n = counts.most_common(1)[0]
    tie = sum(1 for n in counts.values() if n == most_n) > 1
    if len(counts) > 1 and (tie or version != most):
        others = ", ".join(f"{n} {v}" for n, v in sorted(peers.items()) if v != version)
        return problem(f"driver {version}, but other nodes of branch {choice.branch} run "
                       f"{others}", **details, peers=peers)
    return passed(f"driver {version}, branch {choice.branch} as chosen for {choice.os}"
                  + (f" (same on {len(peers)} nodes)" if len(peers) > 1 else ""), **details)


def _branch_peers(facts: NodeFacts, branch: int) -> dict[str, str]:
    """Node -> driver version, for every reachable node whose chosen branch is `branch`."""
    peers = {}
    for name, other in {**facts.fleet, facts.node.name: facts}.items():
        version = loaded_driver(other)
        if version is None or not other.pci:
            continue
        try:
            choice = expected_branch(other)
        except ValueError:
            continue
        if choice.ok and choice.branch == branch:
            peers[name] = version
    return peers
