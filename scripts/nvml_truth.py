#!/usr/bin/env python3
"""What a real GPU answers, next to what gpuprov reads of it: run on a machine with an NVIDIA
GPU and driver, it records NVML's raw answers and compares the probe with `nvidia-smi -q -x`.

    scripts/nvml_truth.py record --out DIR
        DIR/nvml-record.json  NVML's answers to every call the probe makes, in the spec format
                              of tests/fixtures/probe/fake_pynvml.py (so a unit test can replay
                              them), plus the calls the health agent and MIG stage rely on
                              ("extras"), with model, driver and date
        DIR/probe.json        the probe report (python3 -m gpuprov.node.probe), real pynvml
        DIR/nvidia-smi.xml    nvidia-smi -q -x, the same moment
        and prints the comparison (exit 1 where a value differs)
    scripts/nvml_truth.py compare PROBE_JSON SMI_XML
        the comparison again, offline (tests/unit/test_real_gpu.py runs it on the fixtures)

Why both: nvidia-smi is NVIDIA's own reading of the same NVML; where the probe's value and
nvidia-smi's differ, the probe (or a unit conversion) is wrong, not the GPU. Values that move
by themselves (temperature, power, utilisation, used memory) are compared within a tolerance.
Needs only python3, pynvml and this checkout (gpuprov on sys.path).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuprov.nvidia.hardware import GO_NVLIB_BRANDS  # noqa: E402 (after the path)

MIB = 1024 * 1024


# ---------------------------------------------------------------- recording NVML's answers

def _plain(value: Any) -> Any:
    """pynvml's answers (ctypes structures, bytes, tuples) as JSON values."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, ctypes.Array):
        return [_plain(v) for v in value]
    if isinstance(value, ctypes._SimpleCData):  # pynvml returns some counters as c_uint
        return _plain(value.value)
    fields = getattr(value, "_fields_", None)
    if fields is not None:
        return {name: _plain(getattr(value, name)) for name, *_ in fields}
    if value is None or isinstance(value, (bool, int, float, str, dict)):
        return value
    return repr(value)  # a pointer or handle: kept as text, never a failed record


class Recorder:
    """Calls NVML and keeps each answer, or the error code it raised, per function name."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv

    def call(self, name: str, *args: Any) -> tuple[Any, int | None]:
        func = getattr(self.nv, name, None)
        if func is None:
            return None, -1  # this pynvml has no such function
        try:
            return func(*args), None
        except self.nv.NVMLError as exc:
            return None, int(getattr(exc, "value", 999))

    def answer(self, name: str, *args: Any) -> dict:
        value, error = self.call(name, *args)
        if error == -1:
            return {"missing_in_pynvml": True}
        if error is not None:
            return {"error": error}
        return {"value": _plain(value)}


def _pci_hex(packed: int) -> str:
    return f"{packed:08x}"


def _record_ecc_and_retired(rec: Recorder, handle: Any, gpu: dict) -> None:
    ecc = {}
    for counter in (0, 1):
        for error_type in (0, 1):
            value, err = rec.call("nvmlDeviceGetTotalEccErrors", handle, error_type, counter)
            if err is not None:
                gpu["errors"]["nvmlDeviceGetTotalEccErrors"] = err
            else:
                ecc[f"{counter},{error_type}"] = value
    if ecc:
        gpu["ecc"] = ecc
    retired: dict = {}
    for key, cause in (("sbe", 0), ("dbe", 1)):
        value, err = rec.call("nvmlDeviceGetRetiredPages", handle, cause)
        if err is not None:
            gpu["errors"]["nvmlDeviceGetRetiredPages"] = err
        else:
            retired[key] = _plain(value)
    value, err = rec.call("nvmlDeviceGetRetiredPagesPendingStatus", handle)
    if err is not None:
        gpu["errors"]["nvmlDeviceGetRetiredPagesPendingStatus"] = err
    else:
        retired["pending"] = value
    if retired:
        gpu["retired"] = retired


def record_gpu(rec: Recorder, index: int) -> dict:
    """One GPU in fake_pynvml's spec format: the calls gpuprov/node/probe/nvml.py makes."""
    nv = rec.nv
    handle, error = rec.call("nvmlDeviceGetHandleByIndex", index)
    if error is not None:
        return {"handle_error": error}
    gpu: dict = {"errors": {}}

    def keep(key: str, name: str, *args: Any, convert=_plain) -> Any:
        value, err = rec.call(name, handle, *args)
        if err is not None:
            gpu["errors"][name] = err
            return None
        gpu[key] = convert(value)
        return value

    keep("name", "nvmlDeviceGetName")
    keep("uuid", "nvmlDeviceGetUUID")
    keep("serial", "nvmlDeviceGetSerial")
    keep("minor", "nvmlDeviceGetMinorNumber")
    pci, err = rec.call("nvmlDeviceGetPciInfo", handle)
    if err is None:
        gpu["bus_id"] = _plain(pci.busId)
        gpu["pci_device_id"] = _pci_hex(pci.pciDeviceId)
        gpu["pci_subsystem_id"] = _pci_hex(pci.pciSubSystemId)
    else:
        gpu["errors"]["nvmlDeviceGetPciInfo"] = err
    keep("memory", "nvmlDeviceGetMemoryInfo",
         convert=lambda m: {"total": m.total, "used": m.used, "free": m.free})
    if getattr(nv, "nvmlMemory_v2", None) is not None:
        value, err = rec.call("nvmlDeviceGetMemoryInfo", handle, nv.nvmlMemory_v2)
        if err is None:
            gpu["memory_v2"] = {"total": value.total, "reserved": value.reserved,
                                "used": value.used, "free": value.free}
    keep("cc", "nvmlDeviceGetCudaComputeCapability")
    keep("arch", "nvmlDeviceGetArchitecture")
    keep("temp", "nvmlDeviceGetTemperature", 0)
    keep("slowdown", "nvmlDeviceGetTemperatureThreshold", 1)
    keep("shutdown", "nvmlDeviceGetTemperatureThreshold", 0)
    keep("util", "nvmlDeviceGetUtilizationRates", convert=lambda u: [u.gpu, u.memory])
    keep("power_mw", "nvmlDeviceGetPowerUsage")
    keep("limit_mw", "nvmlDeviceGetEnforcedPowerLimit")
    keep("persistence", "nvmlDeviceGetPersistenceMode")
    keep("ecc_mode", "nvmlDeviceGetEccMode")
    _record_ecc_and_retired(rec, handle, gpu)
    keep("remapped", "nvmlDeviceGetRemappedRows")
    keep("reasons", "nvmlDeviceGetCurrentClocksEventReasons")
    pcie = [rec.call(name, handle) for name in (
        "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth")]
    gpu["pcie"] = [value for value, _ in pcie]
    for (_, err), name in zip(pcie, ("nvmlDeviceGetCurrPcieLinkGeneration",
                                     "nvmlDeviceGetMaxPcieLinkGeneration",
                                     "nvmlDeviceGetCurrPcieLinkWidth",
                                     "nvmlDeviceGetMaxPcieLinkWidth"), strict=True):
        if err is not None:
            gpu["errors"][name] = err
    keep("processes", "nvmlDeviceGetComputeRunningProcesses",
         convert=lambda ps: [[p.pid, p.usedGpuMemory] for p in ps])
    mode, err = rec.call("nvmlDeviceGetMigMode", handle)
    if err is not None:
        gpu["errors"]["nvmlDeviceGetMigMode"] = err
    else:
        gpu["mig_mode"] = _plain(mode)
        keep("max_mig_devices", "nvmlDeviceGetMaxMigDeviceCount")
    gpu["extras"] = record_extras(rec, handle, nv)
    return gpu


def record_extras(rec: Recorder, handle: Any, nv: Any) -> dict:
    """Calls beyond the probe's: what the health agent, the MIG stage and labels may read."""
    extras: dict = {}
    for name in ("nvmlDeviceGetBrand", "nvmlDeviceGetVbiosVersion", "nvmlDeviceGetBoardPartNumber",
                 "nvmlDeviceGetInforomImageVersion", "nvmlDeviceGetGspFirmwareVersion",
                 "nvmlDeviceGetGspFirmwareMode", "nvmlDeviceGetPowerManagementLimit",
                 "nvmlDeviceGetPowerManagementDefaultLimit",
                 "nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceGetPerformanceState",
                 "nvmlDeviceGetComputeMode", "nvmlDeviceGetDisplayMode",
                 "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetFanSpeed",
                 "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetSupportedEventTypes",
                 "nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetBAR1MemoryInfo",
                 "nvmlDeviceGetNumGpuCores", "nvmlDeviceGetMemoryBusWidth",
                 "nvmlDeviceGetModuleId", "nvmlDeviceGetRowRemapperHistogram",
                 "nvmlDeviceGetAttributes_v2", "nvmlDeviceIsMigDeviceHandle",
                 "nvmlDeviceGetBoardId", "nvmlDeviceGetMultiGpuBoard",
                 "nvmlDeviceGetVirtualizationMode", "nvmlDeviceGetHostVgpuMode",
                 "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetIndex",
                 "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetNumaNodeId"):
        extras[name] = rec.answer(name, handle)
    extras["nvmlDeviceGetTemperatureThreshold"] = {
        str(t): rec.answer("nvmlDeviceGetTemperatureThreshold", handle, t) for t in range(8)}
    extras["nvmlDeviceGetClockInfo"] = {
        str(c): rec.answer("nvmlDeviceGetClockInfo", handle, c) for c in range(4)}
    extras["nvmlDeviceGetMaxClockInfo"] = {
        str(c): rec.answer("nvmlDeviceGetMaxClockInfo", handle, c) for c in range(4)}
    extras["nvmlDeviceGetNvLinkState"] = {
        str(link): rec.answer("nvmlDeviceGetNvLinkState", handle, link) for link in range(18)}
    # MIG's GPU instance profiles (what `nvidia-smi mig -lgip` lists), by profile id: the
    # facts gpuprov/nvidia/mig.py keeps per model.
    extras["nvmlDeviceGetGpuInstanceProfileInfo"] = {
        str(p): rec.answer("nvmlDeviceGetGpuInstanceProfileInfo", handle, p) for p in range(16)}
    return extras


def record_nvml(nv: Any) -> dict:
    rec = Recorder(nv)
    spec: dict = {"errors": {}}
    _, err = rec.call("nvmlInit")
    if err is not None:
        return {"init_error": err}
    try:
        for key, name in (("driver_version", "nvmlSystemGetDriverVersion"),
                          ("nvml_version", "nvmlSystemGetNVMLVersion"),
                          ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion")):
            value, err = rec.call(name)
            if err is None:
                spec[key] = _plain(value)
            else:
                spec["errors"][name] = err
        count, err = rec.call("nvmlDeviceGetCount")
        spec["gpus"] = [record_gpu(rec, i) for i in range(count or 0)]
    finally:
        rec.call("nvmlShutdown")
    return spec


def metadata(spec: dict) -> dict:
    try:
        from importlib.metadata import version
        pynvml_version = version("nvidia-ml-py")
    except Exception:  # noqa: BLE001 (a record without the version is still a record)
        pynvml_version = None
    return {
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "models": [g.get("name") for g in spec.get("gpus", [])],
        "driver_version": spec.get("driver_version"),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "nvidia_ml_py": pynvml_version,
        "how": "scripts/nvml_truth.py record",
    }


# ---------------------------------------------------------------- nvidia-smi -q -x

def _text(node: ET.Element | None, path: str) -> str | None:
    found = node.find(path) if node is not None else None
    text = found.text.strip() if found is not None and found.text else None
    return None if text in (None, "N/A", "[N/A]", "Not Supported", "[Not Supported]") else text


def _number(text: str | None) -> float | None:
    """'143771 MiB', '30 C', '69.43 W', '16x', '0 %' -> the number."""
    if text is None:
        return None
    head = text.split()[0].rstrip("x%")
    try:
        return float(head)
    except ValueError:
        return None


def _enabled(text: str | None) -> bool | None:
    return None if text is None else text.lower() in ("enabled", "yes", "active")


def _pci_from_smi(text: str | None) -> str | None:
    """nvidia-smi's '233510DE' (device then vendor) -> the probe's '10de:2335'."""
    if not text or len(text) < 8:
        return None
    value = int(text, 16)
    return f"{value & 0xFFFF:04x}:{value >> 16:04x}"


def _threshold(gpu: ET.Element, which: str) -> float | None:
    """A temperature threshold in C: nvidia-smi's absolute gpu_temp_<which>_threshold, or,
    where it shows thresholds against T.Limit (R550 and later on Hopper: gpu_temp_tlimit is
    the headroom to T.Limit, gpu_temp_<which>_tlimit_threshold the threshold's offset below
    T.Limit, negative above), T.Limit - offset with T.Limit = current + headroom."""
    absolute = _number(_text(gpu, f"temperature/gpu_temp_{which}_threshold"))
    if absolute is not None:
        return absolute
    current = _number(_text(gpu, "temperature/gpu_temp"))
    headroom = _number(_text(gpu, "temperature/gpu_temp_tlimit"))
    offset = _number(_text(gpu, f"temperature/gpu_temp_{which}_tlimit_threshold"))
    if None in (current, headroom, offset):
        return None
    return current + headroom - offset


def smi_values(xml_text: str) -> dict:
    """nvidia-smi -q -x as the probe's field names: {"system": {...}, "gpus": {bus_id: {...}}}."""
    root = ET.fromstring(xml_text)
    system = {
        "driver_version": _text(root, "driver_version"),
        "cuda_driver_version": _text(root, "cuda_version"),
        "device_count": int(_number(_text(root, "attached_gpus")) or 0),
    }
    gpus = {}
    link = "pci/pci_gpu_link_info"
    for gpu in root.findall("gpu"):
        bus = (gpu.get("id") or _text(gpu, "pci/pci_bus_id") or "").lower()
        power = gpu.find("gpu_power_readings")
        if power is None:
            power = gpu.find("power_readings")
        reasons = gpu.find("clocks_event_reasons")
        if reasons is None:
            reasons = gpu.find("clocks_throttle_reasons")
        active = sorted(
            child.tag.split("_reason_", 1)[1]
            for child in (reasons if reasons is not None else [])
            if "_reason_" in child.tag and (child.text or "").strip() == "Active")
        uncorrected = [_number(_text(child, ".")) for child in gpu.findall("ecc_errors/volatile/*")
                       if "uncorrectable" in child.tag]
        corrected = [_number(_text(child, ".")) for child in gpu.findall("ecc_errors/volatile/*")
                     if child.tag.endswith("_correctable")]
        gpus[bus] = {
            "name": _text(gpu, "product_name"),
            "uuid": _text(gpu, "uuid"),
            "serial": _text(gpu, "serial"),
            "minor_number": _number(_text(gpu, "minor_number")),
            "pci_bus_id": _text(gpu, "pci/pci_bus_id"),
            "pci_device_id": _pci_from_smi(_text(gpu, "pci/pci_device_id")),
            "pci_subsystem_id": _pci_from_smi(_text(gpu, "pci/pci_sub_system_id")),
            "architecture": _text(gpu, "product_architecture"),
            "brand": _text(gpu, "product_brand"),
            "memory.total_mib": _number(_text(gpu, "fb_memory_usage/total")),
            "memory.reserved_mib": _number(_text(gpu, "fb_memory_usage/reserved")),
            "memory.used_mib": _number(_text(gpu, "fb_memory_usage/used")),
            "memory.free_mib": _number(_text(gpu, "fb_memory_usage/free")),
            "temperature.current": _number(_text(gpu, "temperature/gpu_temp")),
            "temperature.slowdown": _threshold(gpu, "slow"),
            "temperature.shutdown": _threshold(gpu, "max"),
            "utilization.gpu": _number(_text(gpu, "utilization/gpu_util")),
            "utilization.memory": _number(_text(gpu, "utilization/memory_util")),
            "power.usage_w": _number(_text(power, "power_draw")
                                     or _text(power, "instant_power_draw")),
            "power.limit_w": _number(_text(power, "current_power_limit")
                                     or _text(power, "enforced_power_limit")
                                     or _text(power, "power_limit")),
            "persistence_mode": _enabled(_text(gpu, "persistence_mode")),
            "ecc.mode_current": _enabled(_text(gpu, "ecc_mode/current_ecc")),
            "ecc.mode_pending": _enabled(_text(gpu, "ecc_mode/pending_ecc")),
            "ecc.volatile.uncorrected": (sum(v for v in uncorrected if v is not None)
                                         if any(v is not None for v in uncorrected) else None),
            "ecc.volatile.corrected": (sum(v for v in corrected if v is not None)
                                       if any(v is not None for v in corrected) else None),
            "remapped_rows.correctable": _number(_text(gpu, "remapped_rows/remapped_row_corr")),
            "remapped_rows.uncorrectable": _number(_text(gpu, "remapped_rows/remapped_row_unc")),
            "remapped_rows.pending": _enabled(_text(gpu, "remapped_rows/remapped_row_pending")),
            "remapped_rows.failure": _enabled(_text(gpu, "remapped_rows/remapped_row_failure")),
            "clock_event_reasons.names": active,
            "pcie.gen_current": _number(_text(gpu, f"{link}/pcie_gen/current_link_gen")),
            "pcie.gen_max": _number(_text(gpu, f"{link}/pcie_gen/max_link_gen")),
            "pcie.width_current": _number(_text(gpu, f"{link}/link_widths/current_link_width")),
            "pcie.width_max": _number(_text(gpu, f"{link}/link_widths/max_link_width")),
            "processes": len(gpu.findall("processes/process_info")),
            "mig.current": _enabled(_text(gpu, "mig_mode/current_mig")),
            "mig.pending": _enabled(_text(gpu, "mig_mode/pending_mig")),
        }
    return {"system": system, "gpus": gpus}


# ---------------------------------------------------------------- the comparison

# Values that move by themselves between the probe's read and nvidia-smi's: (absolute slack).
LIVE = {"temperature.current": 3, "utilization.gpu": 10, "utilization.memory": 10,
        "power.usage_w": 15.0, "memory.used_mib": 64, "memory.free_mib": 64}


def _dig(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(doc, dict):
            return None
        doc = doc.get(part)
    return doc


def probe_values(report: dict) -> dict:
    """The probe report's values, keyed as smi_values() keys them."""
    nvml = report.get("nvml") or {}
    system = {k: nvml.get(k) for k in ("driver_version", "cuda_driver_version", "device_count")}
    gpus = {}
    for gpu in nvml.get("gpus") or []:
        bus = str(gpu.get("pci_bus_id") or "").lower()
        memory = gpu.get("memory") or {}
        values = {key: _dig(gpu, key) for key in (
            "name", "uuid", "serial", "minor_number", "pci_bus_id", "pci_device_id",
            "pci_subsystem_id", "architecture", "temperature.current", "temperature.slowdown",
            "temperature.shutdown", "utilization.gpu", "utilization.memory", "power.usage_w",
            "power.limit_w", "persistence_mode", "ecc.mode_current", "ecc.mode_pending",
            "ecc.volatile.uncorrected", "ecc.volatile.corrected", "remapped_rows.correctable",
            "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure",
            "pcie.gen_current", "pcie.gen_max", "pcie.width_current", "pcie.width_max",
            "mig.current", "mig.pending")}
        for key in ("total", "used", "free", "reserved"):
            values[f"memory.{key}_mib"] = (None if memory.get(key) is None
                                           else memory[key] / MIB)
        values["clock_event_reasons.names"] = sorted(
            (gpu.get("clock_event_reasons") or {}).get("names") or [])
        values["processes"] = len(gpu.get("processes") or [])
        brand = gpu.get("brand_nvml")
        values["brand"] = GO_NVLIB_BRANDS.get(brand, brand)  # as NVIDIA's DRA driver names it
        gpus[bus] = values
    return {"system": system, "gpus": gpus}


def _same(key: str, ours: Any, theirs: Any) -> bool:
    if key == "architecture" and ours is not None and theirs is not None:
        return str(ours).lower().replace("-", " ") == str(theirs).lower().replace("-", " ")
    if key == "brand" and ours is not None and theirs is not None:
        # go-nvlib's "Nvidia", "NvidiaRTX" are nvidia-smi's "NVIDIA", "NVIDIA RTX"
        return str(ours).lower() == str(theirs).lower().replace(" ", "")
    if isinstance(ours, bool) or isinstance(theirs, bool):
        return ours == theirs
    if isinstance(ours, (int, float)) and isinstance(theirs, (int, float)):
        # nvidia-smi shows whole MiB, not always rounded to the nearest (615.06 MiB reserved
        # shows as 616 on the H200 of tests/fixtures/real/).
        return abs(ours - theirs) <= LIVE.get(key, 1.0 if key.endswith("_mib") else 1e-6)
    return ours == theirs


def compare(report: dict, xml_text: str) -> list[dict]:
    """One row per value: field, probe's, nvidia-smi's, and verdict (same | differs |
    smi-none: nvidia-smi does not show it | probe-none: the probe has no value)."""
    ours, theirs = probe_values(report), smi_values(xml_text)
    rows = []

    def row(where: str, key: str, a: Any, b: Any) -> None:
        if b is None and a is not None:
            verdict = "smi-none"
        elif a is None and b is not None:
            verdict = "probe-none"
        else:
            verdict = "same" if _same(key, a, b) else "differs"
        rows.append({"gpu": where, "field": key, "probe": a, "nvidia_smi": b, "verdict": verdict})

    for key in ("driver_version", "cuda_driver_version", "device_count"):
        row("system", key, ours["system"].get(key), theirs["system"].get(key))
    for bus in sorted(set(ours["gpus"]) | set(theirs["gpus"])):
        a, b = ours["gpus"].get(bus), theirs["gpus"].get(bus)
        if a is None or b is None:
            rows.append({"gpu": bus, "field": "(gpu)", "probe": a is not None,
                         "nvidia_smi": b is not None, "verdict": "differs"})
            continue
        for key in sorted(set(a) | set(b)):
            row(bus, key, a.get(key), b.get(key))
    return rows


def print_rows(rows: list[dict]) -> None:
    for r in rows:
        print(f"{r['verdict']:<10} {r['gpu']:<17} {r['field']:<28} probe={r['probe']!r} "
              f"nvidia-smi={r['nvidia_smi']!r}")
    differs = sum(r["verdict"] == "differs" for r in rows)
    print(f"{len(rows)} values: {sum(r['verdict'] == 'same' for r in rows)} same, {differs} "
          f"differ, {sum(r['verdict'] == 'smi-none' for r in rows)} not shown by nvidia-smi, "
          f"{sum(r['verdict'] == 'probe-none' for r in rows)} missing in the probe")


# ---------------------------------------------------------------- commands

def _record(out: Path) -> int:
    import pynvml

    from gpuprov.node.probe.report import collect

    out.mkdir(parents=True, exist_ok=True)
    spec = record_nvml(pynvml)
    spec["meta"] = metadata(spec)
    (out / "nvml-record.json").write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    report = collect(root="/")
    (out / "probe.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    try:
        smi = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True,
                             check=False, timeout=120)
    except FileNotFoundError:
        print("nvidia-smi is not on PATH: nothing to compare with", file=sys.stderr)
        return 2
    (out / "nvidia-smi.xml").write_text(smi.stdout)
    if smi.returncode != 0:
        print(f"nvidia-smi -q -x exited {smi.returncode}: {smi.stderr.strip()}", file=sys.stderr)
        return 2
    rows = compare(report, smi.stdout)
    print_rows(rows)
    return 1 if any(r["verdict"] == "differs" for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="on a GPU machine: record NVML, the probe, nvidia-smi")
    rec.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "nvml-truth")))
    cmp_ = sub.add_parser("compare", help="compare a recorded probe report with nvidia-smi XML")
    cmp_.add_argument("probe_json", type=Path)
    cmp_.add_argument("smi_xml", type=Path)
    args = parser.parse_args(argv)
    if args.command == "record":
        return _record(args.out)
    rows = compare(json.loads(args.probe_json.read_text()), args.smi_xml.read_text())
    print_rows(rows)
    return 1 if any(r["verdict"] == "differs" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
