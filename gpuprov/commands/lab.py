"""`gpuprov lab up | down | status | fault`: the multi-node GPU lab (test infrastructure)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from gpuprov.errors import ExitCode, GpuprovError
from gpuprov.output import print_json, render_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "lab",
        help="a multi-node GPU lab in podman containers, with simulated GPUs",
        description="Several Debian nodes on this machine, reachable over SSH on 127.0.0.1, "
        "with simulated GPU hardware (PCI + NVML). For development, tests, demos and CI.",
    )
    parser.add_argument(
        "--dir", type=Path, default=Path.cwd(),
        help="project directory: the lab writes inventory/lab/hosts.yml and .lab/ there "
        "(default: the current directory)",
    )
    sub = parser.add_subparsers(dest="lab_command", metavar="ACTION", required=True)

    up = sub.add_parser("up", help="build the node image if needed and start the lab")
    up.add_argument(
        "--nodes", metavar="[NAME=]PROFILE[@OS][+docker],...",
        help="node profiles, each optionally named and on another OS than its profile's, e.g. "
        "gpu-pascal@debian-13 (default: gpu-kepler,gpu-pascal,gpu-hopper,cpu-only; OS: "
        "debian-12 or debian-13)",
    )
    up.add_argument(
        "--with-docker", action="store_true",
        help="add two Docker hosts in a swarm (Debian's docker.io: docker-12 with Docker 20.10, "
        "docker-13 with Docker 26), in the inventory groups docker_hosts and docker_swarm; "
        "--nodes may name Docker hosts itself with PROFILE[@OS]+docker",
    )
    up.set_defaults(func=_up)

    down = sub.add_parser("down", help="remove the lab's containers and files")
    down.set_defaults(func=_down)

    status = sub.add_parser("status", help="show nodes, SSH ports, profiles and faults")
    status.add_argument("--json", action="store_true", help="one JSON document on stdout")
    status.set_defaults(func=_status)

    fault = sub.add_parser("fault", help="switch a simulated hardware fault on or off")
    fault.add_argument("node")
    fault.add_argument("fault", help="fault name: gpuprov/lab/SIMULATION.md lists them")
    fault.add_argument("--clear", action="store_true", help="switch the fault off")
    fault.add_argument("--gpu", type=int, default=None, metavar="INDEX",
                       help="GPU index for faults that hit one GPU (default: 0)")
    fault.set_defaults(func=_fault)


# The lab is test infrastructure: the wheel leaves gpuprov.lab out (pyproject.toml), and the lab
# needs a clone anyway (its CRI stubs come from the clone's .cache/, the node image from
# gpuprov/lab/image/, grpcio from the dev extra).
NEEDS_CHECKOUT = ("gpuprov lab runs from a clone of the repository (git clone, then make lab-up "
                  "there): this gpuprov is installed without the lab")


def _lab(args: argparse.Namespace):
    try:
        from gpuprov.lab.lab import Lab
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("gpuprov.lab"):
            raise
        raise GpuprovError(NEEDS_CHECKOUT, ExitCode.NEEDS_CHECKOUT) from None

    lab_dir = os.environ.get("GPUPROV_LAB_DIR")
    return Lab(args.dir, Path(lab_dir) if lab_dir else None)


def _up(args: argparse.Namespace) -> int:
    started = time.monotonic()
    specs = [s for s in args.nodes.split(",")] if args.nodes is not None else None
    lab = _lab(args)
    state = lab.up(specs, with_docker=args.with_docker)
    print(render_table(
        ["NODE", "PROFILE", "OS", "ENGINE", "SSH"],
        [(n.name, n.profile, n.os, n.engine, f"127.0.0.1:{n.ssh_port}") for n in state.nodes],
    ))
    print(f"lab up in {time.monotonic() - started:.1f} s; inventory: {lab.inventory_path}",
          file=sys.stderr)
    return ExitCode.OK


def _down(args: argparse.Namespace) -> int:
    removed = _lab(args).down()
    print(f"removed {len(removed)} lab container(s)", file=sys.stderr)
    return ExitCode.OK


def _status(args: argparse.Namespace) -> int:
    doc = _lab(args).status()
    if args.json:
        print_json(doc)
    elif not doc["up"]:
        print(f"no lab in {doc['lab_dir']}")
    else:
        print(render_table(
            ["NODE", "PROFILE", "OS", "STATE", "SSH", "GPUS", "FAULTS"],
            [(n["name"], n["profile"], n["os"], n["state"], n["ssh"], n["gpus"],
              ",".join(n["faults"]) or None) for n in doc["nodes"]],
        ))
    return ExitCode.OK


def _fault(args: argparse.Namespace) -> int:
    active = _lab(args).fault(args.node, args.fault, clear=args.clear, gpu_index=args.gpu)
    print(f"{args.node}: active faults: {', '.join(active) or 'none'}")
    return ExitCode.OK
