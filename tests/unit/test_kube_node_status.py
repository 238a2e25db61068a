"""What the emulated kubelets report about their nodes (status.nodeInfo read from the node) and
their node Leases, and the watch-list streams client-go 1.36 informers open."""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpuprov.lab.kube import cri
from gpuprov.lab.kube.backend import LabBackend, NodeInfo, read_node_info
from gpuprov.lab.kube.controllers.nodes import (
    LEASE_DURATION_SECONDS,
    NODE_LEASE_NAMESPACE,
)
from gpuprov.lab.kube.registry import NODES, R
from gpuprov.lab.kube.testing import default_lab_backend, running_emulator, wait_for

LEASES, EVENTS = R["Lease"], R["Event"]
HEARTBEAT = 0.2
HOPPER = NodeInfo("Debian GNU/Linux 13 (trixie)", "6.12.48-amd64", "containerd://2.1.9",
                  "c0ffee00-0000-4000-8000-000000000001", "0123456789abcdef0123456789abcdef",
                  "4c4c4544-0000-1000-8000-000000000001")


@pytest.fixture
def backend():
    fake = default_lab_backend()
    fake.node_map["gpu-hopper"].info = HOPPER
    return fake


@pytest.fixture
def emulator(backend):
    with running_emulator(backend, heartbeat=HEARTBEAT) as emu:
        yield emu


def renew_time(emulator, node: str) -> datetime.datetime | None:
    lease = emulator.registry.find(LEASES, NODE_LEASE_NAMESPACE, node)
    if lease is None:
        return None
    return datetime.datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00"))


def test_each_node_has_a_lease_held_by_it_and_owned_by_its_node(emulator, backend):
    for name in backend.node_map:
        lease = wait_for(lambda n=name: emulator.registry.find(LEASES, NODE_LEASE_NAMESPACE, n),
                         f"the lease of {name}")
        node = emulator.registry.find(NODES, "", name)
        assert lease["spec"]["holderIdentity"] == name
        assert lease["spec"]["leaseDurationSeconds"] == LEASE_DURATION_SECONDS
        assert lease["metadata"]["ownerReferences"] == [{
            "apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}]


def test_a_lease_is_renewed_while_its_node_runs_and_not_when_it_is_down(emulator, backend):
    first = wait_for(lambda: renew_time(emulator, "gpu-kepler"), "the first renewal")
    later = wait_for(lambda: (t := renew_time(emulator, "gpu-kepler")) > first and t,
                     "a second renewal", timeout=10 * HEARTBEAT + 5)
    assert later > first
    backend.node_map["gpu-kepler"].running = False
    # Once a heartbeat has found the node down, its lease stays as it was while the other
    # nodes' leases are renewed twice more.
    down_at = time.monotonic()
    kubelet = emulator.cluster.kubelets["gpu-kepler"]
    wait_for(lambda: kubelet.heartbeat_at > down_at, "a heartbeat of the stopped node")
    stopped = renew_time(emulator, "gpu-kepler")
    other = renew_time(emulator, "gpu-pascal")
    for _ in range(2):
        other = wait_for(lambda o=other: (t := renew_time(emulator, "gpu-pascal")) > o and t,
                         "a renewal of another node")
    assert renew_time(emulator, "gpu-kepler") == stopped
    backend.node_map["gpu-kepler"].running = True
    wait_for(lambda: renew_time(emulator, "gpu-kepler") > stopped, "renewals to resume")


def test_node_info_is_what_the_node_reports(emulator):
    node = emulator.registry.find(NODES, "", "gpu-hopper")
    info = node["status"]["nodeInfo"]
    assert (info["osImage"], info["kernelVersion"], info["containerRuntimeVersion"],
            info["bootID"], info["machineID"], info["systemUUID"]) == (
        HOPPER.os_image, HOPPER.kernel_version, HOPPER.container_runtime_version,
        HOPPER.boot_id, HOPPER.machine_id, HOPPER.system_uuid)
    assert info["kubeletVersion"].startswith("v1.")


def test_a_new_boot_id_updates_the_node_with_a_rebooted_event(emulator, backend):
    wait_for(lambda: emulator.registry.find(NODES, "", "gpu-hopper"), "the node")
    rebooted = dataclasses.replace(HOPPER, boot_id="c0ffee00-0000-4000-8000-00000000beef",
                                   container_runtime_version="containerd://2.2.0")
    backend.node_map["gpu-hopper"].info = rebooted
    info = wait_for(lambda: (i := emulator.registry.find(NODES, "", "gpu-hopper")["status"][
        "nodeInfo"])["bootID"] == rebooted.boot_id and i, "the new boot ID")
    assert info["containerRuntimeVersion"] == "containerd://2.2.0"
    events = emulator.registry.list(EVENTS, field_selector="reason=Rebooted")[0]
    assert [(e["type"], e["involvedObject"]["name"], e["message"]) for e in events] == [
        ("Warning", "gpu-hopper",
         f"Node gpu-hopper has been rebooted, boot id: {rebooted.boot_id}")]


# -- reading a node ------------------------------------------------------------------------------

def node_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    files = {
        "etc/os-release": 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nID=debian\n',
        "proc/sys/kernel/osrelease": "6.12.48-amd64\n",
        "proc/sys/kernel/random/boot_id": "c0ffee00-0000-4000-8000-000000000001\n",
        "proc/sys/kernel/hostname": "gpu-hopper\n",
        "etc/machine-id": "0123456789abcdef0123456789abcdef\n",
    }
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def test_node_info_is_read_from_the_nodes_files(tmp_path):
    info = read_node_info(str(node_root(tmp_path)), "containerd://2.1.9")
    assert info == NodeInfo("Debian GNU/Linux 13 (trixie)", "6.12.48-amd64",
                            "containerd://2.1.9", "c0ffee00-0000-4000-8000-000000000001",
                            "0123456789abcdef0123456789abcdef", "")


class FakeCri:
    def __init__(self, answer: tuple[str, str] | None) -> None:
        self.answer = answer

    def version(self) -> tuple[str, str]:
        if self.answer is None:
            raise cri.CriError("UNAVAILABLE", "connection refused")
        return self.answer


def test_the_lab_kubelet_asks_the_runtime_for_its_version(tmp_path, monkeypatch):
    (tmp_path / "lab.json").write_text(json.dumps(
        {"nodes": [{"name": "gpu-hopper", "container": "gpuprov-lab-gpu-hopper"}]}))
    lab = LabBackend(tmp_path)
    root = node_root(tmp_path)
    runtime = FakeCri(("containerd", "2.1.9+unknown"))
    monkeypatch.setattr(lab, "_node_root", lambda node: str(root))
    monkeypatch.setattr(lab, "_client", lambda node: (runtime, str(root)))
    assert lab.node_info("gpu-hopper").container_runtime_version == "containerd://2.1.9+unknown"
    # A runtime that does not answer is reported as the kubelet reports it.
    runtime.answer = None
    assert lab.node_info("gpu-hopper").container_runtime_version == "containerd://Unknown"
    monkeypatch.setattr(lab, "_node_root", lambda node: None)
    assert lab.node_info("gpu-hopper") is None


# -- watch-list ----------------------------------------------------------------------------------

def watch_lines(url: str) -> tuple[int, list[dict]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, [json.loads(line) for line in resp.read().splitlines()]
    except urllib.error.HTTPError as err:
        return err.code, [json.loads(err.read())]


def test_a_watch_list_streams_the_objects_then_the_end_bookmark(emulator):
    wait_for(lambda: emulator.registry.find(NODES, "", "cpu-only"), "the nodes")
    status, lines = watch_lines(
        f"{emulator.url}/api/v1/nodes?watch=true&sendInitialEvents=true&allowWatchBookmarks=true"
        "&resourceVersionMatch=NotOlderThan&timeoutSeconds=1")
    assert status == 200
    assert sorted(line["object"]["metadata"]["name"] for line in lines[:-1]) == sorted(
        ["cpu-only", "gpu-hopper", "gpu-kepler", "gpu-pascal"])
    assert {line["type"] for line in lines[:-1]} == {"ADDED"}
    end = lines[-1]
    assert end["type"] == "BOOKMARK" and end["object"]["kind"] == "Node"
    assert end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(end["object"]["metadata"]["resourceVersion"]) >= max(
        int(line["object"]["metadata"]["resourceVersion"]) for line in lines[:-1])


@pytest.mark.parametrize("query", ["sendInitialEvents=true",
                                   "sendInitialEvents=true&resourceVersionMatch=Exact",
                                   "resourceVersionMatch=NotOlderThan"])
def test_a_malformed_watch_list_is_refused(emulator, query):
    status, [doc] = watch_lines(f"{emulator.url}/api/v1/nodes?watch=true&{query}")
    assert status == 422 and "resourceVersionMatch" in doc["message"]


def _ready(emulator, node: str) -> dict:
    found = emulator.registry.find(NODES, "", node)
    return next(c for c in found["status"]["conditions"] if c["type"] == "Ready")


def test_a_node_whose_runtime_does_not_answer_is_not_ready_with_the_reason(emulator, backend):
    from gpuprov.lab.kube.registry import PODS

    wait_for(lambda: _ready(emulator, "gpu-pascal")["status"] == "True", "gpu-pascal Ready")
    backend.node_map["gpu-pascal"].runtime_down = "the CRI Version call failed: UNAVAILABLE"
    ready = wait_for(lambda: (c := _ready(emulator, "gpu-pascal"))["status"] == "False" and c,
                     "gpu-pascal NotReady")
    assert ready["reason"] == "KubeletNotReady"
    assert ready["message"] == ("container runtime is down: the CRI Version call failed: "
                                "UNAVAILABLE")
    # Its kubelet skips pod synchronization meanwhile: a pod bound to it stays Pending, and
    # nothing is started there; the other nodes go on.
    started = len(backend.started)
    emulator.registry.create(PODS, "default", {
        "metadata": {"name": "bound"},
        "spec": {"nodeName": "gpu-pascal", "restartPolicy": "Never",
                 "containers": [{"name": "c", "image": "busybox", "command": ["true"]}]}})
    time.sleep(HEARTBEAT * 5)
    pod = emulator.registry.find(PODS, "default", "bound")
    assert pod["status"].get("phase", "Pending") == "Pending"
    assert [s for s in backend.started[started:] if s[0] == "gpu-pascal"] == []
    assert _ready(emulator, "gpu-kepler")["status"] == "True"

    backend.node_map["gpu-pascal"].runtime_down = ""
    wait_for(lambda: _ready(emulator, "gpu-pascal")["status"] == "True", "gpu-pascal Ready again")
    wait_for(lambda: emulator.registry.find(PODS, "default", "bound")["status"].get("phase")
             == "Succeeded", "the bound pod to run once the runtime answers")


def test_a_failure_that_repeats_is_logged_once_a_minute(caplog, monkeypatch):
    from gpuprov.lab.kube import controllers

    clock = [1000.0]
    monkeypatch.setattr(controllers.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(controllers, "_last_logged", {})

    def broken() -> None:
        raise ModuleNotFoundError("No module named 'grpc'")

    for _ in range(120):  # a minute of passes, twice a second
        controllers.guarded(broken)
        clock[0] += 0.5
    controllers.guarded(broken)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["broken failed", "broken still fails: ModuleNotFoundError: "
                        "No module named 'grpc'"]
