"""Runs on a GPU node: reads each GPU's MIG mode and MIG devices, and with --apply makes them
the planned layout. Shipped by gpuprov/payload.py (standard library and pynvml only, as the
probe), started by the gpu_mig role as `python3 -I - PLAN [--apply]`.

PLAN is JSON that gpuprov.nvidia.mig.node_plan() computes on the controller from the node's probe
and the declared layout, so that every decision is made there and tested there:

    {"gpus": [{"index": 0, "mig_enabled": true,
               "instances": [{"profile": "3g.40gb", "nvml_index": 2, "start": 4, "size": 4},
                             ...]},
              {"index": 1, "mig_enabled": false, "instances": []}],
     "reset_command": ["nvidia-smi", "-r", "-i", "{index}"]}

Prints one JSON report: per GPU the state before (and after, with --apply), what was done,
and `error` (null, or one line saying what is wrong and what to do). Exit 0: every GPU has its
layout (or, without --apply, the report says which do not); 1: --apply failed (the error says
where it stopped); 2: bad PLAN or no NVML.

The order follows NVIDIA's mig-parted (pkg/mig/config/config.go and pkg/mig/mode/nvml.go, and
the reconfigure sequence of pkg/mig/reconfigure/reconfigure.go): a GPU whose layout differs
loses its compute instances, then its GPU instances; then the mode is set and, where the
driver keeps it pending (nvmlDeviceSetMigMode's activation status NVML_ERROR_RESET_REQUIRED),
the GPU is reset with nvidia-smi; then each GPU instance is created with a compute instance
that spans it (what `nvidia-smi mig -cgi ... -C` does). Unlike mig-parted this creates each
instance at a planned placement (gpuprov.nvidia.mig.placements), not the driver's default one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any


class ApplyError(Exception):
    """A GPU could not be given its layout; the message says where and what to do."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_gpu(nv: Any, handle: Any) -> dict:
    """MIG mode and the MIG devices by profile, as the probe reports them."""
    current, pending = nv.nvmlDeviceGetMigMode(handle)
    devices: dict[str, int] = {}
    for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            device = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nv.NVMLError_NotFound:
            continue
        # NVML names a MIG device "<GPU name> MIG <profile>" (gpuprov/node/probe/nvml.py reads it
        # so).
        profile = _text(nv.nvmlDeviceGetName(device)).rpartition(" MIG ")[2]
        devices[profile] = devices.get(profile, 0) + 1
    return {"current": bool(current), "pending": bool(pending), "devices": devices}


def wanted_devices(gpu: dict) -> dict[str, int]:
    wanted: dict[str, int] = {}
    for instance in gpu["instances"]:
        wanted[instance["profile"]] = wanted.get(instance["profile"], 0) + 1
    return wanted


def has_layout(state: dict, gpu: dict) -> bool:
    mode = bool(gpu["mig_enabled"])
    return (state["current"] == mode and state["pending"] == mode
            and state["devices"] == (wanted_devices(gpu) if mode else {}))


def gpu_instances(nv: Any, handle: Any) -> list:
    found = []
    for index in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except nv.NVMLError_NotSupported:
            continue
        array = (nv.c_nvmlGpuInstance_t * info.instanceCount)()
        count = nv.c_uint(0)
        nv.nvmlDeviceGetGpuInstances(handle, info.id, array, nv.byref(count))
        found += [array[i] for i in range(count.value)]
    return found


def compute_instances(nv: Any, gi: Any) -> list:
    found = []
    for index in range(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, index, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        except nv.NVMLError_NotSupported:
            continue
        array = (nv.c_nvmlComputeInstance_t * info.instanceCount)()
        count = nv.c_uint(0)
        nv.nvmlGpuInstanceGetComputeInstances(gi, info.id, array, nv.byref(count))
        found += [array[i] for i in range(count.value)]
    return found


def destroy_instances(nv: Any, handle: Any) -> int:
    """Compute instances first, then their GPU instances (the driver refuses the other order)."""
    gis = gpu_instances(nv, handle)
    for gi in gis:
        for ci in compute_instances(nv, gi):
            nv.nvmlComputeInstanceDestroy(ci)
        nv.nvmlGpuInstanceDestroy(gi)
    return len(gis)


def create_instance(nv: Any, handle: Any, instance: dict) -> None:
    info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, instance["nvml_index"])
    placement = nv.c_nvmlGpuInstancePlacement_t(instance["start"], instance["size"])
    # By reference: NVML takes a pointer, and pynvml (13.615) hands the argument through as it
    # is, so a bare structure would be passed by value (a crash in the real library too).
    gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, nv.byref(placement))
    # The compute instance that spans the GPU instance: the CI profile of the same slices.
    for index in reversed(range(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
        try:
            ci = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, index, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        except nv.NVMLError_NotSupported:
            continue
        if ci.sliceCount == info.sliceCount:
            nv.nvmlGpuInstanceCreateComputeInstance(gi, ci.id)
            return
    raise ApplyError(f"{instance['profile']}: NVML offers no compute instance profile "
                     f"spanning the GPU instance")


def _reset(command: list[str], index: int) -> None:
    argv = [part.replace("{index}", str(index)) for part in command]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ApplyError(f"GPU {index}: the MIG mode change needs a GPU reset, and "
                         f"`{' '.join(argv)}` could not run ({exc}): reboot the node, then "
                         f"rerun") from exc
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stdout + done.stderr).splitlines()
                 if line.strip()]
        # nvidia-smi names the GPU and the reason on its first two lines.
        why = " ".join(lines[:2]) if lines else f"exit {done.returncode}"
        raise ApplyError(f"GPU {index}: the MIG mode change needs a GPU reset, and "
                         f"`{' '.join(argv)}` failed: {why}. Stop the processes that use the "
                         f"GPU (nvidia-smi --query-compute-apps=pid,name --format=csv), or "
                         f"reboot the node, then rerun")


def apply_gpu(nv: Any, handle: Any, gpu: dict, reset_command: list[str]) -> list[str]:
    """Give one GPU its layout; the steps taken, in words."""
    index, mode = gpu["index"], bool(gpu["mig_enabled"])
    steps = []
    state = read_gpu(nv, handle)
    if state["current"]:
        destroyed = destroy_instances(nv, handle)
        if destroyed:
            steps.append(f"destroyed {destroyed} GPU instance(s)")
    if state["current"] != mode or state["pending"] != mode:
        status = nv.nvmlDeviceSetMigMode(handle, int(mode))
        steps.append(f"MIG mode {'on' if mode else 'off'}")
        state = read_gpu(nv, handle)
        if state["current"] != mode:
            steps.append(f"GPU reset (activation status {status})")
            _reset(reset_command, index)
            state = read_gpu(nv, handle)
            if state["current"] != mode:
                raise ApplyError(f"GPU {index}: MIG mode is still "
                                 f"{'off' if mode else 'on'} after the GPU reset: reboot the "
                                 f"node, then rerun")
    for instance in gpu["instances"] if mode else []:
        create_instance(nv, handle, instance)
    if mode and gpu["instances"]:
        steps.append(f"created {len(gpu['instances'])} MIG device(s)")
    return steps


def run(nv: Any, plan: dict, apply: bool) -> dict:
    report: dict = {"changed": False, "gpus": [], "error": None}
    started = time.monotonic()
    reset_command = plan.get("reset_command") or ["nvidia-smi", "-r", "-i", "{index}"]
    for gpu in plan["gpus"]:
        entry: dict = {"index": gpu["index"], "mig_enabled": gpu["mig_enabled"],
                       "wanted": wanted_devices(gpu) if gpu["mig_enabled"] else {}}
        report["gpus"].append(entry)
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(gpu["index"])
            entry["before"] = read_gpu(nv, handle)
            entry["has_layout"] = has_layout(entry["before"], gpu)
            if not apply or entry["has_layout"]:
                continue
            report["changed"] = True
            entry["steps"] = apply_gpu(nv, handle, gpu, reset_command)
            entry["after"] = read_gpu(nv, handle)
            if not has_layout(entry["after"], gpu):
                raise ApplyError(f"GPU {gpu['index']}: after the change NVML reports "
                                 f"{entry['after']}, not the layout")
        except ApplyError as exc:
            report["error"] = str(exc)
            break
        except nv.NVMLError as exc:
            report["error"] = (f"GPU {gpu['index']}: NVML: {exc}: the layout is not applied; "
                               f"see `nvidia-smi mig -lgi` and the kernel log, then rerun")
            break
    report["seconds"] = round(time.monotonic() - started, 3)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuprov-mig-apply", description=__doc__.split("\n")[0])
    parser.add_argument("plan", help="the layout per GPU, as JSON")
    parser.add_argument("--apply", action="store_true", help="change the GPUs (default: read)")
    args = parser.parse_args(argv)
    try:
        plan = json.loads(args.plan)
    except ValueError:
        plan = None
    if not isinstance(plan, dict) or not isinstance(plan.get("gpus"), list):
        print(json.dumps({"error": "PLAN must be JSON with a gpus list "
                                   "(gpuprov.nvidia.mig.node_plan)"}))
        return 2
    import pynvml as nv

    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        print(json.dumps({"error": f"NVML: {exc}: is the NVIDIA driver loaded?"}))
        return 2
    try:
        report = run(nv, plan, args.apply)
    finally:
        nv.nvmlShutdown()
    json.dump(report, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")
    return 1 if report["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
