"""The gpu_node_maintenance role's decisions (gpuprov/stages/gpu_node_maintenance.py), called
directly and through its filters (plugins/filter/gpu_node_maintenance.py): gpuprov/cordon.py's
patches with the caller's parts merged in, and the failed task named in the reason."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from gpuprov import cordon
from gpuprov.stages import _task_failure
from gpuprov.stages import gpu_node_maintenance as maintenance

OWNER = "gpu-node-upgrade"
FAILED = cordon.keys(OWNER).failed


@pytest.fixture(scope="module")
def filters(ansible_plugin):
    return ansible_plugin("filter/gpu_node_maintenance.py").FilterModule().filters()


def _node(**annotations: str) -> dict:
    return {"metadata": {"name": "gpu-a", "annotations": annotations}, "spec": {}}


def test_the_callers_labels_and_annotations_go_in_the_same_patch():
    extra = {"metadata": {"labels": {"nvidia.com/mig.config.state": "pending"},
                          "annotations": {"gpuprov.io/mig-device-plugin-deploy": ""}}}
    patch = maintenance.take(_node(), "gpu-mig", "layout", extra)
    assert patch["spec"] == {"unschedulable": True}
    assert patch["metadata"]["labels"] == {"nvidia.com/mig.config.state": "pending"}
    assert patch["metadata"]["annotations"]["gpuprov.io/mig-device-plugin-deploy"] == ""
    assert patch["metadata"]["annotations"]["gpuprov.io/mig-was-cordoned"] == "false"
    # A caller's value replaces a non-mapping one; nothing is changed in place.
    assert maintenance.merged({"a": {"b": 1}, "c": 1}, {"a": {"d": None}, "c": {"e": 2}}) == {
        "a": {"b": 1, "d": None}, "c": {"e": 2}}


def test_the_failure_reason_is_the_task_and_its_message_on_one_line():
    failure = maintenance.failure(
        {"name": "Cordon and drain the node"},
        {"failed": True, "msg": "Failed to delete pod team/trainer due to:\n  Too many requests"},
        OWNER)
    assert failure["reason"] == ("Cordon and drain the node: Failed to delete pod team/trainer "
                                 "due to: Too many requests")
    assert failure["annotation"] == FAILED
    assert failure["patch"] == {"spec": {"unschedulable": True},
                                "metadata": {"annotations": {FAILED: failure["reason"]}}}


def test_a_long_failure_reason_is_cut():
    failure = maintenance.failure({"name": "Assert that every check passed"},
                                  {"msg": "gpuprov verify exited 1: " + "FAIL gpu.ecc x " * 100},
                                  OWNER)
    assert len(failure["reason"]) == _task_failure.REASON_MAX
    assert failure["reason"].startswith("Assert that every check passed: gpuprov verify exited 1")
    assert failure["reason"].endswith("...")


def test_the_failure_reason_of_a_loop_and_of_a_command():
    loop = {"msg": "One or more items failed", "results": [
        {"item": "nvidia-persistenced.service", "failed": False},
        {"item": "nvidia-dcgm.service", "failed": True,
         "msg": "Unable to stop service nvidia-dcgm.service"}]}
    assert maintenance.failure({"name": "Stop the host GPU clients"}, loop, OWNER)["reason"] == (
        "Stop the host GPU clients: nvidia-dcgm.service: Unable to stop service "
        "nvidia-dcgm.service")
    command = {"msg": "non-zero return code", "rc": 1,
               "stderr": "Failed to connect to bus\nSystem has not been booted with systemd\n"}
    assert maintenance.failure({"name": "Find the running host GPU clients"}, command,
                               OWNER)["reason"] == (
        "Find the running host GPU clients: non-zero return code: "
        "System has not been booted with systemd")


def test_a_failure_without_task_or_message_still_names_something():
    assert maintenance.failure({}, {}, OWNER)["reason"] == "unnamed task: failed"
    assert maintenance.failure(None, None, OWNER)["reason"] == "unnamed task: failed"
    reason = maintenance.failure({"action": "ansible.builtin.command"}, {"msg": ["a", "b"]},
                                 OWNER)["reason"]
    assert reason == "ansible.builtin.command: a b"


def test_the_filters_check_what_the_role_hands_them(filters):
    assert set(filters) == {"gpuprov_maintenance_take", "gpuprov_maintenance_give_back",
                            "gpuprov_maintenance_failure", "gpuprov_maintenance_clients"}
    with pytest.raises(AnsibleFilterError, match="Node object"):
        filters["gpuprov_maintenance_take"]([], OWNER, "x")
    with pytest.raises(AnsibleFilterError, match="owner"):
        filters["gpuprov_maintenance_give_back"](_node(), "Gpu Upgrade")
    with pytest.raises(AnsibleFilterError, match="merge patch"):
        filters["gpuprov_maintenance_give_back"](_node(), OWNER, "labels")
    with pytest.raises(AnsibleFilterError, match="systemctl"):
        filters["gpuprov_maintenance_clients"](None)
    with pytest.raises(AnsibleFilterError, match="unit names"):
        filters["gpuprov_maintenance_clients"]("", "nvidia-dcgm.service")
    assert filters["gpuprov_maintenance_clients"]("dcgm.service loaded active running x\n") == {
        "running": ["dcgm.service"], "stop": ["dcgm.service"], "start": ["dcgm.service"]}
