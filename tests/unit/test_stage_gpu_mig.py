"""gpuprov.stages.gpu_mig: the gpu_mig role's decisions, on recorded probe reports of the lab's
nodes (tests/fixtures/verify/probe, recorded by tests/fixtures/verify/record.py from the
simulated NVML), with NVML's MIG sections changed as a partitioned GPU reports them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpuprov.nvidia import labels, mig
from gpuprov.stages import gpu_mig
from gpuprov.stages import gpu_node_maintenance as maintenance

PROBES = Path(__file__).parents[1] / "fixtures" / "verify" / "probe"


def probe(node: str) -> dict:
    return json.loads((PROBES / f"{node}.json").read_text())


def partitioned(report: dict, index: int, profiles: dict[str, int]) -> dict:
    report = copy.deepcopy(report)
    gpu = report["nvml"]["gpus"][index]
    gpu["mig"] = {"current": True, "pending": True, "devices": [
        {"profile": name} for name, count in profiles.items() for _ in range(count)]}
    return report


def node(labels=None, annotations=None, cordoned=False) -> dict:
    return {"metadata": {"name": "gpu-hopper", "labels": labels or {},
                         "annotations": annotations or {}},
            "spec": {"unschedulable": True} if cordoned else {}}


def test_no_layout_declared_changes_nothing():
    found = gpu_mig.plan(probe("gpu-hopper"), None)
    assert found["managed"] is False and found["skip"] is True
    assert "MIG left as it is" in found["summary"]


def test_a_node_without_mig_capable_gpus_changes_nothing_and_says_so():
    found = gpu_mig.plan(probe("gpu-pascal"), "all-1g.10gb", None, node())
    assert found["capable"] == [] and found["change"] == {} and found["skip"] is True
    assert found["apply"]["gpus"] == []
    assert found["summary"] == "no MIG-capable GPU on the node: nothing to change"


def test_all_1g_on_eight_whole_h100s_plans_seven_instances_each_largest_first():
    report = probe("gpu-hopper")
    found = gpu_mig.plan(report, "all-1g.10gb", None, node())
    gpus = report["nvml"]["gpus"]
    assert sorted(found["change"]) == [g["index"] for g in gpus]
    assert all("the layout wants it on" in why for why in found["change"].values())
    one_g = mig.model_of(0x2330).profile("1g.10gb")
    for gpu in found["apply"]["gpus"]:
        assert gpu["mig_enabled"] is True
        assert [i["profile"] for i in gpu["instances"]] == ["1g.10gb"] * one_g.count
        assert sorted(i["start"] for i in gpu["instances"]) == list(one_g.starts)
        assert {i["nvml_index"] for i in gpu["instances"]} == {one_g.nvml_index}
    assert found["skip"] is False


def test_the_patches_cordon_pause_the_plugin_and_give_back_what_was_there():
    """What the role sends: gpu_node_maintenance's patches with the stage's parts merged in."""
    before = node(labels={gpu_mig.PLUGIN_DEPLOY_LABEL: "true"})
    found = gpu_mig.plan(probe("gpu-hopper"), "all-1g.10gb", None, before)
    start = maintenance.take(before, gpu_mig.OWNER, found["reason"], found["take_patch"])
    assert start["spec"] == {"unschedulable": True}
    assert start["metadata"]["labels"] == {
        gpu_mig.CONFIG_LABEL: "all-1g.10gb", gpu_mig.STATE_LABEL: "pending",
        gpu_mig.PLUGIN_DEPLOY_LABEL: gpu_mig.PAUSED}
    annotations = start["metadata"]["annotations"]
    assert annotations[gpu_mig.WAS_CORDONED] == "false"
    assert annotations[gpu_mig.PLUGIN_WAS] == "true"
    assert annotations["gpuprov.io/mig-cordon-reason"] == (
        "gpuprov is changing the MIG layout to all-1g.10gb")
    assert set(annotations) == set(gpu_mig.ANNOTATIONS) - {gpu_mig.FAILED, gpu_mig.DRA_WAS}
    assert found["dra"] is False and found["plugin_selector"] == gpu_mig.DEVICE_PLUGIN_SELECTOR
    taken = node(labels=start["metadata"]["labels"], annotations=annotations, cordoned=True)
    done = maintenance.give_back(taken, gpu_mig.OWNER, found["done_patch"])
    assert done["spec"] == {"unschedulable": False}
    assert done["metadata"]["labels"][gpu_mig.PLUGIN_DEPLOY_LABEL] == "true"
    assert done["metadata"]["labels"][gpu_mig.STATE_LABEL] == "success"
    assert done["metadata"]["annotations"] == dict.fromkeys(gpu_mig.ANNOTATIONS)
    failed = maintenance.failure({"name": "Apply"}, {"msg": "why"}, gpu_mig.OWNER,
                                 found["failed_patch"])["patch"]
    assert failed == {"spec": {"unschedulable": True}, "metadata": {
        "labels": {gpu_mig.STATE_LABEL: "failed", gpu_mig.PLUGIN_DEPLOY_LABEL: "true"},
        "annotations": {gpu_mig.FAILED: "Apply: why"}}}


def test_on_a_dra_node_the_dra_driver_is_paused_too_and_given_back_after():
    """A DRA node (gpu_allocation: dra, labels of gpuprov.nvidia.labels.allocation_labels): the
    DRA kubelet plugin reads the MIG devices once at start, so its pod must go and come back;
    the stage waits for that pod, not the device plugin's."""
    dra_labels = labels.allocation_labels("dra")
    before = node(labels=dra_labels)
    found = gpu_mig.plan(probe("gpu-hopper"), "all-1g.10gb", None, before)
    assert found["dra"] is True
    assert found["plugin_selector"] == gpu_mig.DRA_PLUGIN_SELECTOR
    start = maintenance.take(before, gpu_mig.OWNER, found["reason"], found["take_patch"])
    assert start["metadata"]["labels"][gpu_mig.DRA_DEPLOY_LABEL] == gpu_mig.PAUSED
    assert start["metadata"]["labels"][gpu_mig.PLUGIN_DEPLOY_LABEL] == gpu_mig.PAUSED
    assert start["metadata"]["annotations"][gpu_mig.DRA_WAS] == "true"
    assert start["metadata"]["annotations"][gpu_mig.PLUGIN_WAS] == "false"
    taken = node(labels=start["metadata"]["labels"], annotations=start["metadata"]["annotations"],
                 cordoned=True)
    # Stopped midway, the next run reads the recorded values, not the paused labels.
    again = gpu_mig.plan(probe("gpu-hopper"), "all-1g.10gb", None, taken)
    assert again["dra"] is True and gpu_mig.DRA_WAS in again["unfinished"]
    for plan in (found, again):
        done = maintenance.give_back(taken, gpu_mig.OWNER, plan["done_patch"])
        assert {k: done["metadata"]["labels"][k] for k in dra_labels} == dra_labels
        assert done["metadata"]["annotations"] == dict.fromkeys(gpu_mig.ANNOTATIONS)
        failed = maintenance.failure({"name": "Apply"}, {"msg": "why"}, gpu_mig.OWNER,
                                     plan["failed_patch"])["patch"]
        assert {k: failed["metadata"]["labels"][k] for k in dra_labels} == dra_labels


def test_a_device_plugin_node_gets_no_dra_label():
    for before in (node(), node(labels=labels.allocation_labels("device-plugin")),
                   node(labels={gpu_mig.DRA_DEPLOY_LABEL: "false"})):
        found = gpu_mig.plan(probe("gpu-hopper"), "all-1g.10gb", None, before)
        assert found["dra"] is False
        for patch in ("take_patch", "failed_patch"):
            assert gpu_mig.DRA_DEPLOY_LABEL not in found[patch]["metadata"]["labels"]


def test_a_node_cordoned_before_stays_cordoned_and_an_absent_plugin_label_is_removed():
    before = node(cordoned=True)
    found = gpu_mig.plan(probe("gpu-hopper"), "all-1g.10gb", None, before)
    assert found["was_cordoned"] is True
    start = maintenance.take(before, gpu_mig.OWNER, found["reason"], found["take_patch"])
    assert start["metadata"]["annotations"][gpu_mig.WAS_CORDONED] == "true"
    taken = node(annotations=start["metadata"]["annotations"], cordoned=True)
    done = maintenance.give_back(taken, gpu_mig.OWNER, found["done_patch"])
    assert "spec" not in done
    assert done["metadata"]["labels"][gpu_mig.PLUGIN_DEPLOY_LABEL] is None


def test_a_rerun_after_a_stop_midway_reads_what_the_first_run_recorded():
    # The first run cordoned an uncordoned node and paused the plugin, then stopped.
    midway = node(labels={gpu_mig.PLUGIN_DEPLOY_LABEL: gpu_mig.PAUSED},
                  annotations={gpu_mig.WAS_CORDONED: "false", gpu_mig.PLUGIN_WAS: ""},
                  cordoned=True)
    report = probe("gpu-hopper")
    for i in range(len(report["nvml"]["gpus"])):
        report = partitioned(report, i, {"1g.10gb": 7})
    found = gpu_mig.plan(report, "all-1g.10gb", None, midway)
    assert found["change"] == {}
    assert found["skip"] is False and found["unfinished"] == [gpu_mig.WAS_CORDONED,
                                                               gpu_mig.PLUGIN_WAS]
    assert found["was_cordoned"] is False
    done = maintenance.give_back(midway, gpu_mig.OWNER, found["done_patch"])
    assert done["spec"] == {"unschedulable": False}
    assert done["metadata"]["labels"][gpu_mig.PLUGIN_DEPLOY_LABEL] is None


def test_the_layout_in_place_only_labels():
    report = probe("gpu-hopper")
    for i in range(len(report["nvml"]["gpus"])):
        report = partitioned(report, i, {"1g.10gb": 7})
    found = gpu_mig.plan(report, "all-1g.10gb", None, node())
    assert found["change"] == {} and found["skip"] is True
    assert found["labels_patch"] == {"metadata": {"labels": {
        gpu_mig.CONFIG_LABEL: "all-1g.10gb", gpu_mig.STATE_LABEL: "success"}}}
    assert found["summary"] == "layout all-1g.10gb is in place on 8 MIG-capable GPU(s)"


def test_only_the_gpus_that_differ_are_in_the_applier_plan():
    report = partitioned(probe("gpu-hopper"), 3, {"1g.10gb": 7})
    found = gpu_mig.plan(report, "all-disabled", None, node())
    assert list(found["change"]) == [3]
    assert found["apply"]["gpus"] == [{"index": 3, "mig_enabled": False, "instances": []}]


def test_a_pending_mode_is_a_difference():
    report = copy.deepcopy(probe("gpu-hopper"))
    report["nvml"]["gpus"][1]["mig"] = {"current": False, "pending": True, "devices": []}
    found = gpu_mig.plan(report, "all-disabled", None, node())
    assert list(found["change"]) == [1] and "pending" in found["change"][1]


def test_custom_layouts_in_mig_parteds_format_select_gpus_by_index():
    configs = {"version": "v1", "mig-configs": {"half": [
        {"devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
        {"devices": "all", "mig-enabled": False}]}}
    found = gpu_mig.plan(probe("gpu-hopper"), "half", configs, node())
    assert sorted(found["change"]) == [0, 1]
    assert [(i["profile"], i["start"]) for i in found["apply"]["gpus"][0]["instances"]] == [
        ("3g.40gb", 0), ("3g.40gb", 4)]


@pytest.mark.parametrize(("config", "configs", "words"), [
    ("all-2g.99gb", None, "no MIG layout 'all-2g.99gb'"),
    ("x", {"version": "v2"}, "mig-parted's format"),
    ("too-many", {"version": "v1", "mig-configs": {"too-many": [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 3}}]}},
     "takes at most 2 3g.40gb"),
])
def test_a_layout_the_node_cannot_take_fails_before_any_change(config, configs, words):
    with pytest.raises(gpu_mig.StageError) as error:
        gpu_mig.plan(probe("gpu-hopper"), config, configs, node())
    assert words in str(error.value) and "\n" not in str(error.value)


def test_a_node_whose_nvml_does_not_answer_fails_with_what_to_do():
    report = copy.deepcopy(probe("gpu-hopper"))
    report["nvml"] = {"available": False, "gpus": []}
    with pytest.raises(gpu_mig.StageError, match="run the driver stage"):
        gpu_mig.plan(report, "all-1g.10gb", None, node())


def _pod(name, resources=None, owner=None, phase="Running", init=False):
    container = {"name": "c", "resources": resources or {}}
    spec = {"containers": [] if init else [container]}
    if init:
        spec["initContainers"] = [container]
    meta = {"name": name, "namespace": "ns"}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "x"}]
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_the_pods_to_evict_are_those_that_hold_gpus():
    pods = [
        _pod("whole", {"limits": {"nvidia.com/gpu": 1}}),
        _pod("mig", {"requests": {"nvidia.com/mig-1g.10gb": "2"}}),
        _pod("init", {"limits": {"nvidia.com/gpu": 1}}, init=True),
        _pod("cpu", {"limits": {"cpu": "1"}}),
        _pod("zero", {"limits": {"nvidia.com/gpu": 0}}),
        _pod("other-vendor", {"limits": {"amd.com/gpu": 1}}),
        _pod("daemon", {"limits": {"nvidia.com/gpu": 1}}, owner="DaemonSet"),
        _pod("job", {"limits": {"nvidia.com/gpu": 1}}, owner="Job"),
        _pod("done", {"limits": {"nvidia.com/gpu": 1}}, phase="Succeeded"),
    ]
    assert [p["name"] for p in gpu_mig.gpu_pods(pods)] == ["whole", "mig", "init", "job"]


# -- the role's filters (plugins/filter/gpu_mig.py) ----------------------------------------
@pytest.fixture(scope="module")
def filters(ansible_plugin):
    return ansible_plugin("filter/gpu_mig.py")


def test_the_plan_filter_fails_with_the_stages_one_line(filters):
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="^gpu_mig_config 'nope': no MIG layout"):
        filters.gpuprov_mig_plan(probe("gpu-hopper"), "nope")
    assert filters.gpuprov_mig_plan(probe("gpu-hopper"), "")["managed"] is False


def test_the_appliers_report_is_its_last_json_line_or_why_there_is_none(filters):
    report = {"changed": True, "gpus": [], "error": None, "seconds": 1.5}
    assert filters.gpuprov_mig_applied("a login banner\n" + json.dumps(report), 0) == report
    failed = filters.gpuprov_mig_applied(json.dumps({**report, "error": "GPU 0: x"}), 1)
    assert failed["error"] == "GPU 0: x"
    assert filters.gpuprov_mig_applied(json.dumps(report), 1)["error"] == "the MIG applier exited 1"
    assert filters.gpuprov_mig_applied("Traceback ...", 1) == {
        "error": "the MIG applier exited 1 without a report", "gpus": []}


def test_mig_parteds_own_example_config_plans_an_a100_node_as_mig_parted_would():
    """NVIDIA/mig-parted examples/config.yaml (tests/fixtures/mig), as it is, on eight
    A100-SXM4-40GB (10de:20b0): its custom-config leaves GPUs 0-3 whole and partitions 4-7."""
    import yaml

    configs = yaml.safe_load((Path(__file__).parents[1] / "fixtures" / "mig"
                              / "mig-parted-examples-config.yaml").read_text())
    report = copy.deepcopy(probe("gpu-hopper"))
    for gpu in report["nvml"]["gpus"]:
        gpu["pci_device_id"] = "10de:20b0"
    found = gpu_mig.plan(report, "custom-config", configs, node())
    assert sorted(found["change"]) == [4, 5, 6, 7]
    wanted = {g["index"]: sorted(i["profile"] for i in g["instances"])
              for g in found["apply"]["gpus"]}
    assert wanted == {4: ["1g.5gb"] * 7, 5: ["2g.10gb"] * 3, 6: ["3g.20gb"] * 2,
                      7: ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]}
    # The same file on H100s: their profiles are named otherwise, and the stage says so.
    with pytest.raises(gpu_mig.StageError, match="H100-80GB has no MIG profile '1g.5gb'"):
        gpu_mig.plan(probe("gpu-hopper"), "all-1g.5gb", configs, node())


# -- the validate stage's check (site.yml, before any stage changes anything) --------------


def _preflight_gpus(name: str) -> list[dict]:
    """gpu_preflight_gpus as the preflight sets it: the probe's PCI view, no driver needed."""
    from gpuprov.stages import gpu_preflight

    return gpu_preflight.probe_gpus(probe(name)["pci"])


def test_the_check_passes_a_layout_that_fits_and_no_layout_at_all():
    assert gpu_mig.check(_preflight_gpus("gpu-hopper"), "all-1g.10gb") is None
    assert gpu_mig.check(_preflight_gpus("gpu-hopper"), None) is None
    # Not MIG-capable: a layout for every GPU leaves them alone.
    assert gpu_mig.check(_preflight_gpus("gpu-pascal"), "all-1g.10gb") is None


@pytest.mark.parametrize(("config", "configs", "words"), [
    ("all-1g.10gbb", None, "gpu_mig_config 'all-1g.10gbb': no MIG layout 'all-1g.10gbb'"),
    ("mine", {"version": "v1", "mig-configs": {"mine": [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 8}}]}},
     "gpu_mig_config 'mine': GPU 0:"),
    ("mine", {"version": "v1", "mig-configs": {"mine": [{"devices": "all"}]}},
     "gpu_mig_config 'mine':"),
])
def test_the_check_refuses_what_the_stage_would_refuse_later(config, configs, words):
    gpus = _preflight_gpus("gpu-hopper")
    problem = gpu_mig.check(gpus, config, configs)
    assert problem is not None and problem.startswith(words), problem
    # The stage itself, on the node with the driver, refuses the same settings.
    with pytest.raises(gpu_mig.StageError):
        gpu_mig.plan(probe("gpu-hopper"), config, configs, node())


def test_the_plan_groups_the_nodes_whose_layout_changes():
    assert gpu_mig.plan(probe("gpu-hopper"), "all-1g.10gb", None, node())["group"] == \
        gpu_mig.GROUP_CHANGE
    assert gpu_mig.plan(probe("gpu-pascal"), "all-1g.10gb", None, node())["group"] == \
        gpu_mig.GROUP_STEADY
    assert gpu_mig.plan(probe("gpu-hopper"), None)["group"] == gpu_mig.GROUP_STEADY
