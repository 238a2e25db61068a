"""`python -m gpuprov.lab.kube serve --state-dir DIR [--port 0] [--lab-dir LAB | --fake-nodes F]`"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from gpuprov.lab.kube import app
from gpuprov.lab.kube.backend import LabBackend


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuprov.lab.kube",
                                     description="The lab's emulated Kubernetes API server.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the emulator in the foreground")
    serve.add_argument("--state-dir", type=Path, required=True,
                       help="where the pid, URL and fault files live")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0: any free port")
    nodes = serve.add_mutually_exclusive_group()
    nodes.add_argument("--lab-dir", type=Path, help="a `gpuprov lab` directory (lab.json)")
    nodes.add_argument("--fake-nodes", type=Path, help="JSON file of fake nodes (no lab)")
    serve.add_argument("-v", "--verbose", action="store_true")
    stop = sub.add_parser("stop", help="stop the emulator of a state dir")
    stop.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)

    if args.command == "stop":
        return 0 if app.stop(args.state_dir) else 1

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.lab_dir:
        backend = LabBackend(args.lab_dir)
    elif args.fake_nodes:
        backend = app.fake_backend_from_file(args.fake_nodes)
    else:
        backend = app.FakeBackend({})
    state_dir = args.state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    emulator = app.Emulator(backend, state_dir, args.host, args.port)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    address = emulator.start()
    if args.lab_dir:
        served = app.serve_lab_nodes(emulator.server, args.lab_dir.resolve(),
                                     [n.name for n in backend.nodes()])
        logging.info("serving nodes' kubelet identities on Unix sockets: %s",
                     ", ".join(served) or "none")
    (state_dir / app.PID_FILE).write_text(f"{os.getpid()}\n")
    tmp = state_dir / (app.URL_FILE + ".tmp")
    tmp.write_text(address + "\n")
    tmp.replace(state_dir / app.URL_FILE)  # readers never see a half-written URL
    logging.info("emulated Kubernetes API serving on %s", address)
    done.wait()
    emulator.stop()
    logging.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
