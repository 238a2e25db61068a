"""What the nvidia_container_toolkit role does on a node: decided here, in tested Python, and
called from the role's set_fact tasks (plugins/filter/nvidia_container_toolkit.py):

    plan(settings)               before the node is read: what apt/dnf are asked for, the
                                 runtime's entry, the files the role writes and reads, the
                                 GPU-access keys wanted, and the first problem with the settings
    work(plan, state, probe)     after the node is read (gpuprov.node.probe.node_state) and with the
                                 preflight's probe report of this run: the runtime problem, the
                                 keyring and sources file as found, the packages missing or not
                                 held, containerd's config and the toolkit's merged
    repository(work, ...)        after the key was fetched: whether to dearmor it, and whether
                                 the repository steps have work at all

The containerd/Docker/CRI-O merges are gpuprov/stages/_runtime_config.py's, the toolkit's
config.toml gpuprov/stages/_toolkit_config.py's. Messages name the host and say what to do.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuprov import runtime_mode
from gpuprov.node.probe import runtime as probe_runtime
from gpuprov.stages import _runtime_config, _toolkit_config
from gpuprov.stages._node_read import (
    HOST_SETTING_VARS,
    file_current,
    packages_missing,
    settings_values,
)

# apt: name=version, dnf: name-version.
VERSION_SEPARATORS = {"apt": "=", "dnf": "-"}
# A RuntimeClass handler name (a DNS label), as Kubernetes validates it.
HANDLER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class Settings:
    """The role's settings and the node's per-OS data (vars/<OS>.yml)."""

    host: str
    os_name: str
    os_version: str
    package_manager: str | None = None  # None: the role has no data for this OS
    packages: tuple = ()
    version: str | None = None
    hold: bool = True
    manage_repo: bool = True
    runtime: str = "containerd"
    runtime_name: str = "nvidia"
    runtime_binary: str = "/usr/bin/nvidia-container-runtime"
    # runtime -> {"service", "ready", "installed"} (vars/main.yml)
    runtimes: Mapping = field(default_factory=dict)
    keyring: str = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
    apt_sources_path: str = "/etc/apt/sources.list.d/nvidia-container-toolkit.sources"
    containerd_config: str = "/etc/containerd/config.toml"
    containerd_drop_in: str = "/etc/containerd/conf.d/99-nvidia.toml"
    toolkit_config: str = "/etc/nvidia-container-runtime/config.toml"
    accept_envvar_unprivileged: bool = False
    accept_volume_mounts: bool = True
    mode: str = runtime_mode.AUTO  # auto | cdi | legacy (gpuprov/runtime_mode.py)
    default_runtime: bool = True  # legacy mode: NVIDIA's runtime as the runtime's default
    docker_config: str = "/etc/docker/daemon.json"
    # Docker: NVIDIA's runtime as Docker's default only where the admin asks (a container that
    # asks for no GPU then runs through plain runc and gets none, whatever its environment).
    docker_default_runtime: bool = False
    # Docker: the host is a Swarm GPU node (its GPUs advertised as generic resources).
    docker_swarm: bool = False
    swarm_resource_kind: str = _runtime_config.SWARM_GPU_KIND

    @classmethod
    def from_vars(cls, values: Mapping) -> Settings:
        return cls(**settings_values(cls, values, texts=("os_version",),
                                     optional_texts=("version",), tuples=("packages",)))


# Where tasks/check.yml's gpuprov_stage_settings lookup reads each Settings field: adding a
# setting is a field above and its variable here.
SETTING_VARS = {
    **HOST_SETTING_VARS,
    "package_manager": "__nvidia_container_toolkit_package_manager",
    "packages": "__nvidia_container_toolkit_packages",
    "version": "nvidia_container_toolkit_version",
    "hold": "nvidia_container_toolkit_hold",
    "manage_repo": "nvidia_container_toolkit_manage_repo",
    "runtime": "nvidia_container_toolkit_runtime",
    "runtime_name": "nvidia_container_toolkit_runtime_name",
    "runtime_binary": "nvidia_container_toolkit_runtime_binary",
    "runtimes": "__nvidia_container_toolkit_runtimes",
    "keyring": "nvidia_container_toolkit_keyring",
    "apt_sources_path": "__nvidia_container_toolkit_apt_sources_path",
    "containerd_config": "nvidia_container_toolkit_containerd_config",
    "containerd_drop_in": "nvidia_container_toolkit_containerd_drop_in",
    "toolkit_config": "nvidia_container_toolkit_config",
    "accept_envvar_unprivileged": "nvidia_container_toolkit_accept_envvar_unprivileged",
    "accept_volume_mounts": "nvidia_container_toolkit_accept_volume_mounts",
    "mode": "nvidia_container_toolkit_mode",
    "default_runtime": "nvidia_container_toolkit_default_runtime",
    "docker_config": "nvidia_container_toolkit_docker_config",
    "docker_default_runtime": "nvidia_container_toolkit_docker_default_runtime",
    "docker_swarm": "nvidia_container_toolkit_docker_swarm",
    "swarm_resource_kind": "nvidia_container_toolkit_swarm_resource_kind",
}


def plan(s: Settings) -> dict:
    names = list(s.packages)
    if s.version is not None and s.package_manager in VERSION_SEPARATORS:
        names = [f"{n}{VERSION_SEPARATORS[s.package_manager]}{s.version}" for n in s.packages]
    apt = s.package_manager == "apt"
    containerd = s.runtime == "containerd"
    docker = s.runtime == "docker"
    return {
        "settings": dataclasses.asdict(s),
        "install_names": names,
        "runtime": dict(s.runtimes.get(s.runtime) or {}),
        # Read with the node (checksum, mode, owner), so that each is written only where it
        # differs; the configs are read for their text, to merge into.
        "written_files": ([s.keyring, s.apt_sources_path] if apt else [])
        + ([s.containerd_drop_in] if containerd else []),
        "read_configs": ([s.containerd_config] if containerd else [])
        + ([s.docker_config] if docker else []) + [s.toolkit_config]
        # The toolkit's CDI spec: kept current in cdi mode (cdi_refresh in work()).
        + [runtime_mode.CDI_SPEC],
        # The armoured key as fetched, kept next to the keyring so that a rotated key is
        # noticed and dearmored again (apt reads neither file unless a source names it).
        "key_source": re.sub(r"\.gpg$", "", s.keyring) + ".asc",
        # The toolkit's GPU-access keys as the settings want them
        # (gpuprov/stages/_toolkit_config.py).
        "gpu_access": gpu_access(s),
        "problem": setting_problem(s),
    }


def gpu_access(s: Settings) -> dict:
    """The toolkit's keys that decide which containers get GPUs, as the settings want them.

    Docker: the variable is honoured from unprivileged containers whatever the setting, since
    Docker's own `--gpus` hands the request to NVIDIA's hook only by NVIDIA_VISIBLE_DEVICES
    (moby daemon/devices_nvidia_linux.go `injectNVIDIARuntimeHook`) and NVIDIA's hook honours
    the variable from an unprivileged container only with this key on
    (internal/config/image/cuda_image.go `VisibleDevices`): off, `--gpus` gives no GPU. What
    keeps a container that asked for none from GPUs on Docker is that NVIDIA's runtime is not
    Docker's default (docker_default_runtime), so no hook runs for it. A Swarm GPU node also
    names the variable Swarm sets for the GPUs it assigned (swarm-resource)."""
    docker = s.runtime == "docker"
    access: dict = {
        _toolkit_config.ENVVAR_UNPRIVILEGED: s.accept_envvar_unprivileged or docker,
        _toolkit_config.AS_VOLUME_MOUNTS: s.accept_volume_mounts,
    }
    if docker and s.docker_swarm:
        access[_toolkit_config.SWARM_RESOURCE] = _runtime_config.swarm_resource_env(
            s.swarm_resource_kind)
    return access


def setting_problem(s: Settings) -> str | None:
    """The first thing wrong with the OS data or the runtime settings, with what to do."""
    if s.package_manager is None:
        return (f"{s.os_name} {s.os_version} has no data in the nvidia_container_toolkit role: "
                f"add roles/nvidia_container_toolkit/vars/{s.os_name}_{s.os_version}.yml.")
    if (s.runtime not in s.runtimes or not HANDLER_NAME.match(s.runtime_name)
            or not posixpath.isabs(s.runtime_binary)):
        return (f"{s.host}: nvidia_container_toolkit_runtime must be one of "
                f"{', '.join(s.runtimes)} (is {s.runtime}), nvidia_container_toolkit_runtime_name "
                "a RuntimeClass handler name (lower case letters, digits, '-'; is "
                f"{s.runtime_name}) and nvidia_container_toolkit_runtime_binary an absolute path "
                f"(is {s.runtime_binary}).")
    if s.runtime == "docker" and s.docker_swarm:
        problem = _runtime_config.swarm_kind_problem(s.swarm_resource_kind)
        if problem:
            return f"{s.host}: nvidia_container_toolkit_swarm_resource_kind: {problem}."
    return None


def work(the_plan: Mapping, state: Mapping, probe_packages: list, *,
         apt_sources: str | None = None, nvml: Mapping | None = None,
         driver_changed: bool = False, check_mode: bool = False) -> dict:
    """What the node's read and the preflight's probe (its packages.driver list) leave to do.

    apt_sources: the sources file's text as the role writes it (None on dnf nodes).
    nvml: the preflight probe's NVML section (GPUs, driver version), to judge the CDI spec by.
    driver_changed: the driver stage changed the driver in this run (it then refreshed the
    spec itself, and the preflight's NVML answer is from before the change).
    check_mode: the run is Ansible's check mode.
    """
    s = the_plan["settings"]
    files = state.get("files") or []
    keyring = [f for f in files if f.get("path") == s["keyring"]]
    contents = state.get("contents") or {}
    held = {p.get("name") for p in probe_packages if p.get("held")}
    problem = runtime_problem(the_plan, state)
    choice = runtime_mode.choose(s["mode"], s["runtime"],
                                 (state.get("version") or {}).get("output"))
    if problem is None and choice.problem:
        problem = f"{s['host']}: {choice.problem}"
    cdi = choice.mode == runtime_mode.CDI
    docker = s["runtime"] == "docker"
    sources_current = apt_sources is not None and file_current(files, s["apt_sources_path"],
                                                               apt_sources)
    return {
        "runtime_problem": problem,
        # How containers get GPUs on this node, and why (gpuprov/runtime_mode.py): cdi makes
        # CDI on in the runtime and NVIDIA's runtime not its default.
        "mode": choice.mode,
        "mode_reason": choice.reason,
        "set_default": set_default(s, cdi),
        "cdi_refresh": cdi and cdi_refresh(contents.get(runtime_mode.CDI_SPEC), nvml,
                                           driver_changed),
        "keyring_found": bool(keyring),
        # The keyring is root's 0644 (apt reads it as _apt).
        "keyring_ok": any(f.get("mode") == "0644" and f.get("uid") == 0 and f.get("gid") == 0
                          for f in keyring),
        "apt_sources_current": sources_current,
        # Check mode with the repository not added yet (its key is not dearmored in check mode
        # either): its packages cannot be resolved, so the package and hold steps report what a
        # real run would do instead.
        "repo_pending": (check_mode and bool(s["manage_repo"]) and s["package_manager"] == "apt"
                         and not sources_current),
        # From the preflight's probe of this run (the driver stage installs none of them).
        "missing": packages_missing(s["packages"], probe_packages, s["version"]),
        "unheld": [n for n in s["packages"] if n not in held] if s["hold"] else [],
        "containerd_text": contents.get(s["containerd_config"]),
        # Docker: daemon.json with NVIDIA's runtime, the cdi feature (cdi mode) and, on a Swarm
        # GPU node, its GPUs as generic resources ({"text", "changed"}; None elsewhere).
        "docker": docker_config(s, contents.get(s["docker_config"]), cdi, nvml)
        if docker and problem is None else None,
        # The toolkit's config.toml with the GPU-access keys set, from the file as read (none:
        # missing, e.g. in check mode before the package is installed): {"text", "changed"}.
        "config": _toolkit_config.merge(contents.get(s["toolkit_config"]), the_plan["gpu_access"],
                                       path=s["toolkit_config"]),
    }


def set_default(s: Mapping, cdi: bool) -> bool:
    """Whether NVIDIA's runtime becomes the runtime's default. containerd/CRI-O in legacy mode:
    default_runtime (the device plugin's pods need it). Docker: only where the admin asks
    (docker_default_runtime), or on a Swarm GPU node: Swarm lets no service pick a runtime, so
    its tasks reach NVIDIA's hook only through the default."""
    if s["runtime"] == "docker":
        return bool(s["docker_default_runtime"]) or bool(s["docker_swarm"])
    return bool(s["default_runtime"]) and not cdi


def docker_config(s: Mapping, text: str | None, cdi: bool, nvml: Mapping | None) -> dict:
    """daemon.json merged (gpuprov/stages/_runtime_config.py docker_nvidia): on a Swarm GPU
    node, the GPUs NVML answers for (by UUID) are the node's generic resources."""
    uuids = None
    if s["docker_swarm"]:
        uuids = [g["uuid"] for g in (nvml or {}).get("gpus") or []
                 if g.get("error") is None and g.get("uuid")]
    merged = _runtime_config.docker_nvidia(
        text, runtime_name=s["runtime_name"], binary=s["runtime_binary"],
        set_default=set_default(s, cdi), cdi=cdi, generic_resources=uuids,
        resource_kind=s["swarm_resource_kind"], path=s["docker_config"])
    return {"text": merged["text"], "changed": merged["changed"]}


def cdi_refresh(spec_text: str | None, nvml: Mapping | None, driver_changed: bool) -> bool:
    """Whether nvidia-cdi-refresh must run again: no spec, or one that misses a GPU or was
    generated for another driver than NVML reports (judged only where this run did not change
    the driver: the driver stage refreshed the spec then, after the preflight's NVML read)."""
    if spec_text is None:
        return True
    if driver_changed:
        return False
    nvml = nvml or {}
    gpus = [g for g in nvml.get("gpus") or [] if g.get("error") is None]
    record = probe_runtime.cdi_record(runtime_mode.CDI_SPEC, spec_text)
    return runtime_mode.spec_problem(record, gpus, nvml.get("driver_version")) is not None


def runtime_problem(the_plan: Mapping, state: Mapping) -> str | None:
    """The role configures the runtime the node runs (installing one is the cluster
    installer's job) and merges into its config, never rewriting one it could not read."""
    s = the_plan["settings"]
    version = state.get("version") or {}
    if version.get("rc", 1) != 0:
        command = " ".join(the_plan["runtime"].get("installed") or [s["runtime"]])
        return (f"{s['host']}: {command} failed ({version.get('output') or 'no answer'}): "
                f"install {s['runtime']} first (this role configures the node's runtime, it "
                "installs none), or set nvidia_container_toolkit_runtime to the runtime the node "
                "has.")
    if state.get("unreadable"):
        return (f"{s['host']}: {', '.join(state['unreadable'])} exists but could not be read: "
                "check it (ls -l, cat) on the node; the role merges into it and never rewrites "
                "what it cannot read.")
    return None


def repository(the_work: Mapping, *, manage_repo: bool, key_changed: bool) -> dict:
    """gpg is needed only when there is something to dearmor: the key changed (fetched or
    copied) or the keyring is missing; the repository steps run only when the keyring, the
    sources file or the packages need it, so a converged node skips them all."""
    dearmor = manage_repo and (key_changed or not the_work["keyring_found"])
    repo_work = manage_repo and (dearmor or not the_work["keyring_ok"]
                                 or not the_work["apt_sources_current"])
    return {"dearmor_needed": dearmor, "work": repo_work or bool(the_work["missing"])}
