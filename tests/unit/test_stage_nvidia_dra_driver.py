"""The nvidia_dra_driver role's decisions (gpuprov/stages/nvidia_dra_driver.py), through
plugins/filter/nvidia_dra_driver.py: each host's mode, which nodes switch and how (the deploy
labels of gpuprov/nvidia/labels.py allocation_labels), which pods go before a switch, and when
a switched node offers its GPUs again. Objects are shaped as the API serves them: a
ResourceClaim's status.allocation.devices.results and a ResourceSlice's spec as
resource.k8s.io/v1 has them (kubernetes-validate's 1.34 schemas, research/dra.md 2.1)."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from gpuprov.nvidia import labels

DP, DRA = labels.DEPLOY_DEVICE_PLUGIN, labels.DEPLOY_DRA_DRIVER


@pytest.fixture(scope="module")
def dra(ansible_plugin):
    return ansible_plugin("filter/nvidia_dra_driver.py")


def _node(name: str, gpus: str | None = None, **node_labels) -> dict:
    status = {"allocatable": {"cpu": "8", **({"nvidia.com/gpu": gpus} if gpus else {})}}
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true",
                                                  **node_labels}}, "status": status}


def _slice(node: str, driver: str = "gpu.nvidia.com") -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}-x7k2q"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}]}}


def _pod(name: str, namespace: str = "default", phase: str = "Running", claims=(),
         limits=None, daemonset: bool = False) -> dict:
    meta = {"name": name, "namespace": namespace}
    if daemonset:
        meta["ownerReferences"] = [{"kind": "DaemonSet", "name": "ds", "controller": True}]
    container = {"name": "c", "resources": {"limits": limits or {}}}
    spec = {"nodeName": "gpu-hopper", "containers": [container],
            "resourceClaims": [{"name": entry, "resourceClaimTemplateName": "one-gpu"}
                               for entry, _ in claims]}
    status = {"phase": phase, "resourceClaimStatuses": [
        {"name": entry, "resourceClaimName": claim} for entry, claim in claims]}
    return {"metadata": meta, "spec": spec, "status": status}


def _claim(name: str, namespace: str = "default", driver: str | None = "gpu.nvidia.com") -> dict:
    status = {} if driver is None else {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": driver, "pool": "gpu-hopper", "device": "gpu-0"}]}}}
    return {"metadata": {"name": name, "namespace": namespace}, "status": status}


# -- each host's mode -----------------------------------------------------------------------


def test_the_mode_is_the_device_plugin_unless_dra_is_asked_for(dra):
    assert dra.gpuprov_allocation_mode(None) == "device-plugin"
    assert dra.gpuprov_allocation_mode("DRA") == "dra"
    with pytest.raises(AnsibleFilterError, match=r"^gpu_allocation must be one of device-plugin, "
                       r"dra, got 'both': set it per host or group"):
        dra.gpuprov_allocation_mode("both")


def test_dra_nodes_are_the_gpu_hosts_asking_for_it_by_their_kubernetes_names(dra):
    hostvars = {"gpu-hopper": {"gpu_allocation": "dra", "gpu_node_labels_node_name": "hopper-0"},
                "gpu-kepler": {},
                "cpu-0": {"gpu_allocation": "dra", "gpu_preflight_has_gpu": False},
                "gpu-pascal": {"gpu_allocation": "device-plugin"}}
    assert dra.gpuprov_dra_nodes(list(hostvars), hostvars) == ["hopper-0"]


# -- which nodes switch, with which labels --------------------------------------------------


def test_a_device_plugin_node_asked_for_dra_switches_to_both_deploy_labels(dra):
    plan = dra.gpuprov_allocation_plan([_node("gpu-hopper", "8")], "gpu-hopper", "dra")
    assert plan == {"found": True, "from": "device-plugin", "to": "dra", "switch": True,
                    "patch": {"metadata": {"labels": {DP: "false", DRA: "true"}}},
                    "reason": "GPU allocation device-plugin -> dra (gpu_allocation)"}


def test_a_dra_node_back_on_the_device_plugin_loses_both_deploy_labels(dra):
    node = _node("gpu-hopper", **{DP: "false", DRA: "true"})
    plan = dra.gpuprov_allocation_plan([node], "gpu-hopper", None)
    assert (plan["from"], plan["to"], plan["switch"]) == ("dra", "device-plugin", True)
    assert plan["patch"] == {"metadata": {"labels": {DP: None, DRA: None}}}


@pytest.mark.parametrize("node_labels, setting", [
    ({DP: "false", DRA: "true"}, "dra"),
    ({}, "device-plugin"),
    # gpu_mig paused the plugin for a MIG change: its key is gpu_mig's to give back.
    ({DP: "paused-for-mig-change"}, None),
])
def test_a_node_in_its_mode_does_not_switch(dra, node_labels, setting):
    plan = dra.gpuprov_allocation_plan([_node("gpu-a", **node_labels)], "gpu-a", setting)
    assert (plan["switch"], plan["patch"], plan["reason"]) == (False, {}, "")


def test_a_switch_stopped_midway_is_done_again(dra):
    # The DRA key set, the device plugin's taken back by gpu_mig: not a DRA node yet.
    plan = dra.gpuprov_allocation_plan([_node("gpu-a", **{DRA: "true"})], "gpu-a", "dra")
    assert plan["switch"] and plan["from"] == "dra"
    assert plan["patch"]["metadata"]["labels"] == {DP: "false", DRA: "true"}


def test_a_node_the_cluster_lacks_is_not_found(dra):
    assert dra.gpuprov_allocation_plan([_node("gpu-a")], "gpu-b", "dra")["found"] is False


def test_a_bad_mode_in_the_plan_is_the_settings_line(dra):
    with pytest.raises(AnsibleFilterError, match="gpu_allocation must be one of"):
        dra.gpuprov_allocation_plan([_node("gpu-a")], "gpu-a", "gpus")


# -- the pods a switch evicts ---------------------------------------------------------------


def test_pods_holding_gpus_either_way_are_evicted_and_no_others(dra):
    pods = [
        _pod("dp-gpu", limits={"nvidia.com/gpu": "1"}),
        _pod("mig", limits={"nvidia.com/mig-1g.10gb": "1"}),
        _pod("claim", namespace="ml", claims=[("gpu", "claim-gpu-ab12c")]),
        _pod("cpu"),
        # A claim of another driver (not NVIDIA's GPUs), and a claim not allocated yet.
        _pod("other-driver", claims=[("nic", "claim-nic-x")]),
        _pod("pending-claim", claims=[("gpu", "claim-unallocated")]),
        # The same claim name in another namespace is another claim.
        _pod("elsewhere", namespace="default", claims=[("gpu", "claim-gpu-ab12c")]),
        _pod("done", phase="Succeeded", claims=[("gpu", "claim-gpu-ab12c")], namespace="ml"),
        _pod("plugin", daemonset=True, limits={"nvidia.com/gpu": "1"}),
    ]
    claims = [_claim("claim-gpu-ab12c", "ml"), _claim("claim-nic-x", driver="nic.example.com"),
              _claim("claim-unallocated", driver=None)]
    assert dra.gpuprov_allocation_gpu_pods(pods, claims) == [
        {"namespace": "default", "name": "dp-gpu"}, {"namespace": "default", "name": "mig"},
        {"namespace": "ml", "name": "claim"}]


def test_a_claim_named_in_the_pod_spec_counts_too(dra):
    pod = _pod("shared")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "team-gpu"}]
    assert dra.gpuprov_allocation_gpu_pods([pod], [_claim("team-gpu")]) == [
        {"namespace": "default", "name": "shared"}]


# -- when a switched node offers its GPUs ---------------------------------------------------


def test_a_dra_node_is_switched_once_nvidias_gpu_driver_publishes_its_slice(dra):
    slices = [_slice("gpu-kepler"), _slice("gpu-hopper", driver="compute-domain.nvidia.com")]
    assert dra.gpuprov_allocation_switched("gpu-hopper", "dra", slices=slices) is False
    assert dra.gpuprov_without_slice(["gpu-hopper", "gpu-kepler"], slices) == ["gpu-hopper"]
    slices.append(_slice("gpu-hopper"))
    assert dra.gpuprov_allocation_switched("gpu-hopper", "dra", slices=slices) is True
    assert dra.gpuprov_without_slice(["gpu-hopper", "gpu-kepler"], slices) == []


def test_a_node_back_on_the_device_plugin_is_switched_once_it_advertises_gpus(dra):
    assert dra.gpuprov_allocation_switched("gpu-hopper", "device-plugin",
                                           nodes=[_node("gpu-hopper", "0")]) is False
    assert dra.gpuprov_allocation_switched("gpu-hopper", "device-plugin",
                                           nodes=[_node("gpu-hopper")]) is False
    assert dra.gpuprov_allocation_switched("gpu-hopper", "device-plugin",
                                           nodes=[_node("gpu-hopper", "8")]) is True
    # A slice says nothing about the device plugin.
    assert dra.gpuprov_allocation_switched("gpu-hopper", "device-plugin",
                                           slices=[_slice("gpu-hopper")]) is False


def test_a_switch_that_ran_out_says_where_to_look(dra):
    to_dra = dra.gpuprov_allocation_switch_problem("gpu-hopper", "dra", 300)
    assert to_dra.startswith("gpu-hopper: switched to DRA, but NVIDIA's DRA driver published no "
                             "ResourceSlice for it in 300 s (kubectl get resourceslices "
                             "--field-selector spec.nodeName=gpu-hopper")
    back = dra.gpuprov_allocation_switch_problem("gpu-hopper", "device-plugin", 300)
    assert "advertises no nvidia.com/gpu after 300 s" in back
    assert back.endswith("The node stays cordoned")
