"""NVML checks: the driver's management library answers, and sees every GPU on PCI."""

from __future__ import annotations

from gpuprov.verify.checks._util import gpu_label, nvml_error_text
from gpuprov.verify.facts import NodeFacts
from gpuprov.verify.findings import Verdict, check, passed, problem, skipped


@check(
    "nvml.init",
    phase="node",
    severity="error",
    description="NVML (libnvidia-ml, what nvidia-smi uses) initialises",
    remediation="check the driver: is the nvidia kernel module loaded (lsmod | grep nvidia) "
    "and the matching libnvidia-ml installed? Re-run site.yml, reboot if it asks",
)
def nvml_init(facts: NodeFacts) -> Verdict:
    nvml = facts.nvml
    if not nvml:
        return problem("the probe's NVML section is missing",
                       probe_errors=(facts.report.get("probe") or {}).get("errors"))
    if not nvml.get("available"):
        return problem(f"NVML did not initialise: {nvml_error_text(nvml.get('error'))}",
                       error=nvml.get("error"))
    return passed(
        f"NVML {nvml.get('nvml_version')}, driver {nvml.get('driver_version')}, "
        f"CUDA {nvml.get('cuda_driver_version')}, {nvml.get('device_count')} GPU(s)"
    )


@check(
    "nvml.gpu-count",
    phase="node",
    severity="error",
    gpu_only=False,  # a gpu_nodes host without GPUs on PCI fails here
    description="every NVIDIA GPU on PCI is a healthy NVML device",
    remediation="a GPU NVML lost (XID 79, NVML_ERROR_GPU_IS_LOST) needs a node reboot or "
    "reseat; one missing from NVML may be disabled or need a newer driver branch",
)
def gpu_count(facts: NodeFacts) -> Verdict:
    pci = facts.pci
    if not pci:
        if facts.node.gpu_expected:
            return problem("in gpu_nodes but no NVIDIA GPU on PCI (lspci -d 10de:)")
        return skipped("no NVIDIA GPU on PCI")
    if not facts.nvml.get("available"):
        return skipped("NVML unavailable (see nvml.init)", pci=len(pci))
    healthy = facts.healthy_gpus
    broken = [g for g in facts.gpus if g.get("error") is not None]
    details = {"pci": len(pci), "nvml": facts.nvml.get("device_count"),
               "nvml_healthy": len(healthy)}
    if len(healthy) == len(pci) and not broken:
        return passed(f"{len(pci)} on PCI, {len(healthy)} healthy in NVML", **details)
    parts = [f"{len(pci)} GPU(s) on PCI but {len(healthy)} healthy in NVML"]
    parts += [f"{gpu_label(g)}: {nvml_error_text(g.get('error'))}" for g in broken]
    nvml_buses = {str(g.get("pci_bus_id", "")).lower()[-12:] for g in healthy}
    missing = [d["address"] for d in pci if str(d.get("address", "")).lower() not in nvml_buses]
    if missing and len(missing) < len(pci):
        parts.append("not in NVML: " + ", ".join(missing))
    return problem("; ".join(parts), **details,
                   lost=[{"index": g.get("index"), "error": g.get("error")} for g in broken])
