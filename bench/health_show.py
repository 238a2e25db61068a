"""Benchmark: `gpuprov health show --json` over 4 and over 1000 GPU nodes of the emulated API.

Each node carries the four gpuprov.io/ conditions an agent publishes (patched on its status, as
the agent does; 5 % of them with a GPUFault). show reads one LIST of nodes, so 1000 nodes should
cost about what 4 do plus the size of the list: the bench prints wall and CPU time of show for
both (median of 5 runs each, in this process, after one warm-up), and their ratio. The emulator
runs as its own process (`python -m gpuprov.lab.kube serve`), as in the lab.

    .venv/bin/python bench/health_show.py [--nodes 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client

from gpuprov.cli import main as gpuprov
from gpuprov.lab.kube import app
from gpuprov.lab.kube.testing import agent_conditions
from gpuprov.node.health.kube import Client


def node(name: str) -> dict:
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "nvidia.com/gpu.present": "true"}},
            "status": {"capacity": resources, "allocatable": resources,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def timed_show(kubeconfig: Path, runs: int = 5) -> tuple[float, float]:
    walls, cpus = [], []
    for i in range(runs + 1):
        out = io.StringIO()
        w0, c0 = time.perf_counter(), time.process_time()
        with contextlib.redirect_stdout(out):
            gpuprov(["health", "show", "--kubeconfig", str(kubeconfig), "--json"])
        if i:  # the first run warms imports up
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        url = app.start_background(state)
        kubeconfig = app.write_kubeconfig(state / "kubeconfig", url)
        try:
            cfg = client.Configuration()
            cfg.host = url
            core = client.CoreV1Api(client.ApiClient(cfg))
            results = {}
            made = 0
            for count in (4, args.nodes):
                names = [f"bench-gpu-{i:04d}" for i in range(made, count)]

                def make(name: str) -> None:
                    core.create_node(node(name))
                    Client({"server": url}, name).patch_conditions(
                        agent_conditions(int(name[-4:]) % 20 == 0))

                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(make, names))
                made = count
                results[count] = timed_show(kubeconfig)
                print(f"health show --json, {count} GPU nodes: wall {results[count][0]:.3f} s, "
                      f"CPU {results[count][1]:.3f} s (median of 5)")
            small, large = results[4], results[args.nodes]
            print(f"ratio {args.nodes} / 4 nodes: wall x{large[0] / small[0]:.1f}, "
                  f"CPU x{large[1] / small[1]:.1f}")
        finally:
            app.stop(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
