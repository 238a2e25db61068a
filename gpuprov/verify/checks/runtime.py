"""Container runtime check: the node's runtime can start containers with NVIDIA's runtime."""

from __future__ import annotations

from gpuprov import runtime_mode
from gpuprov.nvidia import toolkit_advisories as advisories
from gpuprov.verify.facts import NodeFacts
from gpuprov.verify.findings import PASS, Verdict, check, passed, problem

RUNTIMES = ("containerd", "crio", "docker")


@check(
    "runtime.nvidia",
    phase="node",
    severity="error",
    description="the container runtime gives containers GPUs in the node's mode "
    "(gpuprov/runtime_mode.py): cdi, CDI enabled and the toolkit's spec in /var/run/cdi naming "
    "every GPU by index and UUID for the installed driver; legacy, NVIDIA's runtime in "
    "containerd, CRI-O or Docker",
    remediation="re-run the nvidia_container_toolkit role (ansible-playbook site.yml "
    "--limit NODE); a stale CDI spec alone: systemctl restart nvidia-cdi-refresh.service",
)
def nvidia_runtime(facts: NodeFacts) -> Verdict:
    runtime_name = facts.node.container_runtime or "containerd"
    version = runtime_mode.packaged_version(runtime_name, facts.report.get("packages") or {})
    choice = runtime_mode.choose(facts.node.toolkit_mode, runtime_name, version)
    if choice.problem:
        return problem(choice.problem)
    unread = ((facts.report.get("container_runtime") or {}).get(runtime_name) or {}).get(
        "version_error")
    if unread:
        # Its CRI tables would be another version's guess: the one line instead.
        return problem(unread)
    verdict = _nvidia_runtime(facts)
    if choice.mode == runtime_mode.LEGACY or verdict.status != PASS:
        if verdict.status == PASS:
            return passed(f"legacy mode ({choice.reason}): {verdict.message}",
                          mode=choice.mode, **verdict.details)
        return verdict
    return _cdi_mode(facts, runtime_name, version, choice, verdict)


def _cdi_mode(facts: NodeFacts, runtime_name: str, version: str | None,
              choice: runtime_mode.Choice, legacy: Verdict) -> Verdict:
    """What CDI mode needs: CDI on in the runtime, the toolkit's spec current."""
    runtime = facts.report.get("container_runtime") or {}
    section = runtime.get(runtime_name) or {}
    details = {"mode": choice.mode, "runtime": runtime_name, "runtime_version": version}
    if runtime_name == "containerd":
        settings, wrong = runtime_mode.containerd_cdi_problem(
            section, runtime_mode.runtime_version(version))
        details.update(settings)
        if wrong:
            return problem(f"cdi mode ({choice.reason}), but {wrong}: pods get no GPU",
                           **details)
    specs = runtime.get("cdi_specs") or []
    record = next((s for s in specs if s.get("path") == runtime_mode.CDI_SPEC), None)
    nvml = facts.nvml
    stale = runtime_mode.spec_problem(record, facts.healthy_gpus, nvml.get("driver_version"))
    details["spec"] = record
    if stale:
        return problem(f"cdi mode: {stale}", **details)
    second = [s["path"] for s in specs if s.get("kind") == runtime_mode.CDI_KIND
              and s.get("path") != runtime_mode.CDI_SPEC]
    if second:
        return problem(f"cdi mode: a second {runtime_mode.CDI_KIND} spec beside "
                       f"{runtime_mode.CDI_SPEC}: {', '.join(second)} (gpuprov 0.2's "
                       "nvidia_container_toolkit_cdi wrote /etc/cdi/nvidia.yaml)", **details)
    default = (section.get("default_is_nvidia") and " nvidia is the default runtime, which "
               "CDI mode does not need;") or ""
    return passed(f"cdi mode ({choice.reason}): CDI on,{default} {runtime_mode.CDI_SPEC} names "
                  f"{len(facts.healthy_gpus)} GPU(s) by index and UUID for driver "
                  f"{nvml.get('driver_version')}; nvidia runtime for the plugin's RuntimeClass",
                  **details, **legacy.details)


def _nvidia_runtime(facts: NodeFacts) -> Verdict:
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
    # Who gets GPUs through that runtime (judged by pods.no-request): for the report.
    toolkit = (runtime.get("toolkit_config") or {}).get("settings")
    return passed(f"nvidia runtime in {', '.join(with_nvidia)}"
                  + (f" (default in {', '.join(default)})" if default else
                     " (through a RuntimeClass)"), runtimes=details, binary=binary,
                  toolkit_settings=toolkit)


# The toolkit's packages, as NVIDIA splits them (since 1.11); the lowest installed version is
# the one a container meets (the hook, the runtime and the CLI each run at container start).
TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                    "libnvidia-container-tools", "libnvidia-container1")


@check(
    "runtime.toolkit-version",
    phase="node",
    severity="error",
    description="NVIDIA's container toolkit is installed at a version with no known CVE "
    "(gpuprov/nvidia/toolkit_advisories.py, each with NVIDIA's bulletin)",
    remediation="re-run the nvidia_container_toolkit role (ansible-playbook site.yml --limit "
    "NODE): it installs nvidia_container_toolkit_version and holds it",
)
def toolkit_version(facts: NodeFacts) -> Verdict:
    packages = (facts.report.get("packages") or {}).get("driver") or []
    installed = {p["name"]: p.get("version") for p in packages
                 if p.get("name") in TOOLKIT_PACKAGES and p.get("state") == "installed"}
    if not installed:
        return problem("nvidia-container-toolkit is not installed (no package)",
                       minimum=advisories.minimum_safe())
    versions = {name: version for name, version in installed.items()
                if advisories.upstream(version) is not None}
    if not versions:
        return problem(f"cannot read the toolkit's version: {installed}")
    name, version = min(versions.items(), key=lambda item: advisories.upstream(item[1]))
    found = advisories.vulnerabilities(version)
    details = {"packages": installed, "minimum": advisories.minimum_safe()}
    if found:
        ids = ", ".join(a.cve for a in found)
        return problem(f"{name} {version} has known vulnerabilities: {ids}; install "
                       f"{advisories.minimum_safe()} or later",
                       cves=[{"cve": a.cve, "fixed_in": a.fixed_in, "severity": a.severity,
                              "advisory": a.url} for a in found], **details)
    return passed(f"toolkit {version}, no known CVE (table: {len(advisories.ADVISORIES)} "
                  "advisories)", **details)
