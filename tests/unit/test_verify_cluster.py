"""The cluster phase against the lab's emulated Kubernetes API (in-process, fake nodes, no
containers): checks, fault switches, kubeconfig errors, and a constant request count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from gpuprov import cli
from gpuprov.errors import ExitCode, GpuprovError
from gpuprov.lab.kube import app, faults
from gpuprov.lab.kube.testing import default_lab_backend, running_emulator, wait_for
from gpuprov.nvidia import labels
from gpuprov.verify import cluster, nodes, runner
from gpuprov.verify.findings import FAIL, PASS, SKIP
from gpuprov.verify.inventory import Node

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
PROBES = FIXTURES / "verify" / "probe"
LAB = ("gpu-kepler", "gpu-pascal", "gpu-hopper", "cpu-only")
GPU = "nvidia.com/gpu"


def probe(node: Node, timeout: float) -> dict:
    return json.loads((PROBES / f"{node.name}.json").read_text())


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("kube-state")


@pytest.fixture(scope="module")
def emulator(state_dir):
    with running_emulator(default_lab_backend(), state_dir) as emu:
        cfg = client.Configuration()
        cfg.host = emu.url
        emu.core = client.CoreV1Api(client.ApiClient(cfg))
        manifest = yaml.safe_load((FIXTURES / "kube" / "nvidia-device-plugin.yml").read_text())
        client.AppsV1Api(emu.core.api_client).create_namespaced_daemon_set("kube-system",
                                                                           manifest)
        wait_for(lambda: all(_allocatable(emu.core).get(n) for n in LAB[:3]),
                 "the device plugin to register on every GPU node")
        yield emu


@pytest.fixture(scope="module")
def kubeconfig(emulator, tmp_path_factory):
    return str(app.write_kubeconfig(tmp_path_factory.mktemp("kc") / "config", emulator.url))


def _allocatable(core) -> dict:
    return {n.metadata.name: (n.status.allocatable or {}).get(GPU) for n in core.list_node().items}


def lab_nodes(names=LAB) -> list[Node]:
    return [Node(name=n, target=None, gpu_expected=n.startswith("gpu-")) for n in names]


def k8s_run(kubeconfig: str, names=LAB, **options) -> dict[tuple[str, str], object]:
    findings = runner.run(lab_nodes(names), runner.Options(only=("k8s",), kubeconfig=kubeconfig,
                                                           **options), probe=probe)
    return {(f.node, f.check): f for f in findings}


def test_healthy_cluster(kubeconfig):
    found = k8s_run(kubeconfig)
    for name in LAB[:3]:
        for check in ("k8s.node-ready", "k8s.device-plugin", "k8s.allocatable"):
            assert found[(name, check)].status == PASS, found[(name, check)]
    assert "allocatable 4 == NVML healthy 4; 0 allocated to pods, 0 busy" in \
        found[("gpu-pascal", "k8s.allocatable")].message
    assert found[("cpu-only", "k8s.node-ready")].status == PASS
    assert found[("cpu-only", "k8s.device-plugin")].status == SKIP


def test_plugin_unregistered_fails_allocatable(emulator, state_dir, kubeconfig):
    faults.set_fault(state_dir, "gpu-pascal", "plugin-unregistered")
    try:
        wait_for(lambda: _allocatable(emulator.core)["gpu-pascal"] in (None, "0"),
                 "gpu-pascal's GPUs to leave allocatable")
        found = k8s_run(kubeconfig)
    finally:
        faults.clear_fault(state_dir, "gpu-pascal", "plugin-unregistered")
    finding = found[("gpu-pascal", "k8s.allocatable")]
    assert finding.status == FAIL and "0 != 4 healthy in NVML" in finding.message
    assert found[("gpu-hopper", "k8s.allocatable")].status == PASS  # the others intact
    wait_for(lambda: _allocatable(emulator.core)["gpu-pascal"] == "4", "re-registration")


def test_node_not_ready_and_unknown_node(state_dir, emulator, kubeconfig):
    faults.set_fault(state_dir, "cpu-only", "node-notready")
    try:
        wait_for(lambda: not _ready(emulator.core, "cpu-only"), "cpu-only to be NotReady")
        found = k8s_run(kubeconfig, names=("cpu-only", "gpu-ghost"))
    finally:
        faults.clear_fault(state_dir, "cpu-only", "node-notready")
    assert found[("cpu-only", "k8s.node-ready")].status == FAIL
    ghost = found[("gpu-ghost", "k8s.node-ready")]
    assert ghost.status == FAIL and "no Kubernetes node named gpu-ghost" in ghost.message


def test_a_node_that_is_not_ready_gets_no_smoke_pods(state_dir, emulator, kubeconfig):
    faults.set_fault(state_dir, "gpu-kepler", "node-notready")
    try:
        wait_for(lambda: not _ready(emulator.core, "gpu-kepler"), "gpu-kepler to be NotReady")
        findings = runner.run(lab_nodes(("gpu-kepler",)), runner.Options(
            only=("k8s.node-ready", "pods"), kubeconfig=kubeconfig, timeout=5), probe=probe)
    finally:
        faults.clear_fault(state_dir, "gpu-kepler", "node-notready")
    found = {f.check: f for f in findings}
    assert found["k8s.node-ready"].status == FAIL
    for kind in ("gpu-count", "isolation", "batch-job"):
        finding = found[f"pods.{kind}"]
        assert finding.status == SKIP, finding
        assert "the node is not Ready (see k8s.node-ready)" in finding.message
    wait_for(lambda: _ready(emulator.core, "gpu-kepler"), "gpu-kepler to be Ready again")


def _ready(core, name: str) -> bool:
    node = core.read_node(name)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def test_labels_drift_is_a_failure_that_shows_the_diff(emulator, kubeconfig):
    """k8s.labels compares the node's labels with gpuprov.nvidia.labels' computation from the
    probe: a node labelled as computed passes, a hand-edited label fails with the diff."""
    for name in ("gpu-pascal", "gpu-hopper"):
        expected = labels.compute_labels(probe(lab_nodes((name,))[0], 1.0))
        emulator.core.patch_node(name, {"metadata": {"labels": expected}})
    emulator.core.patch_node("gpu-hopper", {"metadata": {"labels": {"gputype": "k80"}}})
    try:
        found = k8s_run(kubeconfig, names=("gpu-pascal", "gpu-hopper"))
    finally:
        emulator.core.patch_node("gpu-hopper", {"metadata": {"labels": {"gputype": "h100"}}})
    assert found[("gpu-pascal", "k8s.labels")].status == PASS
    drift = found[("gpu-hopper", "k8s.labels")]
    assert drift.status == FAIL and "gputype" in drift.message
    assert drift.details["diff"] == {"gputype": {"actual": "k80", "expected": "h100"}}


def test_node_checks_use_a_constant_number_of_requests(emulator, kubeconfig):
    """Two LISTs (nodes, pods) whatever the node count: 4 inventory nodes, then 4 + 30."""
    extra = [f"bulk-{i:03d}" for i in range(30)]
    for name in extra:
        emulator.core.create_node({"metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name}}, "status": {"allocatable": {GPU: "8"}}})
    counts = []
    for names in (LAB, LAB + tuple(extra)):
        before = emulator.server.requests
        found = k8s_run(kubeconfig, names=names)
        counts.append(emulator.server.requests - before)
        assert len({n for n, _ in found}) == len(names)
    assert counts == [2, 2]


@pytest.fixture
def verify_cli(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(nodes, "probe_node", probe)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n"
                         "        gpu-pascal: {}\n")

    def call(*argv):
        rc = cli.main(["verify", "-i", str(inventory), "--checks", "k8s", *argv])
        return rc, *capsys.readouterr()

    return call


def test_cli_with_kubeconfig_passes(verify_cli, kubeconfig, emulator):
    expected = labels.compute_labels(probe(lab_nodes(("gpu-pascal",))[0], 1.0))
    emulator.core.patch_node("gpu-pascal", {"metadata": {"labels": expected}})
    rc, out, err = verify_cli("--kubeconfig", kubeconfig, "--json")
    statuses = {r["check"]: r["status"] for r in json.loads(out)["results"]}
    assert rc == 0, (out, err)
    assert statuses["k8s.node-ready"] == statuses["k8s.allocatable"] == PASS


def test_unknown_context_is_exit_2(verify_cli, kubeconfig):
    rc, out, err = verify_cli("--kubeconfig", kubeconfig, "--context", "prod")
    assert rc == ExitCode.USAGE and out == ""
    assert "context 'prod' is not in" in err and "gpuprov-lab" in err
    assert len(err.strip().splitlines()) == 1


def test_unreachable_api_server_is_exit_2(verify_cli, tmp_path):
    dead = app.write_kubeconfig(tmp_path / "dead", "http://127.0.0.1:9")
    rc, out, err = verify_cli("--kubeconfig", str(dead))
    assert rc == ExitCode.USAGE and out == ""
    assert "Kubernetes API at http://127.0.0.1:9 unreachable" in err
    assert len(err.strip().splitlines()) == 1


def test_no_kubeconfig_anywhere_skips_the_cluster_checks(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cluster.find_kubeconfig(None, None) is None
    with pytest.raises(GpuprovError, match="k8s_kubeconfig"):
        cluster.find_kubeconfig(None, str(tmp_path / "gone"))
    findings = runner.run(lab_nodes(("gpu-pascal",)), runner.Options(only=("k8s",)),
                          probe=probe)
    assert {f.status for f in findings} == {SKIP}
    assert "pass --kubeconfig" in findings[0].message
