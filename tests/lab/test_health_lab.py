"""Continuous GPU health on the converged lab (issue 33): the agents that site.yml's gpu_health
role installed, faults in the nodes' simulated kernel logs and NVML, the gpuprov.io/
conditions they publish with each node's kubelet identity, and `gpuprov health remediate`,
`ack` and `show` against the emulated API, as an admin runs them.

The tests run in order on the session lab and build on each other (a fault raised, the agent
restarted, the node cordoned, acknowledged, given back); the module's fixture gives the lab
back healthy whatever failed (conftest.settle_health)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import clear_faults, health_problems, kube_api, reload_agents
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from gpuprov import cordon
from gpuprov.health import fleet
from gpuprov.lab.kube.testing import wait_for

GPU_NODES = ("gpu-kepler", "gpu-pascal", "gpu-hopper")
GPU_FAULT = "gpuprov.io/GPUFault"
AGENT = "gpuprov-health-agent"
METRICS = "/var/lib/node_exporter/textfile_collector/gpuprov_health.prom"


@pytest.fixture(scope="module")
def core(lab, site_run):
    rc, _ = site_run
    assert rc == 0, "site.yml failed on the lab; see test_site_playbook"
    yield client.CoreV1Api(kube_api(lab))
    # Whatever failed: no fault, no condition, no cordon of this module's left behind.
    clear_faults(lab)
    run_gpuprov(lab, "health", "remediate", "--once")
    for name in GPU_NODES:
        node = client.CoreV1Api(kube_api(lab)).read_node(name)
        if node.spec.unschedulable:
            client.CoreV1Api(kube_api(lab)).patch_node(name, {"spec": {"unschedulable": None}})


def run_gpuprov(lab, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuprov", *argv, "-i",
                           str(lab.inventory_path)], capture_output=True, text=True,
                          timeout=timeout)


def ssh(lab, node: str, command: str) -> str:
    proc = subprocess.run(lab.ssh_command(lab.require().node(node), command),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{node}: {command}: {proc.stderr}"
    return proc.stdout


def condition(core, node: str, ctype: str = GPU_FAULT):
    return next((c for c in core.read_node(node).status.conditions or [] if c.type == ctype),
                None)


def cordoned(core) -> set[str]:
    return {n.metadata.name for n in core.list_node().items if n.spec.unschedulable}


def gpus(core, node: str) -> tuple[int, int]:
    status = core.read_node(node).status
    return (int((status.capacity or {}).get("nvidia.com/gpu", 0)),
            int((status.allocatable or {}).get("nvidia.com/gpu", 0)))


def written_by_remediate(node) -> tuple:
    """The parts of a Node that remediate writes: its spec (unschedulable, taints) and metadata."""
    return (node.spec.to_dict(), node.metadata.labels, node.metadata.annotations)


def remediate_events(core, node: str) -> list[str]:
    """The Events remediate posted about a node (one per action it took), by name."""
    return sorted(e.metadata.name for e in core.list_namespaced_event("default").items
                  if e.involved_object.name == node and (e.reason or "").startswith("Gpuprov"))


def test_the_agent_runs_on_every_gpu_node_and_not_on_cpu_only(lab, core):
    for node in GPU_NODES:
        assert ssh(lab, node, f"systemctl is-active {AGENT}").strip() == "active", node
    state = subprocess.run(lab.ssh_command(lab.require().node("cpu-only"),
                                           f"systemctl is-active {AGENT}"),
                           capture_output=True, text=True, timeout=60)
    assert state.stdout.strip() in ("inactive", "unknown") and state.returncode != 0
    # Every GPU node publishes its four conditions, all False; cpu-only none.
    for node in GPU_NODES:
        wait_for(lambda n=node: condition(core, n), f"{node}'s GPUFault condition", 90)
        types = {c.type: c.status for c in core.read_node(node).status.conditions
                 if c.type.startswith("gpuprov.io/")}
        assert set(types.values()) == {"False"} and GPU_FAULT in types, (node, types)
    assert not [c for c in core.read_node("cpu-only").status.conditions or []
                if c.type.startswith("gpuprov.io/")]


def test_xid_79_on_gpu_pascal_raises_gpufault_there_and_nowhere_else(lab, core):
    before = condition(core, "gpu-pascal")
    started = time.time()
    lab.fault("gpu-pascal", "xid-79", gpu_index=0)
    raised = wait_for(lambda: (c := condition(core, "gpu-pascal")) and c.status == "True" and c,
                      "GPUFault True on gpu-pascal", 30)
    latency = time.time() - started
    print(f"xid-79 written -> GPUFault True in the API: {latency:.2f} s")
    assert raised.reason == "XID79"
    assert "GPU 0 (GPU-" in raised.message and "XID 79" in raised.message, raised.message
    assert raised.last_transition_time > before.last_transition_time
    assert health_problems(core) == {"gpu-pascal": [GPU_FAULT]}


def test_restarting_the_agent_keeps_the_condition(lab, core):
    raised = condition(core, "gpu-pascal")
    ssh(lab, "gpu-pascal", f"systemctl restart {AGENT}")
    reload_agents(lab, ["gpu-pascal"])  # a full check cycle after the restart
    time.sleep(3)
    after = condition(core, "gpu-pascal")
    assert (after.status, after.reason, after.last_transition_time) == \
        ("True", "XID79", raised.last_transition_time)


def test_the_metrics_file_counts_the_injected_xid(lab, core):
    text = ssh(lab, "gpu-pascal", f"cat {METRICS}")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    xids = [(s.labels["xid"], s.value) for s in families["gpuprov_health_xid_records"].samples
            if s.name.endswith("_total")]
    assert xids == [("79", 1.0)], xids
    conditions = {s.labels["condition"]: s.labels["status"]
                  for s in families["gpuprov_health_condition"].samples if s.value == 1}
    assert conditions[GPU_FAULT] == "True"


def test_remediate_once_cordons_gpu_pascal_and_a_second_run_changes_nothing(lab, core):
    first = run_gpuprov(lab, "health", "remediate", "--once")
    assert first.returncode == 0, first.stderr
    assert "cordon gpu-pascal" in first.stdout, first.stdout
    node = core.read_node("gpu-pascal")
    assert node.spec.unschedulable
    annotations = node.metadata.annotations or {}
    record = {k: v for k, v in annotations.items() if k.startswith("gpuprov.io/health-remediate")}
    assert any("XID79" in v for v in record.values()), record
    assert cordoned(core) == {"gpu-pascal"}
    events = remediate_events(core, "gpu-pascal")
    assert events, "the cordon left no Gpuprov* event"
    second = run_gpuprov(lab, "health", "remediate", "--once")
    assert second.returncode == 0 and "cordon" not in second.stdout, second.stdout
    assert remediate_events(core, "gpu-pascal") == events
    # What remediate writes (spec, labels, annotations) is as the first run left it. The
    # resourceVersion is not compared: the kubelet and the health agent write the node's status
    # meanwhile (the device plugin takes the XID's GPU out of allocatable when it sees it).
    assert written_by_remediate(core.read_node("gpu-pascal")) == written_by_remediate(node)
    shown = json.loads(run_gpuprov(lab, "health", "show", "--json").stdout)
    pascal = next(n for n in shown["nodes"] if n["node"] == "gpu-pascal")
    assert pascal["state"] != "ok" and pascal["cordoned_by"] == "gpuprov"


def test_ack_clears_the_fault_the_next_run_uncordons_and_restarts_the_stuck_plugin(lab, core):
    lab.fault("gpu-pascal", "xid-79", clear=True)  # the GPU is back (reseated)
    time.sleep(2)
    # The device plugin marked GPU 0 unhealthy for the XID and never takes it back.
    assert gpus(core, "gpu-pascal") == (4, 3)
    ack = run_gpuprov(lab, "health", "ack", "gpu-pascal", "--reason", "reseated GPU 0")
    assert ack.returncode == 0, ack.stderr
    reload_agents(lab, ["gpu-pascal"])
    wait_for(lambda: condition(core, "gpu-pascal").status == "False", "GPUFault False", 30)
    released = run_gpuprov(lab, "health", "remediate", "--once")
    assert "release gpu-pascal" in released.stdout, released.stdout
    assert "restart" in released.stdout and "gpu-pascal" in released.stdout, released.stdout
    assert not core.read_node("gpu-pascal").spec.unschedulable
    assert not [k for k in core.read_node("gpu-pascal").metadata.annotations or {}
                if k.startswith("gpuprov.io/health-remediate")]
    wait_for(lambda: gpus(core, "gpu-pascal") == (4, 4), "allocatable 4 after the restart", 60)


def test_brakes_cordon_one_of_three_faulty_nodes_and_hold_the_others(lab, core):
    for node in GPU_NODES:
        lab.fault(node, "row-remap-pending", gpu_index=0)
    reload_agents(lab, GPU_NODES)
    wait_for(lambda: set(health_problems(core)) == set(GPU_NODES),
             "GPUFault on the three GPU nodes", 60)
    run = run_gpuprov(lab, "health", "remediate", "--once", "--max-unavailable", "1")
    assert run.returncode == 0, run.stderr
    assert len(cordoned(core)) == 1, run.stdout
    held = [line for line in run.stdout.splitlines() if line.startswith("hold")]
    taken = cordoned(core)
    assert len(held) == 2 and not taken & {line.split()[1].rstrip(":") for line in held}, \
        run.stdout
    # The faults clear: the nodes come back, the brake releases by itself.
    clear_faults(lab)
    run = run_gpuprov(lab, "health", "remediate", "--once", "--max-unavailable", "1")
    assert cordoned(core) == set(), run.stdout


def test_a_node_an_admin_cordoned_stays_cordoned_after_it_recovers(lab, core):
    core.patch_node("gpu-kepler", {"spec": {"unschedulable": True}})
    try:
        lab.fault("gpu-kepler", "row-remap-pending", gpu_index=0)
        reload_agents(lab, ["gpu-kepler"])
        wait_for(lambda: condition(core, "gpu-kepler").status == "True", "GPUFault on kepler", 60)
        run_gpuprov(lab, "health", "remediate", "--once")
        annotations = core.read_node("gpu-kepler").metadata.annotations or {}
        assert annotations.get(cordon.keys(fleet.OWNER).was_cordoned) == "true", annotations
        clear_faults(lab)
        released = run_gpuprov(lab, "health", "remediate", "--once")
        assert core.read_node("gpu-kepler").spec.unschedulable, released.stdout
    finally:
        core.patch_node("gpu-kepler", {"spec": {"unschedulable": None}})


def test_containerd_config_rewritten_raises_runtimeproblem_and_clears_after_the_fix(lab, core):
    runtime = "gpuprov.io/RuntimeProblem"
    lab.fault("gpu-hopper", "containerd-config-rewritten")
    try:
        reload_agents(lab, ["gpu-hopper"])
        raised = wait_for(lambda: (c := condition(core, "gpu-hopper", runtime))
                          and c.status == "True" and c, "RuntimeProblem on gpu-hopper", 60)
        assert raised.reason == "runtime.nvidia", raised
        assert health_problems(core) == {"gpu-hopper": [runtime]}
        # Not acted on by remediation (RuntimeProblem is reported, not cordoned for).
        assert "cordon gpu-hopper" not in run_gpuprov(lab, "health", "remediate", "--once").stdout
    finally:
        lab.fault("gpu-hopper", "containerd-config-rewritten", clear=True)
    # An ongoing problem clears after gpu_health_clear_after_passes passing cycles: no ack.
    deadline = time.monotonic() + 45
    while condition(core, "gpu-hopper", runtime).status != "False" \
            and time.monotonic() < deadline:
        reload_agents(lab, ["gpu-hopper"])
        time.sleep(1.0)
    assert condition(core, "gpu-hopper", runtime).status == "False"
