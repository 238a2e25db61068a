"""Helpers for tests of the emulator and of code that talks to it (no containers needed)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from gpuprov.lab import profiles
from gpuprov.lab.cache import CONTAINERD
from gpuprov.lab.kube.app import Emulator, write_kubeconfig
from gpuprov.lab.kube.backend import FakeBackend, FakeNode, Gpu, GpuFacts, RuntimeConfig

T = TypeVar("T")

NVIDIA_CONTAINERD = RuntimeConfig(frozenset({"nvidia"}), "nvidia")
PLAIN_CONTAINERD = RuntimeConfig()
# The toolkit's config.toml as the nvidia_container_toolkit role writes it: no GPU from
# NVIDIA_VISIBLE_DEVICES of an unprivileged container, the device list from volume mounts.
SECURE_TOOLKIT = {"accept-nvidia-visible-devices-envvar-when-unprivileged": False,
                  "accept-nvidia-visible-devices-as-volume-mounts": True}
SECURE_NVIDIA_CONTAINERD = RuntimeConfig(frozenset({"nvidia"}), "nvidia",
                                         toolkit_settings=SECURE_TOOLKIT)


# The times health tests publish conditions with (a fixed moment: comparable output).
HEALTH_TIME = "2026-11-26T10:00:00Z"


def agent_conditions(fault: bool, evidence: str = "ev-b-1") -> list[dict]:
    """The four gpuprov.io/ conditions a health agent publishes (its own state machine,
    gpuprov/node/health/state.py) after its first check cycle: no problem, or an XID 79 on GPU
    0000:3b:00 with this evidence id; as the agent patches them on its Node's status."""
    from gpuprov.node.health import state as hs

    s = hs.State()
    hs.step(s, hs.Started("b", 1))
    hs.step(s, hs.CycleDone(2))
    if fault:
        hs.step(s, hs.XidSeen("0000:3b:00", 79, "GPU has fallen off the bus.", 3,
                              evidence=evidence))
    return [{"type": c["type"], "status": c["status"], "reason": c["reason"],
             "message": c["message"], "lastTransitionTime": HEALTH_TIME,
             "lastHeartbeatTime": HEALTH_TIME} for c in hs.conditions(s, 4)]


def fake_uuids(node: str, count: int) -> list[str]:
    """Stable, distinct GPU UUIDs for a fake node."""
    digest = sum(map(ord, node)) & 0xFFFF
    return [f"GPU-{digest:04x}{i:04x}-0000-4000-8000-{i:012x}" for i in range(count)]


def lab_gpus(node: str, count: int) -> list[Gpu]:
    """A fake node's GPUs with fake_uuids and, where the lab has a profile of that name, what
    its simulated NVML answers of each GPU (GpuFacts: the profile's models, PCI buses, minors
    and driver version)."""
    uuids = fake_uuids(node, count)
    profile = profiles.NODE_PROFILES.get(node)
    if profile is None or profile.driver_version is None:
        return [Gpu(u) for u in uuids]
    version = profile.driver_version
    return [Gpu(u, facts=GpuFacts(
        g.minor_number, g.name, g.model.brand, g.model.nvml_architecture,
        g.compute_capability, g.memory_total, g.pci_bus_id, version,
        profiles.cuda_driver_version(version)))
        for u, g in zip(uuids, profiles.expected_gpus(node, profile)[:count], strict=False)]


def default_lab_backend(runtime: RuntimeConfig = NVIDIA_CONTAINERD) -> FakeBackend:
    """The default lab's shape: three GPU nodes with the NVIDIA runtime (`runtime`), one
    CPU node."""
    return FakeBackend({
        "gpu-kepler": FakeNode(lab_gpus("gpu-kepler", 2), runtime),
        "gpu-pascal": FakeNode(lab_gpus("gpu-pascal", 4), runtime),
        "gpu-hopper": FakeNode(lab_gpus("gpu-hopper", 8), runtime),
        "cpu-only": FakeNode([], PLAIN_CONTAINERD),
    })


@contextmanager
def running_emulator(backend: FakeBackend | None = None, state_dir: Path | None = None,
                     tick: float = 0.1, heartbeat: float | None = None) -> Iterator[Emulator]:
    emulator = Emulator(backend or default_lab_backend(), state_dir, tick=tick,
                        heartbeat=heartbeat)
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 20.0,
             interval: float = 0.05) -> T:
    """Poll until probe() returns something truthy; fail naming `what` after timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


# Debian's kubectl as scripts/fetch-containerd.sh (`make containerd-bins`) fetches it: the real
# client the emulator is tested with. Not the machine's kubectl, which may be any version (or a
# vendor's wrapper); GPUPROV_KUBECTL names another binary.
KUBECTL = CONTAINERD / "kubectl/usr/bin/kubectl"  # scripts/fetch-containerd.sh
KUBECTL_TIMEOUT = 60.0


def kubectl_binary() -> Path | None:
    """The kubectl the tests run, None when it has not been fetched."""
    path = Path(os.environ.get("GPUPROV_KUBECTL") or KUBECTL)
    return path if path.is_file() and os.access(path, os.X_OK) else None


class Kubectl:
    """The real kubectl against one API server, with its own kubeconfig, cache and HOME (so
    nothing of the machine's ~/.kube is read or written)."""

    def __init__(self, binary: Path, kubeconfig: Path, home: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.home = home
        home.mkdir(parents=True, exist_ok=True)

    @classmethod
    def for_url(cls, binary: Path, url: str, work: Path) -> Kubectl:
        return cls(binary, write_kubeconfig(work / "kubeconfig", url), work / "home")

    def run(self, *args: str, stdin: str | None = None, timeout: float = KUBECTL_TIMEOUT,
            check: bool = True) -> subprocess.CompletedProcess:
        """`kubectl ARGS`; check: a non-zero exit fails with its output."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home),
               "KUBECONFIG": str(self.kubeconfig)}
        proc = subprocess.run(
            [str(self.binary), "--cache-dir", str(self.home / "cache"), *args], input=stdin,
            capture_output=True, text=True, timeout=timeout, env=env, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}:\n"
                                 f"{proc.stdout}{proc.stderr}")
        return proc

    def out(self, *args: str, stdin: str | None = None) -> str:
        return self.run(*args, stdin=stdin).stdout


def table_rows(text: str) -> list[dict[str, str]]:
    """kubectl's human-readable table -> one dict per row, by column header. Columns are found
    from the header line's start offsets: kubectl's tabwriter pads columns with at least three
    spaces, while a header may have one inside (NOMINATED NODE); a cell may be empty."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0]
    starts = [i for i, ch in enumerate(header)
              if ch != " " and (i == 0 or header[max(0, i - 2):i] == "  ")]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    rows = []
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows
