"""The one place the lab runs podman, always with the repo's containers.conf.

Podman only works on these machines with the settings in image/containers.conf
(runc, modest ulimits); pointing CONTAINERS_CONF at it keeps the machine's /etc untouched.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from gpuprov.errors import GpuprovError

log = logging.getLogger(__name__)

CONTAINERS_CONF = Path(__file__).parent / "image" / "containers.conf"


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = str(CONTAINERS_CONF)
    return env


def podman(*args: str, check: bool = True, input: bytes | None = None,
           timeout: float | None = 300, stream: bool = False) -> subprocess.CompletedProcess:
    """Run podman; on failure raise GpuprovError with podman's own last line."""
    if shutil.which("podman") is None:
        raise GpuprovError("podman is not installed: run `make deps` (apt-get install podman runc)")
    cmd = ["podman", *args]
    log.debug("+ %s", " ".join(cmd))
    proc = subprocess.run(
        cmd,
        env=environment(),
        input=input,
        stdout=None if stream else subprocess.PIPE,
        stderr=None if stream else subprocess.PIPE,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        detail = (proc.stderr or b"").decode(errors="replace").strip().splitlines()
        last = detail[-1] if detail else f"exit code {proc.returncode}"
        raise GpuprovError(f"podman {args[0]} failed: {last}")
    return proc


def output(*args: str, **kwargs) -> str:
    return podman(*args, **kwargs).stdout.decode().strip()


def image_exists(ref: str) -> bool:
    return podman("image", "exists", ref, check=False).returncode == 0
