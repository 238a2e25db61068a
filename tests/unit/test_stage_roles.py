"""The gpu_node_labels and nvidia_device_plugin roles against the emulated Kubernetes API.

playbooks/labels.yml then playbooks/device_plugin.yml (site.yml's order, through
tests/fixtures/stages/site.yml) run with ansible-playbook on hosts that stand for the lab's
nodes: local connections whose probe reports are the recorded ones
(tests/fixtures/verify/probe), against the in-process emulator whose nodes have the same names
and GPU counts. Each run: --check --diff on the fresh cluster (nothing may change), the real
run, a second run (changed=0), and --check --diff again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from gpuprov.lab.kube.app import write_kubeconfig
from gpuprov.lab.kube.backend import FakeBackend, FakeNode, Gpu
from gpuprov.lab.kube.testing import (
    NVIDIA_CONTAINERD,
    PLAIN_CONTAINERD,
    fake_uuids,
    running_emulator,
)

ROOT = Path(__file__).resolve().parents[2]
PROBES = ROOT / "tests" / "fixtures" / "verify" / "probe"
STAGES = ROOT / "tests" / "fixtures" / "stages" / "site.yml"
PLAYBOOK_BIN = Path(sys.executable).parent / "ansible-playbook"
NODES = ("gpu-kepler", "gpu-pascal", "gpu-hopper", "cpu-only")
# PreferNoSchedule: the plugin (which tolerates only nvidia.com/gpu, as upstream) still runs there.
FOREIGN_TAINT = {"key": "dedicated", "value": "ml", "effect": "PreferNoSchedule"}


def _inventory(path: Path, kubeconfig: Path, **extra_vars) -> Path:
    hosts = {}
    for name in NODES:
        report = json.loads((PROBES / f"{name}.json").read_text())
        hosts[name] = {"gpu_preflight_probe": report, "gpu_preflight_has_gpu": bool(report["pci"])}
    hosts["gpu-hopper"]["gpu_node_labels_taint"] = True
    doc = {"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "k8s_kubeconfig": str(kubeconfig), "gpu_node_labels_reprobe": False,
                 "nvidia_device_plugin_wait_delay": 1,
                 "nvidia_device_plugin_wait_retries": 20, **extra_vars},
        "children": {"k8s_cluster": {"children": {
            "gpu_nodes": {"hosts": {n: hosts[n] for n in NODES if n != "cpu-only"}},
            "cpu_nodes": {"hosts": {"cpu-only": hosts["cpu-only"]}}}}}}}
    path.write_text(yaml.safe_dump(doc))
    return path


def _play(inventory: Path, *args: str) -> dict:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    proc = subprocess.run([str(PLAYBOOK_BIN), "-i", str(inventory), str(STAGES), *args],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    result = json.loads(proc.stdout)
    result["rc"] = proc.returncode
    result["stderr"] = proc.stderr
    return result


def _changed(result: dict) -> dict[str, int]:
    return {host: stats["changed"] for host, stats in result["stats"].items()}


def _failures(result: dict) -> list[str]:
    msgs = []
    for play in result["plays"]:
        for task in play["tasks"]:
            for host, res in task["hosts"].items():
                if res.get("failed"):
                    msgs.append(f"{host}: {task['task']['name']}: {res.get('msg')}")
    return msgs


def _core(kubeconfig: Path) -> client.CoreV1Api:
    from kubernetes import config
    return client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not PLAYBOOK_BIN.exists():
        pytest.skip("ansible-playbook is not installed next to this Python")
    tmp = tmp_path_factory.mktemp("stages")
    with running_emulator() as emu:
        kubeconfig = write_kubeconfig(tmp / "kubeconfig", emu.url)
        core = _core(kubeconfig)
        # Labels as another tool, and an earlier gpuprov run, left them.
        core.patch_node("gpu-pascal", {"metadata": {"labels": {
            "team": "ml", "nvidia.com/gpu.replicas": "1",  # GFD's, not gpuprov's
            "nvidia.com/cuda.driver-version.full": "470.1.1"}}})  # stale
        core.patch_node("cpu-only", {"metadata": {"labels": {
            "gputype": "k80", "nvidia.com/gpu.memory": "11441", "nvidia.com/gpu.present": "true"}}})
        core.patch_node("gpu-hopper", {"spec": {"taints": [FOREIGN_TAINT]}})
        inventory = _inventory(tmp / "hosts.yml", kubeconfig)
        runs = {}
        for name, args in (("check_fresh", ("--check", "--diff")), ("apply", ()),
                           ("again", ()), ("check_again", ("--check", "--diff"))):
            if name == "apply":
                runs["after_check"] = {n: core.read_node(n).to_dict() for n in NODES}
            runs[name] = _play(inventory, *args)
            assert runs[name]["rc"] == 0, (name, _failures(runs[name]),
                                           runs[name]["stderr"][-2000:])
        runs["nodes"] = {n: core.read_node(n).to_dict() for n in NODES}
        apps = client.AppsV1Api(core.api_client)
        runs["daemonsets"] = apps.list_namespaced_daemon_set("kube-system").to_dict()["items"]
        yield runs


def test_check_mode_on_a_fresh_cluster_reports_changes_and_makes_none(cluster):
    assert _changed(cluster["check_fresh"])["gpu-pascal"] >= 1
    # 3 GPU nodes' labels, cpu-only's stale ones, the DaemonSet
    assert sum(_changed(cluster["check_fresh"]).values()) >= 5
    before = cluster["after_check"]
    assert "gputype" not in before["gpu-pascal"]["metadata"]["labels"]
    assert before["cpu-only"]["metadata"]["labels"]["gputype"] == "k80"


def test_second_run_and_check_mode_change_nothing(cluster):
    assert sum(_changed(cluster["apply"]).values()) >= 4
    assert _changed(cluster["again"]) == dict.fromkeys(NODES, 0)
    assert _changed(cluster["check_again"]) == dict.fromkeys(NODES, 0)


def test_gpu_nodes_get_the_computed_labels(cluster):
    labels = cluster["nodes"]["gpu-pascal"]["metadata"]["labels"]
    assert labels["gputype"] == "p100"
    assert labels["nvidia.com/gpu.product"] == "Tesla-P100-PCIE-16GB"
    assert labels["nvidia.com/gpu.family"] == "pascal"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/cuda.driver-version.full"] == "535.261.03"  # the stale value fixed
    assert cluster["nodes"]["gpu-kepler"]["metadata"]["labels"]["gputype"] == "k80"
    assert cluster["nodes"]["gpu-hopper"]["metadata"]["labels"]["gputype"] == "h100"


def test_labels_gpuprov_does_not_own_are_kept(cluster):
    labels = cluster["nodes"]["gpu-pascal"]["metadata"]["labels"]
    assert labels["team"] == "ml"
    assert labels["nvidia.com/gpu.replicas"] == "1"
    assert labels["kubernetes.io/hostname"] == "gpu-pascal"


def test_a_node_without_gpus_loses_stale_gpu_labels(cluster):
    labels = cluster["nodes"]["cpu-only"]["metadata"]["labels"]
    assert not {"gputype", "nvidia.com/gpu.memory", "nvidia.com/gpu.present"} & set(labels)
    assert labels["kubernetes.io/hostname"] == "cpu-only"


def test_taint_is_added_next_to_existing_taints_where_enabled(cluster):
    taints = [{k: t[k] for k in ("key", "value", "effect")}
              for t in cluster["nodes"]["gpu-hopper"]["spec"]["taints"]]
    assert FOREIGN_TAINT in taints
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in taints
    assert not cluster["nodes"]["gpu-pascal"]["spec"].get("taints")


def test_device_plugin_registers_on_every_gpu_node(cluster):
    (ds,) = cluster["daemonsets"]
    assert ds["metadata"]["name"] == "nvidia-device-plugin-daemonset"
    assert ds["spec"]["template"]["spec"]["node_selector"] == {"nvidia.com/gpu.present": "true"}
    assert ds["status"]["desired_number_scheduled"] == 3
    alloc = {n: cluster["nodes"][n]["status"]["allocatable"].get("nvidia.com/gpu") for n in NODES}
    assert alloc == {"gpu-kepler": "2", "gpu-pascal": "4", "gpu-hopper": "8", "cpu-only": None}


def test_device_plugin_names_the_nodes_that_do_not_register(tmp_path):
    if not PLAYBOOK_BIN.exists():
        pytest.skip("ansible-playbook is not installed next to this Python")
    # gpu-pascal's container runtime has no NVIDIA runtime: the plugin runs but sees no GPU.
    backend = FakeBackend({
        "gpu-kepler": FakeNode([Gpu(u) for u in fake_uuids("gpu-kepler", 2)], NVIDIA_CONTAINERD),
        "gpu-pascal": FakeNode([Gpu(u) for u in fake_uuids("gpu-pascal", 4)], PLAIN_CONTAINERD),
        "gpu-hopper": FakeNode([Gpu(u) for u in fake_uuids("gpu-hopper", 8)], NVIDIA_CONTAINERD),
        "cpu-only": FakeNode([], PLAIN_CONTAINERD),
    })
    with running_emulator(backend) as emu:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", emu.url)
        inventory = _inventory(tmp_path / "hosts.yml", kubeconfig,
                               nvidia_device_plugin_use_runtime_class=False,
                               nvidia_device_plugin_wait_retries=3)
        result = _play(inventory)
    assert result["rc"] == 2
    (failure,) = _failures(result)
    message = failure.split(": ", 2)[2]  # after "<host>: <task>: "
    assert "No allocatable nvidia.com/gpu on: gpu-pascal." in message
    assert "gpu-kepler" not in message and "gpu-hopper" not in message
    assert "No running plugin pod" not in message  # the pod runs; it just finds no GPU


def test_device_plugin_refuses_gpu_nodes_the_daemonset_does_not_select(tmp_path):
    if not PLAYBOOK_BIN.exists():
        pytest.skip("ansible-playbook is not installed next to this Python")
    with running_emulator() as emu:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", emu.url)
        inventory = _inventory(tmp_path / "hosts.yml", kubeconfig)
        result = _play(inventory, "--tags", "device_plugin")  # the labels stage skipped
    assert result["rc"] == 2
    (failure,) = _failures(result)
    message = failure.split(": ", 2)[2]
    assert "GPU nodes without the labels" in message
    assert all(node in message for node in ("gpu-hopper", "gpu-kepler", "gpu-pascal"))
    assert "cpu-only" not in message
    assert "playbooks/labels.yml" in message
