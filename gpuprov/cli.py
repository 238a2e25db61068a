"""Command line entry point: parse arguments, call the library, map outcomes to exit codes.

Each sub-command lives in gpuprov/commands/<name>.py and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from gpuprov import __version__
from gpuprov.errors import ExitCode, GpuprovError

COMMAND_MODULES = ("hw", "probe", "verify", "status", "health", "manifests", "bom", "lab")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuprov",
        description="Provision NVIDIA GPU nodes for Kubernetes and verify that they work.",
    )
    parser.add_argument("--version", action="version", version=f"gpuprov {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"gpuprov.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one line
        return int(exc.code or 0) and int(ExitCode.USAGE)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="gpuprov: %(message)s",
        stream=sys.stderr,
    )
    if not args.debug:
        # The libraries' own retry and handshake warnings ("Retrying (Retry(total=0...") come
        # before gpuprov's one line about the same failure: shown with --debug only.
        for library in ("urllib3", "paramiko", "kubernetes"):
            logging.getLogger(library).setLevel(logging.CRITICAL)
    try:
        return int(args.func(args))
    except GpuprovError as exc:
        if args.debug:
            raise
        print(f"gpuprov: error: {exc.message}", file=sys.stderr)
        return int(exc.code)
    except KeyboardInterrupt:
        print("gpuprov: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:
        # The reader went away (`gpuprov probe --json | head`): not an error worth a
        # traceback. Point stdout at /dev/null so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return int(ExitCode.OK)


if __name__ == "__main__":
    sys.exit(main())
