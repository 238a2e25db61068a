"""The gpu_node_labels role's work on the Node (gpuprov/stages/gpu_node_labels.py): the label
patch for the node it names and the taint it keeps. Which labels a node gets is
gpuprov.nvidia.labels' (tests/unit/test_labels.py)."""

from __future__ import annotations

from gpuprov.stages import gpu_node_labels as labels


def test_the_label_plan_patches_owned_labels_of_the_named_node():
    nodes = [{"metadata": {"name": "gpu-a", "labels": {"gputype": "k80", "team": "ml",
                                                        "nvidia.com/gpu.memory": "11441"}}},
             {"metadata": {"name": "gpu-b", "labels": {}}}]
    plan = labels.node_plan(nodes, "gpu-a", {"gputype": "p100"})
    assert plan == {"found": True, "expected": {"gputype": "p100"},
                    "patch": {"gputype": "p100", "nvidia.com/gpu.memory": None},
                    "removed": ["nvidia.com/gpu.memory"]}
    assert labels.node_plan(nodes, "gpu-z", {"gputype": "p100"}) == {
        "found": False, "expected": {"gputype": "p100"}, "patch": {}, "removed": []}


def test_the_taint_plan_replaces_one_of_the_same_key_and_effect():
    foreign = {"key": "dedicated", "value": "ml", "effect": "PreferNoSchedule"}
    old = {"key": "nvidia.com/gpu", "value": "false", "effect": "NoSchedule"}
    plan = labels.taint_plan([foreign, old], "nvidia.com/gpu", "true", "NoSchedule")
    assert plan == {"tainted": False, "taints": [
        foreign, {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]}
    again = labels.taint_plan(plan["taints"], "nvidia.com/gpu", "true", "NoSchedule")
    assert again == {"tainted": True, "taints": plan["taints"]}


def test_a_swarm_node_gets_the_same_labels_through_docker_node_update():
    from gpuprov.stages.gpu_node_labels import swarm_plan

    expected = {"gputype": "h100", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.present": "true"}
    current = {"gputype": "p100", "nvidia.com/gpu.family": "pascal", "team": "ml"}
    plan = swarm_plan(current, expected)
    assert plan["args"] == ["--label-add", "gputype=h100",
                            "--label-add", "nvidia.com/gpu.count=8",
                            "--label-rm", "nvidia.com/gpu.family",
                            "--label-add", "nvidia.com/gpu.present=true"]
    assert plan["removed"] == ["nvidia.com/gpu.family"]  # the admin's "team" is not gpuprov's
    assert swarm_plan({**expected, "team": "ml"}, expected)["args"] == []
