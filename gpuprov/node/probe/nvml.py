"""The NVML view of the node, through pynvml (imported lazily).

Nothing here raises on an NVML failure: a failed nvmlInit becomes the section's
"error", a failed handle becomes the GPU's "error", and any other failed query is
recorded under the GPU's "errors" map (keyed by field) while the rest goes on.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from typing import Any

from ...nvidia import hardware

# Enum values from nvml.h; they are part of NVML's stable ABI, and naming them here
# keeps the probe independent of which pynvml version (or test double) is loaded.
_TEMPERATURE_GPU = 0
_THRESHOLD_SHUTDOWN = 0
_THRESHOLD_SLOWDOWN = 1
_ERROR_CORRECTED = 0
_ERROR_UNCORRECTED = 1
_VOLATILE_ECC = 0
_AGGREGATE_ECC = 1
_RETIRED_SBE = 0  # NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
_RETIRED_DBE = 1  # NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
_ERROR_NOT_SUPPORTED = 3
_ERROR_NOT_FOUND = 6
_ERROR_FUNCTION_NOT_FOUND = 13
_ERROR_ARGUMENT_VERSION_MISMATCH = 25

# nvmlClocksEventReason* bits (called "throttle reasons" before NVML 12.2).
CLOCK_EVENT_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

_LIBRARY_VERSION = re.compile(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$")


def decode_clock_event_reasons(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _error_names(nv: Any) -> dict[int, str]:
    return {
        value: name
        for name, value in vars(nv).items()
        if name.startswith("NVML_ERROR_") and isinstance(value, int)
    }


def error_record(nv: Any, exc: Exception) -> dict:
    code = getattr(exc, "value", None)
    name = _error_names(nv).get(code, "NVML_ERROR_UNKNOWN") if code is not None else None
    try:
        message = str(exc)
    except Exception:  # pynvml's __str__ calls into the library, which may be gone
        message = repr(exc)
    return {"code": code, "name": name, "message": message}


def loaded_library() -> dict | None:
    """Where libnvidia-ml was loaded from, and its version when the file name has one.

    The user-space library's version, compared with the kernel module's version, is
    what a driver/library mismatch is about; it is readable even when nvmlInit fails.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "libnvidia-ml" in line}
    except OSError:
        return None
    for path in sorted(paths):
        real = os.path.realpath(path)
        match = _LIBRARY_VERSION.search(real)
        return {"path": real, "version": match.group(1) if match else None}
    return None


class _Queries:
    """Runs NVML queries, turning each failure into an entry of `errors`."""

    def __init__(self, nv: Any, errors: dict) -> None:
        self.nv = nv
        self.errors = errors

    def __call__(
        self, field: str, func: Callable[[], Any], fallback: Callable[[], Any] | None = None
    ):
        try:
            try:
                return func()
            except self.nv.NVMLError as exc:
                if fallback is None or getattr(exc, "value", None) != _ERROR_FUNCTION_NOT_FOUND:
                    raise
                return fallback()
        except self.nv.NVMLError as exc:
            self.errors[field] = error_record(self.nv, exc)
            return None


def _memory(nv: Any, handle: Any) -> Any:
    """nvmlDeviceGetMemoryInfo_v2 where the library has it, else v1.

    v1's "used" counts the memory the driver reserves for itself: 615 MiB on an idle H200
    (driver 580.159.04, tests/fixtures/real/), which nvidia-smi shows as "Reserved", with
    "Used 0 MiB". v2 reports the two apart, as nvidia-smi does.
    """
    version = getattr(nv, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return nv.nvmlDeviceGetMemoryInfo(handle, version=version)
        except nv.NVMLError as exc:
            # A driver before v2 (R510) or a library that refuses the version: v1 then.
            if getattr(exc, "value", None) not in (_ERROR_FUNCTION_NOT_FOUND,
                                                   _ERROR_ARGUMENT_VERSION_MISMATCH):
                raise
    return nv.nvmlDeviceGetMemoryInfo(handle)


def _architecture_name(value: int | None) -> str | None:
    return None if value is None else hardware.architecture_from_nvml(value)


def _pci_id(packed: int | None) -> str | None:
    # NVML packs PCI ids as (device << 16) | vendor.
    return None if packed is None else f"{packed & 0xFFFF:04x}:{packed >> 16:04x}"


def _gpu(nv: Any, index: int) -> dict:
    errors: dict = {}
    gpu: dict = {"index": index, "error": None}
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
    except nv.NVMLError as exc:
        gpu["error"] = error_record(nv, exc)
        return gpu
    q = _Queries(nv, errors)
    gpu["name"] = _text(q("name", lambda: nv.nvmlDeviceGetName(handle)))
    gpu["uuid"] = _text(q("uuid", lambda: nv.nvmlDeviceGetUUID(handle)))
    gpu["serial"] = _text(q("serial", lambda: nv.nvmlDeviceGetSerial(handle)))
    gpu["minor_number"] = q("minor_number", lambda: nv.nvmlDeviceGetMinorNumber(handle))
    pci = q("pci", lambda: nv.nvmlDeviceGetPciInfo(handle))
    gpu["pci_bus_id"] = _text(pci.busId) if pci is not None else None
    gpu["pci_device_id"] = _pci_id(pci.pciDeviceId) if pci is not None else None
    gpu["pci_subsystem_id"] = _pci_id(pci.pciSubSystemId) if pci is not None else None
    memory = q("memory", lambda: _memory(nv, handle))
    gpu["memory"] = {
        "total": memory.total if memory else None,
        "used": memory.used if memory else None,
        "free": memory.free if memory else None,
        # None: v1 answered, whose "used" includes the reservation
        "reserved": getattr(memory, "reserved", None) if memory else None,
    }
    capability = q("compute_capability", lambda: nv.nvmlDeviceGetCudaComputeCapability(handle))
    gpu["compute_capability"] = "{}.{}".format(*capability) if capability else None
    arch = q("architecture", lambda: nv.nvmlDeviceGetArchitecture(handle))
    gpu["architecture_nvml"] = arch
    gpu["architecture"] = _architecture_name(arch)
    gpu["brand_nvml"] = q("brand", lambda: nv.nvmlDeviceGetBrand(handle))
    gpu["temperature"] = {
        "current": q(
            "temperature.current", lambda: nv.nvmlDeviceGetTemperature(handle, _TEMPERATURE_GPU)
        ),
        "slowdown": q(
            "temperature.slowdown",
            lambda: nv.nvmlDeviceGetTemperatureThreshold(handle, _THRESHOLD_SLOWDOWN),
        ),
        "shutdown": q(
            "temperature.shutdown",
            lambda: nv.nvmlDeviceGetTemperatureThreshold(handle, _THRESHOLD_SHUTDOWN),
        ),
    }
    util = q("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(handle))
    gpu["utilization"] = {
        "gpu": util.gpu if util else None,
        "memory": util.memory if util else None,
    }
    usage = q("power.usage_w", lambda: nv.nvmlDeviceGetPowerUsage(handle))
    limit = q(
        "power.limit_w",
        lambda: nv.nvmlDeviceGetEnforcedPowerLimit(handle),
        lambda: nv.nvmlDeviceGetPowerManagementLimit(handle),
    )
    gpu["power"] = {  # NVML reports milliwatts
        "usage_w": None if usage is None else usage / 1000.0,
        "limit_w": None if limit is None else limit / 1000.0,
    }
    persistence = q("persistence_mode", lambda: nv.nvmlDeviceGetPersistenceMode(handle))
    gpu["persistence_mode"] = None if persistence is None else bool(persistence)
    gpu["ecc"] = _ecc(nv, handle, q)
    gpu["retired_pages"] = _retired_pages(nv, handle, q)
    rows = q("remapped_rows", lambda: nv.nvmlDeviceGetRemappedRows(handle))
    gpu["remapped_rows"] = (
        None
        if rows is None
        else {
            "correctable": rows[0],
            "uncorrectable": rows[1],
            "pending": bool(rows[2]),
            "failure": bool(rows[3]),
        }
    )
    mask = q(
        "clock_event_reasons",
        lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle),
        lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle),
    )
    gpu["clock_event_reasons"] = (
        None
        if mask is None
        else {
            "mask": mask,
            "names": decode_clock_event_reasons(mask),
        }
    )
    gpu["pcie"] = {
        "gen_current": q(
            "pcie.gen_current", lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(handle)
        ),
        "gen_max": q("pcie.gen_max", lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
        "width_current": q("pcie.width_current", lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(handle)),
        "width_max": q("pcie.width_max", lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(handle)),
    }
    # pynvml's default is the _v3 entry point, which drivers before 510 lack.
    procs = q(
        "processes",
        lambda: nv.nvmlDeviceGetComputeRunningProcesses(handle),
        lambda: nv.nvmlDeviceGetComputeRunningProcesses_v2(handle),
    )
    gpu["processes"] = (
        None if procs is None else [{"pid": p.pid, "used_memory": p.usedGpuMemory} for p in procs]
    )
    gpu["mig"] = _mig(nv, handle, errors)
    gpu["errors"] = errors
    return gpu


def _mig(nv: Any, handle: Any, errors: dict) -> dict | None:
    """MIG mode and MIG devices; None where the GPU has no MIG (NOT_SUPPORTED, as every
    pre-Ampere GPU answers) or the driver's NVML has no MIG calls.

        current, pending   MIG mode (True: enabled); pending differs until the GPU is reset
        devices            [{index, uuid, name, profile ("1g.10gb"), gpu_instance_id,
                           compute_instance_id, memory_mb, multiprocessors, gpu_instance_slices,
                           compute_instance_slices, engines {copy, decoder, encoder, jpeg,
                           ofa}}] in NVML's order (nvmlDeviceGetMigDevice-
                           HandleByIndex), as `nvidia-smi -L` lists them under their GPU
    """
    get_mode = getattr(nv, "nvmlDeviceGetMigMode", None)
    if get_mode is None:  # a pynvml from before MIG (or a test double without it)
        return None
    try:
        current, pending = get_mode(handle)
    except nv.NVMLError as exc:
        if getattr(exc, "value", None) in (_ERROR_NOT_SUPPORTED, _ERROR_FUNCTION_NOT_FOUND):
            return None
        errors["mig"] = error_record(nv, exc)
        return None
    mig: dict = {"current": bool(current), "pending": bool(pending), "devices": []}
    q = _Queries(nv, errors)
    for index in range(q("mig.max_devices", lambda: nv.nvmlDeviceGetMaxMigDeviceCount(handle))
                       or 0):
        try:
            device = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) != _ERROR_NOT_FOUND:  # NOT_FOUND: a free slot
                errors[f"mig.devices[{index}]"] = error_record(nv, exc)
            continue
        name = _text(q(f"mig.devices[{index}].name", lambda d=device: nv.nvmlDeviceGetName(d)))
        attrs = q(f"mig.devices[{index}].attributes",
                  lambda d=device: nv.nvmlDeviceGetAttributes_v2(d))
        mig["devices"].append({
            "index": index,
            "uuid": _text(q(f"mig.devices[{index}].uuid",
                            lambda d=device: nv.nvmlDeviceGetUUID(d))),
            "name": name,
            # NVML names a MIG device "<GPU name> MIG <profile>" (the GPU instance profile's
            # name, "MIG 1g.10gb", as nvidia-smi mig -lgip prints it).
            "profile": name.rpartition(" MIG ")[2] if name and " MIG " in name else None,
            "gpu_instance_id": q(f"mig.devices[{index}].gpu_instance_id",
                                 lambda d=device: nv.nvmlDeviceGetGpuInstanceId(d)),
            "compute_instance_id": q(f"mig.devices[{index}].compute_instance_id",
                                     lambda d=device: nv.nvmlDeviceGetComputeInstanceId(d)),
            "memory_mb": None if attrs is None else attrs.memorySizeMB,
            "multiprocessors": None if attrs is None else attrs.multiprocessorCount,
            "gpu_instance_slices": None if attrs is None else attrs.gpuInstanceSliceCount,
            "compute_instance_slices": None if attrs is None else attrs.computeInstanceSliceCount,
            "engines": None if attrs is None else {
                "copy": attrs.sharedCopyEngineCount, "decoder": attrs.sharedDecoderCount,
                "encoder": attrs.sharedEncoderCount, "jpeg": attrs.sharedJpegCount,
                "ofa": attrs.sharedOfaCount},
        })
    return mig


def _ecc(nv: Any, handle: Any, q: _Queries) -> dict:
    mode = q("ecc.mode", lambda: nv.nvmlDeviceGetEccMode(handle))
    ecc: dict = {
        "mode_current": None if mode is None else bool(mode[0]),
        "mode_pending": None if mode is None else bool(mode[1]),
    }
    for counter_name, counter in (("volatile", _VOLATILE_ECC), ("aggregate", _AGGREGATE_ECC)):
        ecc[counter_name] = {
            kind: q(
                f"ecc.{counter_name}.{kind}",
                lambda e=error_type, c=counter: nv.nvmlDeviceGetTotalEccErrors(handle, e, c),
            )
            for kind, error_type in (
                ("corrected", _ERROR_CORRECTED),
                ("uncorrected", _ERROR_UNCORRECTED),
            )
        }
    return ecc


def _retired_pages(nv: Any, handle: Any, q: _Queries) -> dict | None:
    sbe = q("retired_pages.sbe", lambda: nv.nvmlDeviceGetRetiredPages(handle, _RETIRED_SBE))
    dbe = q("retired_pages.dbe", lambda: nv.nvmlDeviceGetRetiredPages(handle, _RETIRED_DBE))
    pending = q("retired_pages.pending", lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(handle))
    if sbe is None and dbe is None and pending is None:
        return None  # the device does not retire pages (Ampere and later remap rows)
    return {
        "sbe": None if sbe is None else len(sbe),
        "dbe": None if dbe is None else len(dbe),
        "pending": None if pending is None else bool(pending),
    }


def _empty() -> dict:
    return {
        "available": False,
        "error": None,
        "library": None,
        "driver_version": None,
        "cuda_driver_version": None,
        "cuda_driver_version_int": None,
        "nvml_version": None,
        "device_count": None,
        "gpus": [],
        "errors": {},
    }


def collect(nv: Any = None) -> dict:
    """The NVML section. `nv` is the pynvml module (a test double in unit tests)."""
    doc = _empty()
    if nv is None:
        try:
            import pynvml as nv
        except ImportError as exc:
            doc["error"] = {"code": None, "name": "PYNVML_NOT_FOUND", "message": str(exc)}
            return doc
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        doc["error"] = error_record(nv, exc)
        doc["library"] = loaded_library()
        return doc
    try:
        doc["available"] = True
        doc["library"] = loaded_library()
        q = _Queries(nv, doc["errors"])
        doc["driver_version"] = _text(q("driver_version", nv.nvmlSystemGetDriverVersion))
        doc["nvml_version"] = _text(q("nvml_version", nv.nvmlSystemGetNVMLVersion))
        cuda = q("cuda_driver_version", nv.nvmlSystemGetCudaDriverVersion)
        if cuda is not None:  # 12020 -> "12.2"
            doc["cuda_driver_version_int"] = cuda
            doc["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        count = q("device_count", nv.nvmlDeviceGetCount)
        doc["device_count"] = count
        doc["gpus"] = [_gpu(nv, index) for index in range(count or 0)]
    finally:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()
    return doc
