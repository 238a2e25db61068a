"""Which NVIDIA driver branches each supported OS can install, and the branch for one node.

Standard library only (used by the preflight Ansible plugin on the controller and shipped
alongside hardware.py). choose_branch() returns a BranchChoice instead of raising, so the
preflight role can fail the one host whose GPUs cannot be driven while the others go on.

Sources (retrieved 2026-11-22):

[debian] Debian archive (deb.debian.org), bookworm non-free/contrib: nvidia-driver and
    nvidia-open-kernel-dkms 535.261.03-1; nvidia-tesla-535-driver 535.216.03-3~deb12u1;
    nvidia-tesla-470-driver 470.256.02-1~deb12u1 (no open flavour: 470 predates production
    open modules); bookworm-backports nvidia-driver 535.216.03-2~bpo12+1. trixie (Debian 13,
    not a gpuprov OS yet) has 550.163.01. Checked with apt-cache policy against the archive.

[ubuntu] Ubuntu archive, restricted: the `nvidia-driver-<branch>-server` and
    `-server-open` packages that ubuntu-drivers installs on servers. NOT verified here:
    archive.ubuntu.com is unreachable from the build machines; from Ubuntu's and NVIDIA's
    documentation: jammy carries 470-server (Kepler's last). Ubuntu has since turned the
    535-server, 550(-server) and 570-server packages into transitional packages that install
    580 (packages.ubuntu.com, noble-updates: nvidia-headless-550 550.163.01-0ubuntu0.24.04.2
    depends on nvidia-headless-580 on amd64; gpuprov issue 19 for 535/570-server), so a node
    asking for them gets 580: TRANSITIONAL below. 26.04 (resolute): 580-server assumed, NOT
    verified.

[cuda-debian] NVIDIA CUDA repositories for Debian 12 and 13 (developer.download.nvidia.com/
    compute/cuda/repos/debian{12,13}/x86_64, flat, keys 3bf863cc.pub and 8793F200.pub):
    Debian's package names without a branch (nvidia-driver-cuda, nvidia-kernel-open-dkms,
    nvidia-kernel-dkms, libcuda1, nvidia-smi), versions like 580.105.08-1, one branch kept by
    installing nvidia-driver-pinning-<branch> (or -<version>) before the driver (NVIDIA Driver
    Installation Guide, "Version locking packages for Ubuntu / Debian"; Google Dataproc's
    spark-rapids init script after its PR #1400 does exactly that on Debian 12). The Debian 13
    repository starts with CUDA 13.0 (R580); NVIDIA/cuda-repo-management issues #38 and #40
    report 580 missing from it at first. Branch lists NOT verified here (unreachable).

[cuda-ubuntu] NVIDIA CUDA repositories for Ubuntu (repos/ubuntu2204, ubuntu2404: key
    3bf863cc.pub; ubuntu2604: key 60DF8A40.pub, from R595). Up to 580 Ubuntu's own package
    names with the branch in them (nvidia-dkms-580-open, libnvidia-compute-580, ...); from 590
    "the Ubuntu packages will be renamed by removing the branch designation" and a branch is
    kept by nvidia-driver-pinning-<branch> (NVIDIA Driver Installation Guide r590, "Ubuntu
    590 and later packages", table 4: libnvidia-compute-580 -> libnvidia-compute,
    nvidia-dkms-580-open -> nvidia-dkms-open). Branch lists NOT verified here.

[cuda-rhel] NVIDIA CUDA repository for RHEL/Rocky 8, 9 and 10 (developer.download.nvidia.com/
    compute/cuda/repos/rhel{8,9,10}). 8 and 9: dnf module `nvidia-driver`, streams
    `<branch>-dkms` and `<branch>-open`. 10 has no modules: `dnf install` and a branch kept by
    `dnf versionlock '*nvidia*<branch>*'` (NVIDIA Driver Installation Guide 620, "Kernel
    Modules", table 5), key CDF6BA43.pub. NOT verified here (NVIDIA's repositories are
    unreachable).

Branches 590 and later (590, 595, 610, 615, 620) are listed for NVIDIA's repositories of every
release whose CUDA 13 support NVIDIA documents; they drive no Maxwell, Pascal or Volta GPU
(hardware.py). Which branch a node gets when none is pinned: the newest one NVIDIA still supports
(an LTSB or PB before its end of life, gpuprov/nvidia/driver_lifecycle.py) that drives every GPU; a
new feature branch only where no supported one fits, as NVIDIA advises datacenters.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from gpuprov.nvidia import driver_advisories, driver_lifecycle
from gpuprov.nvidia.hardware import NVIDIA_VENDOR_ID, Classification, classify, parse_pci_id

# NVIDIA's open kernel modules are production quality for datacenter GPUs from R515.
OPEN_MODULES_MIN_BRANCH = 515


@dataclasses.dataclass(frozen=True)
class InstallableBranch:
    branch: int
    packages: str  # how the nvidia_driver role gets it on this OS
    open_kernel_modules: bool  # an open-module flavour exists for this branch on this OS
    # The newest version the source offers, where gpuprov knows it ([debian]: checked with
    # apt-cache policy; a repository that moves on, NVIDIA's, has None): what the node gets.
    version: str | None = None


def _branches(*rows: tuple) -> tuple[InstallableBranch, ...]:
    return tuple(InstallableBranch(*row) for row in rows)


_UBUNTU_SERVER = "nvidia-driver-{b}-server / nvidia-headless-{b}-server[-open] (Ubuntu archive)"
_RHEL_MODULE = "dnf module nvidia-driver:{b}-dkms / {b}-open (NVIDIA CUDA repository)"
_RHEL_LOCK = ("nvidia-driver-cuda + kmod-nvidia[-open]-dkms {b}.x, kept on the branch by dnf "
              "versionlock (NVIDIA CUDA repository)")
_CUDA_APT = ("nvidia-driver-cuda + nvidia-kernel[-open]-dkms {b}.x, kept on the branch by "
             "nvidia-driver-pinning-{b} (NVIDIA CUDA repository)")
_CUDA_UBUNTU_NAMED = ("nvidia-dkms-{b}[-open] + libnvidia-compute-{b} + nvidia-utils-{b} "
                      "(NVIDIA CUDA repository)")
_CUDA_UBUNTU = ("nvidia-dkms[-open] + libnvidia-compute + nvidia-utils {b}.x, kept on the "
                "branch by nvidia-driver-pinning-{b} (NVIDIA CUDA repository)")
# Branches NVIDIA's CUDA 13 repositories carry from 590 on ([cuda-*] in the docstring).
_CUDA13 = (590, 595, 610, 615, 620)


def _cuda_ubuntu(*branches: int) -> tuple[InstallableBranch, ...]:
    return _branches(*((b, (_CUDA_UBUNTU if b >= 590 else _CUDA_UBUNTU_NAMED).format(b=b), True)
                       for b in branches))

# Where a node's driver packages come from (the nvidia_driver_source setting):
#   distro  the OS's own archive (Debian non-free, Ubuntu restricted);
#   nvidia  NVIDIA's CUDA repository for the OS (developer.download.nvidia.com/compute/cuda/
#           repos/<os><version>/<arch>), or a mirror of it.
DISTRO, NVIDIA = "distro", "nvidia"
SOURCES = (DISTRO, NVIDIA)
# The source a node gets when nvidia_driver_source is not set: its OS's own archive where that
# has drivers; RHEL's has none, so NVIDIA's repository is RHEL's only source.
DEFAULT_SOURCE = {"debian": DISTRO, "ubuntu": DISTRO, "rhel": NVIDIA}

# (os id, version, source) -> installable branches, oldest first.
OS_BRANCHES: dict[tuple[str, str, str], tuple[InstallableBranch, ...]] = {
    ("debian", "12", DISTRO): _branches(
        (470, "nvidia-tesla-470-* 470.256.02 (bookworm non-free)", False, "470.256.02"),
        (535, "nvidia-driver 535.261.03 / nvidia-open-kernel-dkms (bookworm non-free, contrib)",
         True, "535.261.03"),
    ),
    # trixie: nvidia-driver and nvidia-open-kernel-dkms 550.163.01; no nvidia-tesla-470.
    ("debian", "13", DISTRO): _branches(
        (550, "nvidia-driver 550.163.01 / nvidia-open-kernel-dkms (trixie non-free, contrib)",
         True, "550.163.01"),
    ),
    # [cuda-debian]: NVIDIA's repository for Debian 12 carries the branches since CUDA 12.3;
    # the one for Debian 13 starts with CUDA 13.0 (R580).
    ("debian", "12", NVIDIA): _branches(
        *((b, _CUDA_APT.format(b=b), True) for b in (550, 570, 575, 580, *_CUDA13)),
    ),
    ("debian", "13", NVIDIA): _branches(
        *((b, _CUDA_APT.format(b=b), True) for b in (580, *_CUDA13)),
    ),
    # [ubuntu]: 535, 550 and 570 are transitional packages there (TRANSITIONAL).
    ("ubuntu", "22.04", DISTRO): _branches(
        (470, _UBUNTU_SERVER.format(b=470), False),
        (580, _UBUNTU_SERVER.format(b=580), True),
    ),
    ("ubuntu", "24.04", DISTRO): _branches(
        (580, _UBUNTU_SERVER.format(b=580), True),
    ),
    ("ubuntu", "26.04", DISTRO): _branches(
        (580, _UBUNTU_SERVER.format(b=580), True),
    ),
    # From 580, the first branch with NVIDIA's version-lock packages for Ubuntu.
    ("ubuntu", "22.04", NVIDIA): _cuda_ubuntu(580, *_CUDA13),
    ("ubuntu", "24.04", NVIDIA): _cuda_ubuntu(580, *_CUDA13),
    ("ubuntu", "26.04", NVIDIA): _cuda_ubuntu(595, 610, 615, 620),
    ("rhel", "8", NVIDIA): _branches(
        (470, "dnf module nvidia-driver:470-dkms (NVIDIA CUDA repository)", False),
        *((b, _RHEL_MODULE.format(b=b), True) for b in (535, 550, 570, 575, 580, *_CUDA13)),
    ),
    ("rhel", "9", NVIDIA): _branches(
        *((b, _RHEL_MODULE.format(b=b), True) for b in (535, 550, 570, 575, 580, *_CUDA13)),
    ),
    ("rhel", "10", NVIDIA): _branches(
        *((b, _RHEL_LOCK.format(b=b), True) for b in (575, 580, *_CUDA13)),
    ),
}

# Branches whose packages an OS's archive keeps only as transitional packages that install
# another branch ([ubuntu]): (os, version, source) -> {asked: what it installs}.
TRANSITIONAL: dict[tuple[str, str, str], dict[int, int]] = {
    (os_id, version, DISTRO): {535: 580, 550: 580, 570: 580}
    for os_id, version in (("ubuntu", "22.04"), ("ubuntu", "24.04"), ("ubuntu", "26.04"))
}

# Ansible's ansible_distribution / os-release ID -> the key above.
_OS_ALIASES = {"debian": "debian", "ubuntu": "ubuntu", "rhel": "rhel", "redhat": "rhel",
               "rocky": "rhel"}


def normalise_os(os_id: str, os_version: str) -> tuple[str, str]:
    """('Rocky', '9.4') -> ('rhel', '9'); ('Debian', '12.7') -> ('debian', '12')."""
    family = _OS_ALIASES.get(os_id.strip().lower().replace(" ", ""), os_id.strip().lower())
    version = str(os_version).strip()
    if family != "ubuntu":
        version = version.split(".")[0]
    return family, version


def source_for(os_id: str, source: str | None) -> str:
    """The driver source a node uses: the setting, or its OS family's default. Raises
    ValueError for a source gpuprov does not know."""
    if source is None or not str(source).strip():
        return _default_source(normalise_os(os_id, "")[0])
    source = str(source).strip().lower()
    if source not in SOURCES:
        raise ValueError(f"driver source {source!r} is not one of {', '.join(SOURCES)} "
                         "(nvidia_driver_source)")
    return source


def installable_branches(os_id: str, os_version: str,
                         source: str | None = None) -> tuple[InstallableBranch, ...]:
    """Branches for the OS from the source, oldest first; empty when gpuprov does not
    support the OS with that source."""
    family, version = normalise_os(os_id, os_version)
    return OS_BRANCHES.get((family, version, source_for(os_id, source)), ())


def supported_os_names() -> str:
    return ", ".join(dict.fromkeys(f"{os_id} {version}" for os_id, version, _ in OS_BRANCHES))


def _not_offered(os_id: str, os_version: str, source: str) -> str:
    """Why an OS and source have no branches at all, and what to do."""
    sources = _sources_of(*normalise_os(os_id, os_version))
    if sources:
        return (f"{os_id} {os_version} has no driver source {source!r} in gpuprov: set "
                f"nvidia_driver_source to {' or '.join(sources)}")
    return (f"{os_id} {os_version} is not supported: gpuprov installs drivers on "
            f"{supported_os_names()}; reinstall the node with one of them")


def _default_source(family: str) -> str:
    return DEFAULT_SOURCE.get(family, DISTRO)


def _where(family: str, version: str, source: str) -> str:
    """"debian 12", or "debian 12 (nvidia)" where the source is not the OS's default."""
    return f"{family} {version}" + ("" if source == _default_source(family) else f" ({source})")


def _sources_of(family: str, version: str) -> list[str]:
    return [src for (f, v, src) in OS_BRANCHES if (f, v) == (family, version)]


@dataclasses.dataclass(frozen=True)
class BranchChoice:
    """The driver branch for one node, or why there is none (branch None, ok False)."""

    ok: bool
    branch: int | None
    reason: str  # one line: why this branch, or what is wrong and what to do
    os: str
    gpus: tuple[Classification, ...] = ()
    notes: tuple[str, ...] = ()  # per-GPU and per-decision remarks
    open_kernel_modules: bool = False  # every GPU and the branch on this OS support them
    open_kernel_modules_required: bool = False  # some GPU works only with them
    packages: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "branch": self.branch,
            "reason": self.reason,
            "os": self.os,
            "open_kernel_modules": self.open_kernel_modules,
            "open_kernel_modules_required": self.open_kernel_modules_required,
            "packages": self.packages,
            "notes": list(self.notes),
            "gpus": [gpu.to_dict() for gpu in self.gpus],
        }


def _label(gpu: Classification) -> str:
    return f"{gpu.name} ({gpu.pci_id})" if gpu.name else gpu.pci_id


def _pinned(value: int | str | None) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        branch = int(str(value).strip().split(".")[0])
    except ValueError:
        raise ValueError(f"pinned driver branch {value!r} is not a number like 535") from None
    if not driver_lifecycle.released(branch):
        # A typo (999, 585) would otherwise fall back to the newest installable branch.
        raise ValueError(f"pinned driver branch {branch} is not a branch NVIDIA released; "
                         f"its datacenter branches: {driver_lifecycle.released_list()}")
    return branch


def choose_branch(
    pci_ids: Iterable[str],
    os_id: str,
    os_version: str,
    pinned_branch: int | str | None = None,
    source: str | None = None,
    today: datetime.date | None = None,
    chip_names: Mapping[str, str | None] | None = None,
    allow_vulnerable: bool | None = None,
) -> BranchChoice:
    """Pick the node's driver branch: the pinned one if it drives every GPU and the OS can
    install it from the source, else the newest branch from the source that drives them all
    and NVIDIA still supports on `today` (an LTSB or PB; a new feature branch or an ended one
    only where none of those fits). A note says when the branch is past or near its end of
    life and which supported branches drive the GPUs.

    pci_ids are the node's PCI IDs ("10de:15f8"); devices of other vendors (a server's BMC
    VGA, say) are ignored. chip_names maps a PCI ID to its pci.ids name, which classifies a
    GPU the hardware table lacks by its chip's architecture (with a note that says so).
    source is nvidia_driver_source (None: the OS's default).

    Security (gpuprov/nvidia/driver_advisories.py): unpinned, a branch whose version from the
    source is known to lack NVIDIA's fixes, or that gets no fixes any more, gives way to the
    newest supported branch from the source that has them, where one drives every GPU. Where
    the chosen branch's known version is below its fixed version, the choice fails unless
    allow_vulnerable (nvidia_driver_allow_vulnerable) is True, which makes it a note; None
    (a caller that only asks what gpu_preflight would choose) makes it a note too. Raises
    ValueError
    (hardware.InvalidPciId) only for text that is not a PCI ID, a pinned branch that is not a
    number or not a released branch, or a source gpuprov does not know.
    """
    pin = _pinned(pinned_branch)
    family, version = normalise_os(os_id, os_version)
    source = source_for(os_id, source)
    os_name = _where(family, version, source)
    today = today or datetime.date.today()
    names = {str(k).lower(): v for k, v in (chip_names or {}).items()}
    gpus = tuple(
        classify(pci_id, chip_name=names.get(pci_id.strip().lower()))
        for pci_id in pci_ids
        if parse_pci_id(pci_id)[0] == NVIDIA_VENDOR_ID
    )
    if not gpus:
        return BranchChoice(ok=True, branch=None, reason="no NVIDIA GPU", os=os_name)

    def fail(reason: str, notes: tuple[str, ...] = ()) -> BranchChoice:
        return BranchChoice(ok=False, branch=None, reason=reason, os=os_name, gpus=gpus,
                            notes=notes)

    offered = OS_BRANCHES.get((family, version, source))
    if offered is None:
        return fail(_not_offered(os_id, os_version, source))

    legacy = [g for g in gpus if g.status == "legacy"]
    if legacy:
        names = ", ".join(_label(g) for g in legacy)
        return fail(f"{names}: legacy GPU served only by driver branch "
                    f"{legacy[0].max_branch}.xx, which current kernels cannot build; "
                    "remove it from the node (no supported OS can drive it)")

    unknown = [g for g in gpus if g.status == "unknown"]
    known = [g for g in gpus if g.status == "supported"]
    notes = [f"{_label(g)}: unknown to gpuprov's hardware table, support not checked"
             for g in unknown]
    notes += [f"warning: {g.message}" for g in known if g.source == "pci.ids"]
    open_required = any(g.model is not None and g.model.open_kernel_modules_required
                        for g in known)

    conflict = _conflict(known)
    if conflict:
        return fail(conflict, tuple(notes))

    def drives_all(candidate: InstallableBranch) -> bool:
        if open_required and not candidate.open_kernel_modules:
            return False
        return all(g.supports_branch(candidate.branch) for g in known)

    fitting = [b for b in offered if drives_all(b)]
    by_branch = {b.branch: b for b in offered}

    if unknown and pin is None:
        return fail(f"{', '.join(_label(g) for g in unknown)}: unknown GPU, gpuprov cannot "
                    "tell which driver branch supports it; pin one NVIDIA lists for it "
                    "(nvidia_driver_branch)", tuple(notes))

    really = TRANSITIONAL.get((family, version, source), {}).get(pin or 0)
    if really is not None:
        return fail(f"pinned branch {pin}: {os_name}'s packages of branch {pin} are transitional "
                    f"and install {really}; pin {really} (or a newer branch from NVIDIA's "
                    "repository: nvidia_driver_source: nvidia)",
                    tuple(notes))

    chosen = None
    if pin is not None:
        chosen = by_branch.get(pin)
        if chosen is not None and drives_all(chosen):
            reason = f"pinned branch {pin} drives every GPU and installs on {os_name}"
        else:
            notes.extend(_pin_unusable(pin, chosen, offered, known, open_required, os_name))
            chosen = None
    if chosen is None:
        if not fitting:
            return fail(_nothing_fits(known, offered, os_name, open_required), tuple(notes))
        chosen, reason = _prefer_fixed(*_newest(fitting, os_name, today), fitting, os_name,
                                       today, notes, pin)
    refused = _security_gate(chosen, (family, version, os_name), known, open_required, today,
                             allow_vulnerable, notes)
    if refused is not None:
        return fail(refused, tuple(notes))

    open_ok = (chosen.open_kernel_modules and chosen.branch >= OPEN_MODULES_MIN_BRANCH
               and all(g.open_kernel_modules for g in known) and not unknown)
    return BranchChoice(ok=True, branch=chosen.branch, reason=reason, os=os_name, gpus=gpus,
                        notes=tuple(notes), open_kernel_modules=open_ok,
                        open_kernel_modules_required=open_required, packages=chosen.packages)


def _conflict(known: list[Classification]) -> str | None:
    """Why no driver can drive all these GPUs together, whatever the OS: their branch ranges
    do not meet, or one works only with the open kernel modules (Blackwell, Grace Hopper) and
    another only with the proprietary ones (before Turing); a node loads one module."""
    lowest_gpu = max(known, key=lambda g: g.min_branch or 0, default=None)
    capped = [g for g in known if g.max_branch is not None]
    highest_gpu = min(capped, key=lambda g: g.max_branch or 0, default=None)
    if lowest_gpu and highest_gpu and lowest_gpu.min_branch > highest_gpu.max_branch:
        return (f"{_label(highest_gpu)} needs branch <= {highest_gpu.max_branch} and "
                f"{_label(lowest_gpu)} needs >= {lowest_gpu.min_branch}: no single driver "
                "branch drives both; split these GPUs across nodes")
    closed_only = [g for g in known if g.open_kernel_modules is False]
    needs_open = [g for g in known if g.model is not None and g.model.open_kernel_modules_required]
    if needs_open and closed_only:
        return (f"{_label(needs_open[0])} works only with NVIDIA's open kernel modules and "
                f"{_label(closed_only[0])} ({closed_only[0].architecture}) only with the "
                "proprietary ones: no single driver drives both; split these GPUs across nodes")
    return None


def _pin_unusable(pin: int, pinned: InstallableBranch | None,
                  offered: tuple[InstallableBranch, ...], known: list[Classification],
                  open_required: bool, os_name: str) -> list[str]:
    """Why the pinned branch cannot be used on this node (notes)."""
    if pinned is None:
        return [f"pinned branch {pin} is not installable on {os_name} "
                f"(offered: {', '.join(str(b.branch) for b in offered)})"]
    notes = [f"pinned branch {pin} does not support {_label(g)} "
             f"(branches {g.min_branch}-{g.max_branch or 'current'})"
             for g in known if not g.supports_branch(pin)]
    if open_required and not pinned.open_kernel_modules:
        notes.append(f"pinned branch {pin} has no open kernel modules on {os_name}")
    return notes


def _newest(fitting: list[InstallableBranch], os_name: str,
            today: datetime.date) -> tuple[InstallableBranch, str]:
    """The newest fitting branch NVIDIA still supports, else the newest fitting one."""
    supported = {b.branch: b for b in driver_lifecycle.supported(today)}
    maintained = [b for b in fitting if b.branch in supported]
    if maintained:
        info = supported[maintained[-1].branch]
        return maintained[-1], (f"newest branch NVIDIA supports ({info.kind} to {info.eol}) "
                                f"installable on {os_name} that drives every GPU")
    return fitting[-1], (f"newest branch installable on {os_name} that drives every GPU "
                         "(none that NVIDIA still supports does)")


def below_floor(offered: InstallableBranch, os_name: str) -> str | None:
    """One line when the version the source offers for the branch is known and lacks fixes of
    NVIDIA's bulletins for it; None otherwise (unknown version, or every fix)."""
    if offered.version is None:
        return None
    found = driver_advisories.assess(offered.version)
    if not found.vulnerable:
        return None
    return (f"{os_name}'s R{offered.branch} is {offered.version}, below its fixed version "
            f"{found.install} ({found.below_text()})")


def _unfixed(offered: InstallableBranch, os_name: str) -> str | None:
    """Why the branch from this source lacks NVIDIA's fixes: its known version is below the
    floor, or the branch gets no fixes from later bulletins (it ended); None where neither."""
    below = below_floor(offered, os_name)
    if below is not None:
        return below
    missed = driver_advisories.missed(offered.branch)
    if missed:
        return (f"R{offered.branch} gets no fixes from NVIDIA bulletin "
                + ", ".join(str(b.bulletin) for b in missed))
    return None


def _security_gate(chosen: InstallableBranch, where: tuple[str, str, str],
                   known: list[Classification],
                   open_required: bool, today: datetime.date, allow_vulnerable: bool | None,
                   notes: list[str]) -> str | None:
    """Notes on the chosen branch (its end of life, its fixes), and why the choice fails: the
    source's known version of the branch lacks NVIDIA's fixes and the admin did not accept it
    (allow_vulnerable False); accepted or not asked, a note."""
    ending = eol_warning(chosen.branch, known, today)
    if ending:
        notes.append(ending)
    family, version, os_name = where
    below = below_floor(chosen, os_name)
    if below is None:
        return None
    if allow_vulnerable is False:
        return (f"{below}; {_fixed_elsewhere(family, version, known, open_required, today)}, "
                "or set nvidia_driver_allow_vulnerable: true to accept the risk")
    notes.append(f"security: {below}"
                 + (" (accepted: nvidia_driver_allow_vulnerable)" if allow_vulnerable else ""))
    return None


def _prefer_fixed(chosen: InstallableBranch, reason: str, fitting: list[InstallableBranch],
                  os_name: str, today: datetime.date, notes: list[str],
                  pin: int | None) -> tuple[InstallableBranch, str]:
    """The newest fitting branch (a pin could not be used: said in the reason), or, unpinned,
    the newest supported fitting branch with NVIDIA's fixes where that one lacks them (a note
    says why)."""
    if pin is not None:
        return chosen, f"{reason} (pinned {pin} cannot be used)"
    fixed = _fixed_instead(chosen, fitting, today)
    if fixed is None:
        return chosen, reason
    notes.append(f"security: {_unfixed(chosen, os_name)}: chose R{fixed.branch}, the newest "
                 "supported branch with NVIDIA's fixes")
    return fixed, (f"newest branch with NVIDIA's security fixes installable on {os_name} that "
                   "drives every GPU")


def _fixed_instead(chosen: InstallableBranch, fitting: list[InstallableBranch],
                   today: datetime.date) -> InstallableBranch | None:
    """The newest fitting branch NVIDIA supports whose offered version has every fix, where
    the chosen one lacks some; None where the chosen one has them or no other does."""
    if _unfixed(chosen, "") is None:
        return None
    supported = {b.branch for b in driver_lifecycle.supported(today)}
    fixed = [b for b in fitting if b.branch in supported and _unfixed(b, "") is None]
    return fixed[-1] if fixed else None


def _fixed_elsewhere(family: str, version: str, known: list[Classification],
                     open_required: bool, today: datetime.date) -> str:
    """What to do about a known-vulnerable branch: the newest fixed branch another source of
    this OS offers for these GPUs, or a branch pin."""
    supported = {b.branch for b in driver_lifecycle.supported(today)}
    for (f, v, src), branches in OS_BRANCHES.items():
        if (f, v) != (family, version):
            continue
        fixed = [b for b in branches if b.branch in supported and _unfixed(b, "") is None
                 and all(g.supports_branch(b.branch) for g in known)
                 and (b.open_kernel_modules or not open_required)]
        if fixed:
            found = driver_advisories.floor(fixed[-1].branch)
            floor = f", {found[0]} or newer" if found else ""
            return f"set nvidia_driver_source: {src} (it offers R{fixed[-1].branch}{floor})"
    return (f"no driver source gpuprov knows for {family} {version} offers a fixed branch for "
            "these GPUs")


def eol_warning(branch: int, gpus: Iterable[Classification],
                today: datetime.date) -> str | None:
    """One line when the branch is past NVIDIA's end of life or ends within
    driver_lifecycle.EOL_WARNING_DAYS, with the supported branches that drive every one of
    the GPUs (the way out); None otherwise. gpu_preflight, `gpuprov hw choose` and verify's
    driver.branch-eol say it in these words."""
    ending = driver_lifecycle.eol_note(branch, today)
    if ending is None:
        return None
    gpus = [g for g in gpus if g.min_branch is not None]
    ways_out = [b for b in driver_lifecycle.supported(today)
                if b.branch != branch and all(g.supports_branch(b.branch) for g in gpus)]
    if not ways_out:
        return f"{ending}: no supported branch drives these GPUs"
    return (f"{ending}: move to " + " or ".join(
        f"R{b.branch} ({b.kind}, to {b.eol})" for b in reversed(ways_out)))


def _nothing_fits(known: list[Classification], offered: tuple[InstallableBranch, ...],
                  os_name: str, open_required: bool) -> str:
    lo = max(g.min_branch or 0 for g in known)
    caps = [g.max_branch for g in known if g.max_branch is not None]
    wanted = f"{lo}-{min(caps)}" if caps else f">= {lo}"
    elsewhere = [_where(*key) for key, branches in OS_BRANCHES.items()
                 if _where(*key) != os_name
                 and any(all(g.supports_branch(b.branch) for g in known)
                         and (b.open_kernel_modules or not open_required) for b in branches)]
    hint = (f"use an OS or driver source that offers one ({', '.join(elsewhere)})" if elsewhere
            else "no OS gpuprov supports offers one yet")
    return (f"the GPUs need driver branch {wanted}"
            + (" with open kernel modules" if open_required else "")
            + f" but {os_name} offers {', '.join(str(b.branch) for b in offered)}; {hint}")
