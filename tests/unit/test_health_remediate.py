"""`gpuprov health show | ack | remediate` (gpuprov/health/, gpuprov/commands/health.py): the plan's
rules as pure functions, then the commands against the emulated API server with agents
publishing conditions."""

from __future__ import annotations

import json

import pytest

from gpuprov import cordon as cordon_module
from gpuprov.cli import main
from gpuprov.errors import GpuprovError
from gpuprov.health import fleet, remediate
from gpuprov.lab.kube.testing import agent_conditions, running_emulator, write_kubeconfig
from gpuprov.node.health import state as hs
from gpuprov.node.health.kube import Client

T0 = "2026-11-26T10:00:00Z"


def node(name: str, fault: bool = False, since: str = T0, unschedulable: bool = False,
         cordon: dict | None = None, capacity: int = 4, allocatable: int | None = None,
         agent: bool = True, restarted: float | None = None) -> dict:
    conditions = []
    if agent:
        conditions.append({"type": hs.GPU_FAULT, "status": "True" if fault else "False",
                           "reason": "XID79" if fault else "NoProblem",
                           "message": "XID79: GPU 0 (GPU-1, 0000:3b:00): x; evidence ev-1-7; "
                           "action: reboot" if fault else "ok", "lastTransitionTime": since})
    annotations = {}
    if cordon is not None:  # remediation's record, as gpuprov/cordon.py writes it
        names = cordon_module.keys(fleet.OWNER)
        annotations[names.was_cordoned] = "true" if cordon.get("preexisting") else "false"
        annotations[names.reason] = cordon.get("reason", "r")
        annotations[names.since] = T0
        if cordon.get("taint"):
            annotations[fleet.TAINT_ANNOTATION] = "true"
    if restarted is not None:
        annotations[fleet.PLUGIN_RESTART_ANNOTATION] = str(restarted)
    return {"metadata": {"name": name, "annotations": annotations},
            "spec": {"unschedulable": unschedulable},
            "status": {"conditions": conditions,
                       "capacity": {"nvidia.com/gpu": str(capacity)},
                       "allocatable": {"nvidia.com/gpu": str(capacity if allocatable is None
                                                             else allocatable)}}}


def starts(out: str, prefix: str) -> int:
    return sum(1 for line in out.splitlines() if line.startswith(prefix))


def kinds(actions):
    return sorted((a.kind, a.node) for a in actions)


def test_limit():
    assert remediate.limit(None, 3) == 1 and remediate.limit(None, 40) == 4
    assert remediate.limit("2", 3) == 2 and remediate.limit("50%", 5) == 2
    for bad in ("-1", "x", "150%"):
        with pytest.raises(GpuprovError, match="--max-unavailable"):
            remediate.limit(bad, 3)


def test_cordon_with_brakes_oldest_first_the_rest_held():
    nodes = [node("a", True, "2026-11-26T10:00:02Z"), node("b", True, "2026-11-26T10:00:01Z"),
             node("c", True, "2026-11-26T10:00:03Z")]
    actions = remediate.plan(nodes, remediate.Options("1"), 100)
    assert kinds(actions) == [("cordon", "b"), ("hold", "a"), ("hold", "c")]
    taken = next(a for a in actions if a.kind == "cordon")
    assert taken.annotation["evidence"] == ["ev-1-7"] and not taken.annotation["preexisting"]
    assert "evidence ev-1-7" in taken.annotation["reason"]


def test_second_round_changes_nothing_and_release_frees_a_place():
    taken = {"at": 1, "reason": "r", "evidence": [], "preexisting": False, "taint": False}
    nodes = [node("a", True, unschedulable=True, cordon=taken), node("b", True)]
    assert kinds(remediate.plan(nodes, remediate.Options("1"), 100)) == [("hold", "b")]
    nodes[0] = node("a", False, unschedulable=True, cordon=taken)  # a recovered
    assert kinds(remediate.plan(nodes, remediate.Options("1"), 100)) == [("cordon", "b"),
                                                                         ("release", "a")]


def test_admin_cordon_is_kept_and_admin_uncordon_is_respected():
    nodes = [node("a", True, unschedulable=True)]
    (adopt,) = remediate.plan(nodes, remediate.Options("0"), 100)  # no budget needed
    assert adopt.kind == "adopt" and adopt.annotation["preexisting"]
    recovered = node("a", False, unschedulable=True, cordon=adopt.annotation)
    assert kinds(remediate.plan([recovered], remediate.Options(), 100)) == [("forget", "a")]
    ours = {"at": 1, "reason": "r", "evidence": [], "preexisting": False, "taint": False}
    uncordoned = node("b", False, unschedulable=False, cordon=ours)
    assert kinds(remediate.plan([uncordoned], remediate.Options(), 100)) == [("forget", "b")]


def test_plugin_restart_once_an_hour_never_on_a_fault_or_without_the_agent():
    short = node("a", allocatable=3)
    assert kinds(remediate.plan([short], remediate.Options(), 10_000)) == [("restart-plugin", "a")]
    assert kinds(remediate.plan([node("a", allocatable=3, restarted=9_000)],
                                remediate.Options(), 10_000)) == [("hold", "a")]
    assert kinds(remediate.plan([node("a", True, allocatable=3)], remediate.Options("0"),
                                10_000)) == [("hold", "a")]
    assert remediate.plan([node("a", allocatable=3, agent=False)], remediate.Options(),
                          10_000) == []


def test_a_node_given_back_gets_its_stuck_plugin_restarted_in_the_same_round():
    # The XID that cordoned it also made the device plugin mark the GPU unhealthy for good:
    # giving the node back without its GPUs would be half a recovery.
    taken = {"at": 1, "reason": "r", "evidence": [], "preexisting": False, "taint": False}
    recovered = node("a", False, unschedulable=True, cordon=taken, allocatable=3)
    assert kinds(remediate.plan([recovered], remediate.Options(), 10_000)) == [
        ("release", "a"), ("restart-plugin", "a")]
    whole = node("a", False, unschedulable=True, cordon=taken)
    assert kinds(remediate.plan([whole], remediate.Options(), 10_000)) == [("release", "a")]


# -- the commands against the emulated API --------------------------------------------------


def publish(url: str, name: str, fault: bool) -> None:
    Client({"server": url}, name).patch_conditions(agent_conditions(fault))


def test_show_remediate_ack_round_trip(tmp_path, capsys):
    with running_emulator() as emu:
        kubeconfig = str(write_kubeconfig(tmp_path / "kubeconfig", emu.url))
        for name in ("gpu-kepler", "gpu-pascal", "gpu-hopper"):
            publish(emu.url, name, fault=True)
        assert main(["health", "show", "--kubeconfig", kubeconfig]) == 1
        out = capsys.readouterr().out
        assert out.count("GPUFault") == 3 and "ev-b-1" in out
        assert main(["health", "remediate", "--kubeconfig", kubeconfig, "--once",
                     "--dry-run"]) == 0
        assert "would cordon" in capsys.readouterr().out
        assert main(["health", "remediate", "--kubeconfig", kubeconfig, "--once",
                     "--max-unavailable", "1"]) == 0
        out = capsys.readouterr().out
        assert starts(out, "cordon ") == 1 and starts(out, "hold ") == 2, out
        main(["health", "show", "--kubeconfig", kubeconfig, "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert [n["cordoned_by"] for n in doc["nodes"]].count("gpuprov") == 1
        assert main(["health", "remediate", "--kubeconfig", kubeconfig, "--once",
                     "--max-unavailable", "1"]) == 0
        assert starts(capsys.readouterr().out, "cordon ") == 0  # the second round: no change
        cordoned = next(n["node"] for n in doc["nodes"] if n["cordoned_by"] == "gpuprov")
        # The agent clears the fault (an ack, a reset, a reboot): remediate gives it back.
        publish(emu.url, cordoned, fault=False)
        main(["health", "remediate", "--kubeconfig", kubeconfig, "--once",
              "--max-unavailable", "1"])
        out = capsys.readouterr().out
        # its place goes to the next faulty node in the same round
        assert starts(out, f"release {cordoned}") == 1 and starts(out, "cordon ") == 1, out
        annotations = Client({"server": emu.url}, cordoned).get_node()["metadata"].get(
            "annotations") or {}
        assert not [k for k in annotations if k.startswith("gpuprov.io/health-remediate")]
        held = next(n["node"] for n in doc["nodes"] if n["cordoned_by"] != "gpuprov")
        record = Client({"server": emu.url}, "gpu-kepler").get_node()["metadata"]["annotations"]
        assert record["gpuprov.io/health-remediate-was-cordoned"] == "false"
        assert "evidence ev-b-1" in record["gpuprov.io/health-remediate-cordon-reason"]
        assert held != cordoned
        events = Client({"server": emu.url}, "x")._request(
            "GET", "/api/v1/namespaces/default/events")["items"]
        assert {e["reason"] for e in events} >= {"GpuprovCordon", "GpuprovRelease"}
        # found as `kubectl describe node` searches a node's events (by the uid the kubelet
        # gives them: the node's name)
        found = Client({"server": emu.url}, "x")._request(
            "GET", f"/api/v1/events?fieldSelector=involvedObject.kind%3DNode,involvedObject."
            f"name%3D{cordoned},involvedObject.uid%3D{cordoned}")["items"]
        assert "GpuprovCordon" in {e["reason"] for e in found}
        # ack writes the dated annotation the agent reads
        assert main(["health", "ack", "gpu-pascal", "--kubeconfig", kubeconfig,
                     "--reason", "reseated"]) == 0
        annotations = Client({"server": emu.url}, "gpu-pascal").get_node()["metadata"][
            "annotations"]
        assert json.loads(annotations[fleet.ACK_ANNOTATION])["reason"] == "reseated"
        assert main(["health", "ack", "gpu-pascal", "--kubeconfig", kubeconfig,
                     "--reason", "x", "--verified-at", "2999-01-01T00:00:00Z"]) == 2
        assert "future" in capsys.readouterr().err


def test_verify_k8s_health_fails_with_the_conditions_message():
    from gpuprov.verify import runner  # noqa: F401 (registers the cluster checks)
    from gpuprov.verify.checks import k8s
    from gpuprov.verify.facts import ClusterFacts
    from gpuprov.verify.node_phase import NodeSettings

    settings = NodeSettings("a", gpu_expected=True)
    bad = k8s.health(ClusterFacts(settings, None, node("a", True)))
    assert bad.status == "problem" and "evidence ev-1-7" in bad.message
    assert k8s.health(ClusterFacts(settings, None, node("a", False))).status == "pass"
    assert k8s.health(ClusterFacts(settings, None, node("a", agent=False))).status == "skip"


def test_status_line_shows_the_nodes_health():
    from gpuprov.commands import status

    line = status._health_line(fleet.node_health(node("a", True, unschedulable=True)))
    assert line.startswith(", health GPUFault, cordoned by admin (gpuprov.io/GPUFault XID79")
    assert status._health_line(fleet.node_health(node("a"))) == ", health ok"
    assert status._health_line(None) == ""


def test_show_json_lists_every_fault_from_the_agents_annotation():
    s = hs.State()
    hs.step(s, hs.Started("b", 0))
    for gpu in range(3):
        hs.step(s, hs.XidSeen(f"0000:0{gpu}:00", 79, "fallen off the bus", 10 + gpu))
    faulty = node("gpu-1", fault=True)
    faulty["metadata"]["annotations"][hs.FAULTS_ANNOTATION] = json.dumps(hs.fault_records(s))
    doc = fleet.node_health(faulty).to_json()
    assert [(f["reason"], f["gpu"]) for f in doc["faults"]] == [
        ("XID79", "0000:00:00"), ("XID79", "0000:01:00"), ("XID79", "0000:02:00")]
    faulty["metadata"]["annotations"][hs.FAULTS_ANNOTATION] = "not json"
    assert fleet.node_health(faulty).to_json()["faults"] == []
