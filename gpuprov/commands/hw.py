"""`gpuprov hw classify`: what gpuprov knows about NVIDIA PCI device IDs.
`gpuprov hw choose`: which driver a node with these GPUs will get.

classify exit codes: 0 every ID is a supported GPU; 1 (CHECK_FAILED) some ID is unknown or
legacy, the answer being "gpuprov cannot provision it"; 2 (USAGE) some ID is malformed or not
NVIDIA's. Every ID is classified and printed before the exit code is decided.

Both classify GPUs the hardware table lacks by their chip's name in the machine's pci.ids (the
files the probe reads on nodes, hardware.PCI_IDS_PATHS), or in the file --pci-ids names; the
output says which file was used. choose also names the version of the chosen branch with every
fix of NVIDIA's security bulletins (gpuprov.nvidia.driver_advisories), the one to install.

choose answers with gpu_preflight's own decision (gpuprov.nvidia.driver_branches.choose_branch:
one decision, two callers): exit 0 a branch drives every GPU, 1 none can, or the one that can
is offered by the source only at a version below NVIDIA's fixes and --allow-vulnerable is not
given (the reason says why and what to do), 2 bad input (an OS name not like debian-12, a
malformed ID, a pin that is not a number, an unknown source).
"""

from __future__ import annotations

import argparse
import os
import sys

from gpuprov.errors import ExitCode, GpuprovError
from gpuprov.nvidia import driver_advisories, driver_branches, hardware
from gpuprov.output import print_json, render_table

# Where the machine's pci.ids is looked for when --pci-ids is not given: the probe's paths
# (tests replace it).
SYSTEM_PCI_IDS = hardware.PCI_IDS_PATHS

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
                          "pci.ids file (default: the machine's, "
                          f"{' or '.join(SYSTEM_PCI_IDS)})")
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
                        "pci.ids file, as gpu_preflight does with the node's (default: the "
                        f"machine's, {' or '.join(SYSTEM_PCI_IDS)})")
    choose.add_argument("--allow-vulnerable", action="store_true",
                        help="nvidia_driver_allow_vulnerable: accept a branch whose version from "
                        "the source lacks fixes of NVIDIA's security bulletins (refused "
                        "without it, as gpu_preflight refuses it)")
    choose.add_argument("--json", action="store_true", help="print a JSON object")
    choose.set_defaults(func=run_choose)


def _branches(result: hardware.Classification) -> str | None:
    if result.min_branch is None:
        return None
    return f"{result.min_branch}-{result.max_branch if result.max_branch else 'current'}"


def _pci_ids_path(given: str | None) -> str | None:
    """The pci.ids file to read: --pci-ids, else the first of the machine's that exists (as
    the probe reads the node's); None where the machine has none."""
    if given is not None:
        return given
    return next((path for path in SYSTEM_PCI_IDS if os.path.isfile(path)), None)


def _chip_names(path: str | None, pci_ids: list[str]) -> dict[str, str | None]:
    """PCI ID -> its name in the pci.ids file, for the IDs the hardware table lacks (the file,
    1.3 MB, is read only for them)."""
    wanted = []
    for pci_id in pci_ids:
        try:
            vendor, device = hardware.parse_pci_id(pci_id)
        except hardware.InvalidPciId:
            continue  # classify says what is wrong with it
        if vendor == hardware.NVIDIA_VENDOR_ID and hardware.lookup(device) is None:
            wanted.append((pci_id, device))
    if path is None or not wanted:
        return {}
    try:
        text = open(path, encoding="utf-8", errors="replace").read()  # noqa: SIM115
    except OSError as exc:
        raise GpuprovError(f"--pci-ids {path}: cannot read it ({exc.strerror}); give the "
                           "path of a pci.ids file (Debian: /usr/share/misc/pci.ids from the "
                           "pci.ids package)", ExitCode.USAGE) from None
    return {pci_id: hardware.pci_ids_name(device, text) for pci_id, device in wanted}


def _pci_ids_line(path: str | None) -> str:
    return f"pci.ids: {path}" if path else ("pci.ids: none (no " + " or ".join(SYSTEM_PCI_IDS)
                                             + " on this machine; --pci-ids FILE gives one)")


def run(args: argparse.Namespace) -> int:
    path = _pci_ids_path(args.pci_ids_file)
    names = _chip_names(path, args.pci_ids)
    try:
        results = [hardware.classify(pci_id, chip_name=names.get(pci_id))
                   for pci_id in args.pci_ids]
    except hardware.InvalidPciId as exc:
        raise GpuprovError(str(exc), ExitCode.USAGE) from exc
    if args.json:
        print_json([{**result.to_dict(), "pci_ids_file": path} for result in results])
    else:
        print(render_table(HEADERS, (
            (r.pci_id, r.name or "unknown", r.architecture, r.compute_capability, _branches(r),
             r.recommended_branch,
             None if r.open_kernel_modules is None else ("yes" if r.open_kernel_modules
                                                         else "no"),
             r.status)
            for r in results
        )))
        print(_pci_ids_line(path))
    problems = [result for result in results if result.status != "supported"]
    for result in problems:
        print(f"gpuprov: {result.message}", file=sys.stderr)
    for result in results:
        if result.source == "pci.ids":
            print(f"gpuprov: warning: {result.message}", file=sys.stderr)
    return int(ExitCode.CHECK_FAILED if problems else ExitCode.OK)


def _security(branch: int | None) -> dict:
    """The chosen branch's security floor: the version to install (or newer), the bulletin that
    set it, and the bulletins the branch gets no fix from."""
    if branch is None:
        return {"minimum_version": None, "bulletin": None, "missed": [], "notes": []}
    found = driver_advisories.floor(branch)
    missed = driver_advisories.missed(branch)
    notes = []
    if found:
        notes.append(f"security: install {found[0]} or newer (R{branch}'s fixes up to NVIDIA "
                     f"bulletin {found[1].bulletin}, {found[1].date})")
    if missed:
        notes.append(f"security: R{branch} gets no fixes from NVIDIA bulletin "
                     + ", ".join(f"{b.bulletin} ({b.date})" for b in missed)
                     + ": pin a branch they fix (nvidia_driver_branch)")
    return {"minimum_version": found[0] if found else None,
            "bulletin": found[1].bulletin if found else None,
            "missed": [b.bulletin for b in missed], "notes": notes}


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
    path = _pci_ids_path(args.pci_ids_file)
    try:
        choice = driver_branches.choose_branch(
            args.pci_ids, os_id, version, pinned_branch=args.pin, source=args.source,
            chip_names=_chip_names(path, args.pci_ids), allow_vulnerable=args.allow_vulnerable)
    except ValueError as exc:  # hardware.InvalidPciId is one
        raise GpuprovError(str(exc), ExitCode.USAGE) from None
    doc = choice.to_dict()
    security = _security(choice.branch)
    if args.json:
        print_json({**{key: doc[key] for key in
                       ("ok", "branch", "open_kernel_modules", "packages", "reason", "notes")},
                    "minimum_version": security["minimum_version"], "security": security,
                    "pci_ids_file": path})
    else:
        print(render_table(("OS", "BRANCH", "MINIMUM VERSION", "OPEN MODULES", "PACKAGES"), [(
            choice.os, choice.branch, security["minimum_version"],
            "yes" if choice.open_kernel_modules else "no", choice.packages)]))
        print(choice.reason)
        for note in doc["notes"] + security["notes"]:
            print(f"  - {note}")
        print(_pci_ids_line(path))
    if not choice.ok:
        print(f"gpuprov: {choice.reason}", file=sys.stderr)
        return int(ExitCode.CHECK_FAILED)
    return int(ExitCode.OK)
