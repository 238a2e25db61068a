"""`gpuprov probe [--json]`: what this node has (GPUs on PCI, NVML, driver, runtime).

The report is facts, not verdicts (those are `gpuprov verify`'s), so the exit code is
0 whenever the probe ran, NVML errors included.
"""

from __future__ import annotations

import argparse

from gpuprov.errors import ExitCode
from gpuprov.output import print_json, render_table
from gpuprov.payload import run_probe_local

GIB = 1024**3


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "probe",
        help="report this node's GPUs, NVML view, driver and container runtime",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--json", action="store_true", help="print the full JSON report")
    parser.add_argument("--root", default="/", help=argparse.SUPPRESS)  # fixture trees
    parser.set_defaults(func=run)


def _error_text(error: dict | None) -> str | None:
    if not error:
        return None
    return f"{error.get('name')} ({error.get('code')}): {error.get('message')}"


def _gib(value: int | None) -> str | None:
    return None if value is None else f"{value / GIB:.1f}"


def _match_gpus(pci: list[dict], gpus: list[dict]) -> dict[str, dict]:
    """PCI address -> NVML GPU, by bus ID; a GPU whose handle failed has no bus ID and
    takes the first unmatched address, since NVML enumerates GPUs in PCI bus order."""
    addresses = [device["address"].lower() for device in pci]
    matched: dict[str, dict] = {}
    for gpu in gpus:
        bus_id = (gpu.get("pci_bus_id") or "").lower()[-12:]  # "00000000:3b:00.0" -> 12 chars
        if bus_id in addresses:
            matched[bus_id] = gpu
    unmatched = [a for a in addresses if a not in matched]
    for gpu in gpus:
        if not gpu.get("pci_bus_id") and unmatched:
            matched[unmatched.pop(0)] = gpu
    return matched


def summary(report: dict) -> str:
    """The human view of a probe report."""
    host = report.get("host") or {}
    os_name = (host.get("os") or {}).get("pretty_name")
    lines = [f"host     {host.get('hostname')}  ({os_name}, kernel {host.get('kernel')})"]
    nvml = report.get("nvml") or {}
    module = report.get("kernel_module") or {}
    pci = report.get("pci") or []
    if not pci:
        lines.append("GPUs     no NVIDIA GPU on PCI")
    module_text = (
        f"{module.get('version')} ({module.get('flavor') or 'flavor unknown'})"
        if module.get("loaded")
        else "not loaded"
    )
    if nvml.get("available"):
        nvml_text = (
            f"driver {nvml.get('driver_version')}, "
            f"CUDA {nvml.get('cuda_driver_version')}, {nvml.get('device_count')} GPU(s)"
        )
    else:
        nvml_text = f"unavailable: {_error_text(nvml.get('error'))}"
    lines.append(f"NVML     {nvml_text}")
    lines.append(f"module   {module_text}")
    packages = report.get("packages") or {}
    held = [p["name"] for p in packages.get("driver", []) if p.get("held")]
    lines.append(
        f"packages {len(packages.get('driver', []))} driver package(s), "
        f"{len(held)} held; CUDA toolkit on host: "
        + (", ".join(p["name"] for p in packages.get("cuda_toolkit", [])) or "none")
    )
    runtime = report.get("container_runtime") or {}
    runtimes = [
        f"{name} (nvidia runtime {'yes' if info.get('nvidia_runtime') else 'no'})"
        for name, info in runtime.items()
        if isinstance(info, dict) and info.get("present")
    ]
    lines.append("runtime  " + (", ".join(runtimes) or "no containerd/Docker/CRI-O config"))
    if pci:
        matched = _match_gpus(pci, nvml.get("gpus", []))
        rows = []
        for device in pci:
            gpu = matched.get(device["address"].lower(), {})
            classification = device.get("classification") or {}
            memory = gpu.get("memory") or {}
            temperature = gpu.get("temperature") or {}
            rows.append(
                [
                    device["address"],
                    device["device_id"],
                    gpu.get("name") or classification.get("name"),
                    classification.get("architecture"),
                    gpu.get("index"),
                    _gib(memory.get("total")),
                    temperature.get("current"),
                    _error_text(gpu.get("error")) or ("ok" if gpu else "not in NVML"),
                ]
            )
        lines.append("")
        lines.append(
            render_table(["PCI", "ID", "NAME", "ARCH", "NVML", "MEM GiB", "TEMP C", "STATE"], rows)
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    report = run_probe_local(root=args.root)
    if args.json:
        print_json(report)
    else:
        print(summary(report))
    return int(ExitCode.OK)
