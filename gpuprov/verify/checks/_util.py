"""Small helpers shared by the check families."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def gpu_label(gpu: Mapping[str, Any]) -> str:
    """'GPU 1 (00000000:19:00.0)' — index and bus ID, what nvidia-smi shows."""
    bus = gpu.get("pci_bus_id")
    return f"GPU {gpu.get('index')}" + (f" ({bus})" if bus else "")


def nvml_error_text(error: Mapping[str, Any] | None) -> str:
    if not error:
        return "unknown error"
    return f"{error.get('name')} ({error.get('message')})"


def major(version: str | None) -> int | None:
    """'535.261.03' -> 535."""
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None
