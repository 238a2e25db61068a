"""Server-side printing of the emulated API (printers.py): the Table rows of pods and nodes as
kubernetes' printers.go computes them, and the content negotiation kubectl relies on."""

from __future__ import annotations

import datetime
import json
import urllib.error
import urllib.request

import pytest

from gpuprov.lab.kube import printers
from gpuprov.lab.kube.registry import NODES, PODS
from gpuprov.lab.kube.testing import running_emulator, wait_for

NOW = datetime.datetime(2026, 11, 26, 12, 0, 0, tzinfo=datetime.timezone.utc)
TABLE_V1 = "application/json;as=Table;v=v1;g=meta.k8s.io"
# What kubectl get sends (k8s.io/kubectl pkg/cmd/get/get.go transformRequests).
KUBECTL_ACCEPT = (f"{TABLE_V1},application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
                  "application/json")


def ago(seconds: float) -> str:
    return (NOW - datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


# apimachinery pkg/util/duration/duration_test.go: TestHumanDuration and its boundaries.
@pytest.mark.parametrize(("seconds", "want"), [
    (1, "1s"), (70, "70s"), (190, "3m10s"), (70 * 60, "70m"), (47 * 3600, "47h"),
    (49 * 3600, "2d1h"), ((8 * 24 + 2) * 3600, "8d"), (367 * 24 * 3600, "367d"),
    ((365 * 2 * 24 + 25) * 3600, "2y1d"), ((365 * 8 * 24 + 2) * 3600, "8y"),
    (-2, "<invalid>"), (-1.999, "0s"), (0, "0s"), (0.999, "0s"), (119.999, "119s"),
    (120, "2m"), (121, "2m1s"), (599.999, "9m59s"), (600, "10m"), (601, "10m"),
    (3 * 3600 - 0.001, "179m"), (3 * 3600, "3h"), (3 * 3600 + 60, "3h1m"),
    (8 * 3600 - 0.001, "7h59m"), (8 * 3600, "8h"), (8 * 3600 + 59 * 60, "8h"),
    (48 * 3600 - 0.001, "47h"), (48 * 3600, "2d"), (49 * 3600, "2d1h"),
    (8 * 24 * 3600 - 0.001, "7d23h"), (8 * 24 * 3600, "8d"), (8 * 24 * 3600 + 23 * 3600, "8d"),
    (2 * 365 * 24 * 3600 - 0.001, "729d"), (2 * 365 * 24 * 3600, "2y"),
    (2 * 365 * 24 * 3600 + 24 * 3600, "2y1d"), (8 * 365 * 24 * 3600 - 0.001, "7y364d"),
    (8 * 365 * 24 * 3600, "8y"), (9 * 365 * 24 * 3600, "9y"),
])
def test_human_duration_is_apimachinerys(seconds, want):
    assert printers.human_duration(seconds) == want


def pod(phase: str, statuses: list[dict], **extra) -> dict:
    meta = {"name": "p", "namespace": "default", "creationTimestamp": ago(300),
            **extra.pop("metadata", {})}
    return {"metadata": meta,
            "spec": {"nodeName": "gpu-pascal", "containers": [
                {"name": c["name"]} for c in statuses] or [{"name": "main"}],
                **extra.pop("spec", {})},
            "status": {"phase": phase, "containerStatuses": statuses, **extra}}


def running(name: str = "main", restarts: int = 0, ready: bool = True, **last) -> dict:
    status = {"name": name, "ready": ready, "restartCount": restarts,
              "state": {"running": {"startedAt": ago(60)}}}
    if last:
        status["lastState"] = {"terminated": last}
    return status


def cells(obj: dict, rt=PODS) -> list:
    return printers.table(rt, [obj], "1", now=NOW)["rows"][0]["cells"]


@pytest.mark.parametrize(("obj", "want"), [
    (pod("Running", [running()]), ["p", "1/1", "Running", "0", "5m"]),
    (pod("Pending", [{"name": "main", "ready": False, "restartCount": 0,
                      "state": {"waiting": {"reason": "ContainerCreating"}}}]),
     ["p", "0/1", "ContainerCreating", "0", "5m"]),
    # A restart shows when the last container terminated.
    (pod("Running", [running(restarts=2, exitCode=1, finishedAt=ago(30))]),
     ["p", "1/1", "Running", "2 (30s ago)", "5m"]),
    (pod("Running", [{"name": "main", "ready": False, "restartCount": 3,
                      "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                      "lastState": {"terminated": {"exitCode": 1, "finishedAt": ago(4000)}}}]),
     ["p", "0/1", "CrashLoopBackOff", "3 (66m ago)", "5m"]),
    (pod("Succeeded", [{"name": "main", "ready": False, "restartCount": 0,
                        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]),
     ["p", "0/1", "Completed", "0", "5m"]),
    (pod("Failed", [{"name": "main", "ready": False, "restartCount": 0,
                     "state": {"terminated": {"exitCode": 3}}}]),
     ["p", "0/1", "ExitCode:3", "0", "5m"]),
    # One container done, one still running: the pod is Running (or NotReady).
    (pod("Running", [{"name": "a", "ready": False, "restartCount": 0,
                      "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                     running("b")], conditions=[{"type": "Ready", "status": "True"}]),
     ["p", "1/2", "Running", "0", "5m"]),
    (pod("Running", [running()], metadata={"deletionTimestamp": ago(0)}),
     ["p", "1/1", "Terminating", "0", "5m"]),
    (pod("Pending", [], initContainerStatuses=[{"name": "init", "restartCount": 0,
                                                "state": {"running": {}}}],
         spec={"initContainers": [{"name": "init"}]}),
     ["p", "0/1", "Init:0/1", "0", "5m"]),
    (pod("Failed", [running()], reason="Evicted"), ["p", "1/1", "Evicted", "0", "5m"]),
])
def test_pod_rows_are_printers_gos(obj, want):
    row = cells(obj)
    assert row[:5] == want
    assert row[5:] == ["<none>", "gpu-pascal", "<none>", "<none>"]  # IP, node, nominated, gates


def test_finished_pods_carry_a_completed_row_condition():
    done = printers.table(PODS, [pod("Succeeded", [])], "1", now=NOW)["rows"][0]
    assert done["conditions"] == [{"type": "Completed", "status": "True",
                                   "reason": "Succeeded",
                                   "message": "The pod has completed successfully."}]
    assert "conditions" not in printers.table(PODS, [pod("Running", [running()])], "1",
                                              now=NOW)["rows"][0]


def node(ready: str | None, unschedulable: bool = False, labels=None, info=None) -> dict:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {"metadata": {"name": "n", "creationTimestamp": ago(7200), "labels": labels or {}},
            "spec": {"unschedulable": True} if unschedulable else {},
            "status": {"conditions": conditions,
                       "addresses": [{"type": "Hostname", "address": "n"}],
                       "nodeInfo": info or {"kubeletVersion": "v1.36.0"}}}


@pytest.mark.parametrize(("obj", "status", "roles"), [
    (node("True"), "Ready", "<none>"),
    (node("False"), "NotReady", "<none>"),
    (node("Unknown"), "NotReady", "<none>"),
    (node(None), "Unknown", "<none>"),
    (node("True", unschedulable=True), "Ready,SchedulingDisabled", "<none>"),
    (node("True", labels={"node-role.kubernetes.io/worker": "",
                          "node-role.kubernetes.io/gpu": "", "kubernetes.io/role": "edge"}),
     "Ready", "edge,gpu,worker"),
])
def test_node_rows_are_printers_gos(obj, status, roles):
    assert cells(obj, NODES)[:5] == ["n", status, roles, "120m", "v1.36.0"]


def test_node_wide_cells_are_its_node_info():
    info = {"kubeletVersion": "v1.36.0", "osImage": "Debian GNU/Linux 13 (trixie)",
            "kernelVersion": "6.12.48-amd64", "containerRuntimeVersion": "containerd://2.1.9"}
    assert cells(node("True", info=info), NODES)[5:] == [
        "<none>", "<none>", "Debian GNU/Linux 13 (trixie)", "6.12.48-amd64",
        "containerd://2.1.9"]
    assert cells(node("True"), NODES)[7:] == ["<unknown>"] * 3


# -- over HTTP ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def emulator():
    with running_emulator() as emu:
        wait_for(lambda: emu.registry.find(NODES, "", "gpu-hopper"), "the nodes")
        yield emu


def get(emulator, path: str, accept: str) -> tuple[int, dict]:
    req = urllib.request.Request(emulator.url + path, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_kubectls_accept_gets_a_table_with_every_column(emulator):
    status, doc = get(emulator, "/api/v1/nodes", KUBECTL_ACCEPT)
    assert status == 200 and (doc["kind"], doc["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [(c["name"], c["priority"]) for c in doc["columnDefinitions"]] == [
        ("Name", 0), ("Status", 0), ("Roles", 0), ("Age", 0), ("Version", 0),
        ("Internal-IP", 1), ("External-IP", 1), ("OS-Image", 1), ("Kernel-Version", 1),
        ("Container-Runtime", 1)]
    # Descriptions come from the official schema, as printers.go takes them from SwaggerDoc().
    assert doc["columnDefinitions"][0]["description"].startswith("Name must be unique")
    assert sorted(r["cells"][0] for r in doc["rows"]) == sorted(
        ["cpu-only", "gpu-hopper", "gpu-kepler", "gpu-pascal"])
    assert int(doc["metadata"]["resourceVersion"]) > 0
    row_object = doc["rows"][0]["object"]
    assert (row_object["kind"], row_object["apiVersion"]) == ("PartialObjectMetadata",
                                                              "meta.k8s.io/v1")
    assert set(row_object) == {"kind", "apiVersion", "metadata"}


def test_one_object_is_a_table_of_one_row(emulator):
    status, doc = get(emulator, "/api/v1/nodes/gpu-hopper?includeObject=Object", TABLE_V1)
    assert status == 200 and len(doc["rows"]) == 1
    assert doc["rows"][0]["object"]["kind"] == "Node"
    status, doc = get(emulator, "/api/v1/nodes/gpu-hopper?includeObject=None",
                      "application/json;as=Table;v=v1beta1;g=meta.k8s.io")
    assert doc["apiVersion"] == "meta.k8s.io/v1beta1" and doc["rows"][0]["object"] is None


def test_a_plain_accept_or_a_kind_without_printer_gets_the_list(emulator):
    assert get(emulator, "/api/v1/nodes", "application/json")[1]["kind"] == "NodeList"
    assert get(emulator, "/api/v1/secrets", KUBECTL_ACCEPT)[1]["kind"] == "SecretList"


def test_an_unknown_include_object_is_a_bad_request(emulator):
    status, doc = get(emulator, "/api/v1/nodes?includeObject=Everything", KUBECTL_ACCEPT)
    assert status == 400 and doc["message"] == 'unrecognized includeObject value: "Everything"'
