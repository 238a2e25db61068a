"""`gpuprov bom -i INVENTORY [--limit HOSTS] [--json]`: what a site's nodes need from mirrors.

Runs playbooks/bom.yml (site.yml's preflight and validate stages and the roles' plans, then
the nodes' package manager asked, changing nothing) and prints per node every package with
the exact version apt installs, its repository and key; then the de-duplicated list to mirror
(repositories with their keys, packages, container images, downloaded files) and the nodes
that could not be decided, with the reason (gpuprov/bom.py).

Exit codes: 0 every node decided; 1 (CHECK_FAILED) some node undecided (listed, with the
reason); 2 (USAGE) the inventory cannot be read or the playbook could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from gpuprov import bom
from gpuprov.commands.verify import resolve_inventory
from gpuprov.errors import ExitCode, GpuprovError
from gpuprov.manifests import repo_root
from gpuprov.output import print_json, render_table

PLAYBOOK = "playbooks/bom.yml"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bom",
        help="every package, repository, key, image and file a site's nodes need (mirrors)",
        description="The bill of materials of the inventory's nodes, from the decisions "
        "site.yml makes (playbooks/bom.yml; nothing changes on the nodes). Exit 0: every node "
        "decided; 1: some node undecided (listed with the reason); 2: bad input.",
    )
    parser.add_argument("-i", "--inventory", metavar="INVENTORY",
                        help="Ansible inventory (default: the one ansible.cfg names)")
    parser.add_argument("--limit", metavar="HOSTS", help="Ansible host pattern")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(func=run)


def _run_playbook(inventory: str, limit: str | None) -> tuple[int, dict]:
    root = repo_root()
    playbook = root / PLAYBOOK
    if not playbook.is_file():
        raise GpuprovError(f"{playbook} not found: gpuprov bom runs from a checkout (pip "
                           "install -e .)")
    binary = Path(sys.executable).parent / "ansible-playbook"
    argv = [str(binary), "-i", inventory, str(playbook)] + (["--limit", limit] if limit else [])
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
           "ANSIBLE_CONFIG": str(root / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True,
                          check=False)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise GpuprovError(f"ansible-playbook {PLAYBOOK} did not run (exit {proc.returncode}): "
                           f"{last}") from None


def run(args: argparse.Namespace) -> int:
    inventory = resolve_inventory(args.inventory)
    if not Path(inventory).exists():
        raise GpuprovError(f"inventory {inventory} not found: pass -i INVENTORY")
    rc, doc = _run_playbook(inventory, args.limit)
    result = bom.from_playbook(doc, rc)
    if not result["nodes"] and not result["undecided"]:
        raise GpuprovError(f"no GPU node in {inventory}"
                           + (f" matches --limit {args.limit}" if args.limit else ""))
    if args.json:
        print_json(result)
    else:
        _print(result)
    for host, reason in result["undecided"].items():
        print(f"gpuprov: {host}: undecided: {reason}", file=sys.stderr)
    return int(ExitCode.CHECK_FAILED if result["undecided"] else ExitCode.OK)


def _print(result: dict) -> None:
    rows = [(host, p["name"], p["version"], p["repository"] or "-")
            for host, record in result["nodes"].items() for p in record["packages"]
            if p["named"] or "nvidia" in p["name"] or "cuda" in p["name"]]
    print("NVIDIA packages per node (the roles' packages and their NVIDIA dependencies; "
          "--json lists every dependency)")
    print(render_table(("NODE", "PACKAGE", "VERSION", "REPOSITORY"), rows))
    mirror = result["mirror"]
    print(f"\nTo mirror: {len(mirror['packages'])} packages (with dependencies) from "
          f"{len(mirror['repositories'])} repositories")
    print(render_table(("REPOSITORY", "KEY"), [(r["repository"], r["key"] or "the OS's keyring")
                                               for r in mirror["repositories"]]))
    print("\nImages:")
    for image in mirror["images"]:
        print(f"  {image}")
    print("Files downloaded:")
    for url in mirror["files"]:
        print(f"  {url}")
    if result["undecided"]:
        print("\nUndecided:")
        for host, reason in result["undecided"].items():
            print(f"  {host}: {reason}")
