"""What `gpuprov lab up` needs on this machine, checked before it starts anything.

Without this, a missing piece surfaces late and quietly: after `pip install -e .` (no dev
extras) the lab came up, but its kubelet raised `ModuleNotFoundError: grpc` on every pass and
no pod ever started. Each need names the command that provides it; `check()` reports every
missing one in one line (exit 2), so a new user fixes them in one go.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
from collections.abc import Callable

from gpuprov.errors import GpuprovError

DEPS = "make deps"  # scripts/install-system-deps.sh: Debian packages, as root
DEV_EXTRAS = "pip install -e '.[dev]'"
CONTAINERD_BINS = "make containerd-bins"


@dataclasses.dataclass(frozen=True)
class Need:
    name: str  # what is missing, as the user would look for it
    why: str  # what the lab uses it for
    install: str  # the command that provides it
    present: Callable[[], bool]


def _program(name: str) -> Callable[[], bool]:
    return lambda: shutil.which(name) is not None


def _module(name: str) -> Callable[[], bool]:
    def present() -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing, or a broken one
            return False

    return present


def _cri_proto() -> bool:
    from gpuprov.lab.kube import cri

    return cri.PROTO.is_file()


NEEDS: tuple[Need, ...] = (
    Need("podman", "runs the lab's nodes", DEPS, _program("podman")),
    Need("runc", "podman's runtime on these machines (containers.conf)", DEPS, _program("runc")),
    Need("debootstrap", "builds the nodes' Debian images", DEPS, _program("debootstrap")),
    Need("gcc", "compiles the simulated NVML library", DEPS, _program("gcc")),
    Need("ssh-keygen", "makes the nodes' host keys and the admin key", DEPS,
         _program("ssh-keygen")),
    Need("gpg", "signs the lab's package repositories", DEPS, _program("gpg")),
    Need("dpkg-scanpackages", "indexes the lab's package repositories", DEPS,
         _program("dpkg-scanpackages")),
    Need("grpcio", "the lab's kubelet talks to each node's containerd through the CRI",
         DEV_EXTRAS, _module("grpc")),
    Need("grpcio-tools", "generates the CRI stubs from api.proto", DEV_EXTRAS,
         _module("grpc_tools")),
    Need("kubernetes-validate", "the emulated API validates every write against the official "
         "schemas", DEV_EXTRAS, _module("kubernetes_validate")),
    Need("the CRI api.proto", "the CRI stubs are generated from it", CONTAINERD_BINS,
         _cri_proto),
)


def missing(needs: tuple[Need, ...] = NEEDS) -> list[Need]:
    return [need for need in needs if not need.present()]


def check(needs: tuple[Need, ...] = NEEDS) -> None:
    """Raise GpuprovError (exit 2) naming every missing need and what installs it."""
    lacking = missing(needs)
    if not lacking:
        return
    commands = list(dict.fromkeys(need.install for need in lacking))
    what = "; ".join(f"{need.name} ({need.why})" for need in lacking)
    raise GpuprovError(f"the lab cannot start, this machine lacks: {what}; run "
                       + " and ".join(f"`{c}`" for c in commands))
