"""Benchmark: 1000 Node objects created in the emulated API, then listed with one LIST.

Prints the LIST latency (goal < 1 s) and the emulator's resident memory. The emulator runs as
its own process (`python -m gpuprov.lab.kube serve`), as in the lab.
"""

from __future__ import annotations

import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client

from gpuprov.lab.kube import app

NODES = 1000


def node(i: int) -> dict:
    name = f"bench-gpu-{i:04d}"
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "nvidia.com/gpu.present": "true",
                                                  "gputype": "h100"}},
            "status": {"capacity": resources, "allocatable": resources,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        url = app.start_background(state)
        try:
            pid = int((state / app.PID_FILE).read_text())
            cfg = client.Configuration()
            cfg.host = url
            core = client.CoreV1Api(client.ApiClient(cfg))
            rss_before = rss_kib(pid)
            t0 = time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: core.create_node(node(i)), range(NODES)))
            create_s = time.perf_counter() - t0
            latencies = []
            for _ in range(5):
                t1 = time.perf_counter()
                listed = core.list_node()
                latencies.append(time.perf_counter() - t1)
            assert len(listed.items) >= NODES
            t2 = time.perf_counter()
            raw = core.api_client.call_api("GET", url + "/api/v1/nodes")
            raw.read()
            raw_s = time.perf_counter() - t2
            print(f"created {NODES} nodes in {create_s:.2f} s "
                  f"({NODES / create_s:.0f}/s, schema-validated)")
            print(f"LIST {len(listed.items)} nodes: first {latencies[0] * 1000:.0f} ms, "
                  f"best of 5 {min(latencies) * 1000:.0f} ms (kubernetes client, incl. "
                  f"deserialising); raw HTTP {raw_s * 1000:.0f} ms")
            print(f"emulator RSS: {rss_before / 1024:.0f} MiB before, "
                  f"{rss_kib(pid) / 1024:.0f} MiB with {NODES} nodes")
            print(f"kube_list_nodes list_s={latencies[0]:.3f} goal<1.0 "
                  f"{'OK' if latencies[0] < 1.0 else 'MISSED'}")
        finally:
            app.stop(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
