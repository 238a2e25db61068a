#!/usr/bin/env python3
"""Benchmark: `gpuprov lab up` of the default 4-node lab from a cached image.

Baseline, measured in the same run: the floor any lab needs, i.e. 4 containers of the same
image started in parallel with systemd, each waited for until sshd answers on its published
port. The ratio says what gpuprov adds on top (hardware simulation, keys, inventory, SSH).

    .venv/bin/python bench/lab_up.py [--rounds N]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from gpuprov.lab import image, podman
from gpuprov.lab.lab import Lab

NODES = 4


def _wait_for_sshd(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.settimeout(2)
                if sock.recv(8).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"baseline: sshd on 127.0.0.1:{port} did not answer")


def baseline(ref: str, tag: str, hostkey: Path) -> float:
    """Plain containers + sshd readiness, with one host key made beforehand (sshd needs one)."""
    names = [f"gpuprov-bench-{tag}-{i}" for i in range(NODES)]
    start = time.monotonic()

    def run(name: str) -> int:
        podman.podman(
            "run", "--detach", "--name", name, "--systemd=always", "--publish", "127.0.0.1::22",
            "--volume", f"{hostkey}:/etc/ssh/ssh_host_ed25519_key:ro", ref, "/sbin/init",
        )
        return int(podman.output("port", name, "22/tcp").rsplit(":", 1)[1])

    try:
        with concurrent.futures.ThreadPoolExecutor(NODES) as pool:
            ports = list(pool.map(run, names))
            list(pool.map(lambda p: _wait_for_sshd(p, time.monotonic() + 90), ports))
        return time.monotonic() - start
    finally:
        podman.podman("rm", "--force", "--time", "0", *names, check=False)


def lab_up() -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="gpuprov-bench-") as tmp:
        lab = Lab(Path(tmp))
        start = time.monotonic()
        lab.up()
        up = time.monotonic() - start
        start = time.monotonic()
        lab.down()
        return up, time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    # Cached images (every OS the default lab runs): building them is not what is measured.
    for os_name in image.NODE_OSES:
        image.ensure_node_image(os_name)
    ref = image.ensure_node_image()
    base, ups, downs = [], [], []
    keydir = tempfile.TemporaryDirectory(prefix="gpuprov-bench-key-")
    hostkey = Path(keydir.name) / "ssh_host_ed25519_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hostkey)], check=True)
    for i in range(args.rounds):
        base.append(baseline(ref, str(i), hostkey))
        up, down = lab_up()
        ups.append(up)
        downs.append(down)
    b, u, d = statistics.median(base), statistics.median(ups), statistics.median(downs)
    print(f"rounds: {args.rounds}, nodes: {NODES}, image: {ref}")
    print(f"baseline (podman run x{NODES} + sshd answers): {b:.2f} s  (runs: "
          + ", ".join(f"{x:.2f}" for x in base) + ")")
    print(f"gpuprov lab up: {u:.2f} s  (runs: " + ", ".join(f"{x:.2f}" for x in ups) + ")")
    print(f"gpuprov lab down: {d:.2f} s")
    keydir.cleanup()
    print(f"lab_up/baseline={u / b:.2f} lab_up_seconds={u:.2f} goal_seconds=60")


if __name__ == "__main__":
    main()
