"""SIMULATION: the node's GPUs through NVML (ctypes), for the lab's toolkit stand-ins.

NVIDIA's nvidia-ctk and runtime enumerate GPUs through NVML (go-nvml); these stand-ins do the
same through libnvidia-ml.so.1 as the node's loader finds it, which in the lab is the
simulated NVML (gpuprov/lab/nvml/simnvml.c). Standard library only: it runs on the nodes.
"""

from __future__ import annotations

import ctypes

# What the lab injects into a container given GPUs, in both modes (the legacy runtime
# stand-in, and the CDI spec the lab's nvidia-ctk writes): the simulated NVML under the name
# and path the real driver's libnvidia-ml.so.1 has, its configuration, and the lab's
# nvidia-smi. (source on the node, path in the container), each mounted read-only.
SIM_MOUNTS = (
    ("/opt/gpuprov-sim/lib/libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
    ("/etc/gpuprov-sim", "/etc/gpuprov-sim"),
    ("/opt/gpuprov-sim/bin/nvidia-smi", "/usr/bin/nvidia-smi"),
)


class NvmlError(RuntimeError):
    """NVML could not be loaded or answered an error; the message says which call."""


def driver_version() -> str:
    """The driver version NVML reports (nvmlSystemGetDriverVersion)."""
    nvml = _load()
    ret = nvml.nvmlInit_v2()
    if ret != 0:
        raise NvmlError(f"failed to initialize NVML: error {ret}")
    try:
        version = ctypes.create_string_buffer(80)
        if nvml.nvmlSystemGetDriverVersion(version, 80) != 0:
            raise NvmlError("failed to get the driver version")
        return version.value.decode()
    finally:
        nvml.nvmlShutdown()


def _load() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        raise NvmlError(f"failed to load NVML: {exc}") from None


def gpus() -> list[tuple[int, str, int]]:
    """[(index, UUID, minor number)] of every GPU NVML enumerates, in index order."""
    nvml = _load()
    ret = nvml.nvmlInit_v2()
    if ret != 0:
        raise NvmlError(f"failed to initialize NVML: error {ret}")
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            raise NvmlError("failed to get device count")
        found = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                raise NvmlError(f"failed to get device handle {index}")
            uuid = ctypes.create_string_buffer(96)
            minor = ctypes.c_uint(0)
            if nvml.nvmlDeviceGetUUID(handle, uuid, 96) != 0:
                raise NvmlError(f"failed to get UUID of device {index}")
            if nvml.nvmlDeviceGetMinorNumber(handle, ctypes.byref(minor)) != 0:
                raise NvmlError(f"failed to get minor of device {index}")
            found.append((index, uuid.value.decode(), minor.value))
        return found
    finally:
        nvml.nvmlShutdown()


def mig_devices() -> dict[str, list[tuple[int, str]]]:
    """GPU UUID -> [(index, UUID)] of its MIG devices, for each GPU with MIG mode on, as NVML
    enumerates them (nvmlDeviceGetMigDeviceHandleByIndex; a free slot is skipped)."""
    nvml = _load()
    ret = nvml.nvmlInit_v2()
    if ret != 0:
        raise NvmlError(f"failed to initialize NVML: error {ret}")
    try:
        found: dict[str, list[tuple[int, str]]] = {}
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            raise NvmlError("failed to get device count")
        for index in range(count.value):
            handle = ctypes.c_void_p()
            uuid = ctypes.create_string_buffer(96)
            current, pending, most = ctypes.c_uint(0), ctypes.c_uint(0), ctypes.c_uint(0)
            if (nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0
                    or nvml.nvmlDeviceGetUUID(handle, uuid, 96) != 0):
                continue
            get_mode = getattr(nvml, "nvmlDeviceGetMigMode", None)
            if (get_mode is None
                    or get_mode(handle, ctypes.byref(current), ctypes.byref(pending)) != 0
                    or current.value != 1
                    or nvml.nvmlDeviceGetMaxMigDeviceCount(handle, ctypes.byref(most)) != 0):
                continue
            devices = found.setdefault(uuid.value.decode(), [])
            for j in range(most.value):
                mig, mig_uuid = ctypes.c_void_p(), ctypes.create_string_buffer(96)
                if (nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j, ctypes.byref(mig)) == 0
                        and nvml.nvmlDeviceGetUUID(mig, mig_uuid, 96) == 0):
                    devices.append((j, mig_uuid.value.decode()))
        return found
    finally:
        nvml.nvmlShutdown()
