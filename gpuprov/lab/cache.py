"""Where the lab and the tests keep what they download or build once per machine.

gpuprov's own cache directory (gpuprov.payload.cache_dir: GPUPROV_CACHE_DIR, else
$XDG_CACHE_HOME/gpuprov, else ~/.cache/gpuprov), outside the checkout, so that a fresh clone on
a machine that has run the suite before downloads and builds nothing again: Debian's
containerd packages, kubectl and the .proto files (scripts/fetch-containerd.sh computes the
same directory in shell), the stubs generated from them, the apt archives of the lab's nodes,
the pod image archive, the compiled simulated NVML.
"""

from __future__ import annotations

from gpuprov.payload import cache_dir

CACHE = cache_dir()
CONTAINERD = CACHE / "containerd"  # scripts/fetch-containerd.sh: <suite>/, cri-api/, kubectl/
