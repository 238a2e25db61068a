"""The gpu_node_upgrade role's decisions (gpuprov/stages/gpu_node_upgrade.py), called directly,
and through its filters (plugins/filter/gpu_node_upgrade.py) where the role's values are checked.

The probe reports are the recorded ones of tests/fixtures/verify/probe (what gpu_preflight
reads on a lab node), the verify output is gpuprov's own table formatter's.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from gpuprov import cordon
from gpuprov.stages import gpu_node_upgrade as upgrade_stage
from gpuprov.verify.findings import FAIL, PASS, WARN, Finding
from gpuprov.verify.report import table

ROOT = Path(__file__).resolve().parents[2]
PROBES = ROOT / "tests" / "fixtures" / "verify" / "probe"


@pytest.fixture(scope="module")
def upgrade():
    return upgrade_stage


@pytest.fixture(scope="module")
def filters(ansible_plugin):
    return ansible_plugin("filter/gpu_node_upgrade.py").FilterModule().filters()


def _probe(name: str = "gpu-pascal") -> dict:
    return json.loads((PROBES / f"{name}.json").read_text())


def _installed(report: dict) -> str:
    return report["nvml"]["library"]["version"]


def _node(unschedulable: bool | None = None, **annotations: str) -> dict:
    node = {"metadata": {"name": "gpu-pascal", "annotations": annotations or None}, "spec": {}}
    if unschedulable is not None:
        node["spec"]["unschedulable"] = unschedulable
    return node


def _other_version(version: str) -> str:
    """A version of the same branch that is not `version` (535.261.03 -> 535.261.04)."""
    *head, last = version.split(".")
    return ".".join([*head, f"{int(last) + 1:02d}"])


def test_filters_are_registered(filters):
    assert set(filters) == {
        "gpuprov_upgrade_plan", "gpuprov_upgrade_drain", "gpuprov_upgrade_pods_left",
        "gpuprov_upgrade_verify_failures"}


# -- the plan ---------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["{v}-1", "1:{v}-1~deb12u1", "{v}-*", "{v}", "{v}-1.el9"])
def test_a_node_at_the_pinned_version_is_skipped(upgrade, spelling):
    report = _probe()
    version = _installed(report)
    plan = upgrade.plan(report, _node(), spelling.format(v=version), 535)
    assert (plan["installed"], plan["target"]) == (version, version)
    assert plan["at_target"] and plan["skip"]
    assert "skip" in plan["summary"] and version in plan["summary"]


def test_a_node_at_another_version_is_upgraded(upgrade):
    report = _probe()
    target = _other_version(_installed(report))
    plan = upgrade.plan(report, _node(), f"{target}-1", 535)
    assert plan["target"] == target
    assert not plan["at_target"] and not plan["skip"]
    assert plan["summary"].endswith("-> upgrade")


def test_a_version_glob_is_matched_as_apt_would(upgrade):
    report = _probe()
    branch, rest = _installed(report).split(".", 1)
    assert upgrade.plan(report, _node(), f"{branch}.*", int(branch))["at_target"]
    assert not upgrade.plan(report, _node(), f"{int(branch) + 1}.*", int(branch))["at_target"]


def test_without_a_pinned_version_any_version_of_the_branch_is_the_target(upgrade):
    report = _probe()
    branch = int(_installed(report).split(".")[0])
    # Debian 12's own 535.261.03 lacks NVIDIA's later fixes: accepted, as the lab accepts it.
    plan = upgrade.plan(report, _node(), None, branch, "true")
    assert plan["skip"] and plan["target"] == f"{branch}.x"
    assert not upgrade.plan(report, _node(), "", branch + 15)["at_target"]
    # A branch that only starts with the same digits is another branch.
    assert not upgrade.plan(report, _node(), None, branch // 10)["at_target"]


@pytest.mark.parametrize(("installed", "skip", "target"), [
    ("580.105.08", False, "580.x (at least 580.178.04, NVIDIA's security fixes)"),
    ("580.178.04", True, "580.x"),
    # An ended branch at its last fix: no floor to move to, nothing to upgrade.
    ("550.163.01", True, "550.x"),
])
def test_without_a_pin_a_driver_below_the_security_floor_is_upgraded(upgrade, installed, skip,
                                                                     target):
    report = _probe()
    report["nvml"]["library"]["version"] = report["nvml"]["driver_version"] = installed
    report["kernel_module"]["version"] = installed
    branch = int(installed.split(".")[0])
    plan = upgrade.plan(report, _node(), None, branch)
    assert (plan["skip"], plan["target"]) == (skip, target), plan["summary"]
    # Accepted (nvidia_driver_allow_vulnerable): any version of the branch is the target.
    assert upgrade.plan(report, _node(), None, branch, True)["skip"]


def test_a_loaded_kernel_module_of_another_version_is_not_done(upgrade):
    report = _probe()
    version = _installed(report)
    old = _other_version(version)
    report["kernel_module"].update(loaded=True, version=old)
    plan = upgrade.plan(report, _node(), f"{version}-1", 535)
    assert not plan["at_target"] and not plan["skip"]
    assert f"kernel module {old} loaded" in plan["summary"]
    report["kernel_module"]["version"] = version
    assert upgrade.plan(report, _node(), f"{version}-1", 535)["skip"]


def test_the_installed_driver_is_nvml_s_answer_when_the_library_has_no_version(upgrade):
    report = _probe()
    version = _installed(report)
    report["nvml"]["library"] = None
    assert upgrade.plan(report, _node(), f"{version}-1", 535)["installed"] == version
    report["nvml"]["driver_version"] = None
    plan = upgrade.plan(report, _node(), f"{version}-1", 535)
    assert plan["installed"] is None and not plan["at_target"]
    assert "driver not installed" in plan["summary"]


def test_no_driver_at_all_is_upgraded(upgrade):
    plan = upgrade.plan(_probe("cpu-only"), _node(), "535.261.03-1", 535)
    assert plan["installed"] is None and not plan["skip"]


@pytest.mark.parametrize("key", ["FAILED", "WAS_CORDONED"])
def test_a_node_an_earlier_run_left_half_done_is_upgraded_again(upgrade, key):
    report = _probe()
    annotation = getattr(upgrade, key)
    plan = upgrade.plan(report, _node(**{annotation: "false"}), f"{_installed(report)}-1", 535)
    assert plan["at_target"] and not plan["skip"]
    assert plan["unfinished"] == [annotation]
    assert "did not finish" in plan["summary"]


@pytest.mark.parametrize(("unschedulable", "recorded", "was_cordoned"), [
    (None, None, False),
    (False, None, False),
    (True, None, True),           # an admin's cordon, before any upgrade
    (True, "false", False),       # the upgrade's own cordon, from an earlier run
    (True, "true", True),
    (False, "true", True),        # recorded, then uncordoned by hand: the record wins
])
def test_was_cordoned_is_the_earlier_run_s_record_else_the_node_s_cordon(
        upgrade, unschedulable, recorded, was_cordoned):
    annotations = {upgrade.WAS_CORDONED: recorded} if recorded is not None else {}
    plan = upgrade.plan(_probe(), _node(unschedulable, **annotations), "535.1.1-1", 535)
    assert plan["was_cordoned"] is was_cordoned
    # What gpu_node_maintenance then records and gives back (gpuprov/cordon.py, owner
    # gpu-node-upgrade): the upgrade's annotations go either way; the cordon only if the
    # upgrade put it there.
    node = _node(unschedulable, **annotations)
    taken = cordon.take(node, upgrade.OWNER, plan["reason"])
    assert taken["metadata"]["annotations"][upgrade.WAS_CORDONED] == str(was_cordoned).lower()
    done = cordon.give_back(node, upgrade.OWNER)
    assert done["metadata"]["annotations"] == dict.fromkeys(cordon.keys(upgrade.OWNER).all)
    assert (done.get("spec") or {}).get("unschedulable", True) is was_cordoned


def test_a_plan_needs_a_target_and_the_right_inputs(upgrade, filters):
    plan = filters["gpuprov_upgrade_plan"]
    with pytest.raises(AnsibleFilterError, match="no target"):
        plan(_probe(), _node(), None, None)
    with pytest.raises(AnsibleFilterError, match="names no driver version"):
        plan(_probe(), _node(), "-1", 535)
    with pytest.raises(AnsibleFilterError, match="probe report"):
        plan("not a report", _node(), None, 535)
    with pytest.raises(AnsibleFilterError, match="Node object"):
        plan(_probe(), [], None, 535)
    # The stage's own error, which the filter turns into the task's message.
    with pytest.raises(upgrade.UpgradeError, match="no target"):
        upgrade.plan(_probe(), _node(), None, None)


# -- the drain --------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [1, 9, 10, 11, 600, "20"])
def test_the_drain_is_retried_for_about_the_timeout(upgrade, timeout):
    drain = upgrade.drain(timeout)
    seconds = int(timeout)
    assert drain["timeout"] == seconds
    assert drain["delete_options"]["wait_timeout"] == seconds
    # Retried every `delay` seconds until the timeout has passed, and not a try more.
    assert drain["retries"] * drain["delay"] >= seconds
    assert (drain["retries"] - 1) * drain["delay"] < seconds


def test_the_drain_evicts_managed_pods_only_unless_told(upgrade, filters):
    options = upgrade.drain(600)["delete_options"]
    assert options["ignore_daemonsets"] is True
    assert options["force"] is False and options["delete_emptydir_data"] is False
    # Extra vars arrive as strings.
    drain = filters["gpuprov_upgrade_drain"]
    options = drain("600", "true", "yes")["delete_options"]
    assert options["force"] is True and options["delete_emptydir_data"] is True
    assert drain(600, "false", "no")["delete_options"]["force"] is False


@pytest.mark.parametrize("timeout", [0, -5, "soon", None, ""])
def test_a_drain_timeout_that_is_no_duration_is_refused(filters, timeout):
    with pytest.raises(AnsibleFilterError, match="gpu_node_upgrade_drain_timeout"):
        filters["gpuprov_upgrade_drain"](timeout)


def test_a_drain_flag_that_is_no_boolean_is_refused(filters):
    with pytest.raises(AnsibleFilterError, match="gpu_node_upgrade_drain_force"):
        filters["gpuprov_upgrade_drain"](600, "maybe")
    with pytest.raises(AnsibleFilterError, match="delete_emptydir_data"):
        filters["gpuprov_upgrade_drain"](600, False, "perhaps")


def _pod(name: str, phase: str = "Running", owner: str | None = None,
         **annotations: str) -> dict:
    metadata = {"name": name, "namespace": "team"}
    if owner:
        metadata["ownerReferences"] = [{"kind": owner, "name": f"{name}-owner"}]
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "status": {"phase": phase}}


def test_pods_left_after_the_drain(upgrade, filters):
    pods = [
        _pod("trainer", owner="ReplicaSet"),
        _pod("loose"),
        _pod("starting", phase="Pending", owner="Job"),
        _pod("plugin", owner="DaemonSet"),
        _pod("finished", phase="Succeeded", owner="Job"),
        _pod("crashed", phase="Failed"),
        _pod("static", owner="Node", **{"kubernetes.io/config.mirror": "abc"}),
    ]
    assert upgrade.pods_left(pods) == ["team/trainer", "team/loose", "team/starting"]
    assert upgrade.pods_left([]) == []
    with pytest.raises(AnsibleFilterError, match="list of Pod objects"):
        filters["gpuprov_upgrade_pods_left"]({"resources": pods})


# -- verify --------------------------------------------------


def test_verify_failures_are_its_failed_and_error_rows(upgrade):
    report = table([
        Finding("nvml.init", "gpu-hopper", PASS, "NVML initialised"),
        Finding("gpu.ecc", "gpu-hopper", FAIL, "GPU 3: 2 uncorrectable ECC errors",
                remediation="drain the node and replace the GPU"),
        Finding("gpu.pcie", "gpu-hopper", WARN, "GPU 1 runs x8"),
        Finding("pods.batch-job", "gpu-hopper", "error", "the Job did not start"),
    ])
    line = upgrade.verify_failures(report, 1)
    assert line.startswith("gpuprov verify exited 1: FAIL gpu.ecc GPU 3: 2 uncorrectable")
    assert "ERROR pods.batch-job the Job did not start" in line
    assert "nvml.init" not in line and "gpu.pcie" not in line
    coloured = table([Finding("gpu.ecc", "gpu-hopper", FAIL, "GPU 3: 2 uncorrectable ECC errors")],
                     colour=True)
    assert "\x1b[" in coloured
    assert upgrade.verify_failures(coloured, 1) == \
        "gpuprov verify exited 1: FAIL gpu.ecc GPU 3: 2 uncorrectable ECC errors"


def test_verify_failures_without_a_table_name_its_error(upgrade):
    assert upgrade.verify_failures("", 2, "Traceback\n\nverify: no such inventory: x.yml\n") \
        == "gpuprov verify exited 2: verify: no such inventory: x.yml"
    assert upgrade.verify_failures(None, 3) == "gpuprov verify exited 3: see its report"


def test_the_plan_does_not_change_its_inputs(upgrade):
    report, node = _probe(), _node(True, **{"gpuprov.io/upgrade-failed": "x"})
    before = copy.deepcopy((report, node))
    upgrade.plan(report, node, "535.261.03-1", 535)
    assert (report, node) == before
