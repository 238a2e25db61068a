"""Assemble the emulator (store, registry, cluster, HTTP server) and run it in the background.

`gpuprov lab` uses start_background()/stop()/url()/write_kubeconfig(); tests and benchmarks
build an Emulator in-process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from gpuprov.lab.kube.backend import FakeBackend, FakeNode, Gpu, NodeBackend, RuntimeConfig
from gpuprov.lab.kube.cluster import Cluster
from gpuprov.lab.kube.registry import Registry
from gpuprov.lab.kube.server import ApiServer
from gpuprov.lab.kube.store import Store

PID_FILE, URL_FILE, LOG_FILE = "kube-api.pid", "kube-api.url", "kube-api.log"
# SIMULATION: how a lab node reaches the API with its kubelet's identity. The emulator serves
# node N on the Unix socket nodes/N/NODE_API_DIR/NODE_API_SOCKET of the lab directory
# (ApiServer.serve_node_socket); lab.py mounts that directory at NODE_API_PATH in the node,
# where systemd-socket-proxyd (systemd's own) forwards 127.0.0.1:NODE_API_PORT to it, and
# writes the node's /etc/kubernetes/kubelet.conf for that address.
NODE_API_DIR, NODE_API_SOCKET = "api", "apiserver.sock"
NODE_API_PATH, NODE_API_PORT = "/opt/gpuprov-sim/api", 6443
START_TIMEOUT = 30.0


class Emulator:
    def __init__(self, backend: NodeBackend, state_dir: Path | None = None,
                 host: str = "127.0.0.1", port: int = 0, tick: float | None = None,
                 heartbeat: float | None = None) -> None:
        self.registry = Registry(Store())
        kwargs: dict[str, float] = {} if tick is None else {"tick": tick}
        if heartbeat is not None:
            kwargs["heartbeat"] = heartbeat
        self.cluster = Cluster(self.registry, backend, state_dir, **kwargs)
        self.server = ApiServer(self.registry, host, port, logs=self.cluster.pod_logs)

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> str:
        self.cluster.bootstrap()
        self.cluster.start()
        return self.server.start()

    def stop(self) -> None:
        self.cluster.stop()
        self.server.stop()


def serve_lab_nodes(server: ApiServer, lab_dir: Path, nodes: list[str]) -> list[str]:
    """Serve each lab node that has its API directory on its socket; the nodes served."""
    served = []
    for node in nodes:
        directory = lab_dir / "nodes" / node / NODE_API_DIR
        path = str(directory / NODE_API_SOCKET)
        if not directory.is_dir():
            continue  # a node made before the lab had node sockets: `lab down` and up
        server.serve_node_socket(path, node)
        served.append(node)
    return served


def fake_backend_from_file(path: Path) -> FakeBackend:
    """{"node": {"gpus": [uuid, ...] | null, "unhealthy": [uuid], "nvidia_handlers": [...],
    "default_handler": "nvidia"}} -> FakeBackend (for running the server without a lab)."""
    doc = json.loads(Path(path).read_text())
    nodes = {}
    for name, spec in doc.items():
        gpus = spec.get("gpus")
        bad = set(spec.get("unhealthy") or [])
        nodes[name] = FakeNode(
            None if gpus is None else [Gpu(u, u not in bad) for u in gpus],
            RuntimeConfig(frozenset(spec.get("nvidia_handlers") or []),
                          spec.get("default_handler", "runc")))
    return FakeBackend(nodes)


# -- background process ------------------------------------------------------------------------

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def url(state_dir: Path) -> str | None:
    """The URL of the emulator running for this state dir, or None."""
    state_dir = Path(state_dir)
    try:
        pid = int((state_dir / PID_FILE).read_text())
        address = (state_dir / URL_FILE).read_text().strip()
    except (OSError, ValueError):
        return None
    return address if _pid_alive(pid) else None


def _healthy(address: str) -> bool:
    try:
        with urllib.request.urlopen(address + "/healthz", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def start_background(state_dir: Path, lab_dir: Path | None = None,
                     fake_nodes: Path | None = None, port: int = 0) -> str:
    """Start `python -m gpuprov.lab.kube serve` detached; return its URL. Idempotent."""
    state_dir = Path(state_dir).resolve()
    running = url(state_dir)
    if running and _healthy(running):
        return running
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / URL_FILE).unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "gpuprov.lab.kube", "serve", "--state-dir", str(state_dir),
           "--port", str(port)]
    if lab_dir is not None:
        cmd += ["--lab-dir", str(Path(lab_dir).resolve())]
    if fake_nodes is not None:
        cmd += ["--fake-nodes", str(Path(fake_nodes).resolve())]
    with open(state_dir / LOG_FILE, "ab") as logf:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        address = url(state_dir)
        if address and _healthy(address):
            return address
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    tail = (state_dir / LOG_FILE).read_text(errors="replace").strip().splitlines()[-1:]
    raise RuntimeError(f"the emulated Kubernetes API did not start; see {state_dir / LOG_FILE}"
                       f" ({' '.join(tail)})")


def stop(state_dir: Path, timeout: float = 10.0) -> bool:
    """Stop the emulator of this state dir; True if one was running."""
    state_dir = Path(state_dir)
    try:
        pid = int((state_dir / PID_FILE).read_text())
    except (OSError, ValueError):
        return False
    was_running = _pid_alive(pid)
    if was_running:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    for name in (PID_FILE, URL_FILE):
        (state_dir / name).unlink(missing_ok=True)
    return was_running


def write_kubeconfig(path: Path, address: str, name: str = "gpuprov-lab") -> Path:
    """A kubeconfig for the emulator: plain HTTP on loopback, no credentials."""
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": name, "preferences": {},
        "clusters": [{"name": name, "cluster": {"server": address}}],
        "users": [{"name": name, "user": {}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name,
                                                  "namespace": "default"}}],
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Written by `gpuprov lab up` for the lab's emulated Kubernetes API.\n"
                    + yaml.safe_dump(doc, sort_keys=False))
    return path
