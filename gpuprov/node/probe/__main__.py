"""`python3 -m gpuprov.node.probe [--root DIR]`: print the probe report as one JSON line.

This is also what the payload (gpuprov/payload.py) runs on a node.
"""

from __future__ import annotations

import argparse
import json
import sys

from .report import collect


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuprov-probe", description=__doc__)
    parser.add_argument("--root", default="/", help="read the node's files below this directory")
    args = parser.parse_args(argv)
    json.dump(collect(root=args.root), sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
