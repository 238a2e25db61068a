"""Run by tests/unit/test_simnvml.py in a fresh interpreter (pynvml loads libnvidia-ml.so.1
once per process): everything NVML says about the node, through pynvml, as JSON on stdout.

argv[1], optional: a JSON list of UUIDs to look up with nvmlDeviceGetHandleByUUID.
NVML errors are data: {"error": <NVML return code>}.
"""

import json
import sys

import pynvml as N


def call(fn, *args):
    try:
        value = fn(*args)
    except N.NVMLError as exc:
        return {"error": exc.value}
    if isinstance(value, bytes):
        return value.decode()
    return value


def gpu(handle) -> dict:
    pci = N.nvmlDeviceGetPciInfo(handle)
    mem = N.nvmlDeviceGetMemoryInfo(handle)
    mem2 = N.nvmlDeviceGetMemoryInfo(handle, version=N.nvmlMemory_v2)
    util = N.nvmlDeviceGetUtilizationRates(handle)
    volatile, aggregate = N.NVML_VOLATILE_ECC, N.NVML_AGGREGATE_ECC
    unc, cor = N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_MEMORY_ERROR_TYPE_CORRECTED
    dbe = N.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    sbe = N.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    remapped = call(N.nvmlDeviceGetRemappedRows, handle)
    return {
        "index": N.nvmlDeviceGetIndex(handle),
        "name": N.nvmlDeviceGetName(handle),
        "uuid": N.nvmlDeviceGetUUID(handle),
        "serial": N.nvmlDeviceGetSerial(handle),
        "bus_id": pci.busId,
        "bus_id_legacy": pci.busIdLegacy,
        "pci_bus": pci.bus,
        "pci_device_id": pci.pciDeviceId,
        "pci_subsystem_id": pci.pciSubSystemId,
        "memory": [mem.total, mem.free, mem.used],
        "memory_v2": [mem2.total, mem2.reserved, mem2.free, mem2.used],
        "compute_capability": list(N.nvmlDeviceGetCudaComputeCapability(handle)),
        "architecture": N.nvmlDeviceGetArchitecture(handle),
        "brand": N.nvmlDeviceGetBrand(handle),
        "minor_number": N.nvmlDeviceGetMinorNumber(handle),
        "temperature": N.nvmlDeviceGetTemperature(handle, N.NVML_TEMPERATURE_GPU),
        "temperature_v": N.nvmlDeviceGetTemperatureV(handle, N.NVML_TEMPERATURE_GPU),
        "temp_shutdown": call(
            N.nvmlDeviceGetTemperatureThreshold, handle, N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
        ),
        "temp_slowdown": call(
            N.nvmlDeviceGetTemperatureThreshold, handle, N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        ),
        "temp_gpu_max": call(
            N.nvmlDeviceGetTemperatureThreshold, handle, N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX
        ),
        "utilization": [util.gpu, util.memory],
        "power_usage": N.nvmlDeviceGetPowerUsage(handle),
        "power_limit": N.nvmlDeviceGetPowerManagementLimit(handle),
        "enforced_power_limit": N.nvmlDeviceGetEnforcedPowerLimit(handle),
        "persistence_mode": N.nvmlDeviceGetPersistenceMode(handle),
        "ecc_mode": call(N.nvmlDeviceGetEccMode, handle),
        "ecc_volatile_uncorrected": call(N.nvmlDeviceGetTotalEccErrors, handle, unc, volatile),
        "ecc_aggregate_uncorrected": call(N.nvmlDeviceGetTotalEccErrors, handle, unc, aggregate),
        "ecc_volatile_corrected": call(N.nvmlDeviceGetTotalEccErrors, handle, cor, volatile),
        "ecc_dram_volatile_uncorrected": call(
            N.nvmlDeviceGetMemoryErrorCounter, handle, unc, volatile,
            N.NVML_MEMORY_LOCATION_DEVICE_MEMORY,
        ),
        "retired_pages_dbe": call(N.nvmlDeviceGetRetiredPages, handle, dbe),
        "retired_pages_sbe": call(N.nvmlDeviceGetRetiredPages, handle, sbe),
        "retired_pages_dbe_v2": call(N.nvmlDeviceGetRetiredPages_v2, handle, dbe),
        "retired_pages_pending": call(N.nvmlDeviceGetRetiredPagesPendingStatus, handle),
        "remapped_rows": list(remapped) if isinstance(remapped, tuple) else remapped,
        "clocks_event_reasons": N.nvmlDeviceGetCurrentClocksEventReasons(handle),
        "clocks_throttle_reasons": N.nvmlDeviceGetCurrentClocksThrottleReasons(handle),
        "pcie": [
            N.nvmlDeviceGetCurrPcieLinkGeneration(handle),
            N.nvmlDeviceGetMaxPcieLinkGeneration(handle),
            N.nvmlDeviceGetCurrPcieLinkWidth(handle),
            N.nvmlDeviceGetMaxPcieLinkWidth(handle),
        ],
        "processes": len(N.nvmlDeviceGetComputeRunningProcesses(handle)),
        "index_by_bus_id": N.nvmlDeviceGetIndex(
            N.nvmlDeviceGetHandleByPciBusId(pci.busId)
        ),
    }


def main() -> None:
    try:
        N.nvmlInit()
    except N.NVMLError as exc:
        print(json.dumps({"init_error": exc.value}))
        return
    doc = {
        "driver_version": N.nvmlSystemGetDriverVersion(),
        "nvml_version": N.nvmlSystemGetNVMLVersion(),
        "cuda_driver_version": N.nvmlSystemGetCudaDriverVersion_v2(),
        "count": N.nvmlDeviceGetCount(),
    }
    gpus = []
    for index in range(doc["count"]):
        try:
            handle = N.nvmlDeviceGetHandleByIndex(index)
        except N.NVMLError as exc:
            gpus.append({"error": exc.value})
            continue
        gpus.append(gpu(handle))
    doc["gpus"] = gpus
    uuids = json.loads(sys.argv[1]) if len(sys.argv) > 1 else []
    doc["by_uuid"] = {
        uuid: call(lambda u: N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(u)), uuid)
        for uuid in uuids
    }
    N.nvmlShutdown()
    print(json.dumps(doc))


main()
