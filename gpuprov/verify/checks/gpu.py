"""Per-GPU health from NVML and the kernel log: persistence, ECC, memory remapping, XID,
thermal slowdown, PCIe link, MIG. One finding per node; the details name each GPU."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpuprov.nvidia import mig, xid_catalog
from gpuprov.verify.checks._util import gpu_label
from gpuprov.verify.facts import NodeFacts
from gpuprov.verify.findings import Verdict, check, passed, problem, skipped

Gpu = Mapping[str, Any]

# XIDs that mean the GPU or its memory is in trouble, not that an application crashed: the
# faults of gpuprov's XID table (gpuprov/nvidia/xid_catalog.py, with its sources).
CRITICAL_XIDS: dict[int, str] = xid_catalog.FAULT_XIDS

SLOWDOWN_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                    "hw_power_brake_slowdown")


def _per_gpu(facts: NodeFacts, judge: Callable[[Gpu], str | None], what: str,
             ok: str) -> Verdict:
    """Run judge on every healthy GPU: None is fine, a string is that GPU's problem."""
    gpus = facts.healthy_gpus
    if not gpus:
        return skipped("no GPU answers NVML (see nvml.init, nvml.gpu-count)")
    bad = {gpu_label(g): reason for g in gpus if (reason := judge(g)) is not None}
    if bad:
        return problem(f"{len(bad)} of {len(gpus)} GPU(s) {what}: "
                       + "; ".join(f"{k}: {v}" for k, v in bad.items()), gpus=bad)
    return passed(f"{len(gpus)} GPU(s) {ok}")


@check(
    "gpu.persistence",
    phase="node",
    severity="error",
    description="persistence mode is on (nvidia-persistenced keeps the driver initialised)",
    remediation="systemctl enable --now nvidia-persistenced (the nvidia_driver role does)",
)
def persistence(facts: NodeFacts) -> Verdict:
    def judge(g: Gpu) -> str | None:
        mode = g.get("persistence_mode")
        return None if mode else ("unknown" if mode is None else "off")

    return _per_gpu(facts, judge, "without persistence mode", "in persistence mode")


@check(
    "gpu.ecc",
    phase="node",
    severity="error",
    description="no volatile (since driver load) uncorrectable ECC errors",
    remediation="drain the node, reset the GPU (nvidia-smi -r) or reboot; repeated "
    "uncorrectable errors mean the board needs replacing (RMA)",
)
def ecc(facts: NodeFacts) -> Verdict:
    def judge(g: Gpu) -> str | None:
        volatile = ((g.get("ecc") or {}).get("volatile") or {})
        uncorrected = volatile.get("uncorrected")
        return f"{uncorrected} uncorrectable error(s)" if uncorrected else None

    return _per_gpu(facts, judge, "with uncorrectable ECC errors", "without uncorrectable "
                    "ECC errors (or without ECC)")


@check(
    "gpu.memory-remap",
    phase="node",
    severity="error",
    description="no page retirement or row remapping pending a reset, and no remap failure",
    remediation="drain the node and reset the GPU (or reboot) to apply the pending "
    "retirement/remap; a remap failure means the board needs replacing (RMA)",
)
def memory_remap(facts: NodeFacts) -> Verdict:
    def judge(g: Gpu) -> str | None:
        rows, pages = g.get("remapped_rows") or {}, g.get("retired_pages") or {}
        if rows.get("failure"):
            return "row remapping failed"
        if rows.get("pending"):
            return f"row remap pending ({rows.get('uncorrectable')} uncorrectable row(s))"
        if pages.get("pending"):
            return f"page retirement pending ({pages.get('dbe')} double-bit page(s))"
        return None

    return _per_gpu(facts, judge, "need a reset to remap memory", "without pending "
                    "memory remapping")


@check(
    "gpu.xid",
    phase="node",
    severity="error",
    description="no critical XID (GPU fault reported by the driver) in the kernel log since boot",
    remediation="look up the XID in NVIDIA's XID catalogue; most need a GPU reset or "
    "reboot, repeated ones a hardware check",
)
def xid(facts: NodeFacts) -> Verdict:
    log = facts.report.get("kernel_log") or {}
    if not log.get("readable"):
        return skipped(f"kernel log not readable ({log.get('error')}); run verify as root "
                       "(ansible_become) to check XIDs")
    events = log.get("xid_events") or []
    critical = [e for e in events if e.get("xid") in CRITICAL_XIDS]
    if critical:
        text = "; ".join(f"XID {e['xid']} on {e.get('pci')} ({CRITICAL_XIDS[e['xid']]})"
                         for e in critical[:5])
        more = f" and {len(critical) - 5} more" if len(critical) > 5 else ""
        return problem(f"{len(critical)} critical XID(s) since boot: {text}{more}",
                       xids=[dict(e) for e in critical])
    return passed(f"no critical XID since boot ({log.get('xid_count', 0)} XID(s) in all)")


@check(
    "gpu.thermal",
    phase="node",
    severity="error",
    description="GPUs below their slowdown temperature, with no thermal or hardware slowdown",
    remediation="check the node's cooling (fans, airflow, inlet temperature) and power; "
    "nvidia-smi -q -d PERFORMANCE,TEMPERATURE shows the reasons",
)
def thermal(facts: NodeFacts) -> Verdict:
    def judge(g: Gpu) -> str | None:
        temperature = g.get("temperature") or {}
        current, slowdown = temperature.get("current"), temperature.get("slowdown")
        reasons = [r for r in ((g.get("clock_event_reasons") or {}).get("names") or [])
                   if r in SLOWDOWN_REASONS]
        problems = []
        if current is not None and slowdown is not None and current >= slowdown:
            problems.append(f"{current} C >= slowdown {slowdown} C")
        if reasons:
            problems.append("clocks slowed: " + ", ".join(reasons))
        return ", ".join(problems) or None

    return _per_gpu(facts, judge, "too hot or slowed down", "below slowdown temperature, "
                    "not slowed down")


@check(
    "gpu.pcie",
    phase="node",
    severity="warning",
    description="PCIe link at its maximum width, and generation when the GPU is busy",
    remediation="reseat the GPU or riser, check the slot's BIOS link settings",
)
def pcie(facts: NodeFacts) -> Verdict:
    def judge(g: Gpu) -> str | None:
        link = g.get("pcie") or {}
        problems = []
        width, width_max = link.get("width_current"), link.get("width_max")
        if width is not None and width_max is not None and width < width_max:
            problems.append(f"x{width} of x{width_max}")
        gen, gen_max = link.get("gen_current"), link.get("gen_max")
        # An idle GPU lowers its link generation to save power; only a busy one must be
        # at its maximum.
        idle = "gpu_idle" in ((g.get("clock_event_reasons") or {}).get("names") or [])
        if gen is not None and gen_max is not None and gen < gen_max and not idle:
            problems.append(f"gen {gen} of {gen_max}")
        return ", ".join(problems) or None

    return _per_gpu(facts, judge, "with a degraded PCIe link", "with full PCIe links")


def _pci_device(gpu: Gpu) -> int | None:
    """NVML's "10de:2330" -> 0x2330."""
    try:
        return int(str(gpu.get("pci_device_id")).split(":")[1], 16)
    except (IndexError, ValueError):
        return None


def _declared(facts: NodeFacts, gpus: list[Gpu]) -> dict[int, mig.GpuLayout] | str:
    """The declared layout per NVML index, or why it cannot be used."""
    try:
        configs = (mig.default_configs() if facts.node.mig_configs is None
                   else mig.validate(facts.node.mig_configs))
        layouts = mig.plan(configs, facts.node.mig_config or "",
                           [(int(g.get("index") or 0), _pci_device(g) or 0) for g in gpus])
    except mig.ConfigError as exc:
        return f"gpu_mig_config {facts.node.mig_config!r}: {exc}"
    return {layout.index: layout for layout in layouts}


@check(
    "gpu.mig",
    phase="node",
    severity="error",
    description="each MIG-capable GPU's MIG mode has no change pending, and where a layout is "
    "declared (gpu_mig_config), its mode and MIG devices are the layout's",
    remediation="apply the layout again (the gpu_mig stage of site.yml); a pending mode needs a "
    "GPU reset (nvidia-smi -r) or a reboot with the GPU idle",
)
def mig_layout(facts: NodeFacts) -> Verdict:
    gpus = facts.healthy_gpus
    if not gpus:
        return skipped("no GPU answers NVML (see nvml.init, nvml.gpu-count)")
    capable = [g for g in gpus if g.get("mig") is not None]
    declared: dict[int, mig.GpuLayout] | str = {}
    if facts.node.mig_config:
        declared = _declared(facts, gpus)
        if isinstance(declared, str):
            return problem(declared)
    if not capable and not any(layout.mig_enabled for layout in declared.values()):
        return skipped("no GPU with MIG on this node")
    bad = {gpu_label(g): reason for g in gpus
           if (reason := mig.difference(g.get("mig"), declared.get(int(g.get("index") or 0)),
                                        g.get("index"))) is not None}
    devices = sum(len((g.get("mig") or {}).get("devices") or []) for g in capable)
    enabled = sum(1 for g in capable if (g.get("mig") or {}).get("current"))
    if bad:
        return problem(f"{len(bad)} of {len(gpus)} GPU(s) not as declared: "
                       + "; ".join(f"{k}: {v}" for k, v in bad.items()), gpus=bad)
    layout = f"layout {facts.node.mig_config}: " if facts.node.mig_config else ""
    return passed(f"{layout}{enabled} of {len(capable)} MIG-capable GPU(s) in MIG mode, "
                  f"{devices} MIG device(s), no mode change pending",
                  mig_devices=devices, mig_enabled=enabled)
