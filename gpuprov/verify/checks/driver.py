"""Driver checks: kernel module and user-space library agree, the branch is the one
gpu_preflight chose for the node (gpuprov.nvidia.driver_branches, the roles' own choice), and
the driver has the fixes of NVIDIA's security bulletins (gpuprov.nvidia.driver_advisories)."""

from __future__ import annotations

import collections
import datetime
import functools
from collections.abc import Mapping
from typing import Any

from gpuprov.node.probe import boot as boot_probe
from gpuprov.nvidia import driver_advisories, driver_lifecycle
from gpuprov.nvidia.driver_branches import BranchChoice, choose_branch, eol_warning
from gpuprov.verify.checks._util import major, nvml_error_text
from gpuprov.verify.facts import NodeFacts
from gpuprov.verify.findings import Verdict, check, passed, problem, skipped, warned

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


# The day lifecycles are judged on (the branch chosen, driver.branch-eol); tests replace it,
# since a node's answer changes with the date.
today = datetime.date.today


def expected_branch(facts: NodeFacts) -> BranchChoice:
    """The branch gpu_preflight chooses for this node: its PCI IDs, its OS, the pin."""
    os_info: Mapping[str, Any] = (facts.report.get("host") or {}).get("os") or {}
    return _choose(
        tuple(str(d.get("device_id")) for d in facts.pci),
        str(os_info.get("id") or ""),
        str(os_info.get("version_id") or ""),
        facts.node.driver_branch_pin,
        facts.node.driver_source,
        tuple((str(d.get("device_id")), d["pci_ids_name"]) for d in facts.pci
              if d.get("pci_ids_name")),
        today(),
    )


# Every node's choice is needed again for each peer comparison; nodes share few GPU mixes.
@functools.lru_cache(maxsize=1024)
def _choose(pci_ids: tuple[str, ...], os_id: str, os_version: str,
            pin: str | None, source: str | None, chip_names: tuple[tuple[str, str], ...],
            day: datetime.date) -> BranchChoice:
    return choose_branch(pci_ids, os_id, os_version, pinned_branch=pin, source=source,
                         chip_names=dict(chip_names), today=day)


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
    peers = {name: version for name, (chosen, version) in _fleet_choices(facts.fleet).items()
             if chosen == branch}
    own = _chosen_and_loaded(facts)
    if own is not None and own[0] == branch:
        peers[facts.node.name] = own[1]
    else:
        peers.pop(facts.node.name, None)
    return peers


def _chosen_and_loaded(facts: NodeFacts) -> tuple[int | None, str] | None:
    """(the branch chosen for the node, its loaded driver); None without GPUs, a known driver
    or a branch that can drive them."""
    version = loaded_driver(facts)
    if version is None or not facts.pci:
        return None
    try:
        choice = expected_branch(facts)
    except ValueError:
        return None
    return (choice.branch, version) if choice.ok else None


# The last fleet's choices, with that fleet and day. Every node's driver.branch compares it with
# the whole fleet (the runner gives all nodes of a run one fleet mapping): choosing again for
# each pair made the checks quadratic, 1.1 CPU-s for 1024 nodes.
_fleet_memo: tuple[Mapping[str, NodeFacts], datetime.date, dict] | None = None


def _fleet_choices(fleet: Mapping[str, NodeFacts]) -> dict[str, tuple[int | None, str]]:
    """Node -> _chosen_and_loaded, for the fleet's nodes that have one; once per fleet."""
    global _fleet_memo
    memo, day = _fleet_memo, today()
    if memo is not None and memo[0] is fleet and memo[1] == day:
        return memo[2]
    choices = {name: entry for name, other in fleet.items()
               if (entry := _chosen_and_loaded(other)) is not None}
    _fleet_memo = (fleet, day, choices)
    return choices



@check(
    "driver.branch-eol",
    phase="node",
    severity="warning",
    description="the loaded driver's branch is one NVIDIA supports, not past its end of life "
    f"or ending within {driver_lifecycle.EOL_WARNING_DAYS} days "
    "(gpuprov/nvidia/driver_lifecycle.py)",
    remediation="move the node to the supported branch named: pin it (nvidia_driver_branch), "
    "or take it from NVIDIA's repository (nvidia_driver_source: nvidia) where the OS's archive "
    "lacks it, then run playbooks/upgrade-driver.yml",
)
def branch_eol(facts: NodeFacts) -> Verdict:
    version = loaded_driver(facts)
    if version is None:
        return skipped("driver version unknown (NVML unavailable, no kernel module)")
    loaded = major(version) or 0
    try:
        gpus = expected_branch(facts).gpus
    except ValueError:
        gpus = ()
    details = {"version": version, "branch": loaded}
    info = driver_lifecycle.BRANCHES.get(loaded)
    warning = eol_warning(loaded, [g for g in gpus if g.status == "supported"], today())
    if warning:
        return problem(f"driver {version}: {warning}", **details,
                       eol=info.eol if info else None)
    if info is None:
        return problem(f"driver {version}: branch {loaded} is not in gpuprov's list of NVIDIA's "
                       "branches, its lifecycle is unknown", **details)
    if info.eol is None:
        kind = driver_lifecycle.KIND_NAMES.get(info.kind or "", "branch")
        return passed(f"driver {version}: R{loaded} is a {kind} without an end-of-life date",
                      **details)
    return passed(f"driver {version}: R{loaded} ({info.kind}) supported to {info.eol}",
                  **details, eol=info.eol)


@check(
    "driver.security",
    phase="node",
    severity="error",
    description="the loaded driver has every fix NVIDIA's security bulletins give for its branch "
    "(gpuprov/nvidia/driver_advisories.py); a branch the bulletins stopped listing warns",
    remediation="install the version named (nvidia_driver_version, or unset it so that the "
    "role takes the branch's newest) with playbooks/upgrade-driver.yml; on a branch that gets "
    "no fixes, move to one of the branches named (nvidia_driver_branch)",
)
def security(facts: NodeFacts) -> Verdict:
    version = loaded_driver(facts)
    if version is None:
        return skipped("driver version unknown (NVML unavailable, no kernel module)")
    try:
        found = driver_advisories.assess(version)
    except ValueError as exc:
        return problem(f"driver {version}: {exc}")
    details = {"version": version, "branch": found.branch, "install": found.install,
               "below": [b.bulletin for b in found.below], "cves": found.cves(),
               "missed": [b.bulletin for b in found.missed]}
    try:
        gpus = [g for g in expected_branch(facts).gpus if g.status == "supported"]
    except ValueError:
        gpus = []
    # Only branches that drive the node's GPUs (Kepler's last is R470, which no bulletin fixes
    # any more: no way out but other GPUs).
    ways_out = ", ".join(f"R{b} {v}" for b, v in driver_advisories.fixed_branches(today())
                         if b != found.branch and all(g.supports_branch(b) for g in gpus)) \
        or "no branch NVIDIA still fixes drives these GPUs"
    if found.vulnerable:
        message = (f"driver {version} is below R{found.branch}'s fixed version {found.install}: "
                   f"{found.below_text()}; install {found.install} or newer")
        if found.missed:
            message += (f"; R{found.branch} gets no fixes from bulletin "
                        + ", ".join(str(b.bulletin) for b in found.missed)
                        + (f": move to {ways_out}" if ways_out else ""))
        if facts.node.driver_allow_vulnerable:
            return warned(f"{message} (accepted: nvidia_driver_allow_vulnerable)", **details)
        return problem(message, **details)
    if found.missed:
        # No floor to fail on: NVIDIA names none for a branch it stopped fixing.
        return warned(f"driver {version}: R{found.branch} gets no fixes from "
                       f"{found.missed_text()}" + (f"; move to {ways_out}" if ways_out else ""),
                       **details)
    if found.install is None:
        return passed(f"driver {version}: no NVIDIA bulletin since 2024 lists R{found.branch}",
                      **details)
    newest = driver_advisories.floor(found.branch)[1]
    return passed(f"driver {version} has every fix for R{found.branch} (newest: bulletin "
                  f"{newest.bulletin}, {newest.date}, fixed in {found.install})", **details)


def _installed_driver(facts: NodeFacts) -> str | None:
    """The driver the packages installed: the user-space library's version (after an upgrade
    not yet rebooted, the loaded module is still the old one)."""
    versions = _versions(facts)
    return versions["library"] or versions["nvml_driver"] or versions["kernel_module"]


def _build_command(facts: NodeFacts, kernel: str) -> str:
    os_info = (facts.report.get("host") or {}).get("os") or {}
    family = {str(os_info.get("id") or "")} | set(str(os_info.get("id_like") or "").split())
    headers = (f"dnf install kernel-devel-{kernel}" if family & {"rhel", "fedora", "rocky"}
               else f"apt-get install linux-headers-{kernel}")
    return f"{headers} && dkms autoinstall -k {kernel}"


@check(
    "driver.next-boot",
    phase="node",
    severity="error",
    description="the kernel the node boots next (the newest in /boot) has an nvidia module, "
    "built by DKMS or packaged, of the installed driver's version",
    remediation="before the node reboots, run the driver stage again (the nvidia_driver role "
    "installs that kernel's headers and builds the module: nvidia_driver_build_next_kernel), "
    "or do it by hand: install the headers of that kernel and run dkms autoinstall -k KERNEL",
)
def next_boot(facts: NodeFacts) -> Verdict:
    boot = facts.report.get("boot") or {}
    installed = _installed_driver(facts)
    kernel = boot.get("next_kernel")
    if installed is None:
        return skipped("no installed driver found (NVML unavailable, no kernel module)")
    if kernel is None:
        return skipped("no kernel image in /boot (a container, or /boot not mounted): the "
                       "kernel the node boots next is unknown")
    module = (boot.get("modules") or {}).get(kernel)
    details = {"next_kernel": kernel, "running_kernel": boot.get("running_kernel"),
               "installed_driver": installed, "module": module}
    why = boot_probe.next_boot_problem(boot, installed)
    if why is not None:
        effect = ("the node would come up without GPUs" if module is None
                  else "the node would come up with a version mismatch")
        return problem(f"{why}: {effect}; run `{_build_command(facts, kernel)}`", **details)
    return passed(f"next boot: kernel {kernel} has nvidia {installed} ({module['kind']}, "
                  f"{module['path']})", **details)
