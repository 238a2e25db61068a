"""`gpuprov hw classify`: what gpuprov knows about NVIDIA PCI device IDs.
`gpuprov hw choose`: which driver a node with these GPUs will get.

classify exit codes: 0 every ID is a supported GPU; 1 (CHECK_FAILED) some ID is unknown or
legacy, the answer being "gpuprov cannot provision it"; 2 (USAGE) some ID is malformed or not
NVIDIA's. Every ID is classified and printed before the exit code is decided.

choose answers with gpu_preflight's own decision (gpuprov.nvidia.driver_branches.choose_branch:
one decision, two callers): exit 0 a branch drives every GPU, 1 none can (the reason says
why and what to do), 2 bad input (an OS name not like debian-12, a malformed ID, a pin that
is not a number, an unknown source).
"""

from __future__ import annotations

import argparse
import sys

from gpuprov.errors import ExitCode, GpuprovError
from gpuprov.nvidia import driver_branches, hardware
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
    classify.add_argument("--pci-ids", dest="pci_ids_file", metavar="FILE", default=None,
                          help="classify GPUs the table lacks by their chip's name in this "
                          "pci.ids file (e.g. /usr/share/misc/pci.ids)")
    classify.add_argument("--json", action="store_true", help="print a JSON list")
    classify.set_defaults(func=run)
    choose = hw_commands.add_parser(
        "choose",
        help="which driver branch a node with these GPUs gets",
        description="The driver branch gpu_preflight chooses for a node of this OS, driver "
        "source and GPUs (the same function). Exit 0: a branch drives every GPU; 1: none "
        "can; 2: bad input.",
    )
    choose.add_argument("--os", dest="os_name", required=True, metavar="ID-VERSION",
                        help="the node's OS as os-release names it: debian-12, debian-13, "
                        "ubuntu-24.04, rhel-9, rocky-9")
    choose.add_argument("--source", choices=driver_branches.SOURCES, default=None,
                        help="nvidia_driver_source (default: the OS's own, "
                        "distro on Debian/Ubuntu, nvidia on RHEL)")
    choose.add_argument("--pci-id", dest="pci_ids", action="append", required=True,
                        metavar="ID", help="10de:2330 (repeatable: one per GPU, or per model)")
    choose.add_argument("--pin", default=None, metavar="BRANCH",
                        help="nvidia_driver_branch, the branch the inventory pins")
    choose.add_argument("--pci-ids", dest="pci_ids_file", metavar="FILE", default=None,
                        help="classify GPUs the table lacks by their chip's name in this "
                        "pci.ids file, as gpu_preflight does with the node's")
    choose.add_argument("--json", action="store_true", help="print a JSON object")
    choose.set_defaults(func=run_choose)


def _branches(result: hardware.Classification) -> str | None:
    if result.min_branch is None:
        return None
    return f"{result.min_branch}-{result.max_branch if result.max_branch else 'current'}"


def _chip_names(path: str | None, pci_ids: list[str]) -> dict[str, str | None]:
    """PCI ID -> its name in the pci.ids file (only with --pci-ids)."""
    if path is None:
        return {}
    try:
        text = open(path, encoding="utf-8", errors="replace").read()  # noqa: SIM115
    except OSError as exc:
        raise GpuprovError(f"--pci-ids {path}: cannot read it ({exc.strerror}); give the "
                           "path of a pci.ids file (Debian: /usr/share/misc/pci.ids from the "
                           "pci.ids package)", ExitCode.USAGE) from None
    names = {}
    for pci_id in pci_ids:
        try:
            vendor, device = hardware.parse_pci_id(pci_id)
        except hardware.InvalidPciId:
            continue  # classify says what is wrong with it
        if vendor == hardware.NVIDIA_VENDOR_ID:
            names[pci_id] = hardware.pci_ids_name(device, text)
    return names


def run(args: argparse.Namespace) -> int:
    names = _chip_names(args.pci_ids_file, args.pci_ids)
    try:
        results = [hardware.classify(pci_id, chip_name=names.get(pci_id))
                   for pci_id in args.pci_ids]
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
    for result in results:
        if result.source == "pci.ids":
            print(f"gpuprov: warning: {result.message}", file=sys.stderr)
    return int(ExitCode.CHECK_FAILED if problems else ExitCode.OK)


def split_os(text: str) -> tuple[str, str]:
    """'debian-12' -> ('debian', '12'); 'ubuntu-24.04' -> ('ubuntu', '24.04')."""
    os_id, sep, version = text.strip().rpartition("-")
    if not sep or not os_id or not version:
        raise GpuprovError(f"--os {text!r} is not ID-VERSION as os-release names it (e.g. "
                           f"debian-12, ubuntu-24.04, rhel-9); gpuprov knows "
                           f"{driver_branches.supported_os_names()}", ExitCode.USAGE)
    return os_id, version


def run_choose(args: argparse.Namespace) -> int:
    os_id, version = split_os(args.os_name)
    try:
        choice = driver_branches.choose_branch(
            args.pci_ids, os_id, version, pinned_branch=args.pin, source=args.source,
            chip_names=_chip_names(args.pci_ids_file, args.pci_ids))
    except ValueError as exc:  # hardware.InvalidPciId is one
        raise GpuprovError(str(exc), ExitCode.USAGE) from None
    doc = choice.to_dict()
    if args.json:
        print_json({key: doc[key] for key in
                    ("ok", "branch", "open_kernel_modules", "packages", "reason", "notes")})
    else:
        print(render_table(("OS", "BRANCH", "OPEN MODULES", "PACKAGES"), [(
            choice.os, choice.branch, "yes" if choice.open_kernel_modules else "no",
            choice.packages)]))
        print(choice.reason)
        for note in doc["notes"]:
            print(f"  - {note}")
    if not choice.ok:
        print(f"gpuprov: {choice.reason}", file=sys.stderr)
        return int(ExitCode.CHECK_FAILED)
    return int(ExitCode.OK)
