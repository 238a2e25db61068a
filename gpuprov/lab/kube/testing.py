"""Helpers for tests of the emulator and of code that talks to it (no containers needed)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from gpuprov.lab.kube.app import Emulator
from gpuprov.lab.kube.backend import FakeBackend, FakeNode, Gpu, RuntimeConfig

T = TypeVar("T")

NVIDIA_CONTAINERD = RuntimeConfig(frozenset({"nvidia"}), "nvidia")
PLAIN_CONTAINERD = RuntimeConfig()
# The toolkit's config.toml as the nvidia_container_toolkit role writes it: no GPU from
# NVIDIA_VISIBLE_DEVICES of an unprivileged container, the device list from volume mounts.
SECURE_TOOLKIT = {"accept-nvidia-visible-devices-envvar-when-unprivileged": False,
                  "accept-nvidia-visible-devices-as-volume-mounts": True}
SECURE_NVIDIA_CONTAINERD = RuntimeConfig(frozenset({"nvidia"}), "nvidia",
                                         toolkit_settings=SECURE_TOOLKIT)


def fake_uuids(node: str, count: int) -> list[str]:
    """Stable, distinct GPU UUIDs for a fake node."""
    digest = sum(map(ord, node)) & 0xFFFF
    return [f"GPU-{digest:04x}{i:04x}-0000-4000-8000-{i:012x}" for i in range(count)]


def default_lab_backend(runtime: RuntimeConfig = NVIDIA_CONTAINERD) -> FakeBackend:
    """The default lab's shape: three GPU nodes with the NVIDIA runtime (`runtime`), one
    CPU node."""
    return FakeBackend({
        "gpu-kepler": FakeNode([Gpu(u) for u in fake_uuids("gpu-kepler", 2)], runtime),
        "gpu-pascal": FakeNode([Gpu(u) for u in fake_uuids("gpu-pascal", 4)], runtime),
        "gpu-hopper": FakeNode([Gpu(u) for u in fake_uuids("gpu-hopper", 8)], runtime),
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
