"""What the nvidia_driver role does on a node: decided here, in tested Python, and called from
the role's two set_fact tasks (plugins/filter/nvidia_driver.py):

    plan(settings)        before the node is read: the kernel module flavour, the packages
                          and what apt/dnf are asked for, the files the role writes, and the
                          first problem with the settings (None when there is none)
    work(plan, state, ...) after each read of the node (gpuprov.node.probe.node_state): the
                          driver version installed, apt's work left, the packages whose hold
                          is not the one wanted, whether apt has nothing to do, what is
                          wrong with what is installed, and whether the node must reboot

Messages name the host and say what to do, as the role's assert tasks print them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuprov.node.probe import boot as boot_probe
from gpuprov.nvidia import driver_advisories
from gpuprov.nvidia.driver_branches import NVIDIA, source_for
from gpuprov.stages._node_read import (
    HOST_SETTING_VARS,
    file_current,
    packages_missing,
    settings_values,
)

# apt: name=version, dnf: name-version.
VERSION_SEPARATORS = {"apt": "=", "dnf": "-"}
# NVIDIA's CUDA repositories name the architecture their own way.
CUDA_ARCHES = {"x86_64": "x86_64", "aarch64": "sbsa"}


@dataclass(frozen=True)
class Settings:
    """The role's settings, the preflight facts and the node's per-OS data (vars/<OS>.yml)."""

    host: str
    os_name: str  # ansible_facts distribution, e.g. "Debian"
    os_version: str  # distribution_major_version, e.g. "12"
    branch: str  # gpu_preflight_driver_branch (it honours nvidia_driver_branch)
    kernel_modules: str = "auto"  # nvidia_driver_kernel_modules
    open_required: bool = False  # gpu_preflight_open_kernel_modules_required
    open_supported: bool = False  # gpu_preflight_open_kernel_modules_supported
    version: str | None = None  # nvidia_driver_version
    # nvidia_driver_allow_vulnerable: a pinned version below its branch's security floor
    # (gpuprov/nvidia/driver_advisories.py) is installed, with a warning on every run.
    allow_vulnerable: bool = False
    package_manager: str | None = None  # None: the role has no data for this OS
    # branch ("470", or "default" with a {branch} placeholder) -> flavour -> package names
    packages: Mapping = field(default_factory=dict)
    extra_packages: tuple = ()  # packages with their own version numbers
    # Ubuntu's signed prebuilt modules (nvidia_driver_ubuntu_prebuilt_modules), where the OS
    # has them: {"package": "...{branch}...{open}{kernel_flavour}", "replaces": regex}
    prebuilt_modules: bool = False
    prebuilt: Mapping | None = None
    kernel_flavour: str = "generic"  # nvidia_driver_ubuntu_kernel_flavour
    apt_sources_template: str | None = None  # None: the OS needs no sources file of the role's
    apt_sources_path: str = "/etc/apt/sources.list.d/gpuprov-nvidia-debian.sources"
    blacklist_path: str = "/etc/modprobe.d/blacklist-nouveau.conf"
    # nvidia_driver_source (None: the OS's default) and, for "nvidia" on apt, NVIDIA's CUDA
    # repository: its name for this OS (vars/<OS>.yml: debian13; None: no apt repository of
    # NVIDIA's that the role knows), its key file, the URL settings and the packages
    # (vars/main.yml), and the node's architecture (ansible_facts architecture).
    source: str | None = None
    # nvidia_driver_debian_backports, and the codename it names the suite by (ansible_facts
    # distribution_release): only where the driver comes from Debian's archive.
    debian_backports: bool = False
    release: str | None = None
    cuda_distro: str | None = None
    cuda_repo_key: str | None = None
    cuda_repo_url: str = "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/{arch}"
    cuda_repo_key_url: str = "{url}/{key}"
    cuda_packages: Mapping = field(default_factory=dict)
    cuda_pin_package: str = "nvidia-driver-pinning-{pin}"
    cuda_sources_template: str | None = None
    cuda_sources_path: str = "/etc/apt/sources.list.d/gpuprov-nvidia-cuda.sources"
    cuda_keyring: str = "/etc/apt/keyrings/gpuprov-nvidia-cuda.asc"
    arch: str | None = None  # None: x86_64 (the facts a run gathers always have it)
    # dnf: the branch is a stream of NVIDIA's `nvidia-driver` module (RHEL 8, 9); False: the
    # repository has no modules (RHEL 10) and dnf is asked for the branch's versions, then
    # versionlock keeps them ([cuda-rhel] in driver_branches).
    dnf_modules: bool = True
    # Kernel headers for DKMS: the running kernel's (vars/<OS>.yml: patterns with {kernel},
    # linux-headers-{kernel}) when install_kernel_headers, and the headers meta-package of the
    # kernel's flavour (a pattern with {flavour}, or a fixed name) when
    # install_kernel_headers_meta, so that DKMS builds the module for every kernel installed
    # later. The same patterns name the headers of the kernel the node boots next, where that
    # kernel has no module yet (build_next_kernel).
    kernel: str | None = None  # ansible_facts kernel, the running release
    kernel_headers: tuple = ()
    install_kernel_headers: bool = True
    kernel_headers_meta: str | None = None
    install_kernel_headers_meta: bool = True
    build_next_kernel: bool = True  # nvidia_driver_build_next_kernel

    @property
    def from_cuda_apt(self) -> bool:
        """apt packages from NVIDIA's CUDA repository (not the OS's archive)."""
        return self.package_manager == "apt" and source_for(self.os_name, self.source) == NVIDIA

    @classmethod
    def from_vars(cls, values: Mapping) -> Settings:
        return cls(**settings_values(cls, values, texts=("branch", "os_version"),
                                     optional_texts=("version",),
                                     tuples=("extra_packages", "kernel_headers")))


# Settings field -> the variable tasks/check.yml reads it from (the gpuprov_stage_settings
# lookup): a new setting is a field above and a line here.
SETTING_VARS = {
    **HOST_SETTING_VARS,
    "branch": "gpu_preflight_driver_branch",
    "kernel_modules": "nvidia_driver_kernel_modules",
    "open_required": "gpu_preflight_open_kernel_modules_required",
    "open_supported": "gpu_preflight_open_kernel_modules_supported",
    "version": "nvidia_driver_version",
    "allow_vulnerable": "nvidia_driver_allow_vulnerable",
    "package_manager": "__nvidia_driver_package_manager",
    "packages": "__nvidia_driver_packages",
    "extra_packages": "__nvidia_driver_extra_packages",
    "prebuilt_modules": "nvidia_driver_ubuntu_prebuilt_modules",
    "prebuilt": "__nvidia_driver_prebuilt_modules",
    "kernel_flavour": "nvidia_driver_ubuntu_kernel_flavour",
    "apt_sources_template": "__nvidia_driver_apt_sources_template",
    "apt_sources_path": "__nvidia_driver_apt_sources_path",
    "blacklist_path": "__nvidia_driver_blacklist_path",
    "source": "nvidia_driver_source",
    "debian_backports": "nvidia_driver_debian_backports",
    "release": "ansible_facts.distribution_release",
    "cuda_distro": "__nvidia_driver_cuda_distro",
    "cuda_repo_key": "__nvidia_driver_cuda_repo_key",
    "cuda_repo_url": "nvidia_driver_cuda_repo_url",
    "cuda_repo_key_url": "nvidia_driver_cuda_repo_key_url",
    "cuda_packages": "__nvidia_driver_cuda_packages",
    "cuda_pin_package": "__nvidia_driver_cuda_pin_package",
    "cuda_sources_template": "__nvidia_driver_cuda_sources_template",
    "cuda_sources_path": "__nvidia_driver_cuda_sources_path",
    "cuda_keyring": "nvidia_driver_cuda_keyring",
    "arch": "ansible_facts.architecture",
    "dnf_modules": "__nvidia_driver_dnf_modules",
    "kernel": "ansible_facts.kernel",
    "kernel_headers": "__nvidia_driver_kernel_headers_packages",
    "install_kernel_headers": "nvidia_driver_install_kernel_headers",
    "kernel_headers_meta": "__nvidia_driver_kernel_headers_meta",
    "install_kernel_headers_meta": "nvidia_driver_install_kernel_headers_meta",
    "build_next_kernel": "nvidia_driver_build_next_kernel",
}


# The flavour in a kernel release, after its version and ABI: Debian's 6.1.0-27-amd64 and
# 6.12.38+deb13-cloud-amd64, Ubuntu's 6.8.0-45-generic and 5.15.0-1050-aws. RHEL's releases
# (5.14.0-427.13.1.el9_4.x86_64) have none: its meta-package is named without one.
_KERNEL_FLAVOUR = re.compile(r"^[0-9.]+(?:\+\w+)?(?:-[0-9][\w.]*)?-(?P<flavour>[a-z][a-z0-9-]*)$")


def kernel_flavour(release: str | None) -> str | None:
    match = _KERNEL_FLAVOUR.match(release or "")
    return match["flavour"] if match else None


def kernel_headers(s: Settings) -> list[str]:
    """The headers packages the role installs: the running kernel's, and the meta-package
    that pulls in the headers of each new kernel of the same flavour (linux-headers-amd64,
    linux-headers-generic, kernel-devel-matched)."""
    names = headers_of(s, s.kernel) if s.install_kernel_headers and s.kernel else []
    if s.install_kernel_headers_meta and s.kernel_headers_meta:
        flavour = kernel_flavour(s.kernel)
        if "{flavour}" not in s.kernel_headers_meta:
            names.append(s.kernel_headers_meta)
        elif flavour is not None:
            names.append(s.kernel_headers_meta.format(flavour=flavour))
    return names


def headers_of(s: Settings, release: str) -> list[str]:
    return [str(pattern).format(kernel=release) for pattern in s.kernel_headers]


def _next_kernel(s: Settings) -> dict:
    """What the plan needs to build the module of the kernel the node boots next: that
    kernel's headers (the patterns of vars/<OS>.yml), and whether DKMS builds the module at all
    (Ubuntu's signed prebuilt modules come as packages per kernel, which the prebuilt
    meta-package follows; a missing one there is apt's to fix, not DKMS's)."""
    return {"next_kernel_build": s.build_next_kernel and not (s.prebuilt_modules and s.prebuilt),
            "kernel_headers_patterns": [str(p) for p in s.kernel_headers]}


def _flavour(s: Settings) -> str:
    open_wanted = s.kernel_modules == "open" or (s.kernel_modules == "auto" and s.open_required)
    return "open" if open_wanted else "proprietary"


def _driver_packages(s: Settings, branch_packages: Mapping, flavour: str) -> tuple[list, list]:
    names = [str(n).replace("{branch}", s.branch) for n in branch_packages.get(flavour) or []]
    extra = list(s.extra_packages)
    if s.prebuilt_modules and s.prebuilt:
        # The module comes from the prebuilt package, whose version follows the kernel's.
        names = [n for n in names if not re.search(s.prebuilt["replaces"], n)]
        extra.append(s.prebuilt["package"].format(
            branch=s.branch, open="open-" if flavour == "open" else "",
            kernel_flavour=s.kernel_flavour))
    return names, extra


def _backports(s: Settings) -> tuple[str | None, list[str]]:
    """The suite apt installs the driver from (its --target-release), and a note where
    nvidia_driver_debian_backports cannot apply to this node: it names a suite of Debian's
    archive, which the role adds to its own sources file there. Set for every node (-e), it
    is ignored with the note on a node whose driver comes from NVIDIA's repository or from
    another OS's archive, instead of failing there midway (apt: "The value
    'trixie-backports' is invalid for APT::Default-Release")."""
    if not s.debian_backports:
        return None, []
    if s.from_cuda_apt:
        why = "its driver comes from NVIDIA's repository (nvidia_driver_source)"
    elif s.package_manager != "apt" or s.apt_sources_template is None or not s.release:
        why = f"it runs {s.os_name} {s.os_version}, not Debian"
    else:
        return f"{s.release}-backports", []
    return None, [f"{s.host}: nvidia_driver_debian_backports is ignored: {why}."]


def plan(s: Settings) -> dict:
    if s.from_cuda_apt:
        return _cuda_apt_plan(s)
    branch_packages = s.packages.get(s.branch) or s.packages.get("default") or {}
    flavour = _flavour(s)
    driver, extra = _driver_packages(s, branch_packages, flavour)
    names = list(driver)
    apt = s.package_manager == "apt"
    dnf_stream = (f"nvidia-driver:{s.branch}-{'open' if flavour == 'open' else 'dkms'}"
                  if s.package_manager == "dnf" and s.dnf_modules else None)
    if s.version is not None and s.package_manager in VERSION_SEPARATORS:
        names = [f"{n}{VERSION_SEPARATORS[s.package_manager]}{s.version}" for n in driver]
    elif s.package_manager == "dnf" and not s.dnf_modules:
        # No module stream keeps dnf on the branch: name it (dnf matches name-version globs).
        names = [f"{n}-{s.branch}.*" for n in driver]
    return {
        "branch": s.branch,
        "flavour": flavour,
        "source": source_for(s.os_name, s.source),
        "driver_packages": driver,
        "extra_packages": extra,
        "install_names": names + extra,
        # What apt is asked for where the installed driver is of another branch (NVIDIA's,
        # on a node switched to the OS's archive): `present` alone would keep it.
        "branch_names": ([f"{n}={s.branch}.*" for n in driver] + extra
                         if apt and s.version is None else None),
        # The role installs only versions the settings ask for: a lower one is the admin's.
        "allow_downgrade": apt,
        # What the installed driver packages' versions must match (fnmatch).
        "version_match": s.version,
        # Held (apt-mark hold / dnf versionlock) and checked after installing.
        "held_packages": driver + extra,
        "hold": None,  # as nvidia_driver_hold says
        "pin_package": None,
        "dnf_module_stream": dnf_stream,
        "apt_sources_template": s.apt_sources_template,
        "apt_sources_path": s.apt_sources_path,
        "cuda_repo_url": None,
        "cuda_repo_key_url": None,
        # Read with the node (checksum, mode, owner), so that each is written only where it
        # differs.
        "written_files": ([s.apt_sources_path] if s.apt_sources_template else [])
        + [s.blacklist_path],
        # What NVIDIA's repository left on a node switched to the OS's archive: its lock
        # package (it would keep apt on its branch) and the role's repository files.
        "removed_packages": ["nvidia-driver-pinning-*"] if apt else [],
        "removed_files": [s.cuda_sources_path, s.cuda_keyring] if apt else [],
        "kernel_headers": kernel_headers(s),
        **_next_kernel(s),
        **_security(s, setting_problem(s, branch_packages, flavour)),
        "target_release": _backports(s)[0],  # apt's --target-release (None: none)
        "notes": _backports(s)[1],  # settings ignored on this node, and why
    }


def _cuda_apt_plan(s: Settings) -> dict:
    """apt from NVIDIA's CUDA repository: Debian's package names without a branch, one branch
    (or version) kept by NVIDIA's version-lock package, installed in its own apt run before
    the driver (its preferences file must exist when apt resolves the driver). NVIDIA advises
    against apt-mark hold on top of it, so the role holds nothing here and releases the holds
    a Debian-archive driver left (switching sources). Ubuntu's names carry the branch up to
    580 (libnvidia-compute-580) and not from 590 on: cuda_packages has the branch's own
    entry where it differs from "default"."""
    branch_packages = s.cuda_packages.get(s.branch) or s.cuda_packages.get("default") or {}
    flavour = _flavour(s)
    driver = [str(n).replace("{branch}", s.branch) for n in branch_packages.get(flavour) or []]
    # Every driver package name the role knows on this OS (Debian's archive's, every branch
    # and flavour, and NVIDIA's): a hold left on any of them by a Debian-archive driver stops
    # apt's move to NVIDIA's versions ("held broken packages"), so they are released first.
    known = {str(n).replace("{branch}", s.branch) for flavours in s.packages.values()
             for names in flavours.values() for n in names or []}
    known |= {str(n).replace("{branch}", s.branch) for names in branch_packages.values()
              for n in names or []}
    known |= {str(n) for n in s.extra_packages}
    # nvidia_driver_version as apt spells it (580.105.08-1, 580.105.08-*) or upstream's
    # (580.105.08); the version-lock package is named by the upstream version.
    version = s.version
    pin = re.sub(r"^[0-9]+:", "", version).split("-")[0] if version is not None else s.branch
    version_match = (f"{s.branch}.*" if version is None
                     else version if "-" in version else f"{version}-*")
    arch = CUDA_ARCHES.get(s.arch or "x86_64", s.arch)
    url = s.cuda_repo_url.format(distro=s.cuda_distro, arch=arch).rstrip("/")
    problem = setting_problem(s, branch_packages, flavour)
    if problem is None and s.cuda_distro is None:
        problem = (f"{s.host}: nvidia_driver_source is nvidia, but the nvidia_driver role has no "
                   f"apt repository of NVIDIA's for {s.os_name} {s.os_version}: set "
                   "nvidia_driver_source to distro for this host.")
    return {
        "branch": s.branch,
        "flavour": flavour,
        "source": NVIDIA,
        "driver_packages": driver,
        "extra_packages": [],
        # The apt module installs the version that matches (and moves an installed one to it).
        "install_names": [f"{n}={version_match}" for n in driver],
        "branch_names": None,
        "allow_downgrade": True,
        "version_match": version_match,
        "held_packages": sorted(known),
        "hold": False,
        "pin_package": s.cuda_pin_package.format(pin=pin),
        "dnf_module_stream": None,
        "apt_sources_template": s.cuda_sources_template,
        "apt_sources_path": s.cuda_sources_path,
        "cuda_repo_url": url,
        "cuda_repo_key_url": s.cuda_repo_key_url.format(url=url, key=s.cuda_repo_key,
                                                        distro=s.cuda_distro, arch=arch),
        "written_files": [s.cuda_sources_path, s.blacklist_path],
        "removed_packages": [],
        "removed_files": [],
        "kernel_headers": kernel_headers(s),
        **_next_kernel(s),
        **_security(s, problem),
        "target_release": _backports(s)[0],  # apt's --target-release (None: none)
        "notes": _backports(s)[1],  # settings ignored on this node, and why
    }


def setting_problem(s: Settings, branch_packages: Mapping, flavour: str) -> str | None:
    """The first thing wrong with the settings for this node, with what to do."""
    if s.package_manager is None:
        return (f"{s.os_name} {s.os_version} has no data in the nvidia_driver role: add "
                f"roles/nvidia_driver/vars/{s.os_name}_{s.os_version}.yml.")
    if not branch_packages:
        return (f"{s.host}: driver branch {s.branch} has no packages in roles/nvidia_driver/vars "
                f"for {s.os_name} {s.os_version} (it has: {', '.join(map(str, s.packages))}). "
                "Pin one of those with nvidia_driver_branch, or add the branch's packages to "
                "the role.")
    fits = (flavour in branch_packages
            and (flavour == "proprietary" or s.open_supported)
            and (flavour == "open" or not s.open_required))
    if not fits:
        return (f"{s.host}: nvidia_driver_kernel_modules={s.kernel_modules} cannot be used with "
                f"driver branch {s.branch} on these GPUs (open modules supported: "
                f"{s.open_supported}, required: {s.open_required}, flavours of this branch: "
                f"{', '.join(branch_packages)}). Set nvidia_driver_kernel_modules to auto for "
                "this host.")
    if s.version is not None and not s.version.startswith(f"{s.branch}."):
        return (f"{s.host}: nvidia_driver_version {s.version} is not a version of driver branch "
                f"{s.branch}. Set a {s.branch}.x version, or pin nvidia_driver_branch to the "
                "version's branch, or unset nvidia_driver_version.")
    return None


def pinned_security(s: Settings) -> str | None:
    """What NVIDIA's bulletins say against the pinned version (nvidia_driver_version), one
    line with what to do; None when nothing is pinned, the pin is a glob, or it has every fix
    the table gives for its branch."""
    if s.version is None:
        return None
    upstream = re.sub(r"^[0-9]+:", "", s.version).split("-")[0]
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)+", upstream):
        return None  # a glob: apt picks the version, verify's driver.security judges it
    found = driver_advisories.assess(upstream)
    if not found.vulnerable:
        return None
    return (f"{s.host}: nvidia_driver_version {s.version} is below R{found.branch}'s fixed "
            f"version {found.install} ({found.below_text()}). Set nvidia_driver_version to "
            f"{found.install} or newer (or unset it: the branch's newest), or set "
            "nvidia_driver_allow_vulnerable: true to accept the risk.")


def _security(s: Settings, problem: str | None) -> dict:
    """The plan's problem (a pin below the security floor is one, before any change) and its
    warning (the same, accepted by nvidia_driver_allow_vulnerable: printed on every run)."""
    below = None if problem is not None else pinned_security(s)
    if below is not None and s.allow_vulnerable:
        return {"problem": None, "warning": f"{below} Accepted: nvidia_driver_allow_vulnerable."}
    return {"problem": problem or below, "warning": None}


def installed_security(current: str | None) -> str | None:
    """One line when the installed driver lacks fixes NVIDIA's bulletins give for its branch
    (the source had no newer one): the role says it on every run; verify fails on it."""
    if not current:
        return None
    try:
        found = driver_advisories.assess(current)
    except ValueError:
        return None
    if not found.vulnerable:
        return None
    return (f"driver {current} is below R{found.branch}'s fixed version {found.install} "
            f"({found.below_text()}): the driver source offers no fixed version; point it at "
            "one that does (nvidia_driver_source, nvidia_driver_cuda_repo_url) or move to "
            "another branch")


def installed_version(the_plan: Mapping, packages: Mapping) -> str | None:
    """The driver's upstream version ("535.261.03") as installed: the first driver package's
    version without epoch or packaging revision."""
    driver = the_plan["driver_packages"]
    if not driver or driver[0] not in packages:
        return None
    version = re.sub(r"^[0-9]+:", "", str(packages[driver[0]].get("version", "")))
    return version.split("-")[0]


def work(the_plan: Mapping, state: Mapping, *, host: str, hold: bool = True,
         headers: tuple = (), forbidden: tuple = (),
         check_mode: bool = False, apt_sources: str | None = None,
         package_manager: str | None = None) -> dict:
    """What is left to do on the node, from its read.

    headers: the kernel headers packages when the role installs them, else ();
    apt_sources: the sources file's text as the role writes it (None: the OS needs none).
    """
    packages = state.get("packages") or {}
    current = installed_version(the_plan, packages)
    version = the_plan["version_match"]
    hold = hold if the_plan.get("hold") is None else the_plan["hold"]
    pin = [the_plan["pin_package"]] if the_plan.get("pin_package") else []
    removed = [name for name, p in packages.items() if p.get("state") == "installed"
               and any(fnmatch.fnmatchcase(name, pattern)
                       for pattern in the_plan.get("removed_packages") or [])]
    present = {f.get("path") for f in state.get("files") or [] if isinstance(f, Mapping)}
    stale_files = [path for path in the_plan.get("removed_files") or [] if path in present]
    install_names = list(the_plan["install_names"])
    other_branch = []
    if the_plan.get("branch_names") and current and not current.startswith(
            f"{the_plan['branch']}."):
        install_names, other_branch = list(the_plan["branch_names"]), the_plan["driver_packages"]
    apt_work = (list(state.get("interrupted") or []) + removed + stale_files + other_branch
                + packages_missing(pin, packages)
                + packages_missing(the_plan["driver_packages"], packages, version)
                + packages_missing(list(the_plan["extra_packages"]) + list(headers), packages))
    selected = {name for name, p in packages.items() if bool(p.get("held")) == bool(hold)}
    # Holds are set on what is installed (after the install) and released on what is held;
    # a package that is not installed has no selection to change.
    unselected = [name for name in the_plan["held_packages"]
                  if name not in selected and (hold or name in packages)]
    sources_current = apt_sources is None or file_current(
        state.get("files") or [], the_plan["written_files"][0], apt_sources)
    return {
        "installed_version": current,
        "apt_sources_current": sources_current,
        # Check mode with the repository not added yet: its packages cannot be resolved, so
        # the package, hold and module steps report what a real run would do instead.
        "repo_pending": check_mode and not sources_current,
        "apt_work": apt_work,
        "install_names": install_names,
        "removed_packages": removed,
        "stale_files": stale_files,
        "unselected": unselected,
        "apt_converged": (package_manager == "apt" and sources_current and not apt_work
                          and not unselected),
        "installed_problem": installed_problem(the_plan, packages, current, host=host,
                                               forbidden=forbidden, check_mode=check_mode),
        "security_warning": None if check_mode else installed_security(current),
        "reboot_required": reboot_required(state, current),
        "next_kernel": next_kernel_work(the_plan, state, current),
    }


def next_kernel_work(the_plan: Mapping, state: Mapping, current: str | None) -> dict | None:
    """The kernel the node boots next, where it has no nvidia module of the installed driver:
    {"kernel", "headers", "reason"}, the headers to install and the kernel to run `dkms
    autoinstall -k` for. The same judgement as verify's driver.next-boot, from the same read
    (gpuprov/node/probe/boot.py). None: nothing to build (no kernel image in /boot, no driver
    installed yet, or the module there is the installed driver's)."""
    boot = state.get("boot") or {}
    reason = boot_probe.next_boot_problem(boot, current) if the_plan.get(
        "next_kernel_build") else None
    if reason is None:
        return None
    kernel = boot["next_kernel"]
    return {"kernel": kernel, "reason": reason,
            "headers": [str(p).format(kernel=kernel)
                        for p in the_plan.get("kernel_headers_patterns") or []]}


def reboot_required(state: Mapping, current: str | None) -> bool:
    """nouveau holds the GPUs until a reboot (the blacklist only acts at boot), and a loaded
    module of another version than the one installed cannot be swapped while CUDA processes
    and persistenced use it."""
    loaded = state.get("module_version")
    return bool(state.get("nouveau_loaded")) or (
        loaded is not None and current is not None and loaded != current)


def installed_problem(the_plan: Mapping, packages: Mapping, current: str | None, *, host: str,
                      forbidden: tuple, check_mode: bool) -> str | None:
    """What is wrong with what is installed, with what to do (None: nothing)."""
    pattern = "|".join(forbidden)
    found = [name for name in packages if pattern and re.search(pattern, name)]
    if found:
        return (f"{host} has {', '.join(found)} installed, which a GPU node must not have "
                "(nvidia_driver_forbidden_packages: CUDA comes with the container images, a "
                "compute node needs no X server). Remove them (apt purge / dnf remove) and find "
                "what pulled them in (apt-cache rdepends --installed / dnf repoquery "
                "--whatrequires).")
    branch = the_plan["branch"]
    if not check_mode and not (current or "").startswith(f"{branch}."):
        first = the_plan["driver_packages"][0] if the_plan["driver_packages"] else "the driver"
        return (f"{host}: {first} is {current or 'not installed'}, not a version of branch "
                f"{branch}. Check `apt-cache policy {first}` (or `dnf list --showduplicates`) on "
                "the node.")
    return None
