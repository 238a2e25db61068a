"""The real kubectl (Debian's 1.36, `make containerd-bins`) against the lab, as against a real
cluster: the server's columns, what describe shows of a node against what gpuprov's probe reads
on it, renewed node Leases, apply / logs / wait on pods in the nodes' containerd, and a drain
through the Eviction API that stops at a PodDisruptionBudget, then uncordon.

Everything it creates is in its own namespace, removed at the end; the drained node is
uncordoned whatever happens: the session lab is shared.
"""

from __future__ import annotations

import re
import time

import pytest
import yaml

from gpuprov.lab.kube.resources import GIT_VERSION
from gpuprov.lab.kube.testing import Kubectl, kubectl_binary, table_rows
from gpuprov.payload import run_probe

NS = "kubectl-lab-test"
LABEL = {"gpuprov-test": "kubectl"}
DRAINED = "cpu-only"
# A node Lease is renewed every 10 s (a quarter of its 40 s duration).
LEASE_WAIT_S = 25
POD_WAIT = "60s"


@pytest.fixture(scope="module")
def kubectl(lab, tmp_path_factory):
    binary = kubectl_binary()
    if binary is None:
        pytest.fail("Debian's kubectl is not fetched: run `make containerd-bins`")
    kubectl = Kubectl(binary, lab.kubeconfig_path, tmp_path_factory.mktemp("kubectl-home"))
    kubectl.out("apply", "-f", "-", stdin=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}))
    yield kubectl
    kubectl.run("uncordon", DRAINED, check=False)
    kubectl.run("delete", "namespace", NS, "--timeout=60s", check=False)


def pod(name: str, image: str, command: str, node: str, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {**LABEL, **(labels or {})}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": image,
                                     "command": ["sh", "-c", command]}]}}


def apply(kubectl: Kubectl, *docs: dict, server_side: bool = False) -> str:
    args = ["apply", *(["--server-side"] if server_side else []), "-f", "-"]
    return kubectl.out(*args, stdin=yaml.safe_dump_all(docs))


def test_get_nodes_shows_the_servers_columns(kubectl, lab_state):
    rows = {r["NAME"]: r for r in table_rows(kubectl.out("get", "nodes", "-o", "wide"))}
    assert sorted(rows) == sorted(n.name for n in lab_state.nodes)
    for row in rows.values():
        assert (row["STATUS"], row["ROLES"], row["VERSION"]) == ("Ready", "<none>", GIT_VERSION)
        assert row["CONTAINER-RUNTIME"].startswith("containerd://")
    assert rows["gpu-hopper"]["OS-IMAGE"] == "Debian GNU/Linux 13 (trixie)"
    assert rows["gpu-pascal"]["OS-IMAGE"] == "Debian GNU/Linux 12 (bookworm)"


@pytest.mark.parametrize("node", ["gpu-hopper", "gpu-pascal"])
def test_describe_node_is_what_the_node_says(kubectl, node_connection, node):
    conn = node_connection(node)
    host = run_probe(conn, timeout=60)["host"]
    containerd = conn.run("containerd --version", hide=True, in_stream=False).stdout.split()[2]
    text = kubectl.out("describe", "node", node)
    block = text.split("System Info:\n")[1].split("Non-terminated Pods:")[0]
    system = dict(re.findall(r"^  ([A-Za-z ]+):[ \t]*(.*)$", block, re.MULTILINE))
    assert set(system) >= {"Machine ID", "Boot ID", "Kernel Version", "OS Image"}, block
    assert system["OS Image"] == host["os"]["pretty_name"]
    assert system["Kernel Version"] == host["kernel"]
    assert system["Boot ID"] == host["boot_id"]
    assert system["Container Runtime Version"] == f"containerd://{containerd}"
    assert system["Kubelet Version"] == GIT_VERSION
    assert re.search(rf"^Lease:\n\s+HolderIdentity:\s+{node}$", text, re.MULTILINE), text


def test_node_leases_are_renewed(kubectl, lab_state):
    leases = {r["NAME"]: r for r in table_rows(
        kubectl.out("get", "leases", "-n", "kube-node-lease"))}
    assert {name: leases[name]["HOLDER"] for name in leases} == \
        {n.name: n.name for n in lab_state.nodes}
    query = ("get", "lease", "gpu-hopper", "-n", "kube-node-lease", "-o",
             "jsonpath={.spec.renewTime} {.spec.leaseDurationSeconds}")
    first, duration = kubectl.out(*query).split()
    assert duration == "40"
    deadline = time.monotonic() + LEASE_WAIT_S
    while time.monotonic() < deadline:
        if kubectl.out(*query).split()[0] > first:  # RFC 3339 in UTC: ordered as text
            return
        time.sleep(1)
    raise AssertionError(f"the lease of gpu-hopper was not renewed in {LEASE_WAIT_S} s "
                         f"(renewTime {first})")


def test_apply_wait_logs_and_get_pods(kubectl, lab_state):
    created = apply(kubectl, pod("hello", lab_state.pod_image,
                                 "echo hello from $(hostname); sleep 30", "gpu-pascal"))
    assert created.strip() == "pod/hello created"
    kubectl.out("wait", "-n", NS, "--for=condition=Ready", "pod/hello", f"--timeout={POD_WAIT}")
    row = table_rows(kubectl.out("get", "pod", "hello", "-n", NS, "-o", "wide"))[0]
    assert (row["READY"], row["STATUS"], row["RESTARTS"], row["NODE"]) == \
        ("1/1", "Running", "0", "gpu-pascal")
    assert kubectl.out("logs", "hello", "-n", NS) == "hello from gpu-pascal\n"
    config = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "settings", "namespace": NS}, "data": {"a": "1"}}
    assert apply(kubectl, config, server_side=True).strip() == \
        "configmap/settings serverside-applied"
    config["data"]["a"] = "2"
    assert apply(kubectl, config).strip() == "configmap/settings configured"


def test_drain_evicts_a_pod_and_stops_at_a_disruption_budget(kubectl, lab_state):
    budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
              "metadata": {"name": "keep-one", "namespace": NS},
              "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}}
    apply(kubectl, budget,
          pod("free", lab_state.pod_image, "sleep 300", DRAINED, {"app": "free"}),
          pod("guarded", lab_state.pod_image, "sleep 300", DRAINED, {"app": "guarded"}))
    kubectl.out("wait", "-n", NS, "--for=condition=Ready", "pod/free", "pod/guarded",
                f"--timeout={POD_WAIT}")
    try:
        # Only this test's pods: the session lab's other pods stay where they are.
        proc = kubectl.run("drain", DRAINED, "--ignore-daemonsets", "--force", "--timeout=5s",
                           "--pod-selector=gpuprov-test=kubectl", check=False)
        node = table_rows(kubectl.out("get", "node", DRAINED))[0]
        assert node["STATUS"] == "Ready,SchedulingDisabled"
    finally:
        assert kubectl.out("uncordon", DRAINED).strip() == f"node/{DRAINED} uncordoned"
    assert proc.returncode != 0, proc.stdout
    assert "pod/free evicted" in proc.stdout
    assert f'error when evicting pods/"guarded" -n "{NS}" (will retry after 5s): Cannot ' \
           "evict pod as it would violate the pod's disruption budget." in proc.stderr
    left = kubectl.out("get", "pods", "-n", NS, "-l", "gpuprov-test=kubectl", "-o", "name")
    assert "pod/free" not in left.split() and "pod/guarded" in left.split()
    assert table_rows(kubectl.out("get", "node", DRAINED))[0]["STATUS"] == "Ready"
