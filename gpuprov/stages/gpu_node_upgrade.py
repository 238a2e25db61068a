"""The gpu_node_upgrade role's decisions (playbooks/upgrade-driver.yml), made on the controller
and called through plugins/filter/gpu_node_upgrade.py. The role reads (the probe report, the
Node, the pods, systemctl's list) and writes (patches, evictions); what to do with what it read
is decided here.

    plan(probe, node, version, branch)   {"installed", "module", "target", "at_target",
                                          "unfinished", "skip", "was_cordoned", "summary",
                                          "reason"}
    drain(timeout, force, delete_emptydir_data)
                                         {"timeout", "delete_options", "retries", "delay"}
                                         (k8s_drain's delete_options)
    pods_left(pods)                      ["namespace/name", ...]: pods the drain should have
                                         removed that are still running
    verify_failures(stdout, rc, stderr)  "gpuprov verify exited 1: FAIL gpu.ecc ... | ..."

The cordon, its record on the Node, the host's GPU clients and the failure's annotation are
the gpu_node_maintenance role's (gpuprov/cordon.py, owner "gpu-node-upgrade": the
gpuprov.io/upgrade-* annotations), shared with the MIG stage and health remediation. The
record is the role's memory between runs: a rollout stopped at any point gives back only what
it took, and a node that failed is upgraded again.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpuprov import cordon
from gpuprov.nvidia import driver_advisories
from gpuprov.stages import _task_failure

OWNER = "gpu-node-upgrade"  # gpuprov/cordon.py's owner: the gpuprov.io/upgrade-* annotations
FAILED = cordon.keys(OWNER).failed
WAS_CORDONED = cordon.keys(OWNER).was_cordoned
# Between two drain attempts: each one is an eviction request per pod, refused (HTTP 429) while
# a PodDisruptionBudget allows no disruption.
DRAIN_DELAY = 10
# k8s_drain polls the evicted pods this often while it waits for them to go.
DRAIN_POLL = 2
# "1:535.261.03-1~deb12u1" -> epoch "1:", upstream "535.261.03", revision "-1~deb12u1".
_EPOCH = re.compile(r"^[0-9]+:")
_VERIFY_PROBLEM = ("FAIL", "ERROR")
# verify colours its status words only on a terminal; a forced colour must not hide a row.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class UpgradeError(ValueError):
    """The settings give the upgrade no target; the message says what to set."""


def target_pattern(version: Any) -> str | None:
    """The upstream driver version a package version pins, as an fnmatch pattern: the epoch
    and the packaging revision dropped ("1:535.261.03-1~deb12u1" and "535.261.03-*" ->
    "535.261.03"; "535.*" stays a pattern). None: no version is pinned."""
    if version is None or str(version).strip() == "":
        return None
    upstream = _EPOCH.sub("", str(version).strip()).split("-", 1)[0].split("~", 1)[0]
    if not upstream or upstream.strip("*?") == "":
        raise UpgradeError(f"nvidia_driver_version {version!r} names no driver version")
    return upstream


def _installed(probe: Mapping) -> tuple[str | None, str | None]:
    """The driver the node runs, as the probe saw it: the user-space NVML library's version
    (its file name has it even when NVML cannot initialise, after a driver/library mismatch;
    else NVML's own answer), and the loaded kernel module's version (None: none loaded)."""
    nvml = probe.get("nvml") or {}
    library = (nvml.get("library") or {}).get("version") or nvml.get("driver_version") or None
    module = probe.get("kernel_module") or {}
    loaded = module.get("version") if module.get("loaded") else None
    return library, loaded or None


def plan(probe: Mapping, node: Mapping, version: Any = None, branch: Any = None,
         allow_vulnerable: Any = False) -> dict:
    """What the upgrade does with this node. A node is at the target when its library is the
    pinned version (or of the branch when none is pinned, at or above the branch's security
    floor unless nvidia_driver_allow_vulnerable: the driver role then installs the branch's
    newest) and no other kernel module is loaded; it is skipped only when at the target and no
    earlier run left it half-done (an upgrade annotation on the Node): a rerun then resumes a
    stopped rollout where it ended, and upgrades a failed node again."""
    pattern = target_pattern(version)
    if pattern is None and (branch is None or str(branch).strip() in ("", "None")):
        raise UpgradeError(
            "no target: neither nvidia_driver_version nor a driver branch "
            "(gpu_preflight_driver_branch) is set; run the gpu_preflight role first")
    library, module = _installed(probe)
    if library is None:
        at_version = False
    elif pattern is not None:
        at_version = fnmatch.fnmatchcase(library, pattern)
    else:
        at_version = library.startswith(f"{branch}.")
    floor = None
    if pattern is None and library is not None and not _truthy(allow_vulnerable):
        found = _assess(library)
        if found is not None and found.vulnerable:
            at_version, floor = False, found.install
    at_target = at_version and (module is None or module == library)
    unfinished = cordon.unfinished(node, OWNER)
    skip = at_target and not unfinished
    target = pattern if pattern is not None else f"{branch}.x" + (
        f" (at least {floor}, NVIDIA's security fixes)" if floor else "")
    return {
        "installed": library,
        "module": module,
        "target": target,
        "at_target": at_target,
        "unfinished": unfinished,
        "skip": skip,
        # An earlier run's record, else the node's cordon now (an admin's).
        "was_cordoned": cordon.was_cordoned(node, OWNER),
        "summary": _summary(library, module, target, skip, unfinished),
        "reason": f"gpuprov is upgrading the NVIDIA driver to {target}",
    }


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on", "y")


def _assess(library: str) -> driver_advisories.Assessment | None:
    try:
        return driver_advisories.assess(library)
    except ValueError:
        return None


def _summary(library: str | None, module: str | None, target: str, skip: bool,
             unfinished: list[str]) -> str:
    driver = library or "not installed"
    if module is not None and module != library:
        driver += f" (kernel module {module} loaded)"
    action = "skip (already there)" if skip else "upgrade"
    note = " (an earlier upgrade did not finish)" if unfinished else ""
    return f"driver {driver}, target {target} -> {action}{note}"


def drain(timeout: Any, force: bool = False, delete_emptydir_data: bool = False) -> dict:
    """k8s_drain's delete_options, and how often the role retries the drain: evictions, so
    PodDisruptionBudgets are respected; DaemonSet pods stay (they would come back at once)."""
    try:
        seconds = int(str(timeout).strip())
    except ValueError:
        seconds = 0
    if seconds < 1:
        raise UpgradeError(
            f"gpu_node_upgrade_drain_timeout must be a whole number of seconds, 1 or more, "
            f"got {timeout!r}")
    return {
        "timeout": seconds,
        "delete_options": {
            "ignore_daemonsets": True,
            "force": force,
            "delete_emptydir_data": delete_emptydir_data,
            "wait_timeout": seconds,
            "wait_sleep": DRAIN_POLL,
        },
        # Retried until a budget allows the evictions, for about the timeout in all.
        "retries": math.ceil(seconds / DRAIN_DELAY),
        "delay": DRAIN_DELAY,
    }


def _owned_by_daemonset(pod: Mapping) -> bool:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(o, Mapping) and o.get("kind") == "DaemonSet" for o in owners)


def pods_left(pods: Iterable[Mapping]) -> list[str]:
    """Pods on a drained node that should be gone: running (not Succeeded or Failed), not a
    DaemonSet's (the drain leaves those), not a mirror pod (a static pod of the kubelet's,
    which the API cannot evict; k8s_drain skips them too). k8s_drain only warns when evicted
    pods outlive its wait, so the role checks."""
    left = []
    for pod in pods:
        if not isinstance(pod, Mapping):
            continue
        metadata = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if "kubernetes.io/config.mirror" in (metadata.get("annotations") or {}):
            continue
        if not _owned_by_daemonset(pod):
            left.append(f"{metadata.get('namespace', '')}/{metadata.get('name', '')}")
    return left


def verify_failures(stdout: Any, rc: Any, stderr: Any = "") -> str:
    """Why `gpuprov verify --limit <node>` did not pass, in one line: its exit code and its
    FAIL and ERROR lines (the table's rows start with the status), else the last line it
    wrote on stderr (a configuration error)."""
    text = _ANSI.sub("", stdout) if isinstance(stdout, str) else ""
    problems = [_task_failure.one_line(line) for line in text.splitlines()
                if line.split()[:1] and line.split()[0] in _VERIFY_PROBLEM]
    if not problems:
        last = [line for line in str(stderr or "").splitlines() if line.strip()]
        problems = [_task_failure.one_line(last[-1])] if last else ["see its report"]
    return f"gpuprov verify exited {rc}: {' | '.join(problems)}"

