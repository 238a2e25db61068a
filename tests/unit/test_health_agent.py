"""The health agent (gpuprov/node/health/agent.py) against the lab's emulated API server: the
kernel log followed into a node condition, a restart that keeps it, an ack that clears it; the
payload script run by a bare python3; metrics parsed by prometheus_client's own parser."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuprov import payload
from gpuprov.lab.kube.testing import running_emulator, wait_for
from gpuprov.node.health import agent as agent_module
from gpuprov.node.health import state as hs
from gpuprov.node.health.kube import Client
from gpuprov.verify import inventory, node_phase

REPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "verify" / "probe"
XID79 = "NVRM: Xid (PCI:{pci}): 79, pid=1234, name=python3, GPU has fallen off the bus."


def report(name: str = "gpu-pascal") -> dict:
    return json.loads((REPORTS / f"{name}.json").read_text())


def first_pci(rep: dict) -> str:
    return agent_module._short_pci(rep["nvml"]["gpus"][0]["pci_bus_id"])


def evaluate(settings, rep, skip=()):
    return node_phase._agent_evaluate(settings, rep, skip)


def make_agent(tmp_path: Path, url: str | None, name: str = "gpu-pascal",
               rep: dict | None = None) -> agent_module.Agent:
    kmsg = tmp_path / "kmsg"
    if not kmsg.exists():
        kmsg.write_text("6,0,0,-;Linux version (test)\n")
    config = agent_module.Config(
        node_name=name, state_dir=str(tmp_path / "state"), interval_s=0.3, kmsg=str(kmsg),
        kube={"server": url} if url else None, textfile_dir=str(tmp_path),
        settings={"gpu_expected": True})
    rep = rep or report(name)
    return agent_module.Agent(config, evaluate, collect=lambda root: rep)


def node_condition(url: str, node: str, ctype: str = hs.GPU_FAULT) -> dict | None:
    conditions = Client({"server": url}, node).get_node()["status"].get("conditions") or []
    return next((c for c in conditions if c["type"] == ctype), None)


def run_in_thread(agent: agent_module.Agent) -> threading.Thread:
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    return thread


def test_node_settings_are_the_inventory_nodes_fields():
    fields = {f.name: f.default for f in dataclasses.fields(inventory.Node)}
    for f in dataclasses.fields(node_phase.NodeSettings):
        assert f.name in fields
        if f.name not in ("name", "gpu_expected"):  # the inventory's are required
            assert f.default == fields[f.name], f.name


REAL_H200 = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "h200-580.159.04-board2"


@pytest.mark.parametrize("name", ["gpu-pascal", "gpu-hopper", "cpu-only", "real-h200"])
def test_every_node_check_runs_on_the_agents_settings(name):
    # The agent gives the checks a NodeSettings, verify an inventory Node: a check that reads
    # a field NodeSettings lacks crashes only in the agent (driver.security did, on the H200).
    rep = (json.loads((REAL_H200 / "probe.json").read_text()) if name == "real-h200"
           else report(name))
    settings = {"name": name, "gpu_expected": name != "cpu-only",
                "driver_allow_vulnerable": True}
    findings = evaluate(settings, rep)
    assert findings and all(f["status"] != "error" for f in findings), \
        [f for f in findings if f["status"] == "error"]


def test_check_now_reads_an_ack_without_waiting_for_the_interval(tmp_path):
    # `systemctl reload gpuprov-health-agent` (SIGHUP) runs a cycle at once: with an hour's
    # interval, only check_now() can clear the acknowledged fault within the wait.
    pci = first_pci(report())
    with running_emulator() as emu:
        agent = make_agent(tmp_path, emu.url)
        agent.config = dataclasses.replace(agent.config, interval_s=3600.0)
        thread = run_in_thread(agent)
        with open(tmp_path / "kmsg", "a") as f:
            f.write(f"3,7,5000000,-;{XID79.format(pci=pci)}\n")
        wait_for(lambda: (node_condition(emu.url, "gpu-pascal") or {}).get("status") == "True",
                 "GPUFault True")
        ack = {"id": "t", "at": time.time(), "by": "admin", "reason": "reseated"}
        Client({"server": emu.url}, "gpu-pascal")._request(
            "PATCH", "/api/v1/nodes/gpu-pascal",
            {"metadata": {"annotations": {agent_module.ACK_ANNOTATION: json.dumps(ack)}}},
            "application/merge-patch+json")
        time.sleep(1.5)
        assert node_condition(emu.url, "gpu-pascal")["status"] == "True"  # not read yet
        agent.check_now()
        wait_for(lambda: node_condition(emu.url, "gpu-pascal")["status"] == "False",
                 "GPUFault False after check_now", timeout=10)
        agent.stop()
        thread.join(5)


def test_xid_from_the_kernel_log_to_the_condition_restart_keeps_it_ack_clears(tmp_path):
    rep = report()
    pci = first_pci(rep)
    with running_emulator() as emu:
        agent = make_agent(tmp_path, emu.url)
        thread = run_in_thread(agent)
        wait_for(lambda: (node_condition(emu.url, "gpu-pascal") or {}).get("status") == "False",
                 "the first cycle publishes False")
        before = node_condition(emu.url, "gpu-pascal")
        with open(tmp_path / "kmsg", "a") as f:
            f.write(f"3,7,5000000,-;{XID79.format(pci=pci)}\n")
        raised = wait_for(lambda: (c := node_condition(emu.url, "gpu-pascal"))
                          and c["status"] == "True" and c, "GPUFault True")
        assert raised["reason"] == "XID79"
        assert rep["nvml"]["gpus"][0]["uuid"] in raised["message"]
        # Every fault in full, beside the condition's message (which has 1024 characters).
        annotations = Client({"server": emu.url}, "gpu-pascal").get_node()["metadata"][
            "annotations"]
        [record] = json.loads(annotations[hs.FAULTS_ANNOTATION])
        assert (record["reason"], record["gpu"], record["uuid"], record["index"]) == \
            ("XID79", pci, rep["nvml"]["gpus"][0]["uuid"], 0)
        assert raised["lastTransitionTime"] >= before["lastTransitionTime"]
        others = [node_condition(emu.url, n) for n in ("gpu-kepler", "gpu-hopper")]
        assert others == [None, None]
        # Kubelet-owned conditions are untouched: only gpuprov.io/ types were written.
        kinds = {c["type"] for c in Client({"server": emu.url}, "gpu-pascal")
                 .get_node()["status"]["conditions"]}
        assert "Ready" in kinds
        agent.stop()
        thread.join(5)

        # Restart: the same boot, the same kernel log (read again from its oldest record).
        again = make_agent(tmp_path, emu.url)
        again.start()
        assert node_condition(emu.url, "gpu-pascal")["status"] == "True"
        assert node_condition(emu.url, "gpu-pascal")["lastTransitionTime"] == \
            raised["lastTransitionTime"]
        thread = run_in_thread(again)
        time.sleep(1.0)
        assert again.state.faults[f"xid:79:{pci}"].count == 1  # not counted twice
        assert node_condition(emu.url, "gpu-pascal")["status"] == "True"

        # The admin's dated ack (what `gpuprov health ack` writes) clears it.
        ack = {"id": "test-1", "at": time.time(), "by": "admin", "reason": "reseated"}
        Client({"server": emu.url}, "gpu-pascal")._request(
            "PATCH", "/api/v1/nodes/gpu-pascal",
            {"metadata": {"annotations": {agent_module.ACK_ANNOTATION: json.dumps(ack)}}},
            "application/merge-patch+json")
        wait_for(lambda: node_condition(emu.url, "gpu-pascal")["status"] == "False",
                 "GPUFault False after the ack")
        wait_for(lambda: Client({"server": emu.url}, "gpu-pascal").get_node()["metadata"][
            "annotations"][hs.FAULTS_ANNOTATION] == "[]", "no fault in the annotation")
        again.stop()
        thread.join(5)
    families = {f.name: f for f in text_string_to_metric_families(
        (tmp_path / agent_module.METRICS_FILE).read_text())}
    xids = families["gpuprov_health_xid_records"].samples
    assert [(s.labels["xid"], s.labels["pci"], s.value) for s in xids
            if s.name.endswith("_total")] == [("79", pci, 1.0)]
    evidence = [json.loads(line) for line in
                (tmp_path / "state" / "evidence.jsonl").read_text().splitlines()]
    assert evidence[0]["reason"] == "XID79" and XID79.format(pci=pci) in \
        evidence[0]["kernel_log"][0]


def test_a_failing_check_is_a_level_fault_with_its_condition(tmp_path):
    rep = report()
    rep["nvml"]["gpus"][1]["ecc"]["volatile"]["uncorrected"] = 2
    with running_emulator() as emu:
        agent = make_agent(tmp_path, emu.url, rep=rep)
        agent.start()
        agent.run_cycle()
        condition = node_condition(emu.url, "gpu-pascal")
        assert condition["status"] == "True" and condition["reason"] == "gpu.ecc"
        rep["nvml"]["gpus"][1]["ecc"]["volatile"]["uncorrected"] = 0
        for _ in range(hs.CLEAR_AFTER_PASSES - 1):
            agent.run_cycle()
            assert node_condition(emu.url, "gpu-pascal")["status"] == "True"
        agent.run_cycle()
        assert node_condition(emu.url, "gpu-pascal")["status"] == "False"


def test_a_skip_clears_only_while_nvml_answers(tmp_path):
    # driver.next-boot failed for a kernel in /boot; the kernel is removed, the check then
    # skips ("no kernel image in /boot"): nothing is left to worry about, the fault clears.
    # While NVML does not answer, the GPU checks skip for want of evidence: a fault stays.
    script = {"nvml.init": "pass", "driver.next-boot": "fail", "gpu.ecc": "fail"}

    def scripted(settings, rep, skip=()):
        return [{"check": c, "status": s, "message": s} for c, s in script.items()]

    agent = agent_module.Agent(make_agent(tmp_path, None).config, scripted,
                               collect=lambda root: report())
    agent.start()
    agent.run_cycle()
    assert {"check:driver.next-boot", "check:gpu.ecc"} <= set(agent.state.faults)
    script.update({"nvml.init": "fail", "driver.next-boot": "skip", "gpu.ecc": "skip"})
    for _ in range(hs.CLEAR_AFTER_PASSES + 1):
        agent.run_cycle()
    assert {"check:driver.next-boot", "check:gpu.ecc"} <= set(agent.state.faults)
    script.update({"nvml.init": "pass"})
    for _ in range(hs.CLEAR_AFTER_PASSES):
        agent.run_cycle()
    assert "check:driver.next-boot" not in agent.state.faults
    assert "check:gpu.ecc" not in agent.state.faults
    assert agent.check_status["driver.next-boot"] == "skip"  # the metrics say what it said


def test_remove_conditions_takes_only_its_own(tmp_path):
    with running_emulator() as emu:
        agent = make_agent(tmp_path, emu.url)
        agent.start()
        agent.run_cycle()
        client = Client({"server": emu.url}, "gpu-pascal")
        assert hs.FAULTS_ANNOTATION in client.get_node()["metadata"]["annotations"]
        client.delete_conditions(list(hs.CONDITION_TYPES))
        client.patch_annotation(hs.FAULTS_ANNOTATION, None)
        node = client.get_node()
        kinds = {c["type"] for c in node["status"]["conditions"]}
        assert not any(k.startswith(hs.PREFIX) for k in kinds) and "Ready" in kinds
        assert hs.FAULTS_ANNOTATION not in (node["metadata"].get("annotations") or {})
    with pytest.raises(ValueError):
        Client({"server": "http://127.0.0.1:1"}, "x").patch_annotation("other.io/x", "1")
    with pytest.raises(ValueError):
        Client({"server": "http://127.0.0.1:1"}, "x").patch_conditions([{"type": "Ready"}])


def test_the_payload_runs_the_agent_with_a_bare_python3(tmp_path):
    script = tmp_path / "agent.py"
    script.write_bytes(payload.node_script("health-agent"))
    (tmp_path / "kmsg").write_text("6,0,0,-;Linux\n")
    config = tmp_path / "health.json"
    config.write_text(json.dumps({"node_name": "here", "state_dir": str(tmp_path / "state"),
                                  "kmsg": str(tmp_path / "kmsg"),
                                  "textfile_dir": str(tmp_path)}))
    run = subprocess.run([sys.executable, "-I", str(script), "agent", "--config", str(config),
                          "--once"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    published = json.loads((tmp_path / "state" / "conditions.json").read_text())
    assert [c["type"] for c in published["conditions"]] == list(hs.CONDITION_TYPES)
    families = {f.name for f in text_string_to_metric_families(
        (tmp_path / agent_module.METRICS_FILE).read_text())}
    assert {"gpuprov_health_check_status", "gpuprov_health_condition"} <= families
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"node_name": "x", "nonsense": 1}))
    run = subprocess.run([sys.executable, "-I", str(script), "agent", "--config", str(bad),
                          "--once"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 2 and "unknown setting(s) nonsense" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_reset_record_then_the_gpu_answering_clears_its_xid(tmp_path):
    from gpuprov.node.health import kmsg

    rep = report()
    pci, uuid = first_pci(rep), rep["nvml"]["gpus"][0]["uuid"]
    agent = make_agent(tmp_path, None, rep=rep)
    agent.start()
    agent.run_cycle()  # learns the GPUs' UUIDs
    agent.handle_record(kmsg.Record(7, 1, 3, XID79.format(pci=pci)))
    reset = f"GPU reset executed: {uuid}, success: true"
    assert agent.handle_record(kmsg.Record(8, 2, 4, reset))[0]["event"] == "reset-reported"
    lost = json.loads(json.dumps(rep))
    lost["nvml"]["gpus"][0] = {"index": 0, "error": {"code": 15, "name": "NVML_ERROR_GPU_IS_LOST"}}
    agent.collect = lambda root: lost
    agent.run_cycle()  # the GPU did not come back: a failed reset, the fault stays
    assert f"xid:79:{pci}" in agent.state.faults and not agent.state.pending_resets
    assert agent.handle_record(kmsg.Record(9, 3, 4, reset))[0]["event"] == "reset-reported"
    agent.save()  # as the loop does after each batch of records
    again = make_agent(tmp_path, None, rep=rep)  # restarted before the next cycle
    again.start()
    assert again.handle_record(kmsg.Record(9, 3, 4, reset)) == []  # read again: once only
    assert again.state.pending_resets == {pci: again.state.pending_resets[pci]}
    again.run_cycle()
    # The XID is gone; the GPU count the lost GPU failed clears by its own rule (passes).
    assert list(again.state.faults) == ["check:nvml.gpu-count"]
    # A reset of a GPU this node does not have changes nothing.
    assert again.handle_record(kmsg.Record(10, 4, 4, "GPU reset executed: GPU-0000")) == []
