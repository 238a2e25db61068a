"""Build (once, cached) the lab's Debian 12 node image and its pod image.

Each is tagged with a hash of its inputs so that a change rebuilds only what it affects and an
unchanged tree reuses podman's storage as the cache:
- base: `debootstrap --variant=minbase bookworm` from Debian's own archive, imported;
- node: image/Containerfile on top (systemd, sshd, python3, simulation hooks);
- pod: image/pod/Containerfile from the base (sh, sleep, python3; pruned): what the lab's pods
  run in the nodes' containerd, saved once as an archive the nodes import.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from gpuprov.errors import GpuprovError
from gpuprov.lab import podman

log = logging.getLogger(__name__)

IMAGE_DIR = Path(__file__).parent / "image"
SUITE = "bookworm"
MIRROR = os.environ.get("GPUPROV_DEBIAN_MIRROR", "http://deb.debian.org/debian")
DEBOOTSTRAP_ARGS = ("--variant=minbase", SUITE)
NODE_REPO = "localhost/gpuprov-node"
BASE_REPO = "localhost/gpuprov-base"
POD_REPO = "localhost/gpuprov-pod"
POD_DIR = IMAGE_DIR / "pod"


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:12]


def base_ref() -> str:
    return f"{BASE_REPO}:{_digest(*(a.encode() for a in DEBOOTSTRAP_ARGS), MIRROR.encode())}"


def node_ref() -> str:
    files = sorted(p for p in IMAGE_DIR.iterdir() if p.is_file() and p.name != "containers.conf")
    inputs = (p.name.encode() + p.read_bytes() for p in files)
    return f"{NODE_REPO}:{_digest(base_ref().encode(), *inputs)}"


def pod_ref() -> str:
    containerfile = POD_DIR / "Containerfile"
    return f"{POD_REPO}:{_digest(base_ref().encode(), containerfile.read_bytes())}"


def _build_base(ref: str) -> None:
    if shutil.which("debootstrap") is None:
        raise GpuprovError("debootstrap is not installed: run `make deps`")
    log.warning("building the lab base image %s with debootstrap (about 30 s, once)", ref)
    with tempfile.TemporaryDirectory(prefix="gpuprov-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        proc = subprocess.run(
            ["debootstrap", *DEBOOTSTRAP_ARGS, str(rootfs), MIRROR],
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


def _ensure_base() -> str:
    base = base_ref()
    if not podman.image_exists(base):
        _build_base(base)
    return base


def ensure_pod_archive(cache_dir: Path) -> tuple[str, Path]:
    """(reference, archive) of the pod image: built and saved (`podman save`, docker-archive,
    which `ctr images import` reads) into cache_dir, where missing."""
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


def ensure_node_image() -> str:
    """Return the node image reference, building what is missing."""
    base = _ensure_base()
    ref = node_ref()
    if not podman.image_exists(ref):
        log.warning("building the lab node image %s (about 30 s, once)", ref)
        podman.podman(
            "build", "--network", "host", "--build-arg", f"BASE={base}",
            "-t", ref, "-t", f"{NODE_REPO}:latest", "-f", str(IMAGE_DIR / "Containerfile"),
            str(IMAGE_DIR), timeout=900,
        )
    return ref
