"""verify's claim smoke (gpuprov.verify.pods.DraNodeRunner) on the in-process emulator with the
lab's DRA side: gpuprov's DaemonSet of NVIDIA's DRA driver on gpu-hopper only (its simulated
kubelet plugin publishes the node's slice from the lab's NVML), the claim controller, the
scheduler's allocation and the kubelet's prepare / unprepare with the per-claim CDI spec. The
checks judge what the pods printed (`nvidia-smi -L` of the FakeBackend) against the claims'
allocations, mapped through the slice verify read by field selector."""

from __future__ import annotations

import dataclasses
import os
import stat

import pytest
from kubernetes import client
from test_verify_pods import FAKE_NVIDIA_SMI

from gpuprov import manifests
from gpuprov.lab.kube import backend as backend_module
from gpuprov.lab.kube.registry import NODES, R
from gpuprov.lab.kube.testing import default_lab_backend, running_emulator, wait_for
from gpuprov.nvidia import mig
from gpuprov.verify import (
    cluster,
    pods,
    runner,  # noqa: F401 (registers every phase's checks)
)
from gpuprov.verify.facts import PodFacts
from gpuprov.verify.findings import CHECKS, PASS
from gpuprov.verify.inventory import Node

NODE = "gpu-hopper"
KINDS = ("claim-count", "claim-isolation", "claim-selector", "claim-unavailable")


@pytest.fixture(scope="module")
def dra_lab(tmp_path_factory):
    yield from _dra_lab(tmp_path_factory, default_lab_backend())


def _dra_lab(tmp_path_factory, backend):
    bindir = tmp_path_factory.mktemp("bin")
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
        with running_emulator(backend, tmp_path_factory.mktemp("state")) as emulator:
            reg = emulator.registry
            wait_for(lambda: reg.find(NODES, "", NODE), "the node")
            current = reg.find(NODES, "", NODE)
            labels = {**current["metadata"].get("labels", {}),
                      "nvidia.com/gpu.deploy.dra-driver": "true"}
            reg.replace(NODES, "", NODE, {**current, "metadata": {**current["metadata"],
                                                                   "labels": labels}})
            for obj in manifests.dra_driver():
                if obj["kind"] in R:  # not the admission policy: the emulator has none
                    reg.create(R[obj["kind"]], obj["metadata"].get("namespace", ""), obj)
            wait_for(lambda: reg.list(R["ResourceSlice"])[0], "gpu-hopper's slice")
            cfg = client.Configuration()
            cfg.host = emulator.url
            with client.ApiClient(cfg) as api:
                yield backend, api


def assert_claim_checks_pass(runs) -> None:
    """Every claim check, judged from the runs on NODE, passes."""
    facts = PodFacts(Node(name=NODE, target=None, gpu_expected=True, gpu_allocation="dra"),
                     {"pci": [{}]}, runs)
    found = {c: CHECKS[c].finding(NODE, CHECKS[c].func(facts))
             for c in ("dra.claim-count", "dra.claim-isolation", "dra.claim-selector",
                       "dra.claim-unavailable", "dra.claim-cdi")}
    assert {c: f.status for c, f in found.items()} == dict.fromkeys(found, PASS), {
        c: f.message for c, f in found.items()}


def claims_on(run) -> list:
    return [r.node for r in run.records]


def test_the_claim_smoke_passes_on_the_lab_dra_node(dra_lab):
    backend, api = dra_lab
    view = cluster.snapshot(api, (NODE,))
    slices = view.slices_by_node[NODE]
    assert len(slices) == 1 and len(slices[0]["spec"]["devices"]) == 8
    product = slices[0]["spec"]["devices"][0]["attributes"]["productName"]["string"]
    target = pods.DraTarget(NODE, slices, product,
                            lambda path: backend.claim_cdi_spec_exists(NODE, path))
    runs = pods.run(api, [target], KINDS, 60, 4)[NODE]
    assert_claim_checks_pass(runs)
    count = runs["claim-count"].records[0]
    assert len(count.uuids) == 8 and sorted(count.pod.uuids) == sorted(count.uuids)
    assert (count.cdi_while_running, count.cdi_after) == (True, False)
    isolated = runs["claim-isolation"].records
    assert len(isolated) == 8 and len({r.pod.uuids for r in isolated}) == 8
    assert claims_on(runs["claim-selector"]) == [NODE]
    left = [n.metadata.name for n in client.CoreV1Api(api).list_namespace().items
            if n.metadata.name.startswith(pods.NAMESPACE_PREFIX)]
    assert left == []


def test_the_pod_phase_runs_claims_on_the_dra_node(dra_lab):
    """The runner's pod phase: the claim smoke on the DRA node (its slice from the cluster
    view), the device plugin's GPU smoke skipped there with the reason."""
    from gpuprov.verify.nodes import ProbeResult
    from gpuprov.verify.runner import Options, pod_findings, select_checks

    _, api = dra_lab
    view = cluster.snapshot(api, (NODE,))
    product = view.slices_by_node[NODE][0]["spec"]["devices"][0]["attributes"][
        "productName"]["string"]
    report = {"pci": [{}], "nvml": {"gpus": [{"name": product, "error": None}]}}
    node = Node(name=NODE, target=None, gpu_expected=True, gpu_allocation="dra")
    findings = pod_findings([ProbeResult(node, report)], view,
                            select_checks(["pods.gpu-count", "dra.claim-selector",
                                           "dra.claim-unavailable"]), Options(timeout=60), api)
    got = {f.check: (f.status, f.message) for f in findings}
    assert got["dra.claim-selector"][0] == PASS, got
    assert got["dra.claim-unavailable"][0] == PASS, got
    assert got["pods.gpu-count"] == ("skip", "gpu_allocation dra: GPUs are claimed, not "
                                     "requested (see dra.claim-*)")


# gpu-hopper with its GPUs partitioned: two GPUs, each three 1g.10gb MIG devices at the first
# placements H100 allows (gpuprov.nvidia.mig, from nvidia-smi mig -lgip).
H100 = mig.model_of(0x2330)
ONE_G = H100.profile("1g.10gb")


def _partitioned(gpu, n: int):
    info = backend_module.MigProfileInfo(ONE_G.nvml_id, H100.profile_multiprocessors(ONE_G),
                                         1, 1, 0, 1, 0, 9856)
    devices = tuple(backend_module.MigDevice(f"MIG-{gpu.uuid[4:]}-{i}", ONE_G.name, i,
                                             (ONE_G.starts[i], ONE_G.size), info)
                    for i in range(n))
    return dataclasses.replace(gpu, mig_enabled=True, mig_devices=devices)


@pytest.fixture(scope="module")
def mig_dra_lab(tmp_path_factory):
    backend = default_lab_backend()
    hopper = backend.node_map[NODE]
    hopper.gpus = [_partitioned(g, 3) for g in hopper.gpus[:2]]
    yield from _dra_lab(tmp_path_factory, backend)


def test_on_a_partitioned_node_the_claims_ask_for_mig_devices(mig_dra_lab):
    """A DRA node whose GPUs are all in MIG mode publishes MIG devices only: the claim smoke
    asks the mig.nvidia.com class for them, and each pod sees exactly its claim's."""
    backend, api = mig_dra_lab
    view = cluster.snapshot(api, (NODE,))
    slices = view.slices_by_node[NODE]
    product = slices[0]["spec"]["devices"][0]["attributes"]["productName"]["string"]
    target = pods.DraTarget(NODE, slices, product,
                            lambda path: backend.claim_cdi_spec_exists(NODE, path))
    assert (target.device_type, target.device_class, target.gpus) == ("mig", "mig.nvidia.com", 6)
    runs = pods.run(api, [target], KINDS, 60, 4)[NODE]
    assert_claim_checks_pass(runs)
    migs = {d.uuid for g in backend.node_map[NODE].gpus for d in g.mig_devices}
    count = runs["claim-count"].records[0]
    assert set(count.uuids) == migs and sorted(count.pod.uuids) == sorted(count.uuids)
    isolated = runs["claim-isolation"].records
    assert len(isolated) == 6 and {u for r in isolated for u in r.pod.uuids} == migs
    facts = PodFacts(Node(name=NODE, target=None, gpu_expected=True, gpu_allocation="dra"),
                     {"pci": [{}]}, runs)
    assert CHECKS["dra.claim-count"].func(facts).message == (
        "the pod sees exactly its 6 claimed MIG device(s)")
    assert CHECKS["dra.claim-isolation"].func(facts).message == (
        "6 pods, 6 distinct MIG devices, each its claim's")
