"""Where the lab and the tests keep what they download or build once per machine.

Outside the checkout, so that a fresh clone on a machine that has run the suite before
downloads and builds nothing again (Debian's containerd packages and the CRI api.proto,
the stubs generated from it, the apt archives of the lab's nodes, the pod image archive, the
compiled simulated NVML): `GPUPROV_CACHE_DIR`, else `$XDG_CACHE_HOME/gpuprov`, else
`~/.cache/gpuprov`, as the XDG base directory specification places a user's caches.
scripts/fetch-containerd.sh computes the same directory in shell.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    given = os.environ.get("GPUPROV_CACHE_DIR")
    if given:
        return Path(given).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "gpuprov"


CACHE = cache_dir()
CONTAINERD = CACHE / "containerd"  # scripts/fetch-containerd.sh: <suite>/ and cri-api/
