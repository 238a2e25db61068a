"""Build (once, cached) the lab's node images, one per node OS, and its pod image.

Each is tagged with a hash of its inputs so that a change rebuilds only what it affects and an
unchanged tree reuses podman's storage as the cache:
- base: `debootstrap --variant=minbase SUITE` from Debian's own archive, imported (per OS);
- node: image/Containerfile on top (systemd, sshd, python3, containerd, simulation hooks);
- docker: image/docker/Containerfile on a node image (Debian's docker.io: Docker hosts);
- pod: image/pod/Containerfile from the Debian 12 base (sh, sleep, python3; pruned): what the
  lab's pods run in the nodes' containerd, saved once as an archive the nodes import.

NODE_OSES is the one list of node operating systems the lab can build. Each is a Debian
release as admins install it, with that release's containerd, except where the lab takes a
newer containerd from Debian unstable (`containerd_from`): Debian 13 nodes run containerd 2.x,
as current Kubernetes distributions do, and no Debian release ships 2.x yet. That is a
lab-only choice made in the image (the Containerfile says how); the roles never pin suites.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuprov.errors import GpuprovError
from gpuprov.lab import podman
from gpuprov.lab.cache import CACHE

log = logging.getLogger(__name__)

IMAGE_DIR = Path(__file__).parent / "image"
MIRROR = os.environ.get("GPUPROV_DEBIAN_MIRROR", "http://deb.debian.org/debian")


@dataclass(frozen=True)
class NodeOs:
    name: str  # os-release ID-VERSION_ID, as `gpuprov hw` and the lab's profiles spell it
    suite: str  # the Debian release debootstrap installs
    containerd_from: str = ""  # another suite the image takes containerd from ("" = its own)

    @property
    def debootstrap_args(self) -> tuple[str, ...]:
        return ("--variant=minbase", self.suite)

    @property
    def build_args(self) -> dict[str, str]:
        return {"CONTAINERD_FROM": self.containerd_from}


NODE_OSES: dict[str, NodeOs] = {
    o.name: o
    for o in (
        NodeOs("debian-12", "bookworm"),  # containerd 1.6.20
        NodeOs("debian-13", "trixie", containerd_from="unstable"),  # containerd 2.1.x
    )
}
DEFAULT_OS = "debian-12"
NODE_REPO = "localhost/gpuprov-node"
BASE_REPO = "localhost/gpuprov-base"
POD_REPO = "localhost/gpuprov-pod"
POD_DIR = IMAGE_DIR / "pod"
DOCKER_REPO = "localhost/gpuprov-docker"
DOCKER_DIR = IMAGE_DIR / "docker"


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:12]


def node_os(name: str) -> NodeOs:
    try:
        return NODE_OSES[name]
    except KeyError:
        raise GpuprovError(f"the lab cannot build node OS {name!r}; it builds: "
                           f"{', '.join(NODE_OSES)}") from None


def base_ref(os_name: str = DEFAULT_OS) -> str:
    args = node_os(os_name).debootstrap_args
    return f"{BASE_REPO}:{_digest(*(a.encode() for a in args), MIRROR.encode())}"


def node_ref(os_name: str = DEFAULT_OS) -> str:
    files = sorted(p for p in IMAGE_DIR.iterdir() if p.is_file() and p.name != "containers.conf")
    inputs = (p.name.encode() + p.read_bytes() for p in files)
    build_args = (f"{k}={v}".encode() for k, v in sorted(node_os(os_name).build_args.items()))
    return f"{NODE_REPO}:{_digest(base_ref(os_name).encode(), *build_args, *inputs)}"


def docker_ref(os_name: str = DEFAULT_OS) -> str:
    inputs = (p.name.encode() + p.read_bytes() for p in sorted(DOCKER_DIR.iterdir()))
    return f"{DOCKER_REPO}:{_digest(node_ref(os_name).encode(), *inputs)}"


def pod_ref() -> str:
    containerfile = POD_DIR / "Containerfile"
    return f"{POD_REPO}:{_digest(base_ref().encode(), containerfile.read_bytes())}"


def _build_base(ref: str, os_name: str) -> None:
    if shutil.which("debootstrap") is None:
        raise GpuprovError("debootstrap is not installed: run `make deps`")
    args = node_os(os_name).debootstrap_args
    log.warning("building the lab's %s base image %s with debootstrap (about 30 s, once)",
                os_name, ref)
    with tempfile.TemporaryDirectory(prefix="gpuprov-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        proc = subprocess.run(
            ["debootstrap", *args, str(rootfs), MIRROR],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False,
        )
        if proc.returncode != 0:
            tail = proc.stdout.decode(errors="replace").strip().splitlines()[-3:]
            raise GpuprovError(f"debootstrap failed ({MIRROR}): {' | '.join(tail)}")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            podman.podman("import", "-", ref, input=tar.stdout.read(), timeout=600)
        finally:
            tar.wait()


def _ensure_base(os_name: str = DEFAULT_OS) -> str:
    base = base_ref(os_name)
    if not podman.image_exists(base):
        _build_base(base, os_name)
    return base


@contextlib.contextmanager
def _building() -> Iterator[None]:
    """Held while an image is checked for and built: labs started side by side (the test
    suite's workers, a demo beside the tests) must not build the same image twice at once."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "images.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_pod_archive(cache_dir: Path) -> tuple[str, Path]:
    """(reference, archive) of the pod image: built and saved (`podman save`, docker-archive,
    which `ctr images import` reads) into cache_dir, where missing."""
    with _building():
        return _ensure_pod_archive(cache_dir)


def _ensure_pod_archive(cache_dir: Path) -> tuple[str, Path]:
    ref = pod_ref()
    archive = cache_dir / f"{ref.rpartition('/')[2].replace(':', '-')}.tar"
    if archive.is_file():
        return ref, archive
    if not podman.image_exists(ref):
        log.warning("building the lab pod image %s (about 15 s, once)", ref)
        podman.podman("build", "--network", "host", "--build-arg", f"BASE={_ensure_base()}",
                      "-t", ref, "-f", str(POD_DIR / "Containerfile"), str(POD_DIR),
                      timeout=900)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_suffix(f".tmp{os.getpid()}")
    podman.podman("save", "--output", str(tmp), ref, timeout=300)
    tmp.replace(archive)
    return ref, archive


def ensure_node_image(os_name: str = DEFAULT_OS) -> str:
    """Return the reference of the node image for os_name, building what is missing."""
    with _building():
        return _ensure_node_image(os_name)


def _ensure_node_image(os_name: str) -> str:
    base = _ensure_base(os_name)
    ref = node_ref(os_name)
    if not podman.image_exists(ref):
        log.warning("building the lab's %s node image %s (about 60 s, once)", os_name, ref)
        build_args = [f"--build-arg={k}={v}" for k, v in node_os(os_name).build_args.items()]
        podman.podman(
            "build", "--network", "host", "--build-arg", f"BASE={base}", *build_args,
            "-t", ref, "-t", f"{NODE_REPO}:{os_name}", "-f", str(IMAGE_DIR / "Containerfile"),
            str(IMAGE_DIR), timeout=900,
        )
    return ref


def ensure_docker_image(os_name: str = DEFAULT_OS) -> str:
    """The Docker host image for os_name (image/docker/Containerfile on the node image),
    building what is missing."""
    with _building():
        node = _ensure_node_image(os_name)
        ref = docker_ref(os_name)
        if not podman.image_exists(ref):
            log.warning("building the lab's %s Docker host image %s (about 30 s, once)",
                        os_name, ref)
            podman.podman(
                "build", "--network", "host", "--build-arg", f"NODE={node}",
                "--build-arg", f"SUITE={node_os(os_name).suite}", "-t", ref,
                "-f", str(DOCKER_DIR / "Containerfile"), str(DOCKER_DIR), timeout=900,
            )
        return ref
