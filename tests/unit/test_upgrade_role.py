"""The gpu_node_upgrade role (playbooks/upgrade-driver.yml) against the emulated Kubernetes API.

ansible-playbook runs playbooks/upgrade-driver.yml's play, less what needs a real node (the
preflight and the fact gathering), on hosts that stand for two of the lab's GPU nodes, against
the in-process emulator (gpuprov/lab/kube/) whose nodes have the same names. The stand-ins are
local hosts whose Python is /bin/false: they run no module, so the first step on a node fails
as on a node that broke after its drain, and no test can install a driver on the machine that
runs it. gpu_preflight's facts come from the inventory (the recorded probe reports of
tests/fixtures/verify/probe, and the branch gpu_preflight's filter chooses from them on Debian
12), the OS facts from gpuprov_test_facts run on the controller.

One story, each run building on the one before (one node per batch unless said):
  1. settings the role refuses: the first node fails before the cluster is asked anything
  2. a target of another branch: the first node fails before it is cordoned
  3. the installed version as the target: both nodes are skipped, nothing changes
  4. a PodDisruptionBudget forbids evicting gpu-pascal's pod (the deprecated name
     upgrade_drain_timeout=5): gpu-pascal stays cordoned with the reason; gpu-hopper is
     untouched
  5. the budget gone, gpu-hopper cordoned by an admin, both nodes in one batch (the deprecated
     upgrade_serial=2): the pod is evicted, then the first step on each node fails; both stay
     cordoned with the reason, each recording what it was before the first run cordoned it
  6. the role's plan and last step alone (tests/fixtures/upgrade/release.yml), the installed
     version as the target: both nodes are unfinished, so not skipped; gpu-pascal is
     uncordoned, gpu-hopper stays cordoned, neither keeps an upgrade annotation
The steps that need a real node (the driver, DCGM, the labels, verify), and the whole play on
a success, are tests/lab/test_upgrade_driver.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from gpuprov.lab.kube.app import write_kubeconfig
from gpuprov.lab.kube.testing import running_emulator, wait_for

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks" / "upgrade-driver.yml"
RELEASE = ROOT / "tests" / "fixtures" / "upgrade" / "release.yml"
PROBES = ROOT / "tests" / "fixtures" / "verify" / "probe"
PLAYBOOK_BIN = Path(sys.executable).parent / "ansible-playbook"
NODES = ("gpu-pascal", "gpu-hopper")  # inventory order: the rollout's
FAILED = "gpuprov.io/upgrade-failed"
WAS_CORDONED = "gpuprov.io/upgrade-was-cordoned"
ROLE = "gpu_node_upgrade : "
MAINTENANCE = "gpu_node_maintenance : "  # the steps the upgrade shares with the MIG stage
TAKE = MAINTENANCE + "Cordon the node, recording why, since when and whether it was cordoned before"
NS = "upgrade-workload"


def _report(node: str) -> dict:
    return json.loads((PROBES / f"{node}.json").read_text())


INSTALLED = _report(NODES[0])["nvml"]["library"]["version"]
# A version of the same branch that the nodes do not have: the target of a real upgrade.
OTHER = INSTALLED.rsplit(".", 1)[0] + f".{int(INSTALLED.rsplit('.', 1)[1]) + 1:02d}"


def _inventory(path: Path, kubeconfig: Path, preflight) -> Path:
    hosts = {}
    for name in NODES:
        report = _report(name)
        assert report["nvml"]["library"]["version"] == INSTALLED, name
        gpus = preflight.gpuprov_probe_gpus(report["pci"])
        choice = preflight.gpuprov_choose_branch([g["pci_id"] for g in gpus], "debian", "12", None)
        hosts[name] = {
            "gpu_preflight_probe": report, "gpu_preflight_gpus": gpus,
            "gpu_preflight_has_gpu": True, "gpu_preflight_driver_branch": choice["branch"],
            "gpu_preflight_open_kernel_modules_supported": choice["open_kernel_modules"],
            "gpu_preflight_open_kernel_modules_required": choice["open_kernel_modules_required"]}
    doc = {"all": {"vars": {"k8s_kubeconfig": str(kubeconfig)}, "children": {"k8s_cluster": {
        "children": {"gpu_nodes": {"hosts": hosts, "vars": {
            # Debian 12's archive's R535, below NVIDIA's later fixes, as the lab accepts it.
            "nvidia_driver_allow_vulnerable": True,
            "ansible_connection": "local", "ansible_python_interpreter": "/bin/false"}}}}}}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _play_under_test(path: Path) -> Path:
    """playbooks/upgrade-driver.yml's play without the preflight and the fact gathering, which
    need a real node; the OS facts from the controller instead. Everything else as written."""
    (play,) = yaml.safe_load(PLAYBOOK.read_text())
    assert [r["role"] for r in play["roles"]] == ["gpu_preflight", "gpu_node_upgrade"]
    play["roles"] = play["roles"][1:]
    play["gather_facts"] = False
    play.pop("gather_subset")
    play["pre_tasks"] = [{"name": "Supply the OS facts from the controller",
                          "gpuprov_test_facts": None, "delegate_to": "localhost"}]
    path.write_text(yaml.safe_dump([play], sort_keys=False))
    return path


def _play(playbook: Path, inventory: Path, *args: str) -> dict:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
           # The test seam, then the roles' own modules (the variable replaces ansible.cfg's).
           "ANSIBLE_LIBRARY": f"{ROOT / 'tests' / 'fixtures' / 'ansible' / 'library'}:"
                              f"{ROOT / 'plugins' / 'modules'}",
           "GPUPROV_TEST_OS": "Debian 12"}
    proc = subprocess.run([str(PLAYBOOK_BIN), "-i", str(inventory), str(playbook), *args],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    result = json.loads(proc.stdout)
    result["rc"] = proc.returncode
    result["stderr"] = proc.stderr
    return result


def _task_hosts(result: dict, name: str) -> dict:
    """{host: result} of the task of that name (role prefix included), across the plays."""
    hosts: dict = {}
    for play in result["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] == name:
                hosts.update(task["hosts"])
    return hosts


def _failures(result: dict) -> dict[str, str]:
    return {host: f"{task['task']['name']}: {res.get('msg')}"
            for play in result["plays"] for task in play["tasks"]
            for host, res in task["hosts"].items() if res.get("failed")}


def _state(core: client.CoreV1Api) -> dict[str, tuple[bool, dict]]:
    """Each GPU node's cordon and upgrade annotations."""
    state = {}
    for name in NODES:
        node = core.read_node(name)
        annotations = node.metadata.annotations or {}
        state[name] = (bool(node.spec.unschedulable),
                       {k: v for k, v in annotations.items() if k in (FAILED, WAS_CORDONED)})
    return state


UNTOUCHED = dict.fromkeys(NODES, (False, {}))


def _start_protected_workload(api: client.ApiClient) -> str:
    """A Job pod on gpu-pascal whose PodDisruptionBudget forbids evicting it; its uid."""
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    core.create_namespace({"metadata": {"name": NS}})
    batch.create_namespaced_job(NS, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "trainer"},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"app": "trainer"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "nodeSelector": {"kubernetes.io/hostname": "gpu-pascal"},
                     "containers": [{"name": "train", "image": "busybox:1.36",
                                     "command": ["sleep", "600"]}]}}}})
    client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(NS, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "trainer"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}}})
    pod = wait_for(lambda: next((p for p in core.list_namespaced_pod(NS).items
                                 if p.status.phase == "Running"), None), "the trainer pod")
    assert pod.spec.node_name == "gpu-pascal"
    # The budget protects the pod once the disruption controller has counted it.
    wait_for(lambda: (client.PolicyV1Api(api).read_namespaced_pod_disruption_budget(
        "trainer", NS).status.current_healthy or 0) >= 1, "the budget's status")
    return pod.metadata.uid


def _pods_on(core: client.CoreV1Api, node: str) -> set[str]:
    return {p.metadata.uid for p in core.list_namespaced_pod(
        NS, field_selector=f"spec.nodeName={node}").items}


@pytest.fixture(scope="module")
def story(tmp_path_factory, ansible_plugin):
    if not PLAYBOOK_BIN.exists():
        pytest.skip("ansible-playbook is not installed next to this Python")
    tmp = tmp_path_factory.mktemp("upgrade")
    preflight = ansible_plugin("filter/gpu_preflight.py")
    playbook = _play_under_test(tmp / "upgrade-driver.yml")
    runs: dict = {}
    with running_emulator() as emu:
        kubeconfig = write_kubeconfig(tmp / "kubeconfig", emu.url)
        api = config.new_client_from_config(str(kubeconfig))
        core = client.CoreV1Api(api)
        inventory = _inventory(tmp / "hosts.yml", kubeconfig, preflight)

        def run(name: str, *args: str, book: Path = playbook) -> None:
            started = time.monotonic()
            runs[name] = _play(book, inventory, *args)
            runs[name]["seconds"] = time.monotonic() - started
            runs[name]["after"] = _state(core)

        run("bad_type", "-e", f"nvidia_driver_version={OTHER}-1",
            "-e", "gpu_node_upgrade_drain_timeout=soon")
        run("bad_value", "-e", f"nvidia_driver_version={OTHER}-1",
            "-e", "gpu_node_upgrade_drain_timeout=0")
        run("bad_target", "-e", "nvidia_driver_version=470.256.02-1")
        run("at_target", "-e", f"nvidia_driver_version={INSTALLED}-1")
        runs["pod"] = _start_protected_workload(api)
        run("blocked", "-e", f"nvidia_driver_version={OTHER}-1", "-e", "upgrade_drain_timeout=5")
        runs["pod_after_blocked"] = runs["pod"] in _pods_on(core, "gpu-pascal")
        client.PolicyV1Api(api).delete_namespaced_pod_disruption_budget("trainer", NS)
        core.patch_node("gpu-hopper", {"spec": {"unschedulable": True}})  # an admin's cordon
        run("node_fails", "-e", f"nvidia_driver_version={OTHER}-1", "-e", "upgrade_serial=2",
            "-e", "upgrade_drain_timeout=30")
        runs["pod_after_node_fails"] = runs["pod"] in _pods_on(core, "gpu-pascal")
        run("release", "-e", f"nvidia_driver_version={INSTALLED}-1", book=RELEASE)
    yield runs


def _only_the_first_node_failed(result: dict) -> str:
    assert result["rc"] == 2, (result["rc"], _failures(result), result["stderr"][-2000:])
    # The first node failed; max_fail_percentage 0 kept the next batch from starting.
    assert list(result["stats"]) == [NODES[0]], result["stats"]
    assert result["stats"][NODES[0]]["failures"] == 1
    return _failures(result)[NODES[0]]


@pytest.mark.parametrize(("run", "message"), [
    ("bad_type", "gpu_node_upgrade_drain_timeout"),
    ("bad_value", "gpu_node_upgrade_drain_timeout (0) must be 1 or more seconds"),
])
def test_settings_the_role_refuses_fail_before_the_cluster_is_asked(story, run, message):
    failure = _only_the_first_node_failed(story[run])
    assert message in failure, failure
    assert _task_hosts(story[run], ROLE + "Read the node from the Kubernetes API") == {}
    assert story[run]["after"] == UNTOUCHED


def test_a_target_of_another_branch_fails_before_the_node_is_cordoned(story):
    failure = _only_the_first_node_failed(story["bad_target"])
    assert "not a version of driver branch 535" in failure, failure
    recorded = _task_hosts(story["bad_target"], TAKE)
    assert recorded == {}
    assert story["bad_target"]["after"] == UNTOUCHED


def test_nodes_at_the_target_are_skipped_without_a_change(story):
    result = story["at_target"]
    assert result["rc"] == 0, _failures(result)
    assert {n: s["changed"] for n, s in result["stats"].items()} == dict.fromkeys(NODES, 0)
    reports = _task_hosts(result, ROLE + "Report the installed driver and the target")
    assert sorted(reports) == sorted(NODES)
    assert all("skip (already there)" in r["msg"] for r in reports.values()), reports
    assert _task_hosts(result, ROLE + "Cordon and drain the node") == {}
    assert result["after"] == UNTOUCHED


def test_a_budget_that_forbids_the_drain_stops_the_rollout_at_that_node(story):
    result = story["blocked"]
    failure = _only_the_first_node_failed(result)
    assert failure.startswith(ROLE + "Stop the rollout: gpu-pascal: driver upgrade failed"), failure
    cordoned, annotations = result["after"]["gpu-pascal"]
    assert cordoned
    assert annotations[WAS_CORDONED] == "false"
    assert annotations[FAILED].startswith("Cordon and drain the node: "), annotations
    # The shared step that cordoned it (the name test_a_target_of_another_branch... looks for).
    assert list(_task_hosts(result, TAKE)) == ["gpu-pascal"]
    assert result["after"]["gpu-hopper"] == (False, {})
    assert story["pod_after_blocked"], "the budget did not protect the pod"
    # upgrade_drain_timeout=5 (the deprecated name) was the timeout k8s_drain got.
    (drain,) = _task_hosts(result, ROLE + "Cordon and drain the node").values()
    assert drain["invocation"]["module_args"]["delete_options"]["wait_timeout"] == 5


def test_a_node_that_fails_after_its_drain_stays_cordoned_with_the_reason(story):
    result = story["node_fails"]
    assert result["rc"] == 2, (_failures(result), result["stderr"][-2000:])
    # upgrade_serial=2 (the deprecated name): both nodes in one batch.
    assert {n: s["failures"] for n, s in result["stats"].items()} == dict.fromkeys(NODES, 1)
    assert not story["pod_after_node_fails"], "the drain did not evict the pod"
    for node in NODES:
        cordoned, annotations = result["after"][node]
        assert cordoned, node
        assert annotations[FAILED].startswith("Find the running host GPU clients"), annotations
    # gpu-pascal was cordoned by the run before, which recorded that it was schedulable;
    # gpu-hopper by an admin.
    assert result["after"]["gpu-pascal"][1][WAS_CORDONED] == "false"
    assert result["after"]["gpu-hopper"][1][WAS_CORDONED] == "true"


def test_an_unfinished_node_is_not_skipped_and_is_given_back_as_it_was(story):
    result = story["release"]
    assert result["rc"] == 0, (_failures(result), result["stderr"][-2000:])
    reports = _task_hosts(result, ROLE + "Report the installed driver and the target")
    assert all(r["msg"].endswith("-> upgrade (an earlier upgrade did not finish)")
               for r in reports.values()), reports
    released = _task_hosts(result, MAINTENANCE + "Give the node back (uncordon only what this "
                                                 "owner cordoned) and remove its record")
    assert sorted(released) == sorted(NODES)
    assert result["after"] == {"gpu-pascal": (False, {}), "gpu-hopper": (True, {})}


@pytest.mark.parametrize(("run", "names"), [
    ("blocked", {"upgrade_drain_timeout": "gpu_node_upgrade_drain_timeout"}),
    ("node_fails", {"upgrade_drain_timeout": "gpu_node_upgrade_drain_timeout",
                    "upgrade_serial": "gpu_node_upgrade_serial"}),
])
def test_each_node_warns_about_the_deprecated_names_it_was_given(story, run, names):
    """Each host's result carries Ansible's deprecation (the stdout callback shows equal ones
    once: tests/unit/test_deprecated_vars.py)."""
    result = story[run]
    warned = _task_hosts(result, ROLE + "Warn about settings given under their deprecated names "
                                        "(upgrade_*)")
    assert sorted(warned) == sorted(result["stats"])
    for host_result in warned.values():
        assert host_result["deprecated"] == names
        messages = [d["msg"] for d in host_result["deprecations"]]
        assert len(messages) == len(names), messages
        for old, new in names.items():
            assert any(m.startswith(f"The setting {old} is deprecated: rename it {new}")
                       for m in messages), messages


def test_runs_without_deprecated_names_warn_about_none(story):
    for run in ("bad_target", "at_target"):
        warned = _task_hosts(story[run], ROLE + "Warn about settings given under their "
                                                "deprecated names (upgrade_*)")
        assert warned, run
        for host_result in warned.values():
            assert host_result["deprecated"] == {} and not host_result.get("deprecations"), run
