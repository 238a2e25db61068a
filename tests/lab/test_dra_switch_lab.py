"""gpu_allocation per node on the session lab (issue 35): a node asked for NVIDIA's DRA driver
that cannot have it is refused at the preflight, with the reason, and nothing changes on any
node or in the cluster.

gpu-pascal runs Debian 12's containerd 1.6 (no CDI) and R535 (older than R565): both reasons
must be named. The refusal is the preflight's, before the first change, so the test needs the
lab, not the converged lab: it holds whether it runs before or after site.yml, and leaves the
lab as it found it (the host_vars file it writes is removed).

gpu-hopper (Debian 13, containerd 2.x, R580) is switched to DRA by site.yml on the converged
lab, a second run changes nothing, and it is switched back, a pod holding a gpu.nvidia.com claim
evicted first, to 8 nvidia.com/gpu. On DRA, the MIG stage partitions it: the claim pod is
evicted, the DRA plugin restarted, and its slice and verify's claims are MIG devices. The lab's
DRA plugin is the simulated one
(gpuprov/lab/kube/draplugin.py, EMULATION.md). The module's teardown leaves gpu-hopper on the
device plugin with 8 GPUs, as the session lab's other tests expect. Between the switches,
`gpuprov verify` passes on every node, the DRA checks and claim smoke where DRA runs and the
device plugin's where it runs.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time

import pytest
import yaml
from conftest import api_objects, kube_api, node_state, playbook_failures
from kubernetes import client

from gpuprov.nvidia import labels

NODE = "gpu-pascal"
HOPPER = "gpu-hopper"
NAMESPACE = "default"
# site.yml's own verify stage is left out of both runs: the module runs `gpuprov verify` once,
# as JSON, after them (the same checks, one run instead of two, and a report it can read).
SITE = ("site.yml", "--skip-tags", "verify")


def _cluster(lab) -> dict:
    """What a run could change in the cluster: DaemonSets, RuntimeClasses, ConfigMaps and the
    nodes' labels (api_objects), each node's cordon, the DRA driver's namespace and the
    DeviceClasses."""
    api = kube_api(lab)
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    return {
        "objects": api_objects(lab),
        "cordoned": sorted(n.metadata.name for n in core.list_node().items
                           if n.spec.unschedulable),
        "namespaces": sorted(n.metadata.name for n in core.list_namespace().items),
        "deviceclasses": sorted(d["metadata"]["name"] for d in custom.list_cluster_custom_object(
            "resource.k8s.io", "v1", "deviceclasses")["items"]),
    }


@pytest.fixture(scope="module")
def refused(lab, playbook):
    """site.yml with a host_vars file for gpu-pascal saying gpu_allocation: dra (as an admin
    writes it; the other nodes keep the default), removed right after the run (an earlier
    file is put back), with what the nodes and the cluster held before and after."""
    path = lab.inventory_path.parent / "host_vars" / f"{NODE}.yml"
    path.parent.mkdir(exist_ok=True)
    before_file = path.read_text() if path.exists() else None
    path.write_text((before_file or "") + "\ngpu_allocation: dra\n")
    try:
        nodes, cluster = node_state(lab), _cluster(lab)
        rc, doc = playbook("site.yml")
        return rc, doc, (nodes, cluster), (node_state(lab), _cluster(lab))
    finally:
        if before_file is None:
            path.unlink()
        else:
            path.write_text(before_file)


def test_a_containerd_1_6_node_asked_for_dra_is_refused_with_the_reasons(refused):
    rc, doc, _, _ = refused
    assert rc != 0
    failures = playbook_failures(doc)
    line = next(line for line in failures.splitlines()
                if "gpu_allocation is dra" in line)
    # One line: the node, what it asked for, each reason, the source, and what to do.
    assert f"{NODE}: gpu_allocation is dra, but " in line
    assert "containerd 1.6 has no CDI (containerd >= 1.7 is needed)" in line
    assert "driver branch R535 is older than R565" in line
    assert "kubernetes-sigs/dra-driver-nvidia-gpu docs/prerequisites.md" in line
    assert line.endswith("set gpu_allocation: device-plugin for this node")


def test_the_refusal_stops_every_host_at_the_preflight(refused):
    _, doc, _, _ = refused
    # The preflight's play is the only one that ran: no later stage started on any host.
    assert [play["play"]["name"] for play in doc["plays"]] == [
        "Preflight - supported OS, GPUs on PCI, driver branch per node"]
    stats = doc["stats"]
    assert all(s["changed"] == 0 for s in stats.values()), stats
    # The nodes that could have DRA, or did not ask for it, stop too (any_errors_fatal).
    assert {host for host, s in stats.items() if s["failures"]} == {NODE}


def test_nothing_changed_on_any_node_or_in_the_cluster(refused):
    _, _, before, after = refused
    nodes_before, cluster_before = before
    nodes_after, cluster_after = after
    assert nodes_after == nodes_before
    # No label, no cordon, no DRA object.
    assert cluster_after == cluster_before
    assert "nvidia-dra-driver-gpu" not in cluster_after["namespaces"]
    assert cluster_after["deviceclasses"] == []


# -- gpu-hopper to DRA and back ----------------------------------------------------------------


def _hopper(lab) -> dict:
    return client.CoreV1Api(kube_api(lab)).read_node(HOPPER).to_dict()


def _slices(lab) -> list[dict]:
    return client.CustomObjectsApi(kube_api(lab)).list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices")["items"]


def _deploy_labels(node: dict) -> dict:
    return {k: v for k, v in (node["metadata"]["labels"] or {}).items()
            if k in (labels.DEPLOY_DEVICE_PLUGIN, labels.DEPLOY_DRA_DRIVER)}


def _asks_for_dra(lab, on: bool) -> None:
    path = lab.inventory_path.parent / "host_vars" / f"{HOPPER}.yml"
    if on:
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump({"gpu_allocation": "dra"}))
    else:
        path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def hopper_on_dra(site_run, lab, playbook):
    """site.yml with gpu_allocation: dra for gpu-hopper, twice; after the module, gpu-hopper is
    back on the device plugin (switched back by the stage alone where a test did not)."""
    rc, doc = site_run
    assert rc == 0, "the converged lab is needed: " + playbook_failures(doc)
    _asks_for_dra(lab, True)
    first = playbook(*SITE)
    # The second run on the switched node only: the first ran on every node (the others'
    # changed=0 there is asserted), and the suite's minutes are counted (tests/timings.py).
    second = playbook(*SITE, "--limit", HOPPER)
    yield lab, first, second
    _asks_for_dra(lab, False)
    api = kube_api(lab)
    with contextlib.suppress(client.ApiException):
        client.CoreV1Api(api).delete_namespaced_pod("claim-holder", NAMESPACE)
    with contextlib.suppress(client.ApiException):
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            "resource.k8s.io", "v1", NAMESPACE, "resourceclaimtemplates", "one-gpu")
    node = _hopper(lab)
    if _deploy_labels(node) or node["spec"].get("unschedulable"):
        rc, doc = playbook("playbooks/dra_driver.yml")
        assert rc == 0, playbook_failures(doc)


def test_site_yml_switches_gpu_hopper_to_dra_and_the_others_stay(hopper_on_dra):
    lab, (rc, doc), _ = hopper_on_dra
    assert rc == 0, playbook_failures(doc)
    node = _hopper(lab)
    assert _deploy_labels(node) == {labels.DEPLOY_DEVICE_PLUGIN: "false",
                                    labels.DEPLOY_DRA_DRIVER: "true"}
    assert not node["spec"].get("unschedulable")
    assert str(node["status"]["allocatable"].get("nvidia.com/gpu", "0")) == "0"
    mine = [s for s in _slices(lab) if s["spec"]["nodeName"] == HOPPER]
    assert [s["spec"]["driver"] for s in mine] == ["gpu.nvidia.com"]
    assert len(mine[0]["spec"]["devices"]) == 8
    # On the other nodes nothing changed but the cluster's DRA objects, created once from the
    # controller (a run_once task, reported under the play's first host).
    others = {(host, task["task"]["name"]) for play in doc["plays"] for task in play["tasks"]
              for host, result in task["hosts"].items()
              if host != HOPPER and result.get("changed")}
    assert all(name.endswith("Apply the DRA driver's namespace, RBAC, DaemonSet and "
                             "DeviceClasses") for _, name in others), others
    core = client.CoreV1Api(kube_api(lab))
    for other in ("gpu-kepler", "gpu-pascal"):
        n = core.read_node(other).to_dict()
        assert _deploy_labels(n) == {}, other
        assert int(n["status"]["allocatable"]["nvidia.com/gpu"]) > 0, other
    classes = client.CustomObjectsApi(kube_api(lab)).list_cluster_custom_object(
        "resource.k8s.io", "v1", "deviceclasses")["items"]
    assert sorted(c["metadata"]["name"] for c in classes) == ["gpu.nvidia.com", "mig.nvidia.com"]


def test_a_second_run_changes_nothing(hopper_on_dra):
    _, _, (rc, doc) = hopper_on_dra
    assert rc == 0, playbook_failures(doc)
    assert {h: s["changed"] for h, s in doc["stats"].items()} == dict.fromkeys(doc["stats"], 0)


def test_verify_passes_on_both_modes_each_node_checked_in_its_own(hopper_on_dra):
    lab, _, _ = hopper_on_dra
    proc = subprocess.run([sys.executable, "-m", "gpuprov", "verify", "-i",
                           str(lab.inventory_path), "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.stdout.strip(), proc.stderr
    doc = json.loads(proc.stdout)
    status = {(r["node"], r["check"]): r["status"] for r in doc["results"]}
    assert proc.returncode == 0, [r for r in doc["results"] if r["status"] == "fail"]
    dra_checks = ("dra.plugin", "dra.slice", "dra.devices-vs-nvml", "dra.runtime",
                  "dra.claim-count", "dra.claim-isolation", "dra.claim-selector",
                  "dra.claim-unavailable", "dra.claim-cdi")
    assert {c: status.get((HOPPER, c)) for c in dra_checks} == dict.fromkeys(dra_checks, "pass")
    assert status[(HOPPER, "k8s.device-plugin")] == "skip"
    assert status[(HOPPER, "pods.no-request")] == "pass"
    for other in ("gpu-kepler", "gpu-pascal"):
        assert status[(other, "k8s.device-plugin")] == "pass", other
        assert status[(other, "pods.gpu-count")] == "pass", other
        assert status[(other, "dra.slice")] == "skip", other


def _claim_pod(lab) -> None:
    """A ResourceClaimTemplate for one gpu.nvidia.com GPU and a pod holding its claim, running
    (only gpu-hopper publishes a slice: the scheduler puts it there)."""
    api = kube_api(lab)
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "resource.k8s.io", "v1", NAMESPACE, "resourceclaimtemplates",
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
             "metadata": {"name": "one-gpu"},
             "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": "gpu.nvidia.com", "count": 1}}]}}}})
    except client.ApiException as exc:
        if exc.status != 409:  # made by an earlier test of the module
            raise
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(NAMESPACE, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "claim-holder"},
        "spec": {"restartPolicy": "Never",
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                 "containers": [{"name": "main", "image": lab.require().pod_image,
                                 "command": ["sleep", "3600"],
                                 "resources": {"claims": [{"name": "gpu"}]}}]}})
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod("claim-holder", NAMESPACE)
        if pod.status.phase == "Running":
            assert pod.spec.node_name == HOPPER
            return
        time.sleep(2)
    raise AssertionError(f"the claim pod did not run in 90 s: {pod.status}")


def _mig_run(lab, playbook, layout: str) -> dict:
    rc, doc = playbook("playbooks/mig.yml", "--limit", HOPPER, "-e", f"gpu_mig_config={layout}")
    assert rc == 0, playbook_failures(doc)
    return doc


def _hopper_devices(lab, kind: str, count: int) -> list[dict]:
    """gpu-hopper's published devices once the DRA plugin's new pod has published `count` of
    type `kind` (the stage gives the plugin back; its pod then reads NVML)."""
    deadline = time.monotonic() + 90
    devices: list[dict] = []
    while time.monotonic() < deadline:
        devices = [d for s in _slices(lab) if s["spec"]["nodeName"] == HOPPER
                   for d in s["spec"]["devices"]]
        if len(devices) == count and all(
                d["attributes"]["type"]["string"] == kind for d in devices):
            return devices
        time.sleep(1)
    raise AssertionError(f"gpu-hopper publishes {len(devices)} device(s), not {count} {kind}")


def test_a_mig_layout_on_the_dra_node_republishes_its_slice_and_claims_get_mig_devices(
        hopper_on_dra, playbook):
    """The MIG stage on a DRA node: a pod holding a gpu.nvidia.com claim is evicted, the DRA
    plugin is paused and given back (it reads MIG devices once, at start: v0.4.1 nvlib.go),
    the new slice has the 56 MIG devices named as NVIDIA's plugin names them, and verify's DRA
    checks pass with claims of mig.nvidia.com. All disabled again, the 8 GPUs return."""
    lab, _, _ = hopper_on_dra
    _claim_pod(lab)
    try:
        doc = _mig_run(lab, playbook, "all-1g.10gb")
        evicted = [r.get("evicted") for play in doc["plays"] for task in play["tasks"]
                   if task["task"]["name"].endswith("Evict the node's GPU pods")
                   for r in task["hosts"].values() if not r.get("skipped")]
        assert evicted == [[f"{NAMESPACE}/claim-holder"]], evicted
        node = _hopper(lab)
        assert _deploy_labels(node) == {labels.DEPLOY_DEVICE_PLUGIN: "false",
                                        labels.DEPLOY_DRA_DRIVER: "true"}
        assert not node["spec"].get("unschedulable")
        devices = _hopper_devices(lab, "mig", 56)
        # nvidia-smi mig -lgip: 1g.10gb is GPU instance profile 19, at placements 0..6.
        starts = sorted(int(d["name"].rsplit("-", 1)[1]) for d in devices
                        if d["name"].startswith("gpu-0-mig-1g10gb-19-"))
        assert starts == list(range(7)), sorted(d["name"] for d in devices)
        proc = subprocess.run([sys.executable, "-m", "gpuprov", "verify", "-i",
                               str(lab.inventory_path), "--limit", HOPPER, "--checks", "dra",
                               "--json"], capture_output=True, text=True, timeout=600)
        assert proc.stdout.strip(), proc.stderr
        results = json.loads(proc.stdout)["results"]
        assert {r["check"]: r["status"] for r in results} == dict.fromkeys(
            ("dra.plugin", "dra.slice", "dra.devices-vs-nvml", "dra.runtime", "dra.claim-count",
             "dra.claim-isolation", "dra.claim-selector", "dra.claim-unavailable",
             "dra.claim-cdi"), "pass"), [(r["check"], r["message"]) for r in results
                                         if r["status"] != "pass"]
        count = next(r for r in results if r["check"] == "dra.claim-count")
        assert len(count["details"]["claimed"]) == 56
        assert all(u.startswith("MIG-") for u in count["details"]["seen"])
    finally:
        _mig_run(lab, playbook, "all-disabled")
        client.CoreV1Api(kube_api(lab)).patch_node(HOPPER, {"metadata": {"labels": {
            "nvidia.com/mig.config": None, "nvidia.com/mig.config.state": None}}})
    assert len(_hopper_devices(lab, "gpu", 8)) == 8


def test_back_on_the_device_plugin_the_claim_pod_is_evicted_first_and_8_gpus_return(
        hopper_on_dra, playbook):
    lab, _, _ = hopper_on_dra
    _claim_pod(lab)
    _asks_for_dra(lab, False)
    rc, doc = playbook("playbooks/dra_driver.yml")
    assert rc == 0, playbook_failures(doc)
    evicted = [r for play in doc["plays"] for task in play["tasks"]
               if task["task"]["name"].endswith("Evict the node's GPU pods")
               for r in task["hosts"].values()]
    assert [r.get("evicted") for r in evicted] == [[f"{NAMESPACE}/claim-holder"]], evicted
    core = client.CoreV1Api(kube_api(lab))
    assert "claim-holder" not in [p.metadata.name for p in
                                  core.list_namespaced_pod(NAMESPACE).items]
    node = _hopper(lab)
    assert _deploy_labels(node) == {}
    assert not node["spec"].get("unschedulable")
    assert str(node["status"]["allocatable"]["nvidia.com/gpu"]) == "8"
