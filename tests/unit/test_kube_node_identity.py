"""The emulated API's node sockets (gpuprov/lab/kube/server.py serve_node_socket): how a lab
node reaches the API with its kubelet's identity, and the NodeRestriction rules that identity
gets. The health agent's own client is driven through systemd's real systemd-socket-proxyd, as
in a lab node (lab.py _node_api_script)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from gpuprov.lab.kube.testing import running_emulator
from gpuprov.node.health.kube import Client, KubeError

PROXYD = "/lib/systemd/systemd-socket-proxyd"
ACTIVATE = shutil.which("systemd-socket-activate")


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self) -> None:
        # The path is longer than a socket address may be: connect through the directory's
        # descriptor, as the server bound it.
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        directory, name = os.path.split(self.path)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.sock.connect(f"/proc/self/fd/{fd}/{name}")
        finally:
            os.close(fd)


def call(path: str, method: str, url: str, body: dict | None = None,
         ctype: str = "application/strategic-merge-patch+json") -> tuple[int, dict]:
    conn = UnixHTTPConnection(path)
    headers = {"Content-Type": ctype} if body is not None else {}
    conn.request(method, url, json.dumps(body) if body is not None else None, headers)
    response = conn.getresponse()
    doc = json.loads(response.read() or b"{}")
    conn.close()
    return response.status, doc


@pytest.fixture
def node_socket(tmp_path: Path):
    # Deeper than a socket address may be (107 bytes), as a lab under pytest's temp dir is.
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    with running_emulator() as emu:
        path = str(deep / "apiserver.sock")
        assert len(path) > 107
        emu.server.serve_node_socket(path, "gpu-pascal")
        yield emu, path


def test_a_node_reads_and_patches_its_own_status(node_socket):
    emu, path = node_socket
    status, node = call(path, "GET", "/api/v1/nodes/gpu-pascal")
    assert status == 200 and node["metadata"]["name"] == "gpu-pascal"
    status, _ = call(path, "GET", "/api/v1/nodes/gpu-kepler")  # the Node authorizer allows it
    assert status == 200
    patch = {"status": {"conditions": [{"type": "gpuprov.io/GPUFault", "status": "True",
                                        "reason": "Xid79", "message": "m"}]}}
    status, node = call(path, "PATCH", "/api/v1/nodes/gpu-pascal/status", patch)
    assert status == 200
    types = {c["type"] for c in node["status"]["conditions"]}
    assert {"gpuprov.io/GPUFault", "Ready"} <= types


def test_a_node_may_not_modify_another_node(node_socket):
    emu, path = node_socket
    patch = {"status": {"conditions": [{"type": "gpuprov.io/GPUFault", "status": "True"}]}}
    status, doc = call(path, "PATCH", "/api/v1/nodes/gpu-kepler/status", patch)
    assert status == 403
    assert doc["message"] == ('nodes "gpu-kepler" is forbidden: node "gpu-pascal" is not '
                              'allowed to modify node "gpu-kepler"')


def test_a_node_may_not_taint_or_untaint_itself_or_create_pods(node_socket):
    emu, path = node_socket
    taint = {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}
    status, doc = call(path, "PATCH", "/api/v1/nodes/gpu-pascal", taint)
    assert status == 403 and doc["message"].endswith(
        'node "gpu-pascal" is not allowed to modify taints')
    status, node = call(path, "GET", "/api/v1/nodes/gpu-pascal")
    assert not node["spec"].get("taints")  # nothing half-changed
    # annotations are its own to change
    status, _ = call(path, "PATCH", "/api/v1/nodes/gpu-pascal",
                     {"metadata": {"annotations": {"a": "b"}}})
    assert status == 200
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "i"}]}}
    status, doc = call(path, "POST", "/api/v1/namespaces/default/pods", pod)
    assert status == 403 and 'User "system:node:gpu-pascal" cannot create resource "pods"' \
        in doc["message"]


def test_the_tcp_listener_keeps_full_rights(node_socket):
    emu, _ = node_socket
    conn = http.client.HTTPConnection(emu.url.split("//")[1], timeout=10)
    conn.request("PATCH", "/api/v1/nodes/gpu-kepler",
                 json.dumps({"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}),
                 {"Content-Type": "application/merge-patch+json"})
    assert conn.getresponse().status == 200


@pytest.mark.skipif(ACTIVATE is None or not Path(PROXYD).exists(),
                    reason="systemd's socket tools are not installed")
def test_the_agents_client_through_systemd_socket_proxyd(node_socket):
    emu, path = node_socket
    with socket.socket() as probe:  # a free port on loopback for the proxy to listen on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # In a lab node the proxy's path is short (/opt/gpuprov-sim/api/...); here it goes through
    # this process's descriptor of the deep directory.
    directory, name = os.path.split(path)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    proxy = subprocess.Popen([ACTIVATE, "-l", f"127.0.0.1:{port}", PROXYD,
                              f"/proc/{os.getpid()}/fd/{fd}/{name}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        client = Client({"server": f"http://127.0.0.1:{port}"}, "gpu-pascal")
        deadline = time.monotonic() + 10
        while True:
            try:
                node = client.get_node()
                break
            except KubeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert node["metadata"]["name"] == "gpu-pascal"
        client.patch_conditions([{"type": "gpuprov.io/GPUFault", "status": "True",
                                  "reason": "Xid79", "message": "GPU 0 fell off the bus"}])
        other = Client({"server": f"http://127.0.0.1:{port}"}, "gpu-kepler")
        with pytest.raises(KubeError, match="not allowed to modify node"):
            other.patch_conditions([{"type": "gpuprov.io/GPUFault", "status": "True",
                                     "reason": "Xid79", "message": "m"}])
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
        os.close(fd)
    _, node = call(path, "GET", "/api/v1/nodes/gpu-pascal")
    fault = [c for c in node["status"]["conditions"] if c["type"] == "gpuprov.io/GPUFault"]
    assert fault and fault[0]["status"] == "True"
