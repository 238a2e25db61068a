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
    # The MIG state the simulated driver keeps for the node (read-only: what a container's
    # NVML reads of the kernel's MIG configuration).
    ("/var/lib/gpuprov-sim/mig", "/var/lib/gpuprov-sim/mig"),
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


def mig_device_records() -> tuple[list[str], list[dict]]:
    """The GPUs with MIG mode on (UUIDs), and each MIG device NVML enumerates on them:
    {gpu_index, gpu_uuid, gpu_minor, index, uuid, gi, ci} (nvmlDeviceGetMigDeviceHandleByIndex;
    a free slot is skipped; gi/ci: its GPU and compute instance IDs)."""
    nvml = _load()
    ret = nvml.nvmlInit_v2()
    if ret != 0:
        raise NvmlError(f"failed to initialize NVML: error {ret}")
    try:
        enabled: list[str] = []
        records: list[dict] = []
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            raise NvmlError("failed to get device count")
        for index in range(count.value):
            handle = ctypes.c_void_p()
            uuid = ctypes.create_string_buffer(96)
            current, pending, most = ctypes.c_uint(0), ctypes.c_uint(0), ctypes.c_uint(0)
            minor = ctypes.c_uint(0)
            if (nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0
                    or nvml.nvmlDeviceGetUUID(handle, uuid, 96) != 0
                    or nvml.nvmlDeviceGetMinorNumber(handle, ctypes.byref(minor)) != 0):
                continue
            get_mode = getattr(nvml, "nvmlDeviceGetMigMode", None)
            if (get_mode is None
                    or get_mode(handle, ctypes.byref(current), ctypes.byref(pending)) != 0
                    or current.value != 1
                    or nvml.nvmlDeviceGetMaxMigDeviceCount(handle, ctypes.byref(most)) != 0):
                continue
            enabled.append(uuid.value.decode())
            for j in range(most.value):
                mig, mig_uuid = ctypes.c_void_p(), ctypes.create_string_buffer(96)
                gi, ci = ctypes.c_uint(0), ctypes.c_uint(0)
                if (nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j, ctypes.byref(mig)) == 0
                        and nvml.nvmlDeviceGetUUID(mig, mig_uuid, 96) == 0
                        and nvml.nvmlDeviceGetGpuInstanceId(mig, ctypes.byref(gi)) == 0
                        and nvml.nvmlDeviceGetComputeInstanceId(mig, ctypes.byref(ci)) == 0):
                    records.append({"gpu_index": index, "gpu_uuid": uuid.value.decode(),
                                    "gpu_minor": minor.value, "index": j,
                                    "uuid": mig_uuid.value.decode(), "gi": gi.value,
                                    "ci": ci.value})
        return enabled, records
    finally:
        nvml.nvmlShutdown()


def mig_devices() -> dict[str, list[tuple[int, str]]]:
    """GPU UUID -> [(index, UUID)] of its MIG devices, for each GPU with MIG mode on, as NVML
    enumerates them."""
    enabled, records = mig_device_records()
    found: dict[str, list[tuple[int, str]]] = {gpu: [] for gpu in enabled}
    for record in records:
        found[record["gpu_uuid"]].append((record["index"], record["uuid"]))
    return found
