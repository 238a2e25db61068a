"""Run by tests/unit/test_simnvml_mig.py in a fresh interpreter (pynvml loads
libnvidia-ml.so.1 once per process): MIG operations through pynvml, as NVML's users (the MIG
stage, verify) call them, against the lab's simulated NVML. Prints JSON.

argv[1]: JSON {"gpu": index, "ops": [[name, args...], ...]}; each op's result, or
{"error": <NVML return code>}, in order. Ops:
  mode                          -> [current, pending]
  set_mode M                    -> activation status
  profiles                      -> {name: {index, id, slices, count, sms, memory_mb,
                                   placements: [start...]}} for every profile index NVML has
  create PROFILE_INDEX [START]  -> GI id (then a compute instance over the whole GI)
  capacity PROFILE_INDEX        -> remaining capacity
  destroy_gi GI_ID              -> 0 (destroys the GI only)
  destroy_all                   -> 0 (compute instances first, then GPU instances)
  devices                       -> [{uuid, name, memory, gi, ci, parent, is_mig, attrs}]
  max_devices                   -> nvmlDeviceGetMaxMigDeviceCount
"""

import json
import sys

import pynvml as N

# The MIG stage's own enumeration and teardown (compute instances, then GPU instances).
from gpuprov.node import mig_apply


def _gi_profiles(handle):
    found = {}
    for index in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = N.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except N.NVMLError_NotSupported:
            continue
        count = N.c_uint(0)  # asked first with no array: how many there are
        N.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, None, N.byref(count))
        placements = (N.c_nvmlGpuInstancePlacement_t * count.value)()
        N.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, placements,
                                                      N.byref(count))
        name = info.name.decode() if isinstance(info.name, bytes) else info.name
        found[name.removeprefix("MIG ")] = {
            "index": index, "id": info.id, "slices": info.sliceCount,
            "count": info.instanceCount, "sms": info.multiprocessorCount,
            "memory_mb": info.memorySizeMB,
            "placements": [placements[i].start for i in range(count.value)]}
    return found


def _create(handle, index, start=None):
    info = N.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
    if start is None:
        gi = N.nvmlDeviceCreateGpuInstance(handle, info.id)
    else:
        placement = N.c_nvmlGpuInstancePlacement_t(start, 0)
        gi = N.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, placement)
    # The compute instance that spans the GPU instance, as mig-parted creates it.
    for profile in reversed(range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
        try:
            ci = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, profile, N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        except N.NVMLError_NotSupported:
            continue
        if ci.sliceCount == info.sliceCount:
            N.nvmlGpuInstanceCreateComputeInstance(gi, ci.id)
            break
    return N.nvmlGpuInstanceGetInfo(gi).id


def _devices(handle):
    out = []
    for i in range(N.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = N.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except N.NVMLError_NotFound:
            continue
        attrs = N.nvmlDeviceGetAttributes_v2(mig)
        out.append({
            "uuid": N.nvmlDeviceGetUUID(mig), "name": N.nvmlDeviceGetName(mig),
            "memory": N.nvmlDeviceGetMemoryInfo(mig).total,
            "gi": N.nvmlDeviceGetGpuInstanceId(mig), "ci": N.nvmlDeviceGetComputeInstanceId(mig),
            "parent": N.nvmlDeviceGetUUID(N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)),
            "is_mig": bool(N.nvmlDeviceIsMigDeviceHandle(mig).value),
            "attrs": {"gi_slices": attrs.gpuInstanceSliceCount,
                      "ci_slices": attrs.computeInstanceSliceCount,
                      "sms": attrs.multiprocessorCount, "memory_mb": attrs.memorySizeMB}})
    return out


def run(handle, op, *args):
    if op == "mode":
        return list(N.nvmlDeviceGetMigMode(handle))
    if op == "set_mode":
        return N.nvmlDeviceSetMigMode(handle, args[0])
    if op == "profiles":
        return _gi_profiles(handle)
    if op == "create":
        return _create(handle, *args)
    if op == "capacity":
        info = N.nvmlDeviceGetGpuInstanceProfileInfo(handle, args[0])
        return N.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, info.id)
    if op == "destroy_gi":
        N.nvmlGpuInstanceDestroy(N.nvmlDeviceGetGpuInstanceById(handle, args[0]))
        return 0
    if op == "destroy_all":
        mig_apply.destroy_instances(N, handle)
        return 0
    if op == "devices":
        return _devices(handle)
    if op == "max_devices":
        return N.nvmlDeviceGetMaxMigDeviceCount(handle)
    raise SystemExit(f"unknown op {op}")


def main() -> None:
    request = json.loads(sys.argv[1])
    N.nvmlInit()
    handle = N.nvmlDeviceGetHandleByIndex(request["gpu"])
    results = []
    for op, *args in request["ops"]:
        try:
            results.append(run(handle, op, *args))
        except N.NVMLError as exc:
            results.append({"error": exc.value})
    print(json.dumps(results))


main()
