"""The real kubectl (Debian's 1.36, fetched by `make containerd-bins`) against the emulated API
in-process: get with the server's columns, describe node, apply (client-side validation and
--server-side), logs, wait, cordon, drain through the Eviction API, explain (OpenAPI v3 and v2).

Skipped only where the binary has not been fetched; `make test` fetches it first.
"""

from __future__ import annotations

import re
import time

import pytest
import yaml

from gpuprov.lab.kube.backend import NodeInfo
from gpuprov.lab.kube.resources import GIT_VERSION
from gpuprov.lab.kube.testing import (
    Kubectl,
    default_lab_backend,
    kubectl_binary,
    running_emulator,
    table_rows,
    wait_for,
)

# What each fake node "is": distinct values, so that a column shown for the wrong node fails.
INFOS = {
    "gpu-hopper": NodeInfo("Debian GNU/Linux 13 (trixie)", "6.12.48-amd64",
                           "containerd://2.1.9", "c0ffee00-0000-4000-8000-000000000001",
                           "0123456789abcdef0123456789abcdef"),
    "gpu-kepler": NodeInfo("Debian GNU/Linux 12 (bookworm)", "6.1.0-40-amd64",
                           "containerd://1.6.20~ds1", "c0ffee00-0000-4000-8000-000000000002"),
    "gpu-pascal": NodeInfo("Debian GNU/Linux 12 (bookworm)", "6.1.0-41-amd64",
                           "containerd://1.6.20~ds1", "c0ffee00-0000-4000-8000-000000000003"),
    "cpu-only": NodeInfo("Debian GNU/Linux 12 (bookworm)", "6.1.0-42-amd64",
                         "containerd://1.6.20~ds1", "c0ffee00-0000-4000-8000-000000000004"),
}
HEARTBEAT = 0.3


@pytest.fixture(scope="module")
def emulator():
    backend = default_lab_backend()
    for name, node in backend.node_map.items():
        node.info = INFOS[name]
    with running_emulator(backend, heartbeat=HEARTBEAT) as emu:
        yield emu


@pytest.fixture(scope="module")
def kubectl(emulator, tmp_path_factory) -> Kubectl:
    binary = kubectl_binary()
    if binary is None:
        pytest.skip("Debian's kubectl is not fetched: run `make containerd-bins`")
    return Kubectl.for_url(binary, emulator.url, tmp_path_factory.mktemp("kubectl"))


@pytest.fixture
def ns(kubectl, request):
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    # `kubectl create namespace` sends protobuf, which the emulator does not read (below).
    kubectl.out("apply", "-f", "-", stdin=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false")


def pod_yaml(name: str, command: str, labels: dict | None = None, **spec) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": "lab/pod:1",
                                 "command": ["sh", "-c", command]}], **spec}})


def test_the_client_is_in_skew_with_the_emulated_server(kubectl):
    # kubectl warns when the server is more than one minor version away from it.
    proc = kubectl.run("version")
    client = re.search(r"Client Version: v1\.(\d+)\.", proc.stdout)
    server = re.search(r"Server Version: v1\.(\d+)\.", proc.stdout)
    assert client and server, proc.stdout
    assert abs(int(client.group(1)) - int(server.group(1))) <= 1
    assert "version difference" not in proc.stderr


def test_get_nodes_prints_the_servers_columns(kubectl):
    rows = {r["NAME"]: r for r in table_rows(kubectl.out("get", "nodes"))}
    assert set(rows) == set(INFOS)
    for row in rows.values():
        assert list(row) == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
        assert (row["STATUS"], row["ROLES"], row["VERSION"]) == ("Ready", "<none>", GIT_VERSION)
    wide = {r["NAME"]: r for r in table_rows(kubectl.out("get", "nodes", "-o", "wide"))}
    for name, info in INFOS.items():
        assert (wide[name]["OS-IMAGE"], wide[name]["KERNEL-VERSION"],
                wide[name]["CONTAINER-RUNTIME"]) == (info.os_image, info.kernel_version,
                                                     info.container_runtime_version)
        assert wide[name]["INTERNAL-IP"] == "<none>"


def test_get_pods_prints_ready_status_restarts_and_node(kubectl, ns):
    kubectl.out("apply", "-n", ns, "-f", "-", stdin=pod_yaml(
        "sleeper", "sleep 60", nodeName="gpu-pascal"))
    kubectl.out("apply", "-n", ns, "-f", "-", stdin=pod_yaml("failing", "exit 3"))
    kubectl.out("wait", "-n", ns, "--for=condition=Ready", "pod/sleeper", "--timeout=20s")
    kubectl.out("wait", "-n", ns, "--for=jsonpath={.status.phase}=Failed", "pod/failing",
                "--timeout=20s")
    rows = {r["NAME"]: r for r in table_rows(kubectl.out("get", "pods", "-n", ns, "-o", "wide"))}
    assert (rows["sleeper"]["READY"], rows["sleeper"]["STATUS"], rows["sleeper"]["RESTARTS"],
            rows["sleeper"]["NODE"]) == ("1/1", "Running", "0", "gpu-pascal")
    # The container's terminated reason, as a real server prints it.
    assert (rows["failing"]["READY"], rows["failing"]["STATUS"]) == ("0/1", "Error")
    assert set(rows["failing"]) >= {"IP", "NOMINATED NODE", "READINESS GATES"}
    # Across namespaces and with labels, kubectl takes both from each row's object metadata.
    everywhere = [r for r in table_rows(kubectl.out("get", "pods", "-A", "--show-labels"))
                  if r["NAME"] == "sleeper"]
    assert [(r["NAMESPACE"], r["LABELS"]) for r in everywhere] == [(ns, "app=sleeper")]


def test_describe_node_shows_what_the_node_is_and_its_lease(kubectl):
    info = INFOS["gpu-hopper"]
    text = kubectl.out("describe", "node", "gpu-hopper")
    for label, value in (("OS Image", info.os_image), ("Kernel Version", info.kernel_version),
                         ("Container Runtime Version", info.container_runtime_version),
                         ("Boot ID", info.boot_id), ("Machine ID", info.machine_id),
                         ("Kubelet Version", GIT_VERSION)):
        assert re.search(rf"^\s+{label}:\s+{re.escape(value)}$", text, re.MULTILINE), label
    assert re.search(r"^Lease:\n\s+HolderIdentity:\s+gpu-hopper$", text, re.MULTILINE), text
    assert "Failed to get lease" not in text


def test_apply_validates_creates_and_patches(kubectl, ns):
    manifest = pod_yaml("applied", "sleep 60")
    assert kubectl.out("apply", "-n", ns, "-f", "-", stdin=manifest).strip() == \
        "pod/applied created"
    # A second apply computes a patch from the last applied configuration (OpenAPI v3 schema).
    relabelled = manifest.replace("app: applied", "app: relabelled")
    assert kubectl.out("apply", "-n", ns, "-f", "-", stdin=relabelled).strip() == \
        "pod/applied configured"
    assert kubectl.out("get", "pod", "applied", "-n", ns, "-o",
                       "jsonpath={.metadata.labels.app}") == "relabelled"
    # Default (strict) validation rejects an unknown field, whoever checks it.
    bad = kubectl.run("apply", "-n", ns, "-f", "-", check=False,
                      stdin=manifest.replace("restartPolicy:", "restartPolicyy:"))
    assert bad.returncode != 0 and "restartPolicyy" in bad.stderr, bad.stderr
    assert "openapi" not in bad.stderr


def test_apply_server_side(kubectl, ns):
    manifest = pod_yaml("server-applied", "sleep 60")
    assert kubectl.out("apply", "--server-side", "-n", ns, "-f", "-",
                       stdin=manifest).strip() == "pod/server-applied serverside-applied"
    assert kubectl.out("get", "pod", "server-applied", "-n", ns, "-o",
                       "jsonpath={.spec.containers[0].image}") == "lab/pod:1"


def test_logs(kubectl, ns):
    kubectl.out("apply", "-n", ns, "-f", "-", stdin=pod_yaml("talker", "echo one; echo two"))
    kubectl.out("wait", "-n", ns, "--for=jsonpath={.status.phase}=Succeeded", "pod/talker",
                "--timeout=20s")
    assert kubectl.out("logs", "talker", "-n", ns) == "one\ntwo\n"
    assert kubectl.out("logs", "talker", "-n", ns, "--tail=1") == "two\n"


def test_wait_for_a_condition_times_out_when_it_does_not_come(kubectl, ns):
    kubectl.out("apply", "-n", ns, "-f", "-",
                stdin=pod_yaml("stuck", "sleep 60", nodeSelector={"no-such": "node"}))
    proc = kubectl.run("wait", "-n", ns, "--for=condition=Ready", "pod/stuck", "--timeout=2s",
                       check=False)
    assert proc.returncode != 0
    assert "timed out waiting for the condition on pods/stuck" in proc.stderr


def test_cordon_then_uncordon(kubectl):
    try:
        assert kubectl.out("cordon", "cpu-only").strip() == "node/cpu-only cordoned"
        row = next(r for r in table_rows(kubectl.out("get", "nodes")) if r["NAME"] == "cpu-only")
        assert row["STATUS"] == "Ready,SchedulingDisabled"
    finally:
        assert kubectl.out("uncordon", "cpu-only").strip() == "node/cpu-only uncordoned"
    row = next(r for r in table_rows(kubectl.out("get", "nodes")) if r["NAME"] == "cpu-only")
    assert row["STATUS"] == "Ready"


def test_drain_evicts_ignores_daemonsets_and_stops_at_a_disruption_budget(kubectl, ns):
    daemonset = yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {
            "metadata": {"labels": {"app": "agent"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": "cpu-only"},
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": "lab/pod:1",
                                     "command": ["sleep", "300"]}]}}}})
    budget = yaml.safe_dump({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    manifests = "---\n".join([
        daemonset, budget,
        pod_yaml("free", "sleep 300", {"app": "free"}, nodeName="cpu-only"),
        pod_yaml("guarded", "sleep 300", {"app": "guarded"}, nodeName="cpu-only")])
    kubectl.out("apply", "-n", ns, "-f", "-", stdin=manifests)
    kubectl.out("wait", "-n", ns, "--for=condition=Ready", "pod/free", "pod/guarded",
                "--timeout=20s")
    wait_for(lambda: kubectl.out("get", "pods", "-n", ns, "-l", "app=agent", "-o", "name"),
             "the DaemonSet's pod")
    try:
        start = time.monotonic()
        proc = kubectl.run("drain", "cpu-only", "--ignore-daemonsets", "--force",
                           "--timeout=3s", check=False)
        took = time.monotonic() - start
    finally:
        kubectl.out("uncordon", "cpu-only")
    assert proc.returncode != 0, proc.stdout
    assert "pod/free evicted" in proc.stdout
    # kubectl joins its warnings from a Go map with "; ", so their order changes from run to run.
    assert re.search(r"^Warning: .*\bignoring DaemonSet-managed Pods: \S+/agent-", proc.stderr,
                     re.MULTILINE)
    assert "Cannot evict pod as it would violate the pod's disruption budget." in proc.stderr
    assert took < 30
    names = kubectl.out("get", "pods", "-n", ns, "-o", "name").split()
    assert "pod/free" not in names and "pod/guarded" in names
    assert any(n.startswith("pod/agent-") for n in names)


def test_explain_reads_openapi_v3_and_v2(kubectl):
    v3 = kubectl.out("explain", "pod.spec.nodeName")
    assert "FIELD: nodeName <string>" in v3
    # --output=plaintext-openapiv2 reads /openapi/v2 in gnostic's protobuf form.
    v2 = kubectl.out("explain", "daemonsets.spec.updateStrategy",
                     "--output=plaintext-openapiv2")
    assert "RESOURCE: updateStrategy <Object>" in v2 and "rollingUpdate" in v2


def test_a_protobuf_body_is_refused_in_one_line(kubectl, ns):
    # client-go's typed clients send built-in kinds as protobuf; the emulator reads JSON and
    # YAML only, and says so as a real server says it cannot read a body (415).
    proc = kubectl.run("create", "configmap", "settings", "-n", ns, "--from-literal=a=b",
                       check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "error: failed to create configmap: the body of the request was in an unknown format - "
        "accepted media types include: application/json, application/yaml (the lab's emulated "
        "API server reads no protobuf or CBOR)"]
