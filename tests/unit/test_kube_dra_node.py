"""The lab's DRA node side on the in-process emulator: the simulated NVIDIA DRA kubelet plugin
(gpuprov/lab/kube/draplugin.py) run from gpuprov's own DaemonSet of the v0.4.1 driver
(manifests.dra_driver()), the ResourceSlice it publishes from each lab GPU model's NVML
answers, and the kubelet's prepare / unprepare: a claim pod sees exactly its allocated GPUs,
the per-claim CDI spec exists while it runs and is gone after.

The expected attributes are written from NVIDIA's files, not from the code under test:
kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1 cmd/gpu-kubelet-plugin/deviceinfo.go
(`gpu-<minor>`, type/uuid/productName/brand/architecture, versions as semver) and go-nvlib's
names (GetBrandAsString, GetArchitectureAsString), against the lab's GPU models
(gpuprov/lab/profiles.py, whose values are the boards' published nvidia-smi output)."""

from __future__ import annotations

import os
import stat

import pytest
from test_verify_pods import FAKE_NVIDIA_SMI

from gpuprov import manifests
from gpuprov.lab import profiles
from gpuprov.lab.kube import draplugin, faults
from gpuprov.lab.kube.registry import NODES, PODS, R
from gpuprov.lab.kube.testing import default_lab_backend, fake_uuids, running_emulator, wait_for

CLAIMS, SLICES = R["ResourceClaim"], R["ResourceSlice"]
DRA_NS = "nvidia-dra-driver-gpu"
GIB = 1024 ** 3

# (node, minor 0's product name, brand, architecture, compute capability, memory) as NVIDIA
# publishes them for the boards the lab simulates; the versions are the nodes' drivers.
EXPECTED = {
    "gpu-kepler": ("Tesla K80", "Tesla", "Kepler", "3.7.0", "470.256.2", "11.4.0"),
    "gpu-pascal": ("Tesla P100-PCIE-16GB", "Tesla", "Pascal", "6.0.0", "535.261.3", "12.2.0"),
    "gpu-hopper": ("NVIDIA H100 80GB HBM3", "Nvidia", "Hopper", "9.0.0", "550.163.1",
                   "12.4.0"),
}


@pytest.fixture(scope="module")
def bindir(tmp_path_factory):
    bindir = tmp_path_factory.mktemp("bin")
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    return bindir


@pytest.fixture(scope="module")
def emu(bindir, tmp_path_factory):
    backend = default_lab_backend()
    state_dir = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
        with running_emulator(backend, state_dir) as emulator:
            reg = emulator.registry
            wait_for(lambda: len(reg.list(NODES)[0]) == 4, "the nodes")
            for node in EXPECTED:
                current = reg.find(NODES, "", node)
                labels = {**current["metadata"].get("labels", {}),
                          "nvidia.com/gpu.deploy.dra-driver": "true"}
                reg.replace(NODES, "", node, {**current, "metadata": {
                    **current["metadata"], "labels": labels}})
            for obj in manifests.dra_driver():
                if obj["kind"] in R:  # not the admission policy: the emulator has none
                    reg.create(R[obj["kind"]], obj["metadata"].get("namespace", ""), obj)
            wait_for(lambda: len(reg.list(SLICES)[0]) == 3, "a slice per DRA node")
            emulator.backend = backend
            emulator.state_dir = state_dir
            yield emulator


def node_slice(reg, node: str) -> dict:
    found = reg.list(SLICES, field_selector=f"spec.nodeName={node}")[0]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("node", sorted(EXPECTED))
def test_the_published_slice_is_the_nodes_nvml_in_nvidias_names(emu, node):
    item = node_slice(emu.registry, node)
    spec = item["spec"]
    profile = profiles.NODE_PROFILES[node]
    gpus = profiles.expected_gpus(node, profile)
    assert spec["driver"] == "gpu.nvidia.com"
    assert spec["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
    assert item["metadata"]["name"].startswith(f"{node}-gpu.nvidia.com-")
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{g.minor_number}" for g in gpus]
    product, brand, arch, cc, driver, cuda = EXPECTED[node]
    for device, gpu, uuid in zip(spec["devices"], gpus, fake_uuids(node, len(gpus)),
                                 strict=True):
        assert device["attributes"] == {
            "type": {"string": "gpu"}, "uuid": {"string": uuid},
            "productName": {"string": product}, "brand": {"string": brand},
            "architecture": {"string": arch}, "cudaComputeCapability": {"version": cc},
            "driverVersion": {"version": driver}, "cudaDriverVersion": {"version": cuda},
            "resource.kubernetes.io/pciBusID": {"string": gpu.sysfs_address}}
        # No index or minor attribute since v25.8.0 (deviceinfo.go).
        value = device["capacity"]["memory"]["value"]
        assert value.endswith(("Mi", "Gi"))
        scale = GIB if value.endswith("Gi") else 1024 ** 2
        assert int(value[:-2]) * scale == gpu.memory_total


def test_hopper_memory_is_the_boards_bytes(emu):
    # 81559 MiB: what nvidia-smi shows of an H100 SXM5 80GB (profiles.py sources).
    devices = node_slice(emu.registry, "gpu-hopper")["spec"]["devices"]
    assert {d["capacity"]["memory"]["value"] for d in devices} == {"81559Mi"}


def _template(reg, ns: str, name: str, count: int, selector: str = "") -> None:
    exactly = {"deviceClassName": "gpu.nvidia.com", "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    reg.create(R["ResourceClaimTemplate"], ns, {"metadata": {"name": name}, "spec": {
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}}})


def _pod(reg, ns: str, name: str, template: str) -> dict:
    return reg.create(PODS, ns, {"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never",
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
        "containers": [{"name": "smi", "image": "busybox",
                        "command": ["sh", "-c", "nvidia-smi -L; sleep 30"],
                        "resources": {"claims": [{"name": "gpus"}]}}]}})


def _claim_of(reg, ns: str, pod: str) -> dict | None:
    p = reg.find(PODS, ns, pod) or {}
    statuses = p.get("status", {}).get("resourceClaimStatuses") or []
    return reg.find(CLAIMS, ns, statuses[0]["resourceClaimName"]) if statuses else None


def _running(reg, ns: str, pod: str) -> dict | None:
    p = reg.find(PODS, ns, pod)
    return p if p and p.get("status", {}).get("phase") == "Running" else None


def test_claim_pod_sees_exactly_its_gpus_and_the_spec_lives_with_it(emu):
    reg, backend = emu.registry, emu.backend
    _template(reg, "default", "two-hopper", 2,
              "device.attributes['gpu.nvidia.com'].architecture == 'Hopper'")
    _pod(reg, "default", "two", "two-hopper")
    wait_for(lambda: _running(reg, "default", "two"), "the claim pod to run")
    claim = _claim_of(reg, "default", "two")
    uid = claim["metadata"]["uid"]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["pool"] for r in results} == {"gpu-hopper"}
    minors = sorted(int(r["device"].removeprefix("gpu-")) for r in results)
    uuids = fake_uuids("gpu-hopper", 8)
    want = [uuids[m] for m in minors]  # the lab's minors are its NVML indices
    out = wait_for(lambda: "GPU 1" in (emu.cluster.pod_logs(
        reg.find(PODS, "default", "two"), "smi", {})[0]) and emu.cluster.pod_logs(
        reg.find(PODS, "default", "two"), "smi", {})[0], "nvidia-smi -L")
    assert [line.split("UUID: ")[1].rstrip(")") for line in out.splitlines()] == want
    path = f"/var/run/cdi/k8s.gpu.nvidia.com-claim_{uid}.yaml"
    assert backend.claim_cdi_spec_exists("gpu-hopper", path)
    started = [s for s in backend.started if s[0] == "gpu-hopper" and "nvidia-smi" in s[1][-1]]
    assert started
    reg.delete(PODS, "default", "two", {"gracePeriodSeconds": 0})
    wait_for(lambda: not backend.claim_cdi_spec_exists("gpu-hopper", path),
             "the claim's spec to be removed (unprepare)")
    wait_for(lambda: reg.find(CLAIMS, "default", claim["metadata"]["name"]) is None,
             "the claim to go with its pod")


def test_the_kubelet_hands_the_claims_cdi_ids_to_the_runtime(emu):
    reg, backend = emu.registry, emu.backend
    _template(reg, "default", "one-pascal", 1,
              "device.attributes['gpu.nvidia.com'].productName == 'Tesla P100-PCIE-16GB'")
    _pod(reg, "default", "one", "one-pascal")
    wait_for(lambda: _running(reg, "default", "one"), "the claim pod to run")
    claim = _claim_of(reg, "default", "one")
    device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    uid = claim["metadata"]["uid"]
    env = next(s[2] for s in reversed(backend.started) if s[2].get("HOSTNAME") == "one")
    assert env["GPUPROV_SIM_CONTAINER_GPUS"] == fake_uuids("gpu-pascal", 4)[
        int(device.removeprefix("gpu-"))]
    assert backend.claim_specs.specs[
        ("gpu-pascal", draplugin.spec_path(uid))] == {
        f"k8s.gpu.nvidia.com/claim={uid}-{device}": env["GPUPROV_SIM_CONTAINER_GPUS"]}
    reg.delete(PODS, "default", "one", {"gracePeriodSeconds": 0})


def test_prepare_waits_for_the_plugin_and_slices_go_with_it(emu):
    """The plugin's pod gone: the kubelet deletes the node's slice; a pod bound there with an
    allocated claim then cannot be prepared (FailedPrepareDynamicResources) and waits."""
    reg = emu.registry
    pods = reg.list(PODS, DRA_NS, field_selector="spec.nodeName=gpu-kepler")[0]
    assert pods, "the DaemonSet's pod on gpu-kepler"
    # Take gpu-kepler out of the DaemonSet's nodes: its pod goes, its slice with it.
    current = reg.find(NODES, "", "gpu-kepler")
    labels = {**current["metadata"]["labels"], "nvidia.com/gpu.deploy.dra-driver": "false"}
    reg.replace(NODES, "", "gpu-kepler", {**current, "metadata": {
        **current["metadata"], "labels": labels}})
    wait_for(lambda: not reg.list(SLICES, field_selector="spec.nodeName=gpu-kepler")[0],
             "gpu-kepler's slice to go with its plugin")
    assert len(reg.list(SLICES)[0]) == 2


PASCAL_ONE = "device.attributes['gpu.nvidia.com'].productName == 'Tesla P100-PCIE-16GB'"


def _events(reg, pod: str, reason: str) -> list[str]:
    return [e["message"] for e in reg.list(R["Event"], "default")[0]
            if e["involvedObject"]["name"] == pod and e["reason"] == reason]


@pytest.mark.parametrize(("fault", "words"), [
    ("dra-plugin-unregistered", "DRA driver gpu.nvidia.com is not registered"),
    ("dra-prepare-fails", "prepare devices failed"),
])
def test_a_failed_prepare_keeps_the_pod_pending_with_the_kubelets_event(emu, fault, words):
    reg = emu.registry
    name = f"pf-{fault.split('-')[1]}"
    if reg.find(R["ResourceClaimTemplate"], "default", "one-p100") is None:
        _template(reg, "default", "one-p100", 1, PASCAL_ONE)
    faults.set_fault(emu.state_dir, "gpu-pascal", fault)
    try:
        _pod(reg, "default", name, "one-p100")
        message = wait_for(lambda: _events(reg, name, "FailedPrepareDynamicResources"),
                           "the kubelet's event")[0]
        claim = _claim_of(reg, "default", name)
        assert message == (f"Failed to prepare dynamic resources: NodePrepareResources failed "
                           f"for ResourceClaim {claim['metadata']['name']}: "
                           f"{words}" + ("" if fault != "dra-prepare-fails" else
                                         ": lab fault dra-prepare-fails"))
        pod = reg.find(PODS, "default", name)
        assert pod["spec"]["nodeName"] == "gpu-pascal" and pod["status"]["phase"] == "Pending"
        path = draplugin.spec_path(claim["metadata"]["uid"])
        assert not emu.backend.claim_cdi_spec_exists("gpu-pascal", path)
    finally:
        faults.clear_fault(emu.state_dir, "gpu-pascal", fault)
    # Retried at every pass: once the fault is gone the pod starts.
    wait_for(lambda: _running(reg, "default", name), "the pod to start after the fault")
    reg.delete(PODS, "default", name, {"gracePeriodSeconds": 0})


def test_a_cdi_spec_without_device_nodes_starts_the_pod_without_a_gpu(emu):
    reg = emu.registry
    if reg.find(R["ResourceClaimTemplate"], "default", "one-p100") is None:
        _template(reg, "default", "one-p100", 1, PASCAL_ONE)
    faults.set_fault(emu.state_dir, "gpu-pascal", "dra-cdi-spec-empty")
    try:
        _pod(reg, "default", "empty-spec", "one-p100")
        wait_for(lambda: _running(reg, "default", "empty-spec"), "the pod to run")
        out = wait_for(lambda: emu.cluster.pod_logs(
            reg.find(PODS, "default", "empty-spec"), "smi", {})[0], "nvidia-smi -L")
        assert out.strip() == "No devices were found"
    finally:
        faults.clear_fault(emu.state_dir, "gpu-pascal", "dra-cdi-spec-empty")
    reg.delete(PODS, "default", "empty-spec", {"gracePeriodSeconds": 0})


# -- the same slice from the lab's simulated NVML (gpuprov/lab/nvml/simnvml.c) ---------------

@pytest.fixture(scope="module")
def simnvml_lab(tmp_path_factory):
    """A lab directory as LabBackend reads it, with each GPU node's simulated NVML state."""
    import json

    from gpuprov.lab import simhw

    lab_dir = tmp_path_factory.mktemp("lab")
    simhw.build_nvml_library(lab_dir / "nvml")
    (lab_dir / "lab.json").write_text(json.dumps(
        {"nodes": [{"name": n, "container": f"lab-{n}"} for n in EXPECTED]}))
    for node in EXPECTED:
        simhw.write_node_state(lab_dir / "nodes" / node, node, profiles.NODE_PROFILES[node])
    return lab_dir


@pytest.mark.parametrize("node", sorted(EXPECTED))
def test_the_slice_from_the_simulated_nvml_of_each_lab_gpu_model(simnvml_lab, node):
    """What LabBackend reads through the simulated library (the calls of nvlib.go
    getGpuInfo) gives the slice NVIDIA's plugin would publish for the board."""
    from gpuprov.lab.kube.backend import LabBackend

    gpus = LabBackend(simnvml_lab).gpus(node)
    expected = profiles.expected_gpus(node, profiles.NODE_PROFILES[node])
    devices = draplugin.node_slice(node, gpus)["spec"]["devices"]
    product, brand, arch, cc, driver, cuda = EXPECTED[node]
    assert [d["name"] for d in devices] == [f"gpu-{g.minor_number}" for g in expected]
    for device, gpu in zip(devices, expected, strict=True):
        assert device["attributes"] == {
            "type": {"string": "gpu"}, "uuid": {"string": gpu.uuid},
            "productName": {"string": product}, "brand": {"string": brand},
            "architecture": {"string": arch}, "cudaComputeCapability": {"version": cc},
            "driverVersion": {"version": driver}, "cudaDriverVersion": {"version": cuda},
            "resource.kubernetes.io/pciBusID": {"string": gpu.sysfs_address}}
        assert device["capacity"] == {"memory": {"value": draplugin.binary_si(
            gpu.memory_total)}}


def test_values_as_nvidias_plugin_writes_them():
    # A real slice (dra-driver-nvidia-gpu#719) shows driver 580.95.05 as 580.95.5.
    assert draplugin.semver("580.95.05") == "580.95.5"
    assert draplugin.semver("9.0") == "9.0.0"
    assert draplugin.binary_si(80 * GIB) == "80Gi"
    assert draplugin.binary_si(81559 * 1024 ** 2) == "81559Mi"
    assert draplugin.binary_si(1000) == "1000"
    # go-nvlib GetPCIBusID: NVML's 8-digit domain cut to 4, lower case.
    assert draplugin.pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert draplugin.cdi_id("u1", "gpu-3") == "k8s.gpu.nvidia.com/claim=u1-gpu-3"
    assert draplugin.spec_path("u1") == "/var/run/cdi/k8s.gpu.nvidia.com-claim_u1.yaml"


def test_each_container_gets_the_cdi_ids_of_the_requests_it_names():
    from gpuprov.lab.kube.kubelet import _claim_cdi_ids

    claimed = {"gpus": [("train", "k/claim=a-gpu-0"), ("train", "k/claim=a-gpu-1"),
                        ("eval/small", "k/claim=a-gpu-2")],
               "other": [("one", "k/claim=b-gpu-3")]}
    assert _claim_cdi_ids({"resources": {"claims": [{"name": "gpus"}]}}, claimed) == (
        "k/claim=a-gpu-0", "k/claim=a-gpu-1", "k/claim=a-gpu-2")
    assert _claim_cdi_ids({"resources": {"claims": [{"name": "gpus", "request": "train"}]}},
                          claimed) == ("k/claim=a-gpu-0", "k/claim=a-gpu-1")
    # A firstAvailable result "<request>/<subrequest>" counts for its request.
    assert _claim_cdi_ids({"resources": {"claims": [{"name": "gpus", "request": "eval"}]}},
                          claimed) == ("k/claim=a-gpu-2",)
    assert _claim_cdi_ids({"name": "no-claims"}, claimed) == ()


def test_the_driver_installed_in_the_node_is_the_one_published(simnvml_lab, tmp_path,
                                                               monkeypatch):
    """NVML in the node reports the driver package installed there (simnvml.c
    installed_driver_version); LabBackend reads it from the host, through the node's root,
    so that the slice says what the plugin in the node would read after a driver install."""
    from gpuprov.lab.kube.backend import LabBackend

    backend = LabBackend(simnvml_lab)
    root = tmp_path / "root"
    monkeypatch.setattr(backend, "_node_root", lambda node: str(root))
    before = backend.gpus("gpu-hopper")
    assert {g.facts.driver_version for g in before} == {"550.163.01"}  # the profile's
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so.580.178.04").write_text("")
    status = root / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_text("Package: libnvidia-ml1\n")  # a package install touches dpkg's status
    after = backend.gpus("gpu-hopper")
    assert {g.facts.driver_version for g in after} == {"580.178.04"}
    devices = draplugin.node_slice("gpu-hopper", after)["spec"]["devices"]
    assert {d["attributes"]["driverVersion"]["version"] for d in devices} == {"580.178.4"}
    assert {d["attributes"]["cudaDriverVersion"]["version"] for d in devices} == {"13.0.0"}
