"""How a node's containers get their GPUs: native CDI or NVIDIA's legacy runtime.

One decision, three callers: the nvidia_container_toolkit role (which mode to configure),
the nvidia_device_plugin role (which of the plugin's named configs each node gets, through
its `nvidia.com/device-plugin.config` label) and `gpuprov verify` (what runtime.nvidia checks).

- cdi: what NVIDIA's stack does by default since toolkit 1.18 / GPU Operator 25.10. CDI is on
  in the runtime, `nvidia` is not the default runtime (the RuntimeClass stays, for the device
  plugin's own pods), the toolkit's nvidia-cdi-refresh units keep /var/run/cdi/nvidia.yaml
  current, and the device plugin hands the kubelet CDI device names (DEVICE_LIST_STRATEGY
  cdi-cri), which the runtime itself resolves from the specs. A container gets exactly the
  device nodes of the devices named; a pod that asked for none gets no NVIDIA device at all,
  whatever its environment says.
- legacy: NVIDIA's runtime as the default runtime, the device plugin's volume-mounts strategy
  (the toolkit accepts GPU requests from those mounts only, not from NVIDIA_VISIBLE_DEVICES
  of unprivileged containers).

Which runtimes can do CDI: containerd from 1.7 (`enable_cdi`, off by default in 1.7, on by
default from 2.0: `containerd config default` of Debian's 1.7.24 and 2.1.9; 1.6 has no CDI),
CRI-O (CDI always on since 1.23, older releases are out of support), Docker from 25.0 (the
`cdi` feature in daemon.json; on by default only from 28: moby daemon/command/daemon.go
`cdiEnabled`, which takes an absent key as on, while 25-27 took it as off, so the role sets it).
Docker's `--gpus` still goes through NVIDIA's hook on 25-27 (moby
daemon/devices_nvidia_linux.go: the hook's driver, and CDI's only where nvidia-cdi-hook is on
PATH in later releases), so a Docker host in cdi mode serves both `--gpus` and
`--device nvidia.com/gpu=<index|uuid>`.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

AUTO, CDI, LEGACY = "auto", "cdi", "legacy"
MODES = (AUTO, CDI, LEGACY)
# The spec the toolkit's nvidia-cdi-refresh.service writes (its NVIDIA_CTK_CDI_OUTPUT_FILE_PATH)
# and its kind; the device plugin writes its own, of kind k8s.device-plugin.nvidia.com/gpu,
# next to it.
CDI_SPEC = "/var/run/cdi/nvidia.yaml"
CDI_KIND = "nvidia.com/gpu"
# Where both write: the runtime's cdi_spec_dirs must name it.
CDI_SPEC_DIR = posixpath.dirname(CDI_SPEC)
CONTAINERD_CDI_SINCE = (1, 7)
CONTAINERD_CDI_DEFAULT_ON = (2, 0)
DOCKER_CDI_SINCE = (25, 0)


# The packages each runtime comes in (the probe's packages.runtime).
RUNTIME_PACKAGES = {"containerd": ("containerd", "containerd.io"), "crio": ("cri-o",),
                    "docker": ("docker-ce", "docker.io", "moby-engine")}


def packaged_version(runtime: str, packages: dict) -> str | None:
    """The installed version of the runtime's package, from a probe report's packages."""
    for package in packages.get("runtime") or []:
        if package.get("name") in RUNTIME_PACKAGES.get(runtime, ()) \
                and package.get("state", "installed") == "installed":
            return package.get("version")
    return None


@dataclass(frozen=True)
class Choice:
    mode: str | None  # cdi | legacy; None with a problem
    reason: str
    problem: str | None = None


def runtime_version(text: object) -> tuple[int, int] | None:
    """(major, minor) from `containerd --version`, `crio --version` or a package version
    ('1.6.20~ds1-1+deb12u3', 'containerd github.com/containerd/containerd/v2 2.1.9+unknown')."""
    for match in re.finditer(r"(?:^|[\s:v])(\d+)\.(\d+)(?:\.\d+)?", str(text or "")):
        return int(match.group(1)), int(match.group(2))
    return None


def cdi_capable(runtime: str, version: tuple[int, int] | None) -> bool | None:
    """Whether the runtime can inject CDI devices; None: its version is not known."""
    if runtime == "crio":
        return True
    if runtime == "containerd":
        return None if version is None else version >= CONTAINERD_CDI_SINCE
    if runtime == "docker":
        return None if version is None else version >= DOCKER_CDI_SINCE
    return False


def containerd_cdi_default(version: tuple[int, int] | None) -> bool:
    """enable_cdi where a containerd config does not set it."""
    return version is not None and version >= CONTAINERD_CDI_DEFAULT_ON


def containerd_cdi_problem(section: dict, version: tuple[int, int] | None
                           ) -> tuple[dict, str | None]:
    """containerd's CDI settings as the probe read them from its config (`section`: the
    report's container_runtime.containerd) and what keeps CDI devices from a pod: CDI off, or
    /var/run/cdi, where the toolkit, the device plugin and the DRA driver write their specs, not
    among cdi_spec_dirs. Both the toolkit's cdi mode and a DRA node need this of containerd."""
    enabled = section.get("enable_cdi")
    if enabled is None:
        enabled = containerd_cdi_default(version)
    dirs = section.get("cdi_spec_dirs")
    settings = {"enable_cdi": enabled, "cdi_spec_dirs": dirs}
    if not enabled:
        return settings, "CDI is off in containerd (enable_cdi)"
    if dirs is not None and CDI_SPEC_DIR not in dirs:
        return settings, (f"containerd's cdi_spec_dirs {dirs} leave out {CDI_SPEC_DIR}, where "
                          "the toolkit and the GPU drivers write their specs")
    return settings, None


def choose(setting: object, runtime: str, version_text: object = None) -> Choice:
    """The mode for a node: `setting` is nvidia_container_toolkit_mode (auto | cdi | legacy),
    `runtime` nvidia_container_toolkit_runtime, `version_text` what the runtime's --version
    or package version says (None: unknown)."""
    setting = str(setting or AUTO)
    if setting not in MODES:
        return Choice(None, "", f"nvidia_container_toolkit_mode must be one of "
                                f"{', '.join(MODES)}, got {setting!r}")
    version = runtime_version(version_text)
    capable = cdi_capable(runtime, version)
    named = runtime if version is None else f"{runtime} {version[0]}.{version[1]}"
    if setting == LEGACY:
        return Choice(LEGACY, "nvidia_container_toolkit_mode is legacy")
    if capable:
        why = {"crio": "CRI-O injects CDI devices",
               "docker": f"{named} injects CDI devices (Docker >= 25, features.cdi)"}.get(
            runtime, f"{named} injects CDI devices (containerd >= 1.7)")
        return Choice(CDI, why if setting == AUTO else "nvidia_container_toolkit_mode is cdi")
    if capable is None:
        if setting == CDI:
            need = "Docker >= 25" if runtime == "docker" else "containerd >= 1.7"
            return Choice(None, "", f"nvidia_container_toolkit_mode is cdi, but {runtime}'s "
                                    f"version is unknown ({need} is needed): check "
                                    f"`{'dockerd' if runtime == 'docker' else runtime} "
                                    "--version` on the node")
        return Choice(LEGACY, f"{named}: version unknown, so not CDI")
    if setting == CDI:
        need = {"containerd": "containerd >= 1.7 (Debian 13 has 1.7.24), or CRI-O",
                "docker": "Docker >= 25 (Debian 13's docker.io is 26.1)"}.get(
            runtime, "containerd >= 1.7 or CRI-O")
        return Choice(None, "", f"nvidia_container_toolkit_mode is cdi, but {named} cannot "
                                f"inject CDI devices: it needs {need}; set "
                                "nvidia_container_toolkit_mode to auto or legacy for this node")
    return Choice(LEGACY, f"{named} cannot inject CDI devices")


def spec_problem(record: dict | None, gpus: list, driver_version: str | None) -> str | None:
    """What is wrong with the toolkit's CDI spec (gpuprov.node.probe.runtime.cdi_record's record of
    /var/run/cdi/nvidia.yaml; None: no such file) for a node whose NVML shows `gpus`
    ([{index, uuid}]) and `driver_version`; None when it names every GPU by index and by UUID
    and was generated for the installed driver."""
    if record is None:
        return f"no CDI spec at {CDI_SPEC}"
    if record.get("error"):
        return f"{record.get('path')}: {record['error']}"
    if record.get("kind") != CDI_KIND:
        return f"{record.get('path')} is of kind {record.get('kind')!r}, not {CDI_KIND}"
    names = set(record.get("devices") or [])
    missing = [str(g.get("index")) for g in gpus if str(g.get("index")) not in names]
    missing += [str(g.get("uuid")) for g in gpus if g.get("uuid") and g["uuid"] not in names]
    if missing:
        return (f"{record.get('path')} does not name GPU(s) {', '.join(missing)} "
                f"(it names {len(names)} device(s) for {len(gpus)} GPU(s))")
    versions = record.get("driver_versions") or []
    if driver_version and versions and driver_version not in versions:
        return (f"{record.get('path')} was generated for driver {', '.join(versions)}, the node "
                f"runs {driver_version}")
    return None
