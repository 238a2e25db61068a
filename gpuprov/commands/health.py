"""`gpuprov health`: the node agent, and the fleet's GPU health through the Kubernetes API.

    gpuprov health agent [--config FILE] [--once]   the node agent, in this process (the
                                                    gpu_health role runs the same from its
                                                    payload script)
    gpuprov health show [-i INV | --kubeconfig F] [--json]
    gpuprov health ack NODE [--gpu PCI|UUID] --reason TEXT [--verified-at TIME]
    gpuprov health remediate [--once] [--dry-run] [--max-unavailable N|P%] [--taint] [--drain]

show, ack and remediate read only the API (one LIST of nodes per round).
"""

from __future__ import annotations

import argparse
import datetime
import getpass
import json
import time
import uuid
from typing import Any

from gpuprov.errors import ExitCode, GpuprovError
from gpuprov.output import print_json, render_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "health", help="GPU health: the node agent, the fleet's conditions, remediation",
        description="gpuprov's continuous GPU health (issue 33): the node agent, and the "
        "fleet's gpuprov.io/ conditions, acks and remediation through the Kubernetes API.")
    sub = parser.add_subparsers(dest="health_command", metavar="COMMAND", required=True)

    agent = sub.add_parser("agent", help="run the node agent here (as the gpu_health role's "
                           "service does)")
    agent.add_argument("--config", default="/etc/gpuprov/health.json")
    agent.add_argument("--once", action="store_true", help="one check cycle, then exit")
    agent.set_defaults(func=run_agent)

    def api_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("-i", "--inventory", metavar="INVENTORY",
                       help="Ansible inventory: its k8s_kubeconfig, and only its nodes")
        p.add_argument("--kubeconfig", metavar="FILE",
                       help="default: the inventory's k8s_kubeconfig, $KUBECONFIG, "
                       "~/.kube/config")
        p.add_argument("--context", metavar="NAME", help="kubeconfig context")

    show = sub.add_parser("show", help="one line per GPU node: conditions, since when, "
                          "evidence, cordon", description="Exit 0: no GPU node has a "
                          "GPUFault or DriverProblem; 1: some have; 2: could not read.")
    api_options(show)
    show.add_argument("--json", action="store_true", help="one JSON document on stdout")
    show.set_defaults(func=run_show)

    ack = sub.add_parser("ack", help="acknowledge a node's XID faults (after checking the "
                         "GPU): the agent clears those seen before --verified-at")
    api_options(ack)
    ack.add_argument("node", metavar="NODE")
    ack.add_argument("--gpu", metavar="PCI|UUID", help="one GPU (default: every GPU)")
    ack.add_argument("--reason", required=True, help="what was checked or done")
    ack.add_argument("--verified-at", metavar="TIME",
                     help="when the GPU was verified (ISO 8601 or unix time; default now; "
                     "not in the future)")
    ack.set_defaults(func=run_ack)

    rem = sub.add_parser("remediate", help="cordon faulty GPU nodes with brakes, give back "
                         "recovered ones, restart a stuck device plugin")
    api_options(rem)
    rem.add_argument("--once", action="store_true", help="one round, then exit (cron, CI)")
    rem.add_argument("--interval", type=float, default=30.0,
                     help="seconds between rounds when continuous (default 30)")
    rem.add_argument("--dry-run", action="store_true", help="print the actions, take none")
    rem.add_argument("--max-unavailable", metavar="N|P%",
                     help="nodes cordoned by gpuprov at once (default: max(1, 10%% of the "
                     "GPU nodes))")
    rem.add_argument("--taint", action="store_true",
                     help="also taint cordoned nodes gpuprov.io/gpu-unhealthy:NoSchedule")
    rem.add_argument("--drain", action="store_true",
                     help="evict the pods of nodes it cordons (PodDisruptionBudgets hold)")
    rem.add_argument("--plugin-namespace", default="kube-system",
                     help="the device plugin's namespace (default kube-system)")
    rem.set_defaults(func=run_remediate)


def run_agent(args: argparse.Namespace) -> int:
    from gpuprov.verify import node_phase

    return node_phase.main(["agent", "--config", args.config] + (["--once"] if args.once
                                                                  else []))


def _api(args: argparse.Namespace) -> tuple[Any, set[str] | None]:
    """The API client and the inventory's node names (None: every node)."""
    from gpuprov.verify import cluster

    names = None
    inventory_kubeconfig = None
    if args.inventory:
        from gpuprov.verify import inventory

        nodes = inventory.load(args.inventory)
        names = {n.node_name for n in nodes}
        inventory_kubeconfig = next((n.kubeconfig for n in nodes if n.kubeconfig), None)
    kubeconfig = cluster.find_kubeconfig(args.kubeconfig, inventory_kubeconfig)
    if kubeconfig is None:
        raise GpuprovError("no kubeconfig: pass --kubeconfig FILE, or -i INVENTORY with "
                           "k8s_kubeconfig")
    return cluster.api_client(kubeconfig, args.context), names


def _nodes(api: Any, names: set[str] | None) -> list[dict]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        response = client.CoreV1Api(api).list_node(_preload_content=False)
        items = json.loads(response.data)["items"]
    except (ApiException, HTTPError, OSError) as exc:
        raise GpuprovError(f"cannot list nodes at {api.configuration.host}: {exc}") from None
    return [n for n in items if names is None or n["metadata"]["name"] in names]


def run_show(args: argparse.Namespace) -> int:
    from gpuprov.health import fleet

    api, names = _api(args)
    healths = [h for h in fleet.fleet(_nodes(api, names)) if h.gpu_node]
    if args.json:
        print_json({"schema_version": fleet.SCHEMA_VERSION,
                    "nodes": [h.to_json() for h in healths]})
    else:
        print(render_table(fleet.SHOW_HEADERS, fleet.show_rows(healths)))
    return int(ExitCode.CHECK_FAILED) if any(h.actionable for h in healths) else 0


def _when(text: str | None, now: float) -> float:
    if text is None:
        return now
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise GpuprovError(f"--verified-at {text!r}: give ISO 8601 (2026-11-26T18:00:00Z) or "
                           "unix time") from None
    if parsed.tzinfo is None:
        raise GpuprovError(f"--verified-at {text!r}: give a time zone (Z or +01:00)")
    return parsed.timestamp()


def run_ack(args: argparse.Namespace) -> int:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from gpuprov.health import fleet

    now = time.time()
    at = _when(args.verified_at, now)
    if at > now + 60:
        raise GpuprovError(f"--verified-at is {at - now:.0f} s in the future: an ack says "
                           "when the GPU was verified, which has happened")
    if not args.reason.strip():
        raise GpuprovError("--reason is empty: say what was checked or done")
    api, names = _api(args)
    if names is not None and args.node not in names:
        raise GpuprovError(f"node {args.node} is not in the inventory")
    ack = {"id": str(uuid.uuid4()), "at": at, "by": getpass.getuser(),
           "reason": args.reason.strip(), "gpu": args.gpu}
    try:
        client.CoreV1Api(api).patch_node(args.node, {"metadata": {"annotations": {
            fleet.ACK_ANNOTATION: json.dumps(ack, sort_keys=True)}}})
    except ApiException as exc:
        if exc.status == 404:
            raise GpuprovError(f"no node {args.node} in the cluster") from None
        raise GpuprovError(f"cannot annotate node {args.node}: {exc.status} {exc.reason}") \
            from None
    print(f"acknowledged on {args.node}: {ack['reason']} (id {ack['id']}); its agent clears "
          "the XID faults seen before then at its next check cycle (at once: `systemctl reload "
          "gpuprov-health-agent` on the node)")
    return 0


def run_remediate(args: argparse.Namespace) -> int:
    from gpuprov.health import remediate

    api, names = _api(args)
    options = remediate.Options(args.max_unavailable, args.taint, args.drain, args.dry_run,
                                args.plugin_namespace)
    while True:
        now = time.time()
        nodes = _nodes(api, names)
        actions = remediate.plan(nodes, options, now)
        for line in remediate.apply(api, actions, {n["metadata"]["name"]: n for n in nodes},
                                    options, now):
            print(line, flush=True)
        if args.once:
            return 0
        time.sleep(args.interval)

