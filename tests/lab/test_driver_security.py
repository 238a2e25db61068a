"""NVIDIA's driver bulletins on the session lab (issue 32): gpu-hopper, which site.yml gave
R580's fixed version from the lab's mirror of NVIDIA's repository, is moved to the vulnerable
R580 beside it and back with `playbooks/upgrade-driver.yml`, and verify's driver.security
says so each time. One story, in order:
  1. after site.yml: driver 580.178.04, driver.security passes
  2. upgrade-driver.yml to 580.105.08: refused before the node is cordoned (a pin below the
     branch's security floor), nothing changes
  3. the same with nvidia_driver_allow_vulnerable: done, every run warns; verify (whose
     inventory does not accept it) fails driver.security naming bulletin 5861's CVE
  4. upgrade-driver.yml without a version: the node below its branch's floor is not "at the
     target", it gets the branch's newest (580.178.04) and driver.security passes again; the
     node is as site.yml left it (the branch's version-lock package, not the version's)
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import connect, installed_packages, kube_api, node_target, playbook_failures
from kubernetes import client

from gpuprov.lab import cudarepo
from gpuprov.nvidia import driver_advisories

pytestmark = pytest.mark.lab

NODE = "gpu-hopper"
UPGRADE = "playbooks/upgrade-driver.yml"
VULNERABLE, FIXED = cudarepo.VULNERABLE_580, cudarepo.FIXED_580  # 580.105.08-1, 580.178.04-1
DRIVER_PACKAGES = ("nvidia-driver-cuda", "libcuda1", "libnvidia-ml1", "nvidia-smi")


@pytest.fixture(scope="module")
def converged(site_run):
    rc, _ = site_run
    assert rc == 0, "site.yml failed on the lab; see test_site_playbook"


def _security(lab) -> dict:
    """verify --limit gpu-hopper's driver.security finding (node phase only: the check is
    there; the cluster and pod phases belong to test_verify_lab)."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpuprov", "verify", "-i", str(lab.inventory_path), "--limit",
         NODE, "--skip", "k8s,pods", "--json"],
        capture_output=True, text=True, timeout=300, check=False)
    doc = json.loads(proc.stdout)
    (finding,) = [r for r in doc["results"] if r["check"] == "driver.security"]
    print(f"verify --limit {NODE}: exit {proc.returncode}; driver.security {finding['status']}: "
          f"{finding['message']}")
    return {**finding, "rc": proc.returncode}


def _driver(lab) -> dict[str, str]:
    with connect(node_target(lab, NODE)) as conn:
        packages = installed_packages(conn)
    return {name: packages[name][0] for name in (*DRIVER_PACKAGES, "nvidia-driver-pinning-580",
                                                 "nvidia-driver-pinning-580.105.08")
            if name in packages}


def _node(lab):
    return client.CoreV1Api(kube_api(lab)).read_node(NODE)


def _warnings(doc: dict) -> list[str]:
    return [result.get("msg", "") for play in doc["plays"] for task in play["tasks"]
            if task["task"]["name"].endswith("Warn that the installed driver lacks NVIDIA's "
                                             "security fixes")
            for host, result in task["hosts"].items()
            if host == NODE and not result.get("skipped")]


@pytest.fixture(scope="module")
def story(lab, converged, playbook):
    """Each step's outcome, in order (a failed step stops the story)."""
    steps = {"converged": (_driver(lab), _security(lab))}
    rc, doc = playbook(UPGRADE, "--limit", NODE, "-e", f"nvidia_driver_version={VULNERABLE}")
    steps["refused"] = (rc, playbook_failures(doc), _driver(lab), _node(lab))
    rc, doc = playbook(UPGRADE, "--limit", NODE, "-e", f"nvidia_driver_version={VULNERABLE}",
                       "-e", "nvidia_driver_allow_vulnerable=true")
    assert rc == 0, playbook_failures(doc)
    steps["vulnerable"] = (_warnings(doc), _driver(lab), _security(lab))
    rc, doc = playbook(UPGRADE, "--limit", NODE)
    assert rc == 0, playbook_failures(doc)
    steps["fixed"] = (_warnings(doc), _driver(lab), _security(lab), _node(lab))
    return steps


def test_site_yml_installs_the_fixed_r580_and_it_passes(story):
    driver, security = story["converged"]
    assert set(driver[p] for p in DRIVER_PACKAGES) == {FIXED}
    assert security["status"] == "pass" and security["rc"] == 0
    assert security["message"] == ("driver 580.178.04 has every fix for R580 (newest: bulletin "
                                   "5861, 2026-09-30, fixed in 580.178.04)")


def test_a_pin_below_the_floor_is_refused_before_the_node_is_cordoned(story):
    rc, failures, driver, node = story["refused"]
    assert rc != 0
    assert f"nvidia_driver_version {VULNERABLE} is below R580's fixed version 580.178.04" \
        in failures and driver_advisories.assess(VULNERABLE).below_text() in failures, failures
    assert "nvidia_driver_allow_vulnerable: true to accept the risk" in failures
    assert set(driver[p] for p in DRIVER_PACKAGES) == {FIXED}  # nothing changed
    assert not node.spec.unschedulable
    assert not {k for k in node.metadata.annotations or {} if k.startswith("gpuprov.io/upgrade")}


def test_accepted_it_installs_warns_and_verify_fails_it(story):
    warnings, driver, security = story["vulnerable"]
    assert set(driver[p] for p in DRIVER_PACKAGES) == {VULNERABLE}
    assert "nvidia-driver-pinning-580.105.08" in driver
    assert len(warnings) == 1 and warnings[0].startswith(
        f"WARNING: {NODE}: nvidia_driver_version {VULNERABLE} is below R580's fixed version")
    assert warnings[0].endswith("Accepted: nvidia_driver_allow_vulnerable.")
    # The inventory does not accept it: a failure naming the bulletins, the CVE, the version.
    assert security["status"] == "fail" and security["rc"] == 1
    assert security["message"].startswith("driver 580.105.08 is below R580's fixed version "
                                          "580.178.04: bulletin 5747 (2026-01-28")
    # 5861's 78 CVEs for R580, cut to the first three and the count (the table's test checks it).
    assert "bulletin 5861 (2026-09-30, high 7.8: CVE-2026-47489, CVE-2026-47491, " \
        "CVE-2026-47492 and 75 more)" in security["message"]
    assert security["message"].endswith("install 580.178.04 or newer")


def test_the_upgrade_without_a_version_moves_it_to_the_fixed_one(story):
    warnings, driver, security, node = story["fixed"]
    assert set(driver[p] for p in DRIVER_PACKAGES) == {FIXED}
    # As site.yml left it: the branch's lock package, not the version's.
    assert "nvidia-driver-pinning-580" in driver
    assert "nvidia-driver-pinning-580.105.08" not in driver
    assert warnings == []
    assert security["status"] == "pass" and security["rc"] == 0
    assert not node.spec.unschedulable
