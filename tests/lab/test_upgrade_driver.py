"""`playbooks/upgrade-driver.yml` on a lab of its own: a rolling driver upgrade, over real SSH
and real Debian packages (bookworm-backports 535.216.03 -> bookworm 535.261.03).

Its own lab (two GPU nodes and a CPU node), not the session's: the upgrade changes the
driver, which the other lab tests expect at the version site.yml installs.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from conftest import (
    connect,
    installed_packages,
    node_target,
    playbook_failures,
    run_playbook,
    temporary_lab,
)
from kubernetes import client, config

from gpuprov.lab.lab import Lab

pytestmark = pytest.mark.lab

GPU_NODES = ["gpu-pascal", "gpu-hopper"]
NODES = GPU_NODES + ["cpu-only"]
# Written out, not read from the role: a wrong package name in the role must fail here.
DRIVER_PACKAGES = ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1",
                   "libnvidia-cfg1"]
OLD = "535.216.03"  # bookworm-backports
NEW = "535.261.03"  # bookworm
FAILED = "gpuprov.io/upgrade-failed"
WAS_CORDONED = "gpuprov.io/upgrade-was-cordoned"


@pytest.fixture(scope="module")
def upgrade_lab(tmp_path_factory):
    yield from temporary_lab(tmp_path_factory, "upgradelab", "--nodes", ",".join(NODES))




def _core(lab: Lab) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(str(lab.kubeconfig_path)))


def _driver_versions(lab: Lab, node: str) -> dict[str, tuple[str, str]]:
    with connect(node_target(lab, node)) as conn:
        packages = installed_packages(conn)
    missing = [p for p in DRIVER_PACKAGES if p not in packages]
    assert missing == [], f"{node}: {missing} not installed"
    return {p: packages[p] for p in DRIVER_PACKAGES + ["nvidia-persistenced"]}


@pytest.fixture(scope="module")
def site_on_backports(upgrade_lab):
    """site.yml with the driver from bookworm-backports: the older 535 to upgrade from."""
    started = time.monotonic()
    rc, doc = run_playbook(upgrade_lab, "site.yml", "-e", "nvidia_driver_debian_backports=true")
    assert rc == 0, playbook_failures(doc)
    print(f"site.yml (backports) took {time.monotonic() - started:.0f} s")
    for node in GPU_NODES:
        for package, (version, want) in _driver_versions(upgrade_lab, node).items():
            if package != "nvidia-persistenced":
                assert version.startswith(OLD + "-"), (node, package, version)
            assert want == "hold", (node, package, want)
    return doc


UPGRADE = ("playbooks/upgrade-driver.yml", "-e", f"nvidia_driver_version={NEW}-1",
           "-e", "nvidia_driver_debian_backports=false")


WORKLOAD_NS = "upgrade-workload"


def _start_blocked_workload(lab: Lab) -> str:
    """A 1-GPU Job pod on gpu-pascal whose PodDisruptionBudget forbids evicting it; its uid."""
    api = config.new_client_from_config(str(lab.kubeconfig_path))
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    core.create_namespace({"metadata": {"name": WORKLOAD_NS}})
    gpu = {"nvidia.com/gpu": "1"}
    batch.create_namespaced_job(WORKLOAD_NS, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "trainer"},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"app": "trainer"}},
            "spec": {
                "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "nodeSelector": {"kubernetes.io/hostname": "gpu-pascal"},
                "containers": [{"name": "train", "image": "busybox",
                                "command": ["sleep", "3600"],
                                "resources": {"requests": gpu, "limits": gpu}}]}}}})
    client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(WORKLOAD_NS, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "trainer"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}}})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(WORKLOAD_NS, label_selector="app=trainer").items
        if pods and pods[0].status.phase == "Running":
            assert pods[0].spec.node_name == "gpu-pascal"
            return pods[0].metadata.uid
        time.sleep(1)
    raise AssertionError(f"the workload pod did not start: {pods}")


@pytest.fixture(scope="module")
def blocked_run(upgrade_lab, site_on_backports):
    """The upgrade while a PodDisruptionBudget refuses to let gpu-pascal (the first node) be
    drained: the rollout must stop at that node. The budget is removed afterwards."""
    uid = _start_blocked_workload(upgrade_lab)
    rc, doc = run_playbook(upgrade_lab, *UPGRADE, "-e", "upgrade_drain_timeout=20")
    client.PolicyV1Api(config.new_client_from_config(str(upgrade_lab.kubeconfig_path))) \
        .delete_namespaced_pod_disruption_budget("trainer", WORKLOAD_NS)
    return rc, doc, uid


def test_a_node_that_cannot_be_drained_stops_the_rollout(upgrade_lab, blocked_run):
    rc, doc, _ = blocked_run
    assert rc != 0
    assert doc["stats"]["gpu-pascal"]["failures"] == 1
    # max_fail_percentage 0: the second node's batch never started.
    assert doc["stats"].get("gpu-hopper", {}).get("changed", 0) == 0
    nodes = {n.metadata.name: n for n in _core(upgrade_lab).list_node().items}
    pascal = nodes["gpu-pascal"]
    assert pascal.spec.unschedulable is True
    reason = (pascal.metadata.annotations or {}).get(FAILED, "")
    assert reason.startswith("Cordon and drain the node: "), reason
    assert not nodes["gpu-hopper"].spec.unschedulable
    assert FAILED not in (nodes["gpu-hopper"].metadata.annotations or {})
    for node in GPU_NODES:  # neither driver was touched
        versions = _driver_versions(upgrade_lab, node)
        assert versions["nvidia-kernel-dkms"][0].startswith(OLD + "-"), (node, versions)


def _seconds_per_host(doc: dict) -> dict[str, float]:
    """Wall time of each host's tasks (serial 1: one host at a time)."""
    spans: dict[str, list[datetime]] = {}
    for play in doc["plays"]:
        for task in play["tasks"]:
            duration = task["task"].get("duration") or {}
            if not duration.get("end"):
                continue
            start, end = (datetime.fromisoformat(duration[k].replace("Z", "+00:00"))
                          for k in ("start", "end"))
            for host in task["hosts"]:
                span = spans.setdefault(host, [start, end])
                span[0], span[1] = min(span[0], start), max(span[1], end)
    return {host: (end - start).total_seconds() for host, (start, end) in spans.items()}


@pytest.fixture(scope="module")
def upgrade_run(upgrade_lab, blocked_run):
    """The upgrade once the budget is gone: gpu-pascal (cordoned by the failed run) is upgraded
    again; gpu-hopper was cordoned by an admin beforehand, and must stay cordoned."""
    _core(upgrade_lab).patch_node("gpu-hopper", {"spec": {"unschedulable": True}})
    started = time.monotonic()
    rc, doc = run_playbook(upgrade_lab, *UPGRADE)
    elapsed = time.monotonic() - started
    per_host = ", ".join(f"{h} {s:.0f} s" for h, s in sorted(_seconds_per_host(doc).items()))
    print(f"upgrade-driver.yml took {elapsed:.0f} s for {len(GPU_NODES)} nodes ({per_host})")
    return rc, doc


def test_upgrade_succeeds(upgrade_run):
    rc, doc = upgrade_run
    assert rc == 0, playbook_failures(doc)
    stats = doc["stats"]
    assert sorted(stats) == sorted(GPU_NODES)  # the play is over gpu_nodes only
    for node in GPU_NODES:
        assert (stats[node]["failures"], stats[node]["unreachable"]) == (0, 0), node
        assert stats[node]["changed"] > 0, node


@pytest.mark.parametrize("node", GPU_NODES)
def test_nodes_run_the_new_driver_still_held(upgrade_lab, upgrade_run, node):
    for package, (version, want) in _driver_versions(upgrade_lab, node).items():
        if package != "nvidia-persistenced":  # versioned on its own
            assert version == f"{NEW}-1", (node, package, version)
        assert want == "hold", (node, package, want)
    # The backports suite is gone from the node's sources with the backports setting.
    with connect(node_target(upgrade_lab, node)) as conn:
        sources = conn.run("cat /etc/apt/sources.list.d/gpuprov-nvidia-debian.sources",
                           hide=True, in_stream=False).stdout
    assert "backports" not in sources


def test_uncordoned_unless_cordoned_before_and_labelled_for_the_new_driver(
        upgrade_lab, upgrade_run):
    nodes = {n.metadata.name: n for n in _core(upgrade_lab).list_node().items}
    # gpu-pascal was schedulable before the first (failed) run cordoned it.
    assert not nodes["gpu-pascal"].spec.unschedulable, "gpu-pascal is still cordoned"
    # gpu-hopper was cordoned by the admin before the upgrade: it stays cordoned.
    assert nodes["gpu-hopper"].spec.unschedulable is True, "gpu-hopper was uncordoned"
    for node in GPU_NODES:
        annotations = nodes[node].metadata.annotations or {}
        assert FAILED not in annotations and WAS_CORDONED not in annotations, annotations
        assert nodes[node].metadata.labels["nvidia.com/cuda.driver-version.full"] == NEW
        assert nodes[node].status.allocatable.get("nvidia.com/gpu") == \
            {"gpu-pascal": "4", "gpu-hopper": "8"}[node]


def test_the_workload_was_evicted(upgrade_lab, upgrade_run, blocked_run):
    pods = _core(upgrade_lab).list_namespaced_pod(WORKLOAD_NS, label_selector="app=trainer")
    assert blocked_run[2] not in [p.metadata.uid for p in pods.items]


def test_second_run_changes_nothing(upgrade_lab, upgrade_run):
    rc, doc = run_playbook(upgrade_lab, *UPGRADE)
    assert rc == 0, playbook_failures(doc)
    assert {n: s["changed"] for n, s in doc["stats"].items()} == dict.fromkeys(GPU_NODES, 0)
    # Each node stopped at the skip: nothing was cordoned or drained.
    for play in doc["plays"]:
        for task in play["tasks"]:
            assert task["task"]["name"] != "Cordon and drain the node", task["hosts"]
