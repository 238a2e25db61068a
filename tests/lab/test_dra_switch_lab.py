"""gpu_allocation per node on the session lab (issue 35): a node asked for NVIDIA's DRA driver
that cannot have it is refused at the preflight, with the reason, and nothing changes on any
node or in the cluster.

gpu-pascal runs Debian 12's containerd 1.6 (no CDI) and R535 (older than R565): both reasons
must be named. The refusal is the preflight's, before the first change, so the test needs the
lab, not the converged lab: it holds whether it runs before or after site.yml, and leaves the
lab as it found it (the host_vars file it writes is removed).

The switch of gpu-hopper itself (to DRA and back, a claim's pod evicted first) needs the lab's
simulated DRA kubelet plugin (issue 35 item 4) and is added with it.
"""

from __future__ import annotations

import pytest
from conftest import api_objects, kube_api, node_state, playbook_failures
from kubernetes import client

NODE = "gpu-pascal"


@pytest.fixture(scope="module")
def pascal_asks_for_dra(lab):
    """A host_vars file for gpu-pascal with gpu_allocation: dra (as an admin writes it; the
    other nodes keep the default), removed after; an earlier file is put back."""
    path = lab.inventory_path.parent / "host_vars" / f"{NODE}.yml"
    path.parent.mkdir(exist_ok=True)
    before = path.read_text() if path.exists() else None
    path.write_text((before or "") + "\ngpu_allocation: dra\n")
    yield lab
    if before is None:
        path.unlink()
    else:
        path.write_text(before)


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
def refused(pascal_asks_for_dra, playbook):
    lab = pascal_asks_for_dra
    nodes, cluster = node_state(lab), _cluster(lab)
    rc, doc = playbook("site.yml")
    return rc, doc, (nodes, cluster), (node_state(lab), _cluster(lab))


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
