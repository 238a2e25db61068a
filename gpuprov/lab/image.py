"""Build (once, cached) the lab's Debian 12 node image.

Two layers, each tagged with a hash of its inputs so that a change rebuilds only what
it affects and an unchanged tree reuses podman's storage as the cache:
- base: `debootstrap --variant=minbase bookworm` from Debian's own archive, imported;
- node: image/Containerfile on top (systemd, sshd, python3, simulation hooks).
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


def ensure_node_image() -> str:
    """Return the node image reference, building what is missing."""
    base = base_ref()
    if not podman.image_exists(base):
        _build_base(base)
    ref = node_ref()
    if not podman.image_exists(ref):
        log.warning("building the lab node image %s (about 30 s, once)", ref)
        podman.podman(
            "build", "--network", "host", "--build-arg", f"BASE={base}",
            "-t", ref, "-t", f"{NODE_REPO}:latest", "-f", str(IMAGE_DIR / "Containerfile"),
            str(IMAGE_DIR), timeout=900,
        )
    return ref
