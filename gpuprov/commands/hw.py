"""`gpuprov hw classify`: what gpuprov knows about NVIDIA PCI device IDs.

Exit codes: 0 every ID is a supported GPU; 1 (CHECK_FAILED) some ID is unknown or legacy,
the answer being "gpuprov cannot provision it"; 2 (USAGE) some ID is malformed or not
NVIDIA's. Every ID is classified and printed before the exit code is decided.
"""

from __future__ import annotations

import argparse
import sys

from gpuprov import hardware
from gpuprov.errors import ExitCode, GpuprovError
from gpuprov.output import print_json, render_table

HEADERS = ("PCI ID", "NAME", "ARCHITECTURE", "CC", "BRANCHES", "RECOMMENDED", "OPEN MODULES",
           "STATUS")


def register(subparsers: argparse._SubParsersAction) -> None:
    hw = subparsers.add_parser("hw", help="GPU hardware knowledge base")
    hw_commands = hw.add_subparsers(dest="hw_command", metavar="COMMAND", required=True)
    classify = hw_commands.add_parser(
        "classify",
        help="classify NVIDIA GPUs by PCI ID",
        description="Model, architecture, compute capability and driver branches of NVIDIA "
        "GPUs. Exit 0: all supported; 1: some unknown or legacy; 2: malformed ID.",
    )
    classify.add_argument("--pci-id", dest="pci_ids", action="append", required=True,
                          metavar="ID", help="10de:15f8, 0x15f8 or 15f8 (repeatable)")
    classify.add_argument("--json", action="store_true", help="print a JSON list")
    classify.set_defaults(func=run)


def _branches(result: hardware.Classification) -> str | None:
    if result.min_branch is None:
        return None
    return f"{result.min_branch}-{result.max_branch if result.max_branch else 'current'}"


def run(args: argparse.Namespace) -> int:
    try:
        results = [hardware.classify(pci_id) for pci_id in args.pci_ids]
    except hardware.InvalidPciId as exc:
        raise GpuprovError(str(exc), ExitCode.USAGE) from exc
    if args.json:
        print_json([result.to_dict() for result in results])
    else:
        print(render_table(HEADERS, (
            (r.pci_id, r.name or "unknown", r.architecture, r.compute_capability, _branches(r),
             r.recommended_branch,
             None if r.open_kernel_modules is None else ("yes" if r.open_kernel_modules
                                                         else "no"),
             r.status)
            for r in results
        )))
    problems = [result for result in results if result.status != "supported"]
    for result in problems:
        print(f"gpuprov: {result.message}", file=sys.stderr)
    return int(ExitCode.CHECK_FAILED if problems else ExitCode.OK)
