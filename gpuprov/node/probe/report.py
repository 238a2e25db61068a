"""Assemble the probe report from its sections."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import boot, host, nvml, packages, pci, runtime
from .fs import Root

SCHEMA_VERSION = 1


def _section(func: Callable[[], Any], errors: dict, name: str, default: Any) -> Any:
    # A bug in one section must not cost the report: it becomes data, like an NVML error.
    try:
        return func()
    except Exception as exc:
        import traceback  # only on this path: it imports a dozen modules

        errors[name] = {
            "type": type(exc).__name__,
            "message": str(exc),
            "where": traceback.format_exc(limit=-2).strip().splitlines()[-3:],
        }
        return default


def collect(root: str = "/", nvml_module: Any = None, run: packages.Runner | None = None,
            kernel_log: bool = True) -> dict:
    """The probe report (schema: see gpuprov.node.probe). Read-only; never raises.
    kernel_log=False: the health agent, which follows the kernel log itself, skips reading
    all of it again every cycle (the section then says so)."""
    started = time.monotonic()
    fs = Root(root)
    errors: dict = {}
    try:
        from gpuprov import __version__ as gpuprov_version
    except ImportError:
        gpuprov_version = None
    report = {
        "schema_version": SCHEMA_VERSION,
        "probe": {
            "version": gpuprov_version,
            "root": root,
            "collected_at": time.time(),
            "duration_s": None,
            "errors": errors,
        },
        "host": _section(lambda: host.collect_host(fs), errors, "host", None),
        "pci": _section(lambda: pci.collect(fs), errors, "pci", []),
        "nvml": _section(lambda: nvml.collect(nvml_module), errors, "nvml", None),
        "kernel_module": _section(
            lambda: host.collect_kernel_module(fs), errors, "kernel_module", None
        ),
        "kernel_log": _section(lambda: host.collect_kernel_log(fs), errors, "kernel_log", None)
        if kernel_log else {"readable": False, "source": "/dev/kmsg", "xid_events": [],
                            "xid_count": 0, "error": "not read: followed by the health agent"},
        "packages": _section(
            lambda: packages.collect(fs, run or packages.run_command), errors, "packages", None
        ),
        "container_runtime": _section(
            lambda: runtime.collect(fs), errors, "container_runtime", None
        ),
    }
    running = (report["host"] or {}).get("kernel")
    report["boot"] = _section(lambda: boot.collect(fs, running, run or packages.run_command),
                              errors, "boot", None)
    nvml_doc = report["nvml"] or {}
    report["summary"] = {
        "pci_gpu_count": len(report["pci"]),
        "nvml_gpu_count": nvml_doc.get("device_count"),
        "nvml_healthy_gpu_count": sum(
            1 for gpu in nvml_doc.get("gpus", []) if gpu.get("error") is None
        ),
        "gpu_node": bool(report["pci"]),
    }
    report["probe"]["duration_s"] = round(time.monotonic() - started, 4)
    return report
