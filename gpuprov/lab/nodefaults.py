"""SIMULATION: the lab's faults in a node's own files (layer "node" of lab/faults.py).

`containerd-config-rewritten`: /etc/containerd/config.toml replaced by the node's real
`containerd config default` (no imports of conf.d, no nvidia runtime), as an installer that
"resets" containerd's config does; the admin's file is kept aside and put back on clearing.
containerd is not restarted (it keeps what it loaded), so only a reader of the config sees it.

`next-kernel-no-module`: a kernel upgrade whose module was never built. The node gets
/boot/vmlinuz-RELEASE and /lib/modules/RELEASE/ with a modules.dep that lists no nvidia
module, as a Debian kernel package leaves them when DKMS had no headers to build with.
RELEASE is a real one: the release the node's archive has headers for now (what its
linux-headers-<flavour> meta-package depends on, from the node's apt lists), so that the
driver role's fix (those headers, then DKMS) really builds the module for it. What it does
not do: install the kernel package itself (the image is an empty placeholder, not a kernel;
its postinst hooks do not run) or change what the node boots (a container boots nothing).

Clearing removes what the fault wrote and what a fix built on it: the headers packages of
that release (purged, with the dependencies they alone pulled in), DKMS's build tree for
it, /lib/modules/RELEASE and the image. The release is kept in the node
(RELEASE_FILE), so `lab status` lists the fault and clearing finds it.

The switch is written into the container with `podman exec` and recorded in the node's
directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuprov.errors import GpuprovError
from gpuprov.lab import podman

STATE_FILE = "node-faults.json"
RELEASE_FILE = "/var/lib/gpuprov-sim/next-kernel"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_ASIDE = "/var/lib/gpuprov-sim/containerd-config.toml"
# The headers meta-package of the lab's kernel flavour names the newest release (apt-cache
# depends prints "  Depends: linux-headers-6.1.0-50-amd64").
_NEWEST_RELEASE = ("apt-cache depends linux-headers-amd64 2>/dev/null"
                   " | sed -n 's/^ *Depends: linux-headers-\\([0-9].*\\)$/\\1/p' | head -n 1")
_SET = {
    "next-kernel-no-module": (
        f"set -e; r=$({_NEWEST_RELEASE}); "
        "if [ -z \"$r\" ]; then echo 'no linux-headers-amd64 in the apt lists: run site.yml "
        "(or apt-get update) on the node first' >&2; exit 1; fi; "
        f"mkdir -p /boot /lib/modules/$r/kernel \"$(dirname {RELEASE_FILE})\"; "
        ": > /boot/vmlinuz-$r; : > /lib/modules/$r/modules.dep; "
        f"echo $r > {RELEASE_FILE}; echo $r"),
    # An installer (a Kubernetes distribution's, a package's postinst) writes containerd's
    # default config over the admin's: the real containerd's own `config default`, which has
    # no `imports` of conf.d and no nvidia runtime. containerd keeps running with what it
    # loaded; the next restart would lose the NVIDIA runtime.
    "containerd-config-rewritten": (
        f"set -e; [ -e {CONTAINERD_ASIDE} ] || {{ mkdir -p \"$(dirname {CONTAINERD_ASIDE})\"; "
        f"cp -p {CONTAINERD_CONFIG} {CONTAINERD_ASIDE}; }}; "
        f"containerd config default > {CONTAINERD_CONFIG}.new; "
        f"mv {CONTAINERD_CONFIG}.new {CONTAINERD_CONFIG}"),
}
_CLEAR = {
    "next-kernel-no-module": (
        f"[ -s {RELEASE_FILE} ] || exit 0; r=$(cat {RELEASE_FILE}); "
        "if dpkg -s linux-headers-$r >/dev/null 2>&1; then "
        "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q --autoremove linux-headers-$r "
        ">/dev/null; fi; "
        "rm -rf /boot/vmlinuz-$r /lib/modules/$r /var/lib/dkms/*/*/$r /var/lib/dkms/*/kernel-$r-* "
        f"{RELEASE_FILE}"),
    "containerd-config-rewritten": (
        f"[ -e {CONTAINERD_ASIDE} ] || exit 0; mv {CONTAINERD_ASIDE} {CONTAINERD_CONFIG}"),
}


def next_kernel(container: str) -> str | None:
    """The release the fault installed in the node, None where it is not set."""
    out = podman.podman("exec", container, "cat", RELEASE_FILE, check=False)
    if out.returncode != 0:
        return None
    return out.stdout.decode().strip() or None


def active_faults(node_dir: Path) -> list[str]:
    try:
        return list(json.loads((node_dir / STATE_FILE).read_text()))
    except (OSError, ValueError):
        return []


def _record(node_dir: Path, faults: list[str]) -> None:
    (node_dir / STATE_FILE).write_text(json.dumps(faults))


def set_fault(node_dir: Path, container: str, fault: str) -> None:
    done = podman.podman("exec", container, "sh", "-c", _SET[fault], check=False)
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()
        raise GpuprovError(f"fault {fault}: "
                           f"{detail[-1] if detail else f'exit code {done.returncode}'}")
    active = active_faults(node_dir)
    if fault not in active:
        _record(node_dir, [*active, fault])


def clear_fault(node_dir: Path, container: str, fault: str) -> None:
    podman.podman("exec", container, "sh", "-c", _CLEAR[fault])
    _record(node_dir, [f for f in active_faults(node_dir) if f != fault])
