"""`playbooks/upgrade-driver.yml` on a lab of its own: a rolling driver upgrade, over real SSH
and real Debian packages (bookworm-backports 535.216.03 -> bookworm 535.261.03), and what
happens when nodes fail during site.yml and during the rollout.

Its own lab (three GPU nodes and a CPU node), not the session's: the upgrade changes the
driver, which the other lab tests expect at the version site.yml installs. The module is one
story, each fixture building on the one before:
  1. site.yml (driver from backports) while gpu-pascal-2 loses power in the middle of its
     driver install: the other nodes finish; after the node is back a rerun converges,
     changing only that node
  2. the upgrade with a target of another branch: fails before any node is cordoned; then
     while a PodDisruptionBudget forbids draining gpu-pascal: stops at once
  3. the upgrade with a fault that makes verify fail on gpu-hopper (the second node):
     gpu-pascal is upgraded, gpu-hopper stays cordoned with the reason, gpu-pascal-2 is
     untouched
  4. the fault cleared, the upgrade again: it completes
  5. the upgrade once more: nothing changes
"""

from __future__ import annotations

import io
import os
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import (
    connect,
    finish_playbook,
    installed_packages,
    kube_api,
    node_target,
    playbook_failures,
    recheck_health,
    run_playbook,
    start_playbook,
    temporary_lab,
)
from kubernetes import client

from gpuprov.cli import main
from gpuprov.lab import podman
from gpuprov.lab.lab import Lab

pytestmark = pytest.mark.lab

# Inventory order, so the rollout order (serial 1): the repeated profile is named gpu-pascal-2.
GPU_NODES = ["gpu-pascal", "gpu-hopper", "gpu-pascal-2"]
NODES = GPU_NODES + ["cpu-only"]
LOST = "gpu-pascal-2"  # the node killed during site.yml
# Written out, not read from the role: a wrong package name in the role must fail here.
DRIVER_PACKAGES = ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1",
                   "libnvidia-cfg1"]
OLD = "535.216.03"  # bookworm-backports
NEW = "535.261.03"  # bookworm
FAILED = "gpuprov.io/upgrade-failed"
WAS_CORDONED = "gpuprov.io/upgrade-was-cordoned"
GPUS = {"gpu-pascal": "4", "gpu-hopper": "8", "gpu-pascal-2": "4"}
# The role's tasks, as the JSON callback names them.
ROLE = "gpu_node_upgrade : "
VERIFY_TASK = ROLE + "Verify the node, smoke pods included, while it is still cordoned"


@pytest.fixture(scope="module")
def upgrade_lab(tmp_path_factory):
    yield from temporary_lab(tmp_path_factory, "upgradelab",
                             "--nodes", "gpu-pascal,gpu-hopper@debian-12,gpu-pascal,cpu-only")


def _core(lab: Lab) -> client.CoreV1Api:
    return client.CoreV1Api(kube_api(lab))


def _nodes(lab: Lab) -> dict:
    return {n.metadata.name: n for n in _core(lab).list_node().items}


def _task_results(doc: dict, name: str) -> dict:
    """{host: result} of the task of that name, across the plays."""
    return {host: result for play in doc["plays"] for task in play["tasks"]
            if task["task"]["name"] == name for host, result in task["hosts"].items()}


def _upgrade_annotations(node) -> set[str]:
    """The upgrade annotations the Node carries (none before and after an upgrade)."""
    return {FAILED, WAS_CORDONED} & (node.metadata.annotations or {}).keys()


def _driver_versions(lab: Lab, node: str) -> dict[str, tuple[str, str]]:
    with connect(node_target(lab, node)) as conn:
        packages = installed_packages(conn)
    missing = [p for p in DRIVER_PACKAGES if p not in packages]
    assert missing == [], f"{node}: {missing} not installed"
    return {p: packages[p] for p in DRIVER_PACKAGES + ["nvidia-persistenced"]}


def _container(lab: Lab, node: str) -> str:
    return lab.require().node(node).container


def _dpkg_unpacking(container_id: str) -> bool:
    """dpkg is unpacking a package in the container: its `dpkg-deb --fsys-tarfile` child
    runs only then, after dpkg has marked the package half-installed, so a cut from here on
    leaves dpkg interrupted. Read from the host's /proc, where the container's processes
    are, each in a cgroup named after the container: a look costs milliseconds (a
    `podman exec` per look would cost a second under load and miss short unpacks)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if (argv[0].endswith(b"dpkg-deb") and b"--fsys-tarfile" in argv
                    and container_id in (proc / "cgroup").read_text()):
                return True
        except OSError:  # the process ended meanwhile
            continue
    return False


SITE_ON_BACKPORTS = ("site.yml", "-e", "nvidia_driver_debian_backports=true")


@pytest.fixture(scope="module")
def interrupted_site(upgrade_lab):
    """site.yml with the driver from backports; gpu-pascal-2 loses power as soon as dpkg
    unpacks a package on it: the host SIGKILLs the container's init, and the kernel kills
    every process of the node with it, at once. Then the node is started again
    (`gpuprov lab up` starts stopped nodes). Returns site.yml's (rc, doc) and what
    `dpkg --audit` said on the node after it came back."""
    container = _container(upgrade_lab, LOST)
    container_id, init_pid = podman.output(
        "container", "inspect", "--format", "{{.Id}} {{.State.Pid}}", container).split()
    run = start_playbook(upgrade_lab, *SITE_ON_BACKPORTS)
    killed = False
    deadline = time.monotonic() + 900
    while run.proc.poll() is None and time.monotonic() < deadline:
        if _dpkg_unpacking(container_id):
            os.kill(int(init_pid), signal.SIGKILL)
            podman.podman("wait", container)
            killed = True
            break
        time.sleep(0.02)
    rc, doc = finish_playbook(run)
    assert killed, f"dpkg never unpacked a package on {LOST} during site.yml (rc {rc})"
    assert main(["lab", "--dir", str(upgrade_lab.project_dir), "up"]) == 0
    audit = podman.output("exec", container, "dpkg", "--audit")
    print(f"{LOST} after the power cut, dpkg --audit: {audit or '(nothing)'}")
    return rc, doc, audit


def test_a_node_lost_mid_run_does_not_stop_the_others(upgrade_lab, interrupted_site):
    rc, doc, audit = interrupted_site
    assert rc == 4, f"expected 4 (a host unreachable), got {rc}: {playbook_failures(doc)}"
    stats = doc["stats"]
    assert stats[LOST]["unreachable"] == 1, stats[LOST]
    for node in NODES:
        if node != LOST:
            assert (stats[node]["failures"], stats[node]["unreachable"]) == (0, 0), \
                (node, playbook_failures(doc))
    # The others went through every stage, verify included (limited to them).
    verify = [task["hosts"] for play in doc["plays"] for task in play["tasks"]
              if task["task"]["name"] == "gpu_verify : Run gpuprov verify"]
    assert len(verify) == 1 and len(verify[0]) == 1, verify
    result = next(iter(verify[0].values()))
    assert result["rc"] == 0, result.get("stdout")
    limit = result["cmd"][result["cmd"].index("--limit") + 1].split(",")
    assert sorted(limit) == sorted(n for n in NODES if n != LOST)
    # The cut came while dpkg was installing the driver: the node was left half-installed.
    assert audit, f"dpkg --audit found nothing on {LOST}: the cut missed the install"


@pytest.fixture(scope="module")
def site_on_backports(upgrade_lab, interrupted_site):
    """site.yml again, once the lost node is back: it must finish the interrupted install."""
    started = time.monotonic()
    rc, doc = run_playbook(upgrade_lab, *SITE_ON_BACKPORTS)
    print(f"site.yml rerun (backports) took {time.monotonic() - started:.0f} s")
    return rc, doc


def test_the_rerun_converges_changing_only_the_lost_node(upgrade_lab, site_on_backports):
    rc, doc = site_on_backports
    assert rc == 0, playbook_failures(doc)
    changed = {node: s["changed"] for node, s in doc["stats"].items() if s["changed"]}
    assert list(changed) == [LOST], changed
    for node in GPU_NODES:
        for package, (version, want) in _driver_versions(upgrade_lab, node).items():
            if package != "nvidia-persistenced":
                assert version.startswith(OLD + "-"), (node, package, version)
            assert want == "hold", (node, package, want)
    with connect(node_target(upgrade_lab, LOST)) as conn:
        audit = conn.run("dpkg --audit", hide=True, in_stream=False).stdout
    assert audit == "", audit


@pytest.fixture(scope="module")
def bad_target_run(upgrade_lab, site_on_backports):
    """The upgrade with a target of another branch (470 for 535 nodes): a typo."""
    return run_playbook(upgrade_lab, "playbooks/upgrade-driver.yml",
                        "-e", "nvidia_driver_version=470.256.02-1")


def test_a_bad_target_fails_before_any_node_is_cordoned(upgrade_lab, bad_target_run):
    rc, doc = bad_target_run
    assert rc == 2, playbook_failures(doc)
    assert doc["stats"]["gpu-pascal"]["failures"] == 1
    assert "not a version of driver branch 535" in playbook_failures(doc)
    assert [n for n in GPU_NODES[1:] if n in doc["stats"]] == []  # the rollout stopped
    for name, node in _nodes(upgrade_lab).items():
        assert not node.spec.unschedulable, name
        assert _upgrade_annotations(node) == set(), name


UPGRADE = ("playbooks/upgrade-driver.yml", "-e", f"nvidia_driver_version={NEW}-1",
           "-e", "nvidia_driver_debian_backports=false")


WORKLOAD_NS = "upgrade-workload"


def _start_blocked_workload(lab: Lab) -> str:
    """A 1-GPU Job pod on gpu-pascal whose PodDisruptionBudget forbids evicting it; its uid."""
    api = kube_api(lab)
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    core.create_namespace({"metadata": {"name": WORKLOAD_NS}})
    gpu = {"nvidia.com/gpu": "1"}
    batch.create_namespaced_job(WORKLOAD_NS, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "trainer"},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"app": "trainer"}},
            "spec": {
                "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "nodeSelector": {"kubernetes.io/hostname": "gpu-pascal"},
                "containers": [{"name": "train", "image": lab.require().pod_image,
                                "command": ["sleep", "3600"],
                                "resources": {"requests": gpu, "limits": gpu}}]}}}})
    client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(WORKLOAD_NS, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "trainer"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}}})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(WORKLOAD_NS, label_selector="app=trainer").items
        if pods and pods[0].status.phase == "Running":
            assert pods[0].spec.node_name == "gpu-pascal"
            return pods[0].metadata.uid
        time.sleep(1)
    raise AssertionError(f"the workload pod did not start: {pods}")


@pytest.fixture(scope="module")
def blocked_run(upgrade_lab, bad_target_run):
    """The upgrade while a PodDisruptionBudget refuses to let gpu-pascal (the first node) be
    drained: the rollout must stop at that node. The budget is removed afterwards."""
    uid = _start_blocked_workload(upgrade_lab)
    # The timeout under its deprecated name (gpu_node_upgrade_drain_timeout's before the role):
    # still read, with a deprecation warning.
    rc, doc = run_playbook(upgrade_lab, *UPGRADE, "-e", "upgrade_drain_timeout=20")
    client.PolicyV1Api(kube_api(upgrade_lab)).delete_namespaced_pod_disruption_budget(
        "trainer", WORKLOAD_NS)
    return rc, doc, uid


def test_a_node_that_cannot_be_drained_stops_the_rollout(upgrade_lab, blocked_run):
    rc, doc, _ = blocked_run
    assert rc != 0
    assert doc["stats"]["gpu-pascal"]["failures"] == 1
    # max_fail_percentage 0: the next nodes' batches never started.
    assert [n for n in GPU_NODES[1:] if n in doc["stats"]] == []
    nodes = _nodes(upgrade_lab)
    pascal = nodes["gpu-pascal"]
    assert pascal.spec.unschedulable is True
    reason = (pascal.metadata.annotations or {}).get(FAILED, "")
    assert reason.startswith("Cordon and drain the node: "), reason
    (drain,) = _task_results(doc, ROLE + "Cordon and drain the node").values()
    assert drain["invocation"]["module_args"]["delete_options"]["wait_timeout"] == 20
    (warned,) = _task_results(doc, ROLE + "Warn about settings given under their deprecated "
                                          "names (upgrade_*)").values()
    assert warned["deprecated"] == {"upgrade_drain_timeout": "gpu_node_upgrade_drain_timeout"}
    for node in GPU_NODES[1:]:
        assert not nodes[node].spec.unschedulable, node
        assert _upgrade_annotations(nodes[node]) == set(), node
    for node in GPU_NODES:  # no driver was touched
        versions = _driver_versions(upgrade_lab, node)
        assert versions["nvidia-kernel-dkms"][0].startswith(OLD + "-"), (node, versions)


# The fault that makes verify fail on the second node after its upgrade: uncorrectable ECC
# errors on one GPU (gpu.ecc fails). The driver installs and the node labels as usual.
VERIFY_FAULT = ("gpu-hopper", "ecc-uncorrectable")


# A stand-in for DCGM's host engine on gpu-pascal: a real systemd unit, under the name of
# NVIDIA's package, that logs when it is started and stopped. The upgrade must stop it
# before the driver changes and start it again after.
DCGM_UNIT = "nvidia-dcgm.service"
DCGM_LOG = "/var/log/gpuprov-dcgm-stand-in.log"
DCGM_STAND_IN = {
    "/usr/local/sbin/gpuprov-dcgm-stand-in": f"""#!/bin/sh
echo "$1 $(date +%s.%N)" >> {DCGM_LOG}
""",
    f"/etc/systemd/system/{DCGM_UNIT}": """[Unit]
Description=gpuprov test stand-in for DCGM's nv-hostengine
[Service]
ExecStartPre=/usr/local/sbin/gpuprov-dcgm-stand-in start
ExecStart=/bin/sleep infinity
ExecStopPost=/usr/local/sbin/gpuprov-dcgm-stand-in stop
[Install]
WantedBy=multi-user.target
""",
}


def _install_dcgm_stand_in(lab: Lab, node: str) -> None:
    with connect(node_target(lab, node)) as conn:
        for path, text in DCGM_STAND_IN.items():
            conn.put(io.StringIO(text), path)
        conn.run(f"chmod 755 /usr/local/sbin/gpuprov-dcgm-stand-in && rm -f {DCGM_LOG} && "
                 f"systemctl daemon-reload && systemctl enable --now {DCGM_UNIT}",
                 hide=True, in_stream=False)


@pytest.fixture(scope="module")
def faulted_run(upgrade_lab, blocked_run):
    """The upgrade once the budget is gone (the workload on gpu-pascal can be evicted), with
    VERIFY_FAULT on the second node and DCGM's stand-in on the first. gpu-pascal-2 was
    cordoned by an admin beforehand (it must stay cordoned through all of it)."""
    _core(upgrade_lab).patch_node("gpu-pascal-2", {"spec": {"unschedulable": True}})
    _install_dcgm_stand_in(upgrade_lab, "gpu-pascal")
    node, fault = VERIFY_FAULT
    upgrade_lab.fault(node, fault)
    try:
        started = time.monotonic()
        rc, doc = run_playbook(upgrade_lab, *UPGRADE)
        _report_rollout("upgrade-driver.yml with a verify fault", started, doc)
    finally:
        upgrade_lab.fault(node, fault, clear=True)
    # The admin's fix: the ECC errors are gone, and the node's health agent, which saw them
    # (GPUFault; verify's k8s.health), checks again until it clears, as the rerun's verify
    # needs (systemctl reload: a check now, not in a minute).
    recheck_health(upgrade_lab, [node])
    return rc, doc


def test_a_node_failing_verify_stops_the_rollout_cordoned_with_the_reason(
        upgrade_lab, faulted_run):
    rc, doc = faulted_run
    assert rc == 2, f"expected 2 (a host failed), got {rc}: {playbook_failures(doc)}"
    stats = doc["stats"]
    assert stats["gpu-pascal"]["failures"] == 0 and stats["gpu-pascal"]["changed"] > 0
    assert stats["gpu-hopper"]["failures"] == 1
    assert "gpu-pascal-2" not in stats  # its batch never started
    nodes = _nodes(upgrade_lab)
    hopper = nodes["gpu-hopper"]
    assert hopper.spec.unschedulable is True
    reason = (hopper.metadata.annotations or {}).get(FAILED, "")
    assert reason.startswith("Assert that every check passed: gpuprov verify exited 1"), reason
    assert "gpu.ecc" in reason, reason
    # The first node was upgraded and given back; the third was not touched.
    assert not nodes["gpu-pascal"].spec.unschedulable
    assert _driver_versions(upgrade_lab, "gpu-pascal")["nvidia-kernel-dkms"][0] == f"{NEW}-1"
    assert nodes["gpu-pascal-2"].spec.unschedulable is True  # the admin's cordon
    assert _upgrade_annotations(nodes["gpu-pascal-2"]) == set()
    versions = _driver_versions(upgrade_lab, "gpu-pascal-2")
    assert versions["nvidia-kernel-dkms"][0].startswith(OLD + "-"), versions


def test_dcgm_was_stopped_for_the_driver_and_started_again(upgrade_lab, faulted_run):
    with connect(node_target(upgrade_lab, "gpu-pascal")) as conn:
        log = conn.run(f"cat {DCGM_LOG}", hide=True, in_stream=False).stdout.split()
        active = conn.run(f"systemctl is-active {DCGM_UNIT}", hide=True, warn=True,
                          in_stream=False).stdout.strip()
        # When dpkg put the new NVML library in place (its ctime: dpkg keeps the package's
        # mtime).
        installed = float(conn.run(
            f"stat -c %Z /usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.{NEW}",
            hide=True, in_stream=False).stdout)
    events = list(zip(log[::2], map(float, log[1::2]), strict=True))
    assert [e for e, _ in events] == ["start", "stop", "start"], events
    assert events[1][1] <= installed <= events[2][1], (events, installed)
    assert active == "active"


def test_the_workload_was_evicted_before_the_upgrade(upgrade_lab, faulted_run, blocked_run):
    pods = _core(upgrade_lab).list_namespaced_pod(WORKLOAD_NS, label_selector="app=trainer")
    assert blocked_run[2] not in [p.metadata.uid for p in pods.items]


def _seconds_per_host(doc: dict) -> dict[str, float]:
    """Wall time of each host's tasks (serial 1: one host at a time)."""
    spans: dict[str, list[datetime]] = {}
    for play in doc["plays"]:
        for task in play["tasks"]:
            duration = task["task"].get("duration") or {}
            if not duration.get("end"):
                continue
            start, end = (datetime.fromisoformat(duration[k].replace("Z", "+00:00"))
                          for k in ("start", "end"))
            for host in task["hosts"]:
                span = spans.setdefault(host, [start, end])
                span[0], span[1] = min(span[0], start), max(span[1], end)
    return {host: (end - start).total_seconds() for host, (start, end) in spans.items()}


def _report_rollout(what: str, started: float, doc: dict) -> None:
    per_host = ", ".join(f"{h} {s:.0f} s" for h, s in sorted(_seconds_per_host(doc).items()))
    print(f"{what} took {time.monotonic() - started:.0f} s ({per_host})")


@pytest.fixture(scope="module")
def upgrade_run(upgrade_lab, faulted_run):
    """The upgrade once the fault is cleared: it resumes at gpu-hopper."""
    started = time.monotonic()
    rc, doc = run_playbook(upgrade_lab, *UPGRADE)
    _report_rollout("upgrade-driver.yml, resumed", started, doc)
    return rc, doc


def test_rerun_completes_the_rollout(upgrade_run):
    rc, doc = upgrade_run
    assert rc == 0, playbook_failures(doc)
    stats = doc["stats"]
    assert sorted(stats) == sorted(GPU_NODES)  # the play is over gpu_nodes only
    for node in GPU_NODES:
        assert (stats[node]["failures"], stats[node]["unreachable"]) == (0, 0), node
    # gpu-pascal was done and is skipped; the failed node and the untouched one are upgraded.
    assert {n: bool(s["changed"]) for n, s in stats.items()} == \
        {"gpu-pascal": False, "gpu-hopper": True, "gpu-pascal-2": True}


def test_each_upgraded_node_ran_the_smoke_pods_while_cordoned(upgrade_run):
    _, doc = upgrade_run
    verified = {}
    for play in doc["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] == VERIFY_TASK:
                verified.update({h: r.get("stdout", "") for h, r in task["hosts"].items()})
    assert sorted(verified) == ["gpu-hopper", "gpu-pascal-2"]  # gpu-pascal was skipped
    for node, report in verified.items():
        for check in ("pods.gpu-count", "pods.isolation", "pods.batch-job"):
            assert any(line.split()[:2] == ["PASS", check] for line in report.splitlines()), \
                f"{node}: {check} did not pass:\n{report}"


@pytest.mark.parametrize("node", GPU_NODES)
def test_nodes_run_the_new_driver_still_held(upgrade_lab, upgrade_run, node):
    for package, (version, want) in _driver_versions(upgrade_lab, node).items():
        if package != "nvidia-persistenced":  # versioned on its own
            assert version == f"{NEW}-1", (node, package, version)
        assert want == "hold", (node, package, want)
    # The backports suite is gone from the node's sources with the backports setting.
    with connect(node_target(upgrade_lab, node)) as conn:
        sources = conn.run("cat /etc/apt/sources.list.d/gpuprov-nvidia-debian.sources",
                           hide=True, in_stream=False).stdout
    assert "backports" not in sources


def test_uncordoned_unless_cordoned_before_and_labelled_for_the_new_driver(
        upgrade_lab, upgrade_run):
    nodes = _nodes(upgrade_lab)
    # gpu-pascal and gpu-hopper were schedulable before the runs that cordoned them.
    for node in ["gpu-pascal", "gpu-hopper"]:
        assert not nodes[node].spec.unschedulable, f"{node} is still cordoned"
    # gpu-pascal-2 was cordoned by the admin before the upgrade: it stays cordoned.
    assert nodes["gpu-pascal-2"].spec.unschedulable is True, "gpu-pascal-2 was uncordoned"
    for node in GPU_NODES:
        assert _upgrade_annotations(nodes[node]) == set(), node
        assert nodes[node].metadata.labels["nvidia.com/cuda.driver-version.full"] == NEW
        assert nodes[node].status.allocatable.get("nvidia.com/gpu") == GPUS[node]


def test_second_run_changes_nothing(upgrade_lab, upgrade_run):
    rc, doc = run_playbook(upgrade_lab, *UPGRADE)
    assert rc == 0, playbook_failures(doc)
    assert {n: s["changed"] for n, s in doc["stats"].items()} == dict.fromkeys(GPU_NODES, 0)
    # Each node stopped at the skip: nothing was cordoned or drained.
    assert _task_results(doc, ROLE + "Report the installed driver and the target")
    assert _task_results(doc, ROLE + "Cordon and drain the node") == {}
