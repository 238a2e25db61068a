"""`gpuprov status`: every GPU of the inventory in one table, from NVML on each node.

The same probe and SSH fan-out as `gpuprov verify`'s node phase (gpuprov.verify.nodes); no
checks, just what the GPUs are doing: utilisation, memory, temperature, power, processes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprov.errors import ExitCode
from gpuprov.output import print_json, render_table

SCHEMA_VERSION = 1
MIB = 1024 * 1024
BAR_WIDTH = 10


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="cluster-wide GPU table: utilisation, memory, temperature, power, processes",
        description="Probe every node of the inventory over SSH and show each GPU's "
        "utilisation, memory, temperature, power and processes (NVML). Exit 0, or 3 when a "
        "node could not be reached or probed.",
    )
    parser.add_argument("-i", "--inventory", metavar="INVENTORY",
                        help="Ansible inventory (default: Ansible's configured one)")
    parser.add_argument("--limit", metavar="PATTERN", help="Ansible host pattern")
    parser.add_argument("--timeout", metavar="SECONDS", type=float, default=30.0,
                        help="per-host timeout (default 30)")
    parser.add_argument("--concurrency", metavar="N", type=int, default=32,
                        help="nodes probed at once (default 32)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.set_defaults(func=run)


def _bar(percent: float | None) -> str:
    """'[####      ]  40%': readable at a glance, and still plain text in a log."""
    if percent is None:
        return "-"
    filled = round(max(0.0, min(100.0, percent)) / 100 * BAR_WIDTH)
    return f"[{'#' * filled}{' ' * (BAR_WIDTH - filled)}] {percent:3.0f}%"


def gpu_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One plain record per GPU of a probe report (also the --json form)."""
    rows = []
    for gpu in (report.get("nvml") or {}).get("gpus") or []:
        if gpu.get("error"):
            rows.append({"index": gpu.get("index"), "error": gpu["error"].get("name")})
            continue
        memory = gpu.get("memory") or {}
        power = gpu.get("power") or {}
        rows.append({
            "index": gpu.get("index"),
            "name": gpu.get("name"),
            "uuid": gpu.get("uuid"),
            "utilization_gpu": (gpu.get("utilization") or {}).get("gpu"),
            "memory_used_mib": memory.get("used") // MIB if memory.get("used") is not None
            else None,
            "memory_total_mib": memory.get("total") // MIB if memory.get("total") is not None
            else None,
            "temperature_c": (gpu.get("temperature") or {}).get("current"),
            "power_w": power.get("usage_w"),
            "power_limit_w": power.get("limit_w"),
            "processes": [{"pid": p.get("pid"), "used_memory_mib":
                           (p.get("used_memory") or 0) // MIB}
                          for p in gpu.get("processes") or []],
            "mig": _mig(gpu.get("mig")),
        })
    return rows


def _mig(mig: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """MIG mode and devices of a GPU; None where it has no MIG."""
    if mig is None:
        return None
    return {"enabled": mig.get("current"), "pending": mig.get("pending"),
            "devices": [{"uuid": d.get("uuid"), "profile": d.get("profile"),
                         "gpu_instance_id": d.get("gpu_instance_id"),
                         "compute_instance_id": d.get("compute_instance_id"),
                         "memory_mib": d.get("memory_mb")}
                        for d in mig.get("devices") or []]}


def _mig_mode(mig: Mapping[str, Any] | None) -> str:
    if not mig or (not mig["enabled"] and not mig["pending"]):
        return ""
    if mig["enabled"] == mig["pending"]:
        return " [MIG]"
    return f" [MIG {'on' if mig['enabled'] else 'off'}, {'on' if mig['pending'] else 'off'} " \
        "after reset]"


def _mig_rows(row: Mapping[str, Any]) -> list[list[Any]]:
    """The GPU's MIG devices under it, as `nvidia-smi -L` lists them: GPU/GI/CI, profile,
    the instance's memory and its MIG- UUID."""
    return [[f"  {row['index']}/{d['gpu_instance_id']}/{d['compute_instance_id']}",
             f"  MIG {d['profile']} ({d['uuid']})", "-",
             f"{d['memory_mib']} MiB" if d["memory_mib"] is not None else None, "-", "-", "-"]
            for d in (row["mig"] or {}).get("devices") or []]


def _health(node_list: Sequence[Any]) -> dict[str, Any]:
    """Each node's gpuprov health (gpuprov/health/fleet.py) from one LIST of nodes, where the
    inventory names a kubeconfig; {} otherwise, or when the API cannot be read (said once)."""
    kubeconfig = next((n.kubeconfig for n in node_list if n.kubeconfig), None)
    if kubeconfig is None:
        return {}
    try:
        from kubernetes import client

        from gpuprov.health import fleet
        from gpuprov.verify import cluster

        api = cluster.api_client(kubeconfig, None)
        items = client.ApiClient().sanitize_for_serialization(
            client.CoreV1Api(api).list_node().items)
    except Exception as exc:  # the GPU table is the point; health is extra
        sys.stderr.write(f"gpuprov: node health not shown: {type(exc).__name__}: {exc}\n")
        return {}
    return {h.name: h for h in fleet.fleet(items)}


def _health_line(health: Any) -> str:
    if health is None:
        return ""
    problems = "; ".join(f"{c['type']} {c.get('reason')} since {c.get('lastTransitionTime')}"
                         for c in health.problems)
    cordon = f", cordoned by {health.cordoned_by}" if health.cordoned_by != "-" else ""
    return f", health {health.state}{cordon}" + (f" ({problems})" if problems else "")


def _table(results: Sequence[Any], health: Mapping[str, Any] | None = None) -> str:
    lines = []
    health = health or {}
    for result in results:
        name = result.node.name
        extra = _health_line(health.get(result.node.node_name))
        if result.report is None:
            lines.append(f"{name}: {'unreachable' if result.unreachable else 'probe failed'}: "
                         f"{result.error}")
            continue
        nvml = result.report.get("nvml") or {}
        rows = gpu_rows(result.report)
        if not result.report.get("pci"):
            lines.append(f"{name}: no NVIDIA GPU")
            continue
        if not nvml.get("available"):
            error = (nvml.get("error") or {}).get("name", "unknown error")
            lines.append(f"{name}: NVML unavailable ({error}){extra}")
            continue
        lines.append(f"{name}: driver {nvml.get('driver_version')}, "
                     f"CUDA {nvml.get('cuda_driver_version')}{extra}")
        table_rows = []
        for row in rows:
            if "error" in row:
                table_rows.append([row["index"], row["error"], "-", "-", "-", "-", "-"])
                continue
            used, total = row["memory_used_mib"], row["memory_total_mib"]
            mem_pct = 100.0 * used / total if used is not None and total else None
            power = (f"{row['power_w']:.0f}/{row['power_limit_w']:.0f} W"
                     if row["power_w"] is not None and row["power_limit_w"] else None)
            table_rows.append([
                row["index"], f"{row['name']}{_mig_mode(row['mig'])}", _bar(row["utilization_gpu"]),
                f"{_bar(mem_pct)} {used}/{total} MiB" if total else None,
                f"{row['temperature_c']} C" if row["temperature_c"] is not None else None,
                power,
                ", ".join(str(p["pid"]) for p in row["processes"]) or "-",
            ])
            table_rows += _mig_rows(row)
        table = render_table(["GPU", "NAME", "UTIL", "MEMORY", "TEMP", "POWER", "PIDS"],
                             table_rows)
        lines += ["  " + line for line in table.splitlines()]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from gpuprov.commands.verify import resolve_inventory
    from gpuprov.verify import inventory, nodes

    node_list = inventory.load(resolve_inventory(args.inventory), args.limit)
    results = nodes.collect(node_list, args.timeout, max(1, args.concurrency))
    health = _health(node_list)
    if args.json:
        print_json({"schema_version": SCHEMA_VERSION, "nodes": [
            {"node": r.node.name, "error": r.error, "unreachable": r.unreachable,
             "driver_version": ((r.report or {}).get("nvml") or {}).get("driver_version"),
             "gpus": gpu_rows(r.report) if r.report else [],
             "health": health[r.node.node_name].to_json()
             if r.node.node_name in health else None}
            for r in results]})
    else:
        print(_table(results, health))
    failed = any(r.report is None for r in results)
    if failed:
        sys.stderr.write("gpuprov: some nodes could not be probed\n")
    return int(ExitCode.UNREACHABLE if failed else ExitCode.OK)
